/**
 * The server-sent event stream (docs/contract.md "Event stream"; api/routes/events.ts,
 * api/events/hub.ts): a real SSE client (the `eventsource` package) against real ports. The
 * `connected` frame, real events with `id:`, the exact-match `events` filter, keepalives, resumption
 * with Last-Event-ID (header, query, and the client's own reconnect across a server restart) with
 * exactly the missed events, two API processes over one database, a slow client dropped without
 * holding up the others, and the problem+json answers before a stream starts.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { EventSource } from 'eventsource';
import { buildApp } from '../../api/app';
import { closeServiceDeps as closeDeps, createServiceDeps as createDeps } from '../../services/deps';
import type { AppDeps } from '../../api/context';
import { eventHubOf } from '../../api/routes/events';
import { EVENT_TYPES } from '../../domain/events';
import { sequenceEvents } from '../../db/events';
import { createHarness, type Harness } from '../support/harness';
import { addMember, insertKey, makeUser } from '../support/identity';
import { publishFiles, seedRoost } from './rollout-fixtures';
import { testLogger } from '../support/test-log';
import { waitFor } from '../support/wait';

/** Stream settings of these tests: frequent keepalives and polls. */
const STREAM_ENV = { ROOST_STREAM_KEEPALIVE_MS: '300', ROOST_STREAM_POLL_MS: '40' };

let h: Harness;
let base1: string;
/** A second API process over the same database (own pool, own hub, own port), with a small client buffer and a short stall limit. */
let deps2: AppDeps;
let app2: FastifyInstance;
let base2: string;

async function listen(app: FastifyInstance, port = 0): Promise<string> {
  await app.listen({ host: '127.0.0.1', port });
  return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
}

async function startSecondProcess(port = 0): Promise<void> {
  deps2 = await createDeps({ ...h.deps.cfg, ROOST_STREAM_CLIENT_BUFFER_BYTES: 262144, ROOST_STREAM_STALL_MS: 1000 });
  app2 = await buildApp(deps2, { loggerInstance: testLogger('roost-api') });
  base2 = await listen(app2, port);
}

beforeAll(async () => {
  h = await createHarness(STREAM_ENV);
  base1 = await listen(h.app);
  await startSecondProcess();
});
afterAll(async () => {
  await app2.close();
  await closeDeps(deps2);
  await h.close();
});

/** Polls `fn` every 20 ms until it returns a truthy value (fails after `ms` with `what`). */
const until = <T>(what: string, fn: () => T | Promise<T>, ms = 20_000) => waitFor(what, fn, ms, 20);

interface Frame {
  type: string;
  id: string;
  data: any;
}

/** A real EventSource client that records every frame it receives (connected, keepalive, catalog events). */
class Client {
  readonly frames: Frame[] = [];
  readonly errors: unknown[] = [];
  readonly es: EventSource;

  constructor(url: string, headers: Record<string, string> = {}) {
    this.es = new EventSource(url, {
      fetch: (input, init) => fetch(input, { ...init, headers: { ...headers, ...init.headers } }),
    });
    for (const type of ['connected', 'keepalive', ...EVENT_TYPES]) {
      this.es.addEventListener(type, (e) => this.frames.push({ type, id: e.lastEventId, data: JSON.parse(e.data) }));
    }
    this.es.addEventListener('error', (e) => this.errors.push(e));
  }

  /** Catalog events only (no connected/keepalive). */
  get events(): Frame[] {
    return this.frames.filter((f) => f.type !== 'connected' && f.type !== 'keepalive');
  }

  async connected(): Promise<Frame> {
    return until('connected frame', () => this.frames.find((f) => f.type === 'connected'));
  }

  async eventWithId(id: number): Promise<Frame> {
    return until(`event id ${id}`, () => this.events.find((f) => f.id === String(id)));
  }

  close(): void {
    this.es.close();
  }
}

/** The version.* frames of a client (other events of the site, such as api_key.used, may interleave). */
const versionFrames = (c: Client) => c.events.filter((f) => f.type.startsWith('version.'));
/** True when every id is greater than the one before (no duplicate, no reordering). */
const increasing = (c: Client) => c.events.every((f, i, all) => i === 0 || Number(f.id) > Number(all[i - 1].id));

const streamUrl = (base: string, q: Record<string, string>) => `${base}/api/events/stream?${new URLSearchParams(q).toString()}`;
const auth = (key: string) => ({ authorization: `Bearer ${key}` });

/** seq of the event of `type` matching `match` (numbering pending events first, as any sequencer may). */
async function seqOf(type: string, match: Record<string, string>): Promise<number> {
  return until(`seq of ${type}`, async () => {
    await sequenceEvents(h.deps.db, h.siteId);
    const conds = Object.keys(match).map((k, i) => `data->>'${k}' = $${i + 3}`);
    const { rows } = await h.deps.db.query<{ seq: string | null }>(
      `SELECT seq FROM events WHERE site_id = $1 AND type = $2 AND ${conds.join(' AND ')} ORDER BY seq LIMIT 1`,
      [h.siteId, type, ...Object.values(match)],
    );
    return rows[0]?.seq ? Number(rows[0].seq) : 0;
  });
}

async function rollback(roostId: string): Promise<void> {
  const res = await h.request({ method: 'POST', url: `/api/roosts/${roostId}/rollback`, body: { siteId: h.siteId }, idempotencyKey: true });
  expect(res.statusCode).toBe(200);
}

describe('before the stream starts: problem+json', () => {
  it('answers 401 without a credential, 404 for another site, 403 without site read, 400 for bad input', async () => {
    const url = `/api/events/stream?siteId=${h.siteId}`;
    const accept = { accept: 'text/event-stream' };
    const other = await h.other();
    const { raw: writeOnly } = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['write'] }],
    });
    const cases: { url: string; key?: string | null; headers?: Record<string, string>; status: number; code: string; param?: string }[] = [
      { url, key: null, status: 401, code: 'unauthorized' },
      { url: `${url}&api_key=svk_live_${'x'.repeat(43)}`, key: null, status: 401, code: 'unauthorized' },
      { url, key: other.apiKey, status: 404, code: 'not_found' },
      { url, key: writeOnly, status: 403, code: 'scope_insufficient' },
      { url: '/api/events/stream', status: 400, code: 'validation_failed' },
      { url: '/api/events/stream?siteId=bad%20site', status: 400, code: 'validation_failed' },
      { url, headers: { accept: 'application/json' }, status: 400, code: 'validation_failed', param: 'Accept' },
      { url: `${url}&events=version.published,roost.created`, status: 400, code: 'validation_failed', param: 'events' },
      { url: `${url}&events=version.published,,quota.warning`, status: 400, code: 'validation_failed', param: 'events' },
      { url: `${url}&events=Version.Published`, status: 400, code: 'validation_failed', param: 'events' },
      { url, headers: { 'last-event-id': 'abc' }, status: 400, code: 'validation_failed', param: 'Last-Event-ID' },
      { url, headers: { 'last-event-id': '-1' }, status: 400, code: 'validation_failed', param: 'Last-Event-ID' },
      { url, headers: { 'last-event-id': '999999999' }, status: 400, code: 'validation_failed', param: 'Last-Event-ID' },
      { url: `${url}&lastEventId=1.5`, status: 400, code: 'validation_failed' },
    ];
    for (const c of cases) {
      const res = await h.request({ method: 'GET', url: c.url, key: c.key, headers: { ...accept, ...c.headers } });
      expect([c.url, c.headers, res.statusCode, res.json().code]).toEqual([c.url, c.headers, c.status, c.code]);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      if (c.param) expect(res.json().param).toBe(c.param);
      if (c.code === 'scope_insufficient') expect(res.json().required).toEqual({ resource: 'site', id: h.siteId, permission: 'read' });
    }
  });

  it('answers HEAD with the headers of the stream and ends it (no stream held open); HEAD is refused like GET', async () => {
    const head = (key?: string) =>
      new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }>((resolve, reject) => {
        const req = http.request(
          `${base1}/api/events/stream?siteId=${h.siteId}`,
          { method: 'HEAD', headers: key ? auth(key) : {}, timeout: 5_000 },
          (res) => {
            let body = '';
            res.on('data', (d: Buffer) => (body += d.toString()));
            res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
          },
        );
        req.on('timeout', () => req.destroy(new Error('HEAD /api/events/stream: no complete answer within 5 s')));
        req.on('error', reject);
        req.end();
      });
    const hub = eventHubOf(h.deps)!;
    const clientsBefore = hub.clientCount;
    const ok = await head(h.apiKey);
    expect(ok.status).toBe(200);
    expect(ok.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(ok.headers['cache-control']).toBe('no-cache, no-transform');
    expect(ok.body).toBe('');
    expect(hub.clientCount).toBe(clientsBefore);
    const refused = await head();
    expect(refused.status).toBe(401);
    expect(refused.headers['content-type']).toMatch(/^application\/problem\+json/);
  });

  it('a real client gets the refusal and does not retry', async () => {
    const c = new Client(streamUrl(base1, { siteId: h.siteId }));
    await until('error event', () => c.errors.length > 0);
    expect(c.es.readyState).toBe(EventSource.CLOSED);
    expect((c.errors[0] as { code?: number }).code).toBe(401);
    c.close();
  });
});

describe('the stream', () => {
  it('opens with headers and a connected frame at the current end, without rate-limit headers', async () => {
    const ac = new AbortController();
    const res = await fetch(streamUrl(base1, { siteId: h.siteId }), {
      headers: { ...auth(h.apiKey), accept: 'text/event-stream' },
      signal: ac.signal,
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(res.headers.get('cache-control')).toContain('no-cache');
    expect(res.headers.get('x-request-id')).toMatch(/^req_/);
    expect([...res.headers.keys()].filter((k) => /ratelimit/i.test(k))).toEqual([]);
    const reader = res.body!.getReader();
    let text = '';
    while (!text.includes('event: connected')) text += new TextDecoder().decode((await reader.read()).value);
    ac.abort();
    expect(text).toMatch(/^retry: \d+\n\n/);

    const c = new Client(streamUrl(base1, { siteId: h.siteId, api_key: h.apiKey }));
    const connected = await c.connected();
    const end = Number((await h.deps.db.query(`SELECT coalesce(max(seq), 0) AS s FROM events WHERE site_id = $1`, [h.siteId])).rows[0].s);
    expect(connected.data).toEqual({ siteId: h.siteId, lastEventId: String(end), serverTime: expect.any(String), events: null });
    expect(connected.id).toBe(String(end));
    c.close();
  });

  it('delivers a published version as version.published with its per-site seq as id, and keepalives', async () => {
    const c = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    await c.connected();
    const seeded = await seedRoost(h);
    const seq = await seqOf('version.published', { versionId: seeded.versionId });
    const got = await c.eventWithId(seq);
    expect(got.type).toBe('version.published');
    expect(got.data).toEqual({
      event: 'version.published',
      siteId: h.siteId,
      occurredAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
      data: {
        roostId: seeded.roostId,
        siteId: h.siteId,
        versionId: seeded.versionId,
        versionNumber: 1,
        description: null,
        totalFiles: 2,
        totalSize: expect.any(Number),
        createdBy: h.userId,
      },
    });
    // Keepalives (ROOST_STREAM_KEEPALIVE_MS=300 here) arrive while the stream is idle.
    const before = c.frames.filter((f) => f.type === 'keepalive').length;
    await until('two more keepalives', () => c.frames.filter((f) => f.type === 'keepalive').length >= before + 2);
    const later = c.frames.slice(c.frames.indexOf(got) + 1).filter((f) => f.type === 'keepalive');
    expect(later[0].data).toEqual({ serverTime: expect.any(String) });
    // Keepalives carry no id of their own: the client's resume point stays the last event.
    expect(later.map((f) => f.id)).toEqual(later.map(() => got.id));
    c.close();
  });

  it('applies the exact-match events filter', async () => {
    const only = new Client(streamUrl(base1, { siteId: h.siteId, events: 'version.rolled_back, quota.exceeded' }), auth(h.apiKey));
    const all = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    expect((await only.connected()).data.events.sort()).toEqual(['quota.exceeded', 'version.rolled_back']);
    await all.connected();
    const seeded = await seedRoost(h);
    await publishFiles(h, seeded.roostId, { 'two.txt': 'two\n' });
    await rollback(seeded.roostId);
    const rolledSeq = await seqOf('version.rolled_back', { roostId: seeded.roostId });
    await only.eventWithId(rolledSeq);
    await all.eventWithId(rolledSeq);
    // Events arrive in seq order, so everything before the rollback has been seen by now.
    expect(only.events.map((f) => f.type)).toEqual(['version.rolled_back']);
    expect(versionFrames(all).map((f) => f.type)).toEqual(['version.published', 'version.published', 'version.rolled_back']);
    expect(versionFrames(all).map((f) => Number(f.id))).toEqual([
      await seqOf('version.published', { roostId: seeded.roostId, versionNumber: '1' }),
      await seqOf('version.published', { roostId: seeded.roostId, versionNumber: '2' }),
      rolledSeq,
    ]);
    expect(increasing(all)).toBe(true);
    only.close();
    all.close();
  });

  it('resumes with Last-Event-ID (header or query): exactly the missed events, in order, then live', async () => {
    // A client that stays connected keeps process 1's feed running and ahead of the resuming clients.
    const keeper = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    await keeper.connected();
    const seeded = await seedRoost(h);
    const first = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    await first.connected();
    const v2 = await publishFiles(h, seeded.roostId, { 'a.txt': 'a\n' });
    const seen = await first.eventWithId(await seqOf('version.published', { versionId: v2.versionId }));
    first.close();

    // While disconnected: two publishes and a rollback.
    const v3 = await publishFiles(h, seeded.roostId, { 'b.txt': 'b\n' });
    const v4 = await publishFiles(h, seeded.roostId, { 'c.txt': 'c\n' });
    await rollback(seeded.roostId);
    const missed = [
      await seqOf('version.published', { versionId: v3.versionId }),
      await seqOf('version.published', { versionId: v4.versionId }),
      await seqOf('version.rolled_back', { roostId: seeded.roostId }),
    ];
    expect(missed[0]).toBeGreaterThan(Number(seen.id));
    expect([...missed].sort((a, b) => a - b)).toEqual(missed);

    await keeper.eventWithId(missed[2]);
    const byHeader = new Client(streamUrl(base1, { siteId: h.siteId }), { ...auth(h.apiKey), 'Last-Event-ID': seen.id });
    const byQuery = new Client(streamUrl(base2, { siteId: h.siteId, lastEventId: seen.id, api_key: h.apiKey }));
    for (const c of [byHeader, byQuery]) {
      expect((await c.connected()).data.lastEventId).toBe(seen.id);
      await c.eventWithId(missed[2]);
    }
    // …then live, with no duplicate at the hand-over.
    const v5 = await publishFiles(h, seeded.roostId, { 'd.txt': 'd\n' });
    const live = await seqOf('version.published', { versionId: v5.versionId });
    for (const c of [byHeader, byQuery]) {
      await c.eventWithId(live);
      expect(versionFrames(c).map((f) => Number(f.id))).toEqual([...missed, live]);
      expect(versionFrames(c).map((f) => f.type)).toEqual([
        'version.published',
        'version.published',
        'version.rolled_back',
        'version.published',
      ]);
      expect(Number(c.events[0].id)).toBeGreaterThan(Number(seen.id));
      expect(increasing(c)).toBe(true);
      c.close();
    }
    keeper.close();
  });

  it('resumes by itself after a server restart, from its last event id', async () => {
    const port = Number(new URL(base2).port);
    const c = new Client(streamUrl(base2, { siteId: h.siteId }), auth(h.apiKey));
    const connected = await c.connected();
    const seeded = await seedRoost(h);
    const before = await c.eventWithId(await seqOf('version.published', { versionId: seeded.versionId }));
    expect(Number(before.id)).toBeGreaterThan(Number(connected.id));

    // The second process shuts down (its hub ends the stream promptly) and comes back on the same port.
    await app2.close();
    await closeDeps(deps2);
    const v2 = await publishFiles(h, seeded.roostId, { 'while-down.txt': 'x\n' });
    await startSecondProcess(port);
    const missed = await seqOf('version.published', { versionId: v2.versionId });
    await c.eventWithId(missed);
    const connects = c.frames.filter((f) => f.type === 'connected');
    expect(connects.length).toBe(2);
    expect(connects[1].data.lastEventId).toBe(before.id);
    expect(versionFrames(c).map((f) => Number(f.id))).toEqual([Number(before.id), missed]);
    expect(increasing(c)).toBe(true);
    c.close();
  });

  it('gives every client of a site every event, whichever API process serves it, with the same ids', async () => {
    const c1 = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    const c2 = new Client(streamUrl(base2, { siteId: h.siteId }), auth(h.apiKey));
    await c1.connected();
    await c2.connected();
    const seeded = await seedRoost(h);
    await publishFiles(h, seeded.roostId, { 'p1.txt': '1\n' });
    // Writes through both processes, concurrently.
    const [, second] = await Promise.all([
      publishFiles(h, seeded.roostId, { 'p2.txt': '2\n' }),
      fetch(`${base2}/api/roosts/${seeded.roostId}/rollback`, {
        method: 'POST',
        headers: { ...auth(h.apiKey), 'content-type': 'application/json', 'idempotency-key': `idem-${Date.now()}` },
        body: JSON.stringify({ siteId: h.siteId }),
      }),
    ]);
    expect(second.status).toBe(200);
    await until('both clients got the four events', () => versionFrames(c1).length >= 4 && versionFrames(c2).length >= 4);
    const view = (c: Client) => c.events.map((f) => `${f.id} ${f.type} ${JSON.stringify(f.data)}`);
    expect(view(c2)).toEqual(view(c1));
    expect(
      versionFrames(c1)
        .map((f) => f.type)
        .sort(),
    ).toEqual(['version.published', 'version.published', 'version.published', 'version.rolled_back']);
    expect(increasing(c1)).toBe(true);
    c1.close();
    c2.close();
  });

  it('drops a client that does not read, without holding up the others; the dropped client resumes without loss', async () => {
    const other = await h.other();
    const url = streamUrl(base2, { siteId: other.siteId, api_key: other.apiKey, events: 'quota.warning' });
    // A client that reads the headers and then stops reading.
    const slow = await new Promise<http.IncomingMessage>((resolve, reject) => {
      http.get(url, { headers: { accept: 'text/event-stream' } }, resolve).on('error', reject);
    });
    expect(slow.statusCode).toBe(200);
    let slowText = '';
    slow.on('data', (d: Buffer) => (slowText += d.toString()));
    let slowClosed = false;
    slow.on('close', () => (slowClosed = true));
    await until('slow client connected', () => slowText.includes('event: connected'));
    slow.pause();
    const fast = new Client(url);
    await fast.connected();
    const hub2 = eventHubOf(deps2)!;
    const connectedClients = hub2.clientCount;

    // 1,500 events of ~8 KB (about 12 MB): far more than the kernel buffers plus the 256 KB client bound.
    const N = 1500;
    await h.deps.db.query(
      `INSERT INTO events (event_id, site_id, type, data, occurred_at)
       SELECT 'evt_bulk_' || $1 || '_' || g, $1, 'quota.warning',
              jsonb_build_object('siteId', $1::text, 'tier', 'free', 'threshold', 0.5, 'usedBytes', g, 'limitBytes', 1, 'pad', repeat('x', 8000)),
              now() + g * INTERVAL '1 microsecond'
         FROM generate_series(1, $2::int) AS g`,
      [other.siteId, N],
    );
    await until('fast client received every event', () => fast.events.length >= N, 60_000);
    expect(fast.events.map((f) => f.data.data.usedBytes)).toEqual(Array.from({ length: N }, (_, i) => i + 1));
    const bulk = (
      await h.deps.db.query<{ seq: string }>(`SELECT seq FROM events WHERE site_id = $1 AND event_id LIKE 'evt_bulk_%' ORDER BY seq`, [
        other.siteId,
      ])
    ).rows.map((r) => Number(r.seq));
    expect(fast.events.map((f) => Number(f.id))).toEqual(bulk);

    // The slow client stays over its bound past ROOST_STREAM_STALL_MS and is dropped; reading again
    // yields what was buffered, then the end.
    await until('the server dropped the slow client', () => hub2.clientCount === connectedClients - 1);
    slow.resume();
    await until('the slow client dropped', () => slowClosed);
    // Complete frames only (the last one may have been cut off by the drop).
    const blocks = slowText.split('\n\n').slice(0, -1);
    const slowIds = blocks.filter((b) => b.includes('event: quota.warning')).map((b) => Number(/^id: (\d+)$/m.exec(b)![1]));
    expect(slowIds.length).toBeLessThan(N);
    expect(slowIds).toEqual(bulk.slice(0, slowIds.length));
    // It resumes where it stopped and gets the rest, exactly.
    const resumed = new Client(url, { 'Last-Event-ID': String(slowIds.length ? slowIds[slowIds.length - 1] : bulk[0] - 1) });
    await until('resumed client got the rest', () => resumed.events.length >= N - slowIds.length, 60_000);
    expect(resumed.events.map((f) => Number(f.id))).toEqual(bulk.slice(slowIds.length));
    fast.close();
    resumed.close();
  });

  it('ends the stream when its key is revoked; the reconnect is refused with 401', async () => {
    const { raw, keyId } = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
    });
    const c = new Client(streamUrl(base1, { siteId: h.siteId, api_key: raw }));
    await c.connected();
    await h.deps.db.query(`UPDATE api_keys SET status = 'revoked' WHERE key_id = $1`, [keyId]);
    await until('the refused reconnect', () => c.es.readyState === EventSource.CLOSED);
    expect((c.errors[c.errors.length - 1] as { code?: number }).code).toBe(401);
    c.close();
  });

  it('writes a revoked key no further event: its stream ends before the next delivery, not at the keepalive', async () => {
    const { raw, keyId } = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
    });
    const revokedKey = new Client(streamUrl(base1, { siteId: h.siteId, api_key: raw }));
    const witness = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    await Promise.all([revokedKey.connected(), witness.connected()]);
    // Revoked, then events at once (well inside the 300 ms keepalive of this file, with polls every 40 ms).
    await h.deps.db.query(`UPDATE api_keys SET status = 'revoked' WHERE key_id = $1`, [keyId]);
    const after = await seedRoost(h);
    const seq = await seqOf('version.published', { versionId: after.versionId });
    await witness.eventWithId(seq);
    expect(revokedKey.events.map((f) => Number(f.id)).filter((id) => id >= seq)).toEqual([]);
    await until('the refused reconnect', () => revokedKey.es.readyState === EventSource.CLOSED);
    expect(revokedKey.events.map((f) => Number(f.id)).filter((id) => id >= seq)).toEqual([]);
    revokedKey.close();
    witness.close();
  });

  it('writes no further event to a key whose user has lost the site: its stream ends before the next delivery', async () => {
    const member = await makeUser(h.deps.db);
    await addMember(h.deps.db, h.siteId, member.uid);
    const { raw } = await insertKey(h.deps.db, {
      uid: member.uid,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
    });
    const removed = new Client(streamUrl(base1, { siteId: h.siteId, api_key: raw }));
    const witness = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    await Promise.all([removed.connected(), witness.connected()]);
    // Removed from the site, then events at once (well inside the 300 ms keepalive of this file).
    await h.deps.db.query('DELETE FROM site_members WHERE site_id = $1 AND uid = $2', [h.siteId, member.uid]);
    const after = await seedRoost(h);
    const seq = await seqOf('version.published', { versionId: after.versionId });
    await witness.eventWithId(seq);
    expect(removed.events.map((f) => Number(f.id)).filter((id) => id >= seq)).toEqual([]);
    await until('the refused reconnect', () => removed.es.readyState === EventSource.CLOSED);
    expect(removed.events.map((f) => Number(f.id)).filter((id) => id >= seq)).toEqual([]);
    removed.close();
    witness.close();
  });

  it('samples the use of a key that only ever opens streams: api_key.used once, an api_key_used audit record', async () => {
    const { raw, keyId } = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
    });
    for (let i = 0; i < 2; i++) {
      const c = new Client(streamUrl(base1, { siteId: h.siteId, api_key: raw }));
      await c.connected();
      c.close();
    }
    const events = await h.deps.db.query(`SELECT data FROM events WHERE site_id = $1 AND type = 'api_key.used' AND data->>'keyId' = $2`, [
      h.siteId,
      keyId,
    ]);
    expect(events.rows).toHaveLength(1);
    expect(events.rows[0].data).toMatchObject({ keyId, keyPrefix: raw.slice(0, 12), firstUseFromIp: true });
    const audit = await h.deps.db.query(
      `SELECT count(*)::int AS n FROM audit_records WHERE site_id = $1 AND kind = 'api_key_used' AND actor = $2`,
      [h.siteId, `apiKey:${keyId}`],
    );
    expect(audit.rows[0].n).toBe(1);
  });

  it("stops a site's poller when its last client leaves", async () => {
    const hub = eventHubOf(h.deps)!;
    const c = new Client(streamUrl(base1, { siteId: h.siteId }), auth(h.apiKey));
    await c.connected();
    await until('a client and a poller', () => hub.clientCount >= 1 && hub.pollerCount >= 1);
    c.close();
    await until('no clients and no pollers', () => hub.clientCount === 0 && hub.pollerCount === 0);
  });
});
