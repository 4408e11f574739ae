/**
 * The Idempotency-Key reservation is a lease tied to the live request (api/plugins/idempotency.ts,
 * docs/decisions/idempotency-concurrency.md). A real API child process reaches PostgreSQL through a TCP proxy
 * of this test, which can hold back the statement that would insert the command of
 * `POST /api/sites/{siteId}/machines/{machineId}/commands` (its transaction has begun, nothing committed):
 *
 * - killed there (SIGKILL), the process leaves its reservation behind; a retry with the same key runs within
 *   a few seconds (it used to answer 409 for 5 minutes) and queues the command once;
 * - kept waiting there for several leases, the live request keeps renewing its key: a concurrent request with
 *   the same key gets 409, and the first one's answer is then replayed.
 */
import type { ChildProcess } from 'node:child_process';
import { createHarness, type Harness } from '../support/harness';
import { PgProxy, killHard, startApiChild } from '../support/api-child';
import { idempotencyScopeHash } from '../../services/idempotency';

/** Renewed every third of it: two renewals may lag 650 ms each before the lease lapses. */
const LEASE_MS = 2000;
const HOLD = 'INSERT INTO commands';

let h: Harness;
const proxy = new PgProxy();
const children: ChildProcess[] = [];
let machineId: string;
let keyId: string;
let environment: 'live' | 'test' | 'unknown';

async function startChild(): Promise<{ child: ChildProcess; url: string }> {
  const started = await startApiChild(proxy, { ROOST_IDEMPOTENCY_LEASE_MS: String(LEASE_MS) });
  children.push(started.child);
  return started;
}

beforeAll(async () => {
  h = await createHarness();
  await proxy.open();
  const secret = await h.enrolmentSecret();
  machineId = `lease-m-${Date.now()}`;
  const res = await h.request({
    method: 'POST',
    url: '/api/agent/enrol',
    key: null,
    body: { siteId: h.siteId, enrolmentSecret: secret, machineId, hostname: 'lease.local', agentVersion: '1.0.0' },
  });
  expect(res.statusCode).toBe(201);
  const me = (await h.request({ method: 'GET', url: '/api/whoami' })).json();
  keyId = me.key.keyId;
  environment = me.key.environment;
});

afterAll(async () => {
  for (const c of children) await killHard(c);
  await proxy.close();
  await h?.close();
});

const commandsPath = () => `/api/sites/${h.siteId}/machines/${machineId}/commands`;
const body = { type: 'capture_screenshot', params: {} };

/** The row key of an Idempotency-Key sent with the harness key to the commands route (api/plugins/idempotency.ts scopeOf). */
function keyHash(key: string): string {
  return idempotencyScopeHash({ user: h.userId, environment, keyId, method: 'POST', path: commandsPath(), idempotencyKey: key });
}

/** The reservation of `key`: state and how far its lease was pushed past its creation (ms). */
async function reservation(key: string): Promise<{ state: string; leaseMs: number } | undefined> {
  const { rows } = await h.deps.db.query<{ state: string; lease_ms: number }>(
    `SELECT state, EXTRACT(EPOCH FROM (expires_at - created_at)) * 1000 AS lease_ms FROM idempotency_keys WHERE key_hash = $1`,
    [keyHash(key)],
  );
  return rows[0] ? { state: rows[0].state, leaseMs: Number(rows[0].lease_ms) } : undefined;
}

async function commandsWith(correlation: string): Promise<number> {
  const { rows } = await h.deps.db.query(
    `SELECT count(*)::int AS n FROM commands WHERE site_id = $1 AND machine_id = $2 AND audit_correlation_id = $3`,
    [h.siteId, machineId, correlation],
  );
  return rows[0].n;
}

test('a retry after the API process died mid-request proceeds within seconds and queues the command once', async () => {
  const { child, url } = await startChild();
  const key = `lease-kill-${Date.now()}`;
  const tagged = { ...body, auditCorrelationId: key };
  const reached = proxy.holdAt(HOLD);
  const first = fetch(`${url}${commandsPath()}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${h.apiKey}`, 'idempotency-key': key, 'content-type': 'application/json' },
    body: JSON.stringify(tagged),
  }).catch((err: unknown) => err);
  await reached; // reserved, transaction begun, the INSERT held back by the proxy
  expect(await reservation(key)).toMatchObject({ state: 'in_progress' });
  await killHard(child);
  proxy.cut();
  expect(String(await first)).toMatch(/fetch failed/); // the connection died with the process

  // The same request again (through the in-process API): 409 while the dead request's lease runs out, then it runs.
  let tries = 0;
  let res = await h.request({ method: 'POST', url: commandsPath(), body: tagged, idempotencyKey: key });
  while (res.statusCode === 409 && tries++ < 10) {
    expect(res.json().code).toBe('idempotency_key_in_use');
    await new Promise((r) => setTimeout(r, Number(res.headers['retry-after']) * 1000));
    res = await h.request({ method: 'POST', url: commandsPath(), body: tagged, idempotencyKey: key });
  }
  expect(res.statusCode).toBe(202);
  expect(await commandsWith(key)).toBe(1);
  const replay = await h.request({ method: 'POST', url: commandsPath(), body: tagged, idempotencyKey: key });
  expect([replay.statusCode, replay.headers['idempotent-replayed'], replay.json().commandId]).toEqual([202, 'true', res.json().commandId]);
  expect(await commandsWith(key)).toBe(1);
});

test('a live request keeps its key for as long as it runs: a concurrent one gets 409, then the replay', async () => {
  const { url } = await startChild();
  const key = `lease-live-${Date.now()}`;
  const tagged = { ...body, auditCorrelationId: key };
  const reached = proxy.holdAt(HOLD);
  const first = fetch(`${url}${commandsPath()}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${h.apiKey}`, 'idempotency-key': key, 'content-type': 'application/json' },
    body: JSON.stringify(tagged),
  });
  await reached;
  // Wait until the request has outlived two leases: its renewals pushed the lease past three from the start.
  while (((await reservation(key))?.leaseMs ?? 0) <= 3 * LEASE_MS) await new Promise((r) => setTimeout(r, 100));
  const busy = await h.request({ method: 'POST', url: commandsPath(), body: tagged, idempotencyKey: key });
  expect([busy.statusCode, busy.json().code]).toEqual([409, 'idempotency_key_in_use']);
  // Let the held statement through: the first request finishes and its answer is stored.
  proxy.release();
  const done = await first;
  expect(done.status).toBe(202);
  const created = (await done.json()) as { commandId: string };
  const replay = await h.request({ method: 'POST', url: commandsPath(), body: tagged, idempotencyKey: key });
  expect([replay.statusCode, replay.headers['idempotent-replayed'], replay.json().commandId]).toEqual([202, 'true', created.commandId]);
  expect(await commandsWith(key)).toBe(1);
});
