/**
 * A database outage answers 503 service_unavailable with Retry-After, not 500 (api/plugins/problem.ts over
 * domain/outage.ts). The API reaches PostgreSQL through a TCP proxy in front of the suite's server; closing the
 * proxy is the outage (its connections are cut, new ones refused), reopening it ends it.
 */
import net from 'node:net';
import { createHarness, type Harness } from '../support/harness';
import { testConfig } from '../support/env';

/** The API's waits on the database in this file (config ROOST_DB_QUERY_TIMEOUT_MS, ROOST_DB_CONNECT_TIMEOUT_MS). */
const QUERY_TIMEOUT_MS = 3000;
const CONNECT_TIMEOUT_MS = 2000;

let h: Harness;
let proxy: net.Server;
let port = 0;
const sockets = new Set<net.Socket>();
/** While set, what clients send is held back and the first held bytes call it (a query is in flight). */
let frozen: (() => void) | undefined;

function openProxy(): Promise<void> {
  const pg = testConfig().ROOST_PG_PORT;
  proxy = net.createServer((client) => {
    const upstream = net.connect(pg, '127.0.0.1');
    sockets.add(client).add(upstream);
    client.on('data', (d: Buffer) => (frozen ? frozen() : upstream.write(d)));
    upstream.pipe(client);
    const end = () => (client.destroy(), upstream.destroy());
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  return new Promise((resolve) => proxy.listen(port, '127.0.0.1', () => ((port = (proxy.address() as net.AddressInfo).port), resolve())));
}

async function closeProxy(): Promise<void> {
  await new Promise<void>((resolve) => proxy.close(() => resolve()));
  for (const s of sockets) s.destroy();
  sockets.clear();
}

beforeAll(async () => {
  await openProxy();
  const cfg = testConfig();
  h = await createHarness({
    DATABASE_URL: cfg.databaseUrl.replace(`:${cfg.ROOST_PG_PORT}/`, `:${port}/`),
    ROOST_DB_QUERY_TIMEOUT_MS: String(QUERY_TIMEOUT_MS),
    ROOST_DB_CONNECT_TIMEOUT_MS: String(CONNECT_TIMEOUT_MS),
  });
});

afterAll(async () => {
  await h?.close();
  await closeProxy().catch(() => undefined);
});

test('reads and writes during the outage are 503 with Retry-After; they work again when it ends', async () => {
  const list = () => h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` });
  expect((await list()).statusCode).toBe(200);
  await closeProxy();
  for (const res of [
    await list(),
    await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'during outage' } }),
  ]) {
    expect([res.statusCode, res.json().code]).toEqual([503, 'service_unavailable']);
    expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
    expect(res.json().detail).toMatch(/unavailable; retry shortly/);
  }
  const health = await h.request({ method: 'GET', url: '/readyz' });
  expect([health.statusCode, health.json().code, health.json().dependencies, health.json().migrations]).toEqual([
    503,
    'service_unavailable',
    { database: 'down', blobStorage: 'up', temporal: 'up' },
    'unknown',
  ]);
  expect(health.json().detail).toMatch(/not ready: the database; retry shortly/);
  // Liveness asks no dependency: the process still serves.
  expect((await h.request({ method: 'GET', url: '/healthz' })).json()).toEqual({ ok: true });
  expect(Number(health.headers['retry-after'])).toBeGreaterThan(0);
  await openProxy();
  let res = await list();
  for (let i = 0; i < 20 && res.statusCode !== 200; i++) {
    await new Promise((r) => setTimeout(r, 250));
    res = await list();
  }
  expect(res.statusCode).toBe(200);
  expect(res.json().roosts.map((r: { name: string }) => r.name)).not.toContain('during outage');
});

test('a connection lost in the middle of a query (no SQLSTATE: "Connection terminated unexpectedly") is 503 too', async () => {
  expect((await h.request({ method: 'GET', url: '/readyz' })).json()).toEqual({
    ok: true,
    dependencies: { database: 'up', blobStorage: 'up', temporal: 'up' },
    migrations: 'applied',
  });
  const held = new Promise<void>((resolve) => (frozen = resolve));
  const pending = h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` });
  await held; // the request's query reached the proxy and waits there
  for (const s of sockets) s.destroy();
  sockets.clear();
  frozen = undefined;
  const res = await pending;
  expect([res.statusCode, res.json().code]).toEqual([503, 'service_unavailable']);
  expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
  let again = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` });
  for (let i = 0; i < 20 && again.statusCode !== 200; i++)
    again = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` });
  expect(again.statusCode).toBe(200);
});

test('a database that stops answering (frozen: connections open, nothing comes back) is 503 within the timeouts, then works again', async () => {
  const list = () => h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` });
  expect((await list()).statusCode).toBe(200);
  // Everything the API sends from now on is swallowed: pooled connections wait on their statement, new ones on
  // their start-up, as with a frozen server or a network path that drops packets.
  frozen = () => undefined;
  const started = Date.now();
  const [read, write] = await Promise.all([
    list(),
    h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'while frozen' } }),
  ]);
  const took = Date.now() - started;
  for (const res of [read, write]) {
    expect([res.statusCode, res.json().code]).toEqual([503, 'service_unavailable']);
    expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
  }
  // One statement's wait, plus a new connection's for a request that found the pool's clients discarded.
  expect(took).toBeLessThan(QUERY_TIMEOUT_MS + CONNECT_TIMEOUT_MS + 5000);
  // A new connection started while frozen fails at the connect timeout too (the pool's clients were discarded).
  const again = await list();
  expect([again.statusCode, again.json().code]).toEqual([503, 'service_unavailable']);

  frozen = undefined;
  for (const s of sockets) s.destroy();
  sockets.clear();
  let res = await list();
  for (let i = 0; i < 40 && res.statusCode !== 200; i++) {
    await new Promise((r) => setTimeout(r, 250));
    res = await list();
  }
  expect(res.statusCode).toBe(200);
  expect(res.json().roosts.map((r: { name: string }) => r.name)).not.toContain('while frozen');
});
