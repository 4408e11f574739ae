/**
 * Webhooks end to end (docs/contract.md "Webhook subscription", "Events"; docs/decisions/webhooks.md):
 * a real HTTP receiver (node:http on a random port) verifies every delivery with the library helper
 * (domain/webhook-signature.ts), dedupes on Roost-Delivery and counts what it processed. Events come from
 * real routes (publish → version.published), the event relay and delivery workflows run on an in-process
 * worker on the harness's task queue.
 *
 * Set ROOST_RECORD_HISTORIES=1 to refresh test/replay/histories/webhooks/ from these runs.
 */
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';
import { createHarness, type Harness } from '../support/harness';
import { publishFiles, scopedKey, startTestWorker, terminateAll, type TestWorker } from './rollout-fixtures';
import { type SignatureCheck, verifySignature } from '../../domain/webhook-signature';
import { ensureEventRelay } from '../../worker/background';
import { relayPass } from '../../activities/events';
import { deliveryWorkflowId } from '../../domain/webhooks';
import { nonPublicAddressesOf } from '../../net/webhooks';
import { recordHistory } from '../../scripts/record-history';
import { waitFor } from '../support/wait';

const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories', 'webhooks');

/** One request the receiver got. */
interface Received {
  path: string;
  headers: http.IncomingHttpHeaders;
  raw: string;
  check: SignatureCheck;
  status: number;
}

/** A webhook receiver following the spec's receiver rules; per-path secrets and answers. */
class Receiver {
  server!: http.Server;
  base = '';
  received: Received[] = [];
  /** path → secrets the receiver accepts. */
  secrets = new Map<string, string[]>();
  /** path → status codes to answer next (then `fallback`). */
  plan = new Map<string, number[]>();
  fallback = new Map<string, number>();
  /** path → delivery ids processed (each once: idempotent on Roost-Delivery). */
  processed = new Map<string, string[]>();
  /** Roost-Delivery values answered 200 without reprocessing. */
  duplicates: string[] = [];

  async start(): Promise<void> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const raw = Buffer.concat(chunks).toString('utf8');
        const p = req.url ?? '/';
        const check = verifySignature({ header: req.headers['roost-signature'], rawBody: raw, secrets: this.secrets.get(p) ?? [] });
        let status = check.ok ? (this.plan.get(p)?.shift() ?? this.fallback.get(p) ?? 200) : 400;
        const id = String(req.headers['roost-delivery']);
        if (status >= 200 && status < 300) {
          const seen = this.processed.get(p) ?? [];
          if (seen.includes(id)) this.duplicates.push(id);
          else seen.push(id);
          this.processed.set(p, seen);
          status = 200;
        }
        this.received.push({ path: p, headers: req.headers, raw, check, status });
        res.writeHead(status, { 'content-type': 'text/plain' }).end(check.ok ? 'ok' : check.reason);
      });
    });
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.base = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  at(p: string): Received[] {
    return this.received.filter((r) => r.path === p);
  }

  close(): Promise<void> {
    return new Promise((r) => this.server.close(() => r()));
  }
}

let h: Harness;
let w: TestWorker;
let rx: Receiver;
let relayId: string;
let relayFirstRun: string;
const workflows: string[] = [];

/** Polls `fn` every 100 ms until it returns a truthy value (fails after `timeoutMs` with `what`). */
const until = <T>(what: string, fn: () => Promise<T>, timeoutMs = 45_000) => waitFor(what, fn, timeoutMs, 100);

const hooks = () => `/api/sites/${h.siteId}/webhooks`;

async function createWebhook(
  p: string,
  events: string[],
  extra: Record<string, unknown> = {},
): Promise<{ webhookId: string; signingSecret: string; body: any }> {
  const res = await h.request({
    method: 'POST',
    url: hooks(),
    body: { url: `${rx.base}${p}`, name: `hook ${p}`, events, ...extra },
    idempotencyKey: true,
  });
  if (res.statusCode !== 201) throw new Error(`create failed: ${res.statusCode} ${res.body}`);
  const body = res.json();
  rx.secrets.set(p, [body.signingSecret]);
  return { webhookId: body.webhookId, signingSecret: body.signingSecret, body };
}

async function deliveries(webhookId: string): Promise<any[]> {
  const res = await h.request({ method: 'GET', url: `${hooks()}/${webhookId}/deliveries` });
  expect(res.statusCode).toBe(200);
  return res.json().deliveries;
}

async function webhook(webhookId: string): Promise<any> {
  const res = await h.request({ method: 'GET', url: `${hooks()}/${webhookId}` });
  expect(res.statusCode).toBe(200);
  return res.json();
}

/** Publishes a new version to a fresh roost; returns ids and the event's seq once sequenced and fanned out. */
async function publish(): Promise<{ roostId: string; versionId: string; versionNumber: number; eventId: string }> {
  const r = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: h.siteId, name: `wh ${randomBytes(3).toString('hex')}`, targets: [], extractPath: 'apps/wh' },
  });
  expect(r.statusCode).toBe(201);
  const roostId = r.json().roostId as string;
  const v = await publishFiles(h, roostId, { 'a.txt': `hello ${randomBytes(4).toString('hex')}\n` });
  const { rows } = await h.deps.db.query<{ event_id: string }>(
    `SELECT event_id FROM events WHERE site_id = $1 AND type = 'version.published' AND data->>'versionId' = $2 AND data->>'roostId' = $3`,
    [h.siteId, v.versionId, roostId],
  );
  return { roostId, ...v, eventId: rows[0].event_id };
}

/** Waits until the relay has fanned out the event (the site's cursor passed its seq). */
async function fannedOut(eventId: string): Promise<void> {
  await until(`fan-out of ${eventId}`, async () => {
    const { rows } = await h.deps.db.query<{ ok: boolean }>(
      `SELECT (e.seq IS NOT NULL AND c.last_seq >= e.seq) AS ok FROM events e LEFT JOIN webhook_cursors c ON c.site_id = e.site_id
        WHERE e.site_id = $1 AND e.event_id = $2`,
      [h.siteId, eventId],
    );
    return rows[0]?.ok;
  });
}

async function deliveryOf(webhookId: string, eventId: string, status: string): Promise<any> {
  return until(`delivery of ${eventId} to ${webhookId} (${status})`, async () =>
    (await deliveries(webhookId)).find((d) => d.eventId === eventId && d.status === status),
  );
}

/** Records the delivery's (closed) workflow run under test/replay/histories/webhooks/. */
async function recordDelivery(deliveryId: string, file: string): Promise<void> {
  const handle = h.deps.temporal.workflow.getHandle(deliveryWorkflowId(deliveryId));
  expect(await handle.result()).toMatchObject({ deliveryId, status: 'succeeded' });
  await recordHistory(h.deps.temporal, deliveryWorkflowId(deliveryId), path.join(HISTORIES, file));
}

async function remove(webhookId: string): Promise<void> {
  const res = await h.request({ method: 'DELETE', url: `${hooks()}/${webhookId}`, idempotencyKey: true });
  expect(res.statusCode).toBe(200);
}

beforeAll(async () => {
  h = await createHarness({
    ROOST_WEBHOOK_ALLOW_PRIVATE: 'true',
    ROOST_WEBHOOK_MAX_ATTEMPTS: '3',
    ROOST_WEBHOOK_RETRY_INITIAL_MS: '100',
    ROOST_WEBHOOK_RETRY_MAX_MS: '300',
    ROOST_WEBHOOK_PAUSE_AFTER_FAILURES: '2',
    ROOST_WEBHOOK_RELAY_POLL_MS: '100',
    ROOST_WEBHOOK_RELAY_RUN_SECONDS: '4',
    ROOST_WEBHOOK_TIMEOUT_MS: '5000',
  });
  rx = new Receiver();
  await rx.start();
  w = await startTestWorker(h);
  relayId = await ensureEventRelay(h.deps.temporal, h.deps.cfg);
  relayFirstRun = (await h.deps.temporal.workflow.getHandle(relayId).describe()).runId;
  workflows.push(relayId);
});

afterAll(async () => {
  if (RECORD && relayId) {
    // A closed run of the relay (it continued as new at least once by now).
    const first = relayFirstRun;
    await until(
      'relay continued as new',
      async () => (await h.deps.temporal.workflow.getHandle(relayId, first).describe()).status.name !== 'RUNNING',
    );
    await recordHistory(h.deps.temporal, relayId, path.join(HISTORIES, 'relay.json'), first);
  }
  await terminateAll(h, workflows);
  await w?.stop();
  await rx?.close();
  await h?.close();
});

describe('delivery of real events', () => {
  it('delivers version.published exactly once, signed, with exactly the catalog data fields', async () => {
    const a = await createWebhook('/published', ['version.published']);
    const other = await createWebhook('/offline-only', ['machine.offline']);
    const disabled = await createWebhook('/disabled', ['version.published'], { enabled: false });
    expect(a.body).toMatchObject({
      url: `${rx.base}/published`,
      events: ['version.published'],
      enabled: true,
      paused: false,
      failCount: 0,
      lastStatus: null,
      createdBy: h.userId,
    });
    expect(a.signingSecret).toMatch(/^whsec_[A-Za-z0-9_-]{43}$/);

    const v = await publish();
    const d = await deliveryOf(a.webhookId, v.eventId, 'succeeded');
    await fannedOut(v.eventId);

    const got = rx.at('/published');
    expect(got).toHaveLength(1);
    const req = got[0];
    expect(req.check).toEqual({ ok: true });
    expect(req.headers['content-type']).toBe('application/json');
    expect(req.headers['roost-event']).toBe('version.published');
    expect(req.headers['roost-delivery']).toBe(d.deliveryId);
    expect(req.headers['roost-signature']).toMatch(/^t=\d+,v1=[0-9a-f]{64}$/);
    const envelope = JSON.parse(req.raw);
    expect(Object.keys(envelope).sort()).toEqual(['data', 'event', 'occurredAt', 'siteId']);
    expect(envelope).toMatchObject({ event: 'version.published', siteId: h.siteId });
    expect(envelope.occurredAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
    expect(Object.keys(envelope.data).sort()).toEqual(
      ['createdBy', 'description', 'roostId', 'siteId', 'totalFiles', 'totalSize', 'versionId', 'versionNumber'].sort(),
    );
    expect(envelope.data).toMatchObject({
      roostId: v.roostId,
      siteId: h.siteId,
      versionId: v.versionId,
      versionNumber: v.versionNumber,
      totalFiles: 1,
      createdBy: h.userId,
    });
    expect(d.envelope).toEqual(envelope);
    expect(d.attempts).toEqual([expect.objectContaining({ attempt: 1, status: 'succeeded', responseCode: 200, error: null })]);
    expect(d.attempts[0].latencyMs).toBeGreaterThanOrEqual(0);

    // Subscriptions to other events, and disabled ones, got nothing for it.
    expect(await deliveries(other.webhookId)).toEqual([]);
    expect(await deliveries(disabled.webhookId)).toEqual([]);
    expect(rx.at('/offline-only')).toHaveLength(0);
    expect(rx.at('/disabled')).toHaveLength(0);

    const after = await webhook(a.webhookId);
    expect(after).toMatchObject({ lastStatus: 'succeeded', lastResponseCode: 200, failCount: 0 });
    expect(after.lastTriggered).not.toBeNull();

    // A second relay pass over the same events (another relay, or a retried activity) adds nothing.
    const started: string[] = [];
    await h.deps.db.query('DELETE FROM webhook_cursors WHERE site_id = $1', [h.siteId]);
    await relayPass(h.deps.db, async (x) => started.push(x.deliveryId));
    expect(started).toEqual([]);
    expect((await deliveries(a.webhookId)).filter((x) => x.eventId === v.eventId)).toHaveLength(1);

    if (RECORD) await recordDelivery(d.deliveryId, 'delivery-succeeded.json');
    workflows.push(deliveryWorkflowId(d.deliveryId));
    for (const x of [a, other, disabled]) await remove(x.webhookId);
  });

  it('retries after 500s: delivered on the third attempt, attempts recorded with codes and latency; the receiver dedupes a redelivery', async () => {
    const a = await createWebhook('/flaky', ['version.published']);
    rx.plan.set('/flaky', [500, 500]);
    const v = await publish();
    const d = await deliveryOf(a.webhookId, v.eventId, 'succeeded');
    expect(d.attempts.map((x: any) => [x.attempt, x.status, x.responseCode])).toEqual([
      [1, 'failed', 500],
      [2, 'failed', 500],
      [3, 'succeeded', 200],
    ]);
    for (const x of d.attempts) {
      expect(x.latencyMs).toBeGreaterThanOrEqual(0);
      expect(Number.isInteger(x.latencyMs)).toBe(true);
    }
    expect(d.attempts[0].error).toBe('HTTP 500');
    const got = rx.at('/flaky');
    expect(got.map((r) => r.status)).toEqual([500, 500, 200]);
    expect(new Set(got.map((r) => r.headers['roost-delivery']))).toEqual(new Set([d.deliveryId]));
    // Every attempt carries the same bytes, signed afresh.
    expect(new Set(got.map((r) => r.raw)).size).toBe(1);
    expect(got.every((r) => r.check.ok)).toBe(true);
    expect(rx.processed.get('/flaky')).toEqual([d.deliveryId]);
    if (RECORD) await recordDelivery(d.deliveryId, 'delivery-retried.json');

    // Manual retry of the succeeded delivery: same Roost-Delivery, the receiver answers 200 without reprocessing.
    const res = await h.request({
      method: 'POST',
      url: `${hooks()}/${a.webhookId}/deliveries/${d.deliveryId}/retry`,
      idempotencyKey: true,
    });
    expect(res.statusCode).toBe(202);
    expect(res.json()).toMatchObject({
      deliveryId: d.deliveryId,
      webhookId: a.webhookId,
      status: 'pending',
      workflowId: `webhook-delivery:${d.deliveryId}`,
    });
    const again = await until('redelivery', async () => {
      const x = (await deliveries(a.webhookId)).find((y) => y.deliveryId === d.deliveryId);
      return x?.status === 'succeeded' && x.attempts.length === 4 ? x : undefined;
    });
    expect(again.attempts[3]).toMatchObject({ attempt: 4, status: 'succeeded', responseCode: 200 });
    expect(rx.duplicates).toContain(d.deliveryId);
    expect(rx.processed.get('/flaky')).toEqual([d.deliveryId]);
    workflows.push(deliveryWorkflowId(d.deliveryId));
    await remove(a.webhookId);
  });

  it('fails after the last attempt, can be retried by hand, and pauses the subscription after repeated failures', async () => {
    const a = await createWebhook('/down', ['version.published']);
    rx.fallback.set('/down', 503);
    const v1 = await publish();
    const d1 = await deliveryOf(a.webhookId, v1.eventId, 'failed');
    expect(d1.attempts.map((x: any) => x.responseCode)).toEqual([503, 503, 503]);
    expect(d1.lastError).toContain('HTTP 503');
    expect(await webhook(a.webhookId)).toMatchObject({ failCount: 1, paused: false, lastStatus: 'failed', lastResponseCode: 503 });

    // Manual retry once the receiver is back: a new run, attempts appended, failCount reset.
    rx.fallback.set('/down', 200);
    const retry = await h.request({
      method: 'POST',
      url: `${hooks()}/${a.webhookId}/deliveries/${d1.deliveryId}/retry`,
      idempotencyKey: true,
    });
    expect(retry.statusCode).toBe(202);
    const retried = await until('manual retry', async () => {
      const x = (await deliveries(a.webhookId)).find((y) => y.deliveryId === d1.deliveryId);
      return x?.status === 'succeeded' ? x : undefined;
    });
    expect(retried.attempts.map((x: any) => [x.attempt, x.responseCode])).toEqual([
      [1, 503],
      [2, 503],
      [3, 503],
      [4, 200],
    ]);
    expect(await webhook(a.webhookId)).toMatchObject({ failCount: 0, lastStatus: 'succeeded' });

    // Two failed deliveries in a row (ROOST_WEBHOOK_PAUSE_AFTER_FAILURES=2) pause it.
    rx.fallback.set('/down', 500);
    const v2 = await publish();
    await deliveryOf(a.webhookId, v2.eventId, 'failed');
    const v3 = await publish();
    await deliveryOf(a.webhookId, v3.eventId, 'failed');
    expect(await webhook(a.webhookId)).toMatchObject({ failCount: 2, paused: true, lastStatus: 'failed' });

    // Paused: new events make no deliveries.
    const v4 = await publish();
    await fannedOut(v4.eventId);
    expect((await deliveries(a.webhookId)).find((x) => x.eventId === v4.eventId)).toBeUndefined();

    // Unpausing resets failCount; the next event is delivered again.
    rx.fallback.set('/down', 200);
    const resumed = await h.request({ method: 'PATCH', url: `${hooks()}/${a.webhookId}`, body: { paused: false }, idempotencyKey: true });
    expect(resumed.statusCode).toBe(200);
    expect(resumed.json()).toMatchObject({ paused: false, failCount: 0 });
    const v5 = await publish();
    await deliveryOf(a.webhookId, v5.eventId, 'succeeded');
    for (const d of await deliveries(a.webhookId)) workflows.push(deliveryWorkflowId(d.deliveryId));
    await remove(a.webhookId);
  });

  it('rotates the secret: both secrets sign during the grace window, only the new one after a zero grace', async () => {
    const a = await createWebhook('/rotate', ['version.published']);
    const oldSecret = a.signingSecret;
    const rot = await h.request({ method: 'POST', url: `${hooks()}/${a.webhookId}/rotate-secret`, idempotencyKey: true });
    expect(rot.statusCode).toBe(200);
    const newSecret = rot.json().signingSecret as string;
    expect(newSecret).not.toBe(oldSecret);
    expect(Date.parse(rot.json().previousSecretExpiresAt) - Date.now()).toBeGreaterThan(23 * 3_600_000);
    rx.secrets.set('/rotate', [newSecret]);

    const v = await publish();
    await deliveryOf(a.webhookId, v.eventId, 'succeeded');
    const req = rx.at('/rotate')[0];
    expect(req.headers['roost-signature']).toMatch(/^t=\d+,v1=[0-9a-f]{64},v1=[0-9a-f]{64}$/);
    const verifyWith = (secrets: string[], r = req) => verifySignature({ header: r.headers['roost-signature'], rawBody: r.raw, secrets });
    expect(verifyWith([oldSecret])).toEqual({ ok: true });
    expect(verifyWith([newSecret])).toEqual({ ok: true });

    // Rotate again with no grace: only the newest secret signs.
    const rot2 = await h.request({
      method: 'POST',
      url: `${hooks()}/${a.webhookId}/rotate-secret`,
      body: { graceHours: 0 },
      idempotencyKey: true,
    });
    expect(rot2.statusCode).toBe(200);
    expect(rot2.json().previousSecretExpiresAt).toBeNull();
    const newest = rot2.json().signingSecret as string;
    rx.secrets.set('/rotate', [newest]);
    const v2 = await publish();
    await deliveryOf(a.webhookId, v2.eventId, 'succeeded');
    const req2 = rx.at('/rotate')[1];
    expect(req2.headers['roost-signature']).toMatch(/^t=\d+,v1=[0-9a-f]{64}$/);
    expect(verifyWith([newest], req2)).toEqual({ ok: true });
    expect(verifyWith([newSecret, oldSecret], req2)).toEqual({ ok: false, reason: 'bad_signature' });
    for (const d of await deliveries(a.webhookId)) workflows.push(deliveryWorkflowId(d.deliveryId));
    await remove(a.webhookId);
  });
});

describe('replays of answers that carry a secret', () => {
  it('replay a created webhook and a rotated secret with Cache-Control: no-store, like the first answer', async () => {
    const createBody = { url: `${rx.base}/replayed`, name: 'hook replayed', events: ['version.published'] };
    const create = () => h.request({ method: 'POST', url: hooks(), body: createBody, idempotencyKey: 'replay-create-secret' });
    const first = await create();
    const again = await create();
    expect([first.statusCode, again.statusCode]).toEqual([201, 201]);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json().signingSecret).toBe(first.json().signingSecret);
    expect([first.headers['cache-control'], again.headers['cache-control']]).toEqual(['no-store', 'no-store']);

    const rotate = () =>
      h.request({
        method: 'POST',
        url: `${hooks()}/${first.json().webhookId}/rotate-secret`,
        body: { graceHours: 0 },
        idempotencyKey: 'replay-rotate-secret',
      });
    const rot = await rotate();
    const rotAgain = await rotate();
    expect([rot.statusCode, rotAgain.statusCode]).toEqual([200, 200]);
    expect(rotAgain.headers['idempotent-replayed']).toBe('true');
    expect(rotAgain.json().signingSecret).toBe(rot.json().signingSecret);
    expect([rot.headers['cache-control'], rotAgain.headers['cache-control']]).toEqual(['no-store', 'no-store']);
    await remove(first.json().webhookId);
  });
});

describe('the probe', () => {
  const probe = (body: Record<string, unknown>, key?: string) =>
    h.request({ method: 'POST', url: `/api/webhooks/probe?siteId=${h.siteId}`, body, key });

  it('takes a URL of the documented 2048 characters even when its normalised form is longer', async () => {
    const head = `${rx.base}/probe-long?q=`;
    const quotes = 2048 - head.length;
    const url = head + '"'.repeat(quotes); // each " is sent as %22
    expect(url).toHaveLength(2048);
    const sent = `/probe-long?q=${'%22'.repeat(quotes)}`;
    rx.secrets.set(sent, ['whsec_long_url']);
    const res = await probe({ url, event: 'machine.offline', payload: {}, signingSecret: 'whsec_long_url' });
    expect([res.statusCode, res.json().ok]).toEqual([200, true]);
    expect(rx.at(sent)).toHaveLength(1);
  });

  it('sends one signed probe envelope and reports success', async () => {
    rx.secrets.set('/probe-ok', ['whsec_probe_secret']);
    const res = await probe({
      url: `${rx.base}/probe-ok`,
      event: 'machine.offline',
      payload: { machineId: 'm1', siteId: h.siteId, lastHeartbeat: null },
      signingSecret: 'whsec_probe_secret',
    });
    expect(res.statusCode).toBe(200);
    const r = res.json();
    expect(r).toMatchObject({ ok: true, statusCode: 200, error: null, event: 'machine.offline' });
    expect(r.signingSecret).toBeUndefined();
    const got = rx.at('/probe-ok');
    expect(got).toHaveLength(1);
    expect(got[0].check).toEqual({ ok: true });
    expect(got[0].headers['roost-delivery']).toBe(r.id);
    expect(got[0].headers['roost-event']).toBe('machine.offline');
    const env = JSON.parse(got[0].raw);
    expect(Object.keys(env).sort()).toEqual(['data', 'event', 'id', 'occurredAt', 'siteId']);
    expect(env).toEqual({
      id: r.id,
      event: 'machine.offline',
      occurredAt: r.occurredAt,
      siteId: h.siteId,
      data: { machineId: 'm1', siteId: h.siteId, lastHeartbeat: null },
    });
    expect(env.occurredAt).toMatch(/Z$/);

    // Without a secret, a fresh one signs and comes back; ids are unique per probe.
    const res2 = await probe({ url: `${rx.base}/probe-gen`, event: 'quota.warning', payload: {} });
    expect(res2.statusCode).toBe(200);
    expect(res2.json().id).not.toBe(r.id);
    const gen = rx.at('/probe-gen')[0];
    expect(verifySignature({ header: gen.headers['roost-signature'], rawBody: gen.raw, secrets: [res2.json().signingSecret] })).toEqual({
      ok: true,
    });
  });

  it('reports a failing receiver without retrying, and an unreachable one', async () => {
    rx.fallback.set('/probe-fail', 500);
    rx.secrets.set('/probe-fail', ['whsec_probe_secret']);
    const res = await probe({
      url: `${rx.base}/probe-fail`,
      event: 'version.published',
      payload: { a: 1 },
      signingSecret: 'whsec_probe_secret',
    });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ ok: false, statusCode: 500, error: 'HTTP 500' });
    expect(rx.at('/probe-fail')).toHaveLength(1);

    const closed = http.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((r) => closed.close(r));
    const down = await probe({ url: `http://127.0.0.1:${port}/x`, event: 'version.published', payload: {} });
    expect(down.statusCode).toBe(200);
    expect(down.json()).toMatchObject({ ok: false, statusCode: null });
    expect(down.json().error).toEqual(expect.any(String));
  });

  it('rejects unknown and planned events, bad URLs and a missing siteId', async () => {
    const unknown = await probe({ url: `${rx.base}/p`, event: 'version.exploded', payload: {} });
    expect(unknown.statusCode).toBe(400);
    expect(unknown.json()).toMatchObject({ code: 'validation_failed', param: 'event' });
    expect(unknown.json().errors.event[0]).toContain('unknown event version.exploded');
    const planned = await probe({ url: `${rx.base}/p`, event: 'roost.created', payload: {} });
    expect(planned.statusCode).toBe(400);
    expect(planned.json().detail).toContain('planned');
    const badUrl = await probe({ url: 'ftp://example.com/x', event: 'version.published', payload: {} });
    expect(badUrl.statusCode).toBe(400);
    expect(badUrl.json()).toMatchObject({ code: 'validation_failed', param: 'url' });
    const noPayload = await probe({ url: `${rx.base}/p`, event: 'version.published' });
    expect(noPayload.statusCode).toBe(400);
    const noSite = await h.request({
      method: 'POST',
      url: '/api/webhooks/probe',
      body: { url: `${rx.base}/p`, event: 'version.published', payload: {} },
    });
    expect(noSite.statusCode).toBe(400);
    expect(noSite.json().code).toBe('validation_failed');
    expect(rx.at('/p')).toHaveLength(0);
  });
});

describe('subscription management', () => {
  it('validates bodies: unknown and planned events, empty events, bad URLs, unknown PATCH fields', async () => {
    const post = (body: Record<string, unknown>) => h.request({ method: 'POST', url: hooks(), body, idempotencyKey: true });
    const base = { url: `${rx.base}/v`, name: 'v' };
    const unknown = await post({ ...base, events: ['version.published', 'nope.nothing'] });
    expect(unknown.statusCode).toBe(400);
    expect(unknown.json()).toMatchObject({ code: 'validation_failed', param: 'events.1' });
    expect(unknown.json().errors['events.1'][0]).toContain('unknown event nope.nothing');
    const planned = await post({ ...base, events: ['roost.deleted'] });
    expect(planned.statusCode).toBe(400);
    expect(planned.json().errors['events.0'][0]).toContain('planned');
    expect((await post({ ...base, events: [] })).json().code).toBe('validation_failed');
    for (const url of ['not a url', 'ftp://example.com/', 'https://user:pw@example.com/', `https://example.com/${'a'.repeat(2100)}`]) {
      const r = await post({ ...base, url, events: ['version.published'] });
      expect([url.slice(0, 30), r.statusCode, r.json().code]).toEqual([url.slice(0, 30), 400, 'validation_failed']);
    }
    expect((await post({ ...base, events: ['version.published'], secret: 'mine' })).statusCode).toBe(400);
    const noKey = await h.request({ method: 'POST', url: hooks(), body: { ...base, events: ['version.published'] } });
    expect(noKey.statusCode).toBe(400);
    expect(noKey.json().code).toBe('idempotency_key_required');
    const { rows } = await h.deps.db.query("SELECT count(*)::int AS n FROM webhooks WHERE site_id = $1 AND url LIKE '%/v'", [h.siteId]);
    expect(rows[0].n).toBe(0);

    const a = await createWebhook('/v', ['version.published']);
    const patch = (body: unknown) => h.request({ method: 'PATCH', url: `${hooks()}/${a.webhookId}`, body, idempotencyKey: true });
    const foreign = await patch({ name: 'x', signingSecret: 'mine' });
    expect(foreign.statusCode).toBe(400);
    expect(foreign.json()).toMatchObject({ code: 'forbidden_field', param: 'signingSecret' });
    expect((await patch({})).json().code).toBe('validation_failed');
    expect((await patch({ events: ['roost.updated'] })).json().code).toBe('validation_failed');
    const ok = await patch({ name: 'renamed', events: ['deployment.failed', 'deployment.failed', 'machine.online'], enabled: false });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toMatchObject({ name: 'renamed', events: ['deployment.failed', 'machine.online'], enabled: false });
    expect(ok.json().signingSecret).toBeUndefined();
    await remove(a.webhookId);
  });

  it('creates idempotently, lists with paging, gets, deletes; malformed and unknown ids', async () => {
    const key = `idem-${randomBytes(6).toString('hex')}`;
    const body = { url: `${rx.base}/idem`, name: 'idem', events: ['api_key.used'] };
    const first = await h.request({ method: 'POST', url: hooks(), body, idempotencyKey: key });
    const replay = await h.request({ method: 'POST', url: hooks(), body, idempotencyKey: key });
    expect(first.statusCode).toBe(201);
    expect(replay.statusCode).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(first.json());
    const mismatch = await h.request({ method: 'POST', url: hooks(), body: { ...body, name: 'other' }, idempotencyKey: key });
    expect(mismatch.statusCode).toBe(422);
    const second = await createWebhook('/idem2', ['api_key.expired']);

    // Walk every page of one: newest first, each subscription once, the last page ends with ''.
    const seen: string[] = [];
    let token = '';
    for (let i = 0; i < 50; i++) {
      const page = await h.request({ method: 'GET', url: `${hooks()}?page_size=1${token ? `&page_token=${token}` : ''}` });
      expect(page.statusCode).toBe(200);
      expect(page.json().webhooks.length).toBeLessThanOrEqual(1);
      expect(JSON.stringify(page.json())).not.toContain('whsec_');
      seen.push(...page.json().webhooks.map((x: any) => x.webhookId));
      token = page.json().next_page_token;
      expect(page.json().nextPageToken).toBe(token);
      if (!token) break;
    }
    expect(token).toBe('');
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen.slice(0, 2)).toEqual([second.webhookId, first.json().webhookId]);
    expect((await h.request({ method: 'GET', url: `${hooks()}?page_size=0` })).statusCode).toBe(400);
    expect((await h.request({ method: 'GET', url: `${hooks()}?page_token=garbage` })).statusCode).toBe(400);

    const malformed = await h.request({ method: 'GET', url: `${hooks()}/not-a-webhook` });
    expect(malformed.statusCode).toBe(400);
    expect(malformed.json().code).toBe('validation_failed');
    const missing = await h.request({ method: 'GET', url: `${hooks()}/wh_${'0'.repeat(24)}` });
    expect(missing.statusCode).toBe(404);
    const noDelivery = await h.request({
      method: 'POST',
      url: `${hooks()}/${second.webhookId}/deliveries/dlv_${'0'.repeat(24)}/retry`,
      idempotencyKey: true,
    });
    expect(noDelivery.statusCode).toBe(404);

    await remove(first.json().webhookId);
    await remove(second.webhookId);
    expect((await h.request({ method: 'GET', url: `${hooks()}/${second.webhookId}` })).statusCode).toBe(404);
    expect((await h.request({ method: 'DELETE', url: `${hooks()}/${second.webhookId}`, idempotencyKey: true })).statusCode).toBe(404);
  });

  it('hides other sites (404) and needs site admin for mutations, site read for reads (403 scope_insufficient)', async () => {
    const a = await createWebhook('/authz', ['version.published']);
    const other = await h.other();
    const foreign = await h.request({ method: 'GET', url: `${hooks()}/${a.webhookId}`, key: other.apiKey });
    expect(foreign.statusCode).toBe(404);
    const foreignCreate = await h.request({
      method: 'POST',
      url: hooks(),
      key: other.apiKey,
      body: { url: `${rx.base}/x`, name: 'x', events: ['version.published'] },
      idempotencyKey: true,
    });
    expect(foreignCreate.statusCode).toBe(404);
    // The other site's own list does not show this site's subscription.
    const theirs = await h.request({ method: 'GET', url: `/api/sites/${other.siteId}/webhooks`, key: other.apiKey });
    expect(theirs.json().webhooks).toEqual([]);

    const reader = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const writer = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read', 'write'] }]);
    expect((await h.request({ method: 'GET', url: hooks(), key: reader })).statusCode).toBe(200);
    expect((await h.request({ method: 'GET', url: `${hooks()}/${a.webhookId}/deliveries`, key: reader })).statusCode).toBe(200);
    for (const key of [reader, writer]) {
      const res = await h.request({ method: 'PATCH', url: `${hooks()}/${a.webhookId}`, key, body: { name: 'nope' }, idempotencyKey: true });
      expect(res.statusCode).toBe(403);
      expect(res.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: h.siteId, permission: 'admin' } });
    }
    const probe = await h.request({
      method: 'POST',
      url: `/api/webhooks/probe?siteId=${h.siteId}`,
      key: reader,
      body: { url: `${rx.base}/x`, event: 'version.published', payload: {} },
    });
    expect(probe.statusCode).toBe(403);
    const none = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['read'] }]);
    expect((await h.request({ method: 'GET', url: hooks(), key: none })).json()).toMatchObject({
      code: 'scope_insufficient',
      required: { permission: 'read' },
    });
    expect(await webhook(a.webhookId)).toMatchObject({ name: 'hook /authz' });
    expect(rx.at('/x')).toHaveLength(0);
    await remove(a.webhookId);
  });
});

describe('address rules without ROOST_WEBHOOK_ALLOW_PRIVATE', () => {
  let strict: Harness;
  beforeAll(async () => {
    strict = await createHarness({ ROOST_WEBHOOK_ALLOW_PRIVATE: 'false' });
  });
  afterAll(async () => strict?.close());

  it('refuses loopback, private, link-local and mapped addresses with url_not_allowed, and plain http', async () => {
    const create = (url: string) =>
      strict.request({
        method: 'POST',
        url: `/api/sites/${strict.siteId}/webhooks`,
        body: { url, name: 'x', events: ['version.published'] },
        idempotencyKey: true,
      });
    for (const url of [
      'https://127.0.0.1/hook',
      'https://[::1]/hook',
      'https://[::ffff:127.0.0.1]/hook',
      'https://10.0.0.7/hook',
      'https://169.254.169.254/latest',
      'https://localhost:8443/hook',
      'https://[::127.0.0.1]/hook', // IPv4-compatible IPv6
      'https://[2002:7f00:1::]/hook', // 6to4
      'https://[64:ff9b::a00:7]/hook', // NAT64 of 10.0.0.7
      'https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook', // Teredo
    ]) {
      const res = await create(url);
      expect([url, res.statusCode, res.json().code, res.json().param]).toEqual([url, 400, 'url_not_allowed', 'url']);
      expect(res.headers['content-type']).toContain('application/problem+json');
    }
    const http1 = await create('http://example.com/hook');
    expect(http1.json()).toMatchObject({ code: 'validation_failed', param: 'url' });
    const probe = await strict.request({
      method: 'POST',
      url: `/api/webhooks/probe?siteId=${strict.siteId}`,
      body: { url: rx.base.replace('http:', 'https:') + '/p', event: 'version.published', payload: {} },
    });
    expect(probe.statusCode).toBe(400);
    expect(probe.json().code).toBe('url_not_allowed');
    const { rows } = await strict.deps.db.query('SELECT count(*)::int AS n FROM webhooks WHERE site_id = $1', [strict.siteId]);
    expect(rows[0].n).toBe(0);
    expect(rx.at('/p')).toHaveLength(0);
    // Names are judged by what they resolve to (the send-time check uses the same rule).
    expect((await nonPublicAddressesOf('localhost')).length).toBeGreaterThan(0);
  });
});
