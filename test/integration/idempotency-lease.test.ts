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
import { type ChildProcess, spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { createHarness, type Harness } from '../support/harness';
import { testConfig, testDatabase } from '../support/env';
import { idempotencyScopeHash } from '../../services/idempotency';

const ROOT = path.join(__dirname, '..', '..');
const LEASE_MS = 900;
const HOLD = 'INSERT INTO commands';

let h: Harness;
let proxy: net.Server;
let proxyPort = 0;
const sockets = new Set<net.Socket>();
/** Packets held back (with the socket they go to) while `holding`; `onHold` is told of the first. */
let held: { upstream: net.Socket; data: Buffer }[] = [];
let onHold: (() => void) | undefined;
const children: ChildProcess[] = [];
let machineId: string;
let keyId: string;
let environment: 'live' | 'test' | 'unknown';

function openProxy(): Promise<void> {
  const pg = testConfig().ROOST_PG_PORT;
  proxy = net.createServer((client) => {
    const upstream = net.connect(pg, '127.0.0.1');
    sockets.add(client).add(upstream);
    client.on('data', (d: Buffer) => {
      if (onHold && d.includes(HOLD)) {
        held.push({ upstream, data: d });
        const tell = onHold;
        onHold = undefined;
        tell();
      } else if (held.some((x) => x.upstream === upstream)) held.push({ upstream, data: d });
      else upstream.write(d);
    });
    upstream.pipe(client);
    const end = () => (client.destroy(), upstream.destroy());
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  return new Promise((resolve) => proxy.listen(0, '127.0.0.1', () => ((proxyPort = (proxy.address() as net.AddressInfo).port), resolve())));
}

/** Starts `node api/server.ts` on a free port, its database reached through the proxy; resolves with its URL. */
function startApiChild(): Promise<{ child: ChildProcess; url: string }> {
  const cfg = testConfig();
  const child = spawn(process.execPath, ['-r', 'tsx/cjs', path.join(ROOT, 'api', 'server.ts')], {
    cwd: ROOT,
    env: {
      ...process.env,
      ROOST_PG_DATABASE: testDatabase(),
      DATABASE_URL: cfg.databaseUrl.replace(`:${cfg.ROOST_PG_PORT}/`, `:${proxyPort}/`),
      ROOST_API_PORT: '0',
      ROOST_API_HOST: '127.0.0.1',
      ROOST_LOG_LEVEL: 'silent',
      ROOST_IDEMPOTENCY_LEASE_MS: String(LEASE_MS),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    child.stderr!.on('data', (d) => (err += d));
    child.stdout!.on('data', (d) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) resolve({ child, url: m[1] });
    });
    child.on('exit', (code) => reject(new Error(`api exited ${code}: ${err.slice(-2000)}`)));
  });
}

beforeAll(async () => {
  h = await createHarness();
  await openProxy();
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
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await new Promise<void>((resolve) => proxy.close(() => resolve()));
  for (const s of sockets) s.destroy();
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
  const { child, url } = await startApiChild();
  const key = `lease-kill-${Date.now()}`;
  const tagged = { ...body, auditCorrelationId: key };
  const reached = new Promise<void>((resolve) => (onHold = resolve));
  const first = fetch(`${url}${commandsPath()}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${h.apiKey}`, 'idempotency-key': key, 'content-type': 'application/json' },
    body: JSON.stringify(tagged),
  }).catch((err: unknown) => err);
  await reached; // reserved, transaction begun, the INSERT held back by the proxy
  expect(await reservation(key)).toMatchObject({ state: 'in_progress' });
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  for (const s of sockets) s.destroy();
  held = [];
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
  const { url } = await startApiChild();
  const key = `lease-live-${Date.now()}`;
  const tagged = { ...body, auditCorrelationId: key };
  const reached = new Promise<void>((resolve) => (onHold = resolve));
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
  const release = held;
  held = [];
  for (const x of release) x.upstream.write(x.data);
  const done = await first;
  expect(done.status).toBe(202);
  const created = (await done.json()) as { commandId: string };
  const replay = await h.request({ method: 'POST', url: commandsPath(), body: tagged, idempotencyKey: key });
  expect([replay.statusCode, replay.headers['idempotent-replayed'], replay.json().commandId]).toEqual([202, 'true', created.commandId]);
  expect(await commandsWith(key)).toBe(1);
});
