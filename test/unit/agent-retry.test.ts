/**
 * The agent's calls through an outage (agent/transport.ts): a 503 service_unavailable with Retry-After is
 * retried no sooner than the answer says, and reports (command and target state) are retried until they land,
 * however many answers fail, while a sync's other calls give up once their window is spent. Against a real
 * local HTTP server answering from a script.
 */
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { HttpError, parseRetryAfter } from '../../agent/http';
import { MachineRoot } from '../../agent/machine-root';
import { AgentTransport } from '../../agent/transport';
import { KeyRing } from '../../agent/trust';

type Reply = { status: number; headers?: Record<string, string>; body?: unknown };
let server: http.Server;
let base: string;
let script: Reply[] = [];
const seen: { at: number; url: string }[] = [];

beforeAll(async () => {
  server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen.push({ at: Date.now(), url: req.url ?? '' });
      const r = script.shift() ?? { status: 200, body: { status: 'downloading', applied: true } };
      res.writeHead(r.status, { 'content-type': r.status >= 400 ? 'application/problem+json' : 'application/json', ...r.headers });
      res.end(JSON.stringify(r.body ?? { code: 'service_unavailable', detail: 'the database is unavailable; retry shortly' }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise((r) => server.close(r)));
beforeEach(() => {
  script = [];
  seen.length = 0;
});

function transport(stop = new AbortController()): AgentTransport {
  const id = { baseUrl: base, siteId: 'site_x', enrolmentSecret: 's', machineId: 'm1', persistToken: false };
  return new AgentTransport(
    id,
    new MachineRoot(path.join(os.tmpdir(), 'roost-agent-retry')),
    new KeyRing(),
    () => stop.signal,
    () => 0,
    1,
  );
}

const outage = (retryAfter?: string): Reply => ({ status: 503, headers: retryAfter ? { 'retry-after': retryAfter } : {} });

test('Retry-After of a 503 is parsed (seconds or HTTP date) and kept on the HttpError', () => {
  expect(parseRetryAfter('5')).toBe(5000);
  expect(parseRetryAfter(new Date(Date.now() + 3000).toUTCString(), Date.now())).toBeGreaterThan(1000);
  expect(parseRetryAfter('soon')).toBeUndefined();
  expect(new HttpError(503, 'service_unavailable', 'x', undefined, 1000).retryAfterMs).toBe(1000);
});

test('a command report waits as long as Retry-After says, and lands after more failed answers than any retry limit', async () => {
  script = [outage('1'), ...Array.from({ length: 6 }, () => outage()), { status: 502 }];
  const r = await transport().reportCommand('cmd_1', { status: 'downloading', progress: 0 });
  expect(r).toEqual({ status: 'downloading', applied: true });
  expect(seen).toHaveLength(9);
  // The second attempt came no sooner than the Retry-After of the first answer.
  expect(seen[1].at - seen[0].at).toBeGreaterThanOrEqual(1000);
});

test('a target-state report is retried until it lands; a stop ends the retries with the last error', async () => {
  script = Array.from({ length: 8 }, () => outage());
  await transport().reportState('roost_1', 'a'.repeat(64), 'downloading', {
    chunks_fetched: 0,
    chunks_total: 0,
    chunks_dedup: 0,
    files_total: 0,
    files_assembled: 0,
    files_skipped: 0,
    bytes_fetched: 0,
  });
  expect(seen).toHaveLength(9);

  const stop = new AbortController();
  script = Array.from({ length: 1000 }, () => outage());
  seen.length = 0;
  const pending = transport(stop).reportCommand('cmd_2', { status: 'failed', error: 'x' });
  while (seen.length < 10) await new Promise((r) => setImmediate(r));
  stop.abort();
  await expect(pending).rejects.toMatchObject({ status: 503 });
});

test("a sync's other calls give up when their window is spent; non-transient answers surface at once", async () => {
  script = Array.from({ length: 6 }, () => outage());
  await expect(transport().callRetrying('GET', '/api/agent/signing-keys', {}, { forMs: 30 })).rejects.toMatchObject({ status: 503 });
  expect(seen.length).toBeLessThan(6);
  script = [{ status: 404, body: { code: 'not_found' } }];
  seen.length = 0;
  await expect(transport().callRetrying('GET', '/api/agent/signing-keys')).rejects.toMatchObject({ status: 404 });
  expect(seen).toHaveLength(1);
});
