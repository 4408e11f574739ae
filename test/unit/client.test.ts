/**
 * The CLI's HTTP client against a real local HTTP server that answers from a script: retry policy
 * (docs/contract.md Errors), Idempotency-Key reuse, problem+json → ClientError, blob PUTs. Sleeps are recorded
 * instead of waited so the delays can be checked exactly.
 */
import { getEventListeners } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { ClientError, RoostClient, backoffDelayMs, isRetryable, retryAfterMs } from '../../cli/client';

interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}
/**
 * `hang`: the request is read and never answered (the client must end it). `truncate`: a 200 whose
 * connection drops half-way through the promised body.
 */
type Reply = { status: number; body?: unknown; headers?: Record<string, string | string[]> } | 'destroy' | 'hang' | 'truncate';

let server: http.Server;
let base: string;
let script: Reply[] = [];
let seen: Seen[] = [];

beforeAll(async () => {
  server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(parts).toString('utf8') });
      const reply = script.shift() ?? { status: 200, body: { ok: true } };
      if (reply === 'destroy') return void req.socket.destroy();
      if (reply === 'hang') return;
      if (reply === 'truncate') {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
        res.write('{"missing":["');
        return void setTimeout(() => req.socket.destroy(), 20);
      }
      const isProblem = reply.status >= 400;
      res.writeHead(reply.status, {
        'content-type': isProblem ? 'application/problem+json' : 'application/json',
        'x-request-id': `req_${seen.length}`,
        ...reply.headers,
      });
      res.end(reply.body === undefined ? '' : typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => server.close(r));
});
beforeEach(() => {
  script = [];
  seen = [];
});

function client(delays: number[], random = () => 0) {
  return new RoostClient({ baseUrl: `${base}/`, apiKey: 'svk_test_abc', sleep: async (ms) => void delays.push(ms), random });
}
const problem = (status: number, code: string, extra: Record<string, unknown> = {}) => ({
  status,
  body: { type: `x/problems/${code}`, title: code, status, code, detail: `${code} happened`, ...extra },
});

describe('requests', () => {
  it('sends the key, JSON body and query, and returns the parsed body', async () => {
    script = [{ status: 201, body: { id: 'x' }, headers: { 'idempotent-replayed': 'true' } }];
    const res = await client([]).request('POST', '/api/things', {
      query: { siteId: 's1', hash: ['a', 'b'], skip: undefined },
      body: { n: 1 },
      idempotencyKey: 'k-1',
    });
    expect(res).toMatchObject({ status: 201, body: { id: 'x' }, replayed: true, requestId: 'req_1', idempotencyKey: 'k-1', attempts: 1 });
    expect(seen[0]).toMatchObject({ method: 'POST', url: '/api/things?siteId=s1&hash=a&hash=b', body: '{"n":1}' });
    expect(seen[0].headers).toMatchObject({
      authorization: 'Bearer svk_test_abc',
      'content-type': 'application/json',
      'idempotency-key': 'k-1',
    });
  });

  it('turns problem+json into a ClientError with code, status, detail and extras, without retrying a 400', async () => {
    script = [problem(400, 'validation_failed', { errors: { 'version.files': ['must not be empty'] } })];
    const delays: number[] = [];
    const err = (await client(delays)
      .get('/api/x')
      .catch((e) => e)) as ClientError;
    expect(err).toBeInstanceOf(ClientError);
    expect(err).toMatchObject({
      code: 'validation_failed',
      status: 400,
      detail: 'validation_failed happened',
      requestId: 'req_1',
      attempts: 1,
    });
    expect(err.body.errors).toEqual({ 'version.files': ['must not be empty'] });
    expect(seen).toHaveLength(1);
    expect(delays).toEqual([]);
  });

  it.each([401, 403, 404, 409, 412, 422, 402])('never retries %i, even for a GET', async (status) => {
    script = [problem(status, 'nope')];
    await expect(client([]).get('/api/x')).rejects.toMatchObject({ status, code: 'nope' });
    expect(seen).toHaveLength(1);
  });
});

describe('retries', () => {
  it('retries a GET on 500/502/503/504 with the fallback backoff, then succeeds', async () => {
    script = [
      problem(500, 'internal_error'),
      problem(502, 'bad_gateway'),
      problem(503, 'service_unavailable'),
      problem(504, 'timeout'),
      { status: 200, body: { ok: 1 } },
    ];
    const delays: number[] = [];
    expect(await client(delays, () => 0).get('/api/x')).toEqual({ ok: 1 });
    expect(seen).toHaveLength(5);
    // min(60000, 500·2^attempt) × 0.5 with random 0
    expect(delays).toEqual([250, 500, 1000, 2000]);
  });

  it('answers a 503 with a code of its own (cortex_unavailable: the machine is offline) at once, Retry-After or not', async () => {
    script = [
      { ...problem(503, 'cortex_unavailable'), headers: { 'retry-after': '30' } },
      { status: 201, body: {} },
    ];
    const delays: number[] = [];
    await expect(client(delays).request('POST', '/api/x', { body: {}, idempotencyKey: true })).rejects.toMatchObject({
      status: 503,
      code: 'cortex_unavailable',
      attempts: 1,
    });
    expect(seen).toHaveLength(1);
    expect(delays).toEqual([]);
  });

  it('gives up after 6 attempts with the last problem', async () => {
    script = Array.from({ length: 8 }, () => problem(502, 'bad_gateway'));
    const delays: number[] = [];
    await expect(client(delays, () => 0.999999).get('/api/x')).rejects.toMatchObject({ code: 'bad_gateway', attempts: 6 });
    expect(seen).toHaveLength(6);
    expect(delays).toHaveLength(5);
    delays.forEach((d, i) => expect(d).toBeCloseTo(500 * 2 ** i, -1));
  });

  it('rides out an outage: 503 with Retry-After is retried past 6 attempts for the outage window, waiting as told', async () => {
    const outage = { ...problem(503, 'service_unavailable'), headers: { 'retry-after': '2' } };
    script = [...Array.from({ length: 9 }, () => outage), { status: 201, body: { ok: true } }];
    const delays: number[] = [];
    const c = new RoostClient({ baseUrl: base, sleep: async (ms) => void delays.push(ms), outageWindowMs: 20_000 });
    const res = await c.request('POST', '/api/x', { body: {}, idempotencyKey: true });
    expect([res.status, res.attempts]).toEqual([201, 10]);
    expect(delays).toEqual(Array.from({ length: 9 }, () => 2000));
    // Past the window the outage surfaces.
    script = Array.from({ length: 12 }, () => outage);
    await expect(c.request('POST', '/api/x', { body: {}, idempotencyKey: true })).rejects.toMatchObject({
      code: 'service_unavailable',
      attempts: 11,
    });
  });

  it('rides out a lost connection past 6 attempts only once the API has answered; an API never reached gets 6', async () => {
    const delays: number[] = [];
    const c = new RoostClient({ baseUrl: base, sleep: async (ms) => void delays.push(ms), random: () => 0, outageWindowMs: 300_000 });
    script = [
      { status: 200, body: { ok: true } },
      ...Array.from({ length: 8 }, (): Reply => 'destroy'),
      { status: 200, body: { ok: true } },
    ];
    await c.get('/api/x');
    const res = await c.request('GET', '/api/x');
    expect([res.status, res.attempts]).toEqual([200, 9]);

    const spare = http.createServer();
    await new Promise<void>((r) => spare.listen(0, '127.0.0.1', r));
    const port = (spare.address() as AddressInfo).port;
    await new Promise((r) => spare.close(r)); // nothing listens there now
    const never = new RoostClient({ baseUrl: `http://127.0.0.1:${port}`, sleep: async () => undefined, outageWindowMs: 300_000 });
    await expect(never.get('/api/x')).rejects.toMatchObject({ code: 'network_error', attempts: 6 });
  });

  it('does not retry a 5xx on a mutation without an Idempotency-Key', async () => {
    script = [problem(503, 'service_unavailable')];
    await expect(client([]).post('/api/x', { a: 1 })).rejects.toMatchObject({ code: 'service_unavailable', attempts: 1 });
    expect(seen).toHaveLength(1);
  });

  it('retries a 5xx on a keyed mutation, reusing the generated key and the exact body bytes', async () => {
    script = [problem(503, 'service_unavailable'), problem(500, 'internal_error'), { status: 201, body: { ok: true } }];
    const res = await client([]).request('POST', '/api/x', { body: { b: [1, 2], a: 'x' }, idempotencyKey: true });
    expect(seen).toHaveLength(3);
    const keys = seen.map((s) => s.headers['idempotency-key']);
    expect(keys[0]).toMatch(/^roost-cli-[0-9a-f-]{36}$/);
    expect(new Set(keys).size).toBe(1);
    expect(res.idempotencyKey).toBe(keys[0]);
    expect(new Set(seen.map((s) => s.body)).size).toBe(1);
    // a second logical call gets a new key
    await client([]).request('POST', '/api/x', { body: {}, idempotencyKey: true });
    expect(seen[3].headers['idempotency-key']).not.toBe(keys[0]);
  });

  it('waits out 409 idempotency_key_in_use on a keyed mutation (the first attempt still runs), then gets the replay', async () => {
    script = [
      { ...problem(409, 'idempotency_key_in_use'), headers: { 'retry-after': '1' } },
      { status: 201, body: { ok: true }, headers: { 'idempotent-replayed': 'true' } },
    ];
    const delays: number[] = [];
    const res = await client(delays).request('POST', '/api/x', { body: { a: 1 }, idempotencyKey: true });
    expect(res.replayed).toBe(true);
    expect(delays).toEqual([1000]);
    expect(seen[0].headers['idempotency-key']).toBe(seen[1].headers['idempotency-key']);
    // without a key there is nothing to wait for: the 409 is final
    script = [problem(409, 'idempotency_key_in_use')];
    await expect(client([]).request('POST', '/api/x', { body: {} })).rejects.toMatchObject({ code: 'idempotency_key_in_use', status: 409 });
  });

  it('retries a read-only POST marked retrySafe', async () => {
    script = [problem(502, 'bad_gateway'), { status: 200, body: { missing: [] } }];
    expect(await client([]).post('/api/chunks/check', { hashes: [] }, { retrySafe: true })).toEqual({ missing: [] });
    expect(seen).toHaveLength(2);
  });

  it('retries 429 even on an unkeyed mutation, honouring Retry-After (seconds or HTTP date) over the fallback', async () => {
    script = [
      { ...problem(429, 'rate_limited', { retryAfter: 9 }), headers: { 'retry-after': '3' } },
      problem(429, 'rate_limited', { retryAfter: 7 }),
      { status: 200, body: { ok: true } },
    ];
    const delays: number[] = [];
    await client(delays).post('/api/x', {});
    expect(delays).toEqual([3000, 7000]); // header first, then the body's retryAfter
    expect(retryAfterMs(new Date(Date.UTC(2030, 0, 1, 0, 0, 30)).toUTCString(), undefined, Date.UTC(2030, 0, 1))).toBe(30000);
    expect(retryAfterMs('soon', undefined)).toBeUndefined();
  });

  it('surfaces a 429 whose Retry-After is beyond the ten-minute ceiling', async () => {
    script = [{ ...problem(429, 'rate_limited'), headers: { 'retry-after': '3600' } }];
    await expect(client([]).get('/api/x')).rejects.toMatchObject({ code: 'rate_limited', status: 429 });
    expect(seen).toHaveLength(1);
  });

  it('retries a dropped connection on a GET and on a keyed mutation, but not on an unkeyed one', async () => {
    script = ['destroy', { status: 200, body: { ok: 1 } }];
    expect(await client([]).get('/api/x')).toEqual({ ok: 1 });
    script = ['destroy', { status: 200, body: { ok: 2 } }];
    expect(await client([]).post('/api/x', {}, { idempotencyKey: 'k' })).toEqual({ ok: 2 });
    seen = [];
    script = ['destroy'];
    await expect(client([]).post('/api/x', {})).rejects.toMatchObject({ code: 'network_error', status: 0, attempts: 1 });
    expect(seen).toHaveLength(1);
  });

  it('retries a connection that drops mid-body on a retry-safe POST, and surfaces it as network_error on an unkeyed one', async () => {
    script = ['truncate', { status: 200, body: { missing: [] } }];
    const res = await client([]).request('POST', '/api/chunks/check', { body: { hashes: [] }, retrySafe: true });
    expect(res).toMatchObject({ status: 200, body: { missing: [] }, attempts: 2 });
    seen = [];
    script = ['truncate'];
    await expect(client([]).post('/api/x', {})).rejects.toMatchObject({ code: 'network_error', status: 0, attempts: 1 });
    expect(seen).toHaveLength(1);
  });

  it('keeps every value of a repeated header, and names the status when a failure has no body', async () => {
    script = [{ status: 200, body: { ok: 1 }, headers: { link: ['<a>; rel="next"', '<b>; rel="prev"'] } }];
    const res = await client([]).request('GET', '/api/x');
    expect(res.headers.get('link')).toBe('<a>; rel="next", <b>; rel="prev"');
    script = [{ status: 418 }];
    await expect(client([]).get('/api/x')).rejects.toMatchObject({ code: 'http_418', status: 418, detail: "I'm a Teapot" });
  });

  it('names the refused connection in a network_error', async () => {
    const spare = http.createServer();
    await new Promise<void>((r) => spare.listen(0, '127.0.0.1', r));
    const port = (spare.address() as AddressInfo).port;
    await new Promise((r) => spare.close(r)); // nothing listens there now
    const closed = new RoostClient({ baseUrl: `http://127.0.0.1:${port}`, maxAttempts: 1, sleep: async () => undefined });
    await expect(closed.get('/api/x')).rejects.toMatchObject({ code: 'network_error', detail: expect.stringContaining('ECONNREFUSED') });
  });

  it('policy helpers follow the spec table', () => {
    expect(backoffDelayMs(0, () => 0)).toBe(250);
    expect(backoffDelayMs(20, () => 0.999999)).toBeLessThanOrEqual(60000);
    expect(backoffDelayMs(20, () => 0)).toBe(30000);
    expect(isRetryable(429, false)).toBe(true);
    expect(isRetryable(503, false)).toBe(false);
    expect(isRetryable(503, true)).toBe(true);
    expect(isRetryable(503, true, 'service_unavailable')).toBe(true);
    expect(isRetryable(503, true, 'cortex_unavailable')).toBe(false);
    expect(isRetryable(501, true)).toBe(false);
    expect(isRetryable(undefined, false)).toBe(false);
    expect(isRetryable(undefined, true)).toBe(true);
  });
});

describe('putBlob', () => {
  it('PUTs the bytes as a BlockBlob octet-stream without the API key', async () => {
    script = [{ status: 503, body: '' }, { status: 201 }];
    await client([]).putBlob(`${base}/chunks/abc?sig=1`, Buffer.from('bytes!'));
    expect(seen).toHaveLength(2);
    expect(seen[1]).toMatchObject({ method: 'PUT', url: '/chunks/abc?sig=1', body: 'bytes!' });
    expect(seen[1].headers).toMatchObject({
      'x-ms-blob-type': 'BlockBlob',
      'content-type': 'application/octet-stream',
      'content-length': '6',
    });
    expect(seen[1].headers.authorization).toBeUndefined();
  });

  it("ends a PUT in flight when the caller's signal aborts, with its reason, without retrying, and lets go of the signal", async () => {
    script = ['hang'];
    const stop = new AbortController();
    const reason = new Error('the push failed elsewhere');
    const put = client([]).putBlob(`${base}/chunks/abc?sig=1`, Buffer.from('x'), { signal: stop.signal });
    while (seen.length === 0) await new Promise((r) => setTimeout(r, 5));
    stop.abort(reason);
    await expect(put).rejects.toBe(reason);
    expect(seen).toHaveLength(1);
    // A finished PUT leaves no listener on the caller's signal (a push reuses one signal for thousands).
    const after = new AbortController();
    await client([]).putBlob(`${base}/chunks/abc?sig=1`, Buffer.from('x'), { signal: after.signal });
    expect(getEventListeners(after.signal, 'abort')).toHaveLength(0);
  });

  it('rides out a storage outage past 6 attempts once storage has answered this client; storage never reached gets 6', async () => {
    const delays: number[] = [];
    const c = new RoostClient({ baseUrl: base, sleep: async (ms) => void delays.push(ms), random: () => 0, outageWindowMs: 60_000 });
    const url = `${base}/chunks/abc?sig=1`;
    // Storage answered once (the first chunk), then goes away mid-push: connections dropped, then 503s.
    script = [
      { status: 201 },
      ...Array.from({ length: 5 }, (): Reply => 'destroy'),
      ...Array.from({ length: 2 }, (): Reply => ({ status: 503, body: '' })),
      { status: 201 },
    ];
    expect(await c.putBlob(url, Buffer.from('a'))).toBe('created');
    expect(await c.putBlob(url, Buffer.from('b'))).toBe('created');
    expect(seen).toHaveLength(9);
    // 7 pauses of min(60 s, 500·2^n ms) halved (random 0): 31.75 s of the 60 s window.
    expect(delays).toEqual([250, 500, 1000, 2000, 4000, 8000, 16000]);
    // Past the window the outage surfaces: the 8th pause (30 s) would end at 61.75 s.
    script = Array.from({ length: 12 }, (): Reply => 'destroy');
    await expect(c.putBlob(url, Buffer.from('c'))).rejects.toMatchObject({ code: 'network_error', attempts: 8 });
    // Other 5xx keep the 6 attempts.
    script = Array.from({ length: 8 }, (): Reply => ({ status: 500, body: '' }));
    await expect(c.putBlob(url, Buffer.from('d'))).rejects.toMatchObject({ code: 'upload_failed', status: 500, attempts: 6 });

    const spare = http.createServer();
    await new Promise<void>((r) => spare.listen(0, '127.0.0.1', r));
    const port = (spare.address() as AddressInfo).port;
    await new Promise((r) => spare.close(r)); // nothing listens there now
    const never = new RoostClient({ baseUrl: base, sleep: async () => undefined, outageWindowMs: 300_000 });
    await expect(never.putBlob(`http://127.0.0.1:${port}/chunks/abc?sig=1`, Buffer.from('x'))).rejects.toMatchObject({
      code: 'network_error',
      attempts: 6,
    });
  });

  it('reports a refused URL as upload_forbidden with the storage error code', async () => {
    script = [
      {
        status: 403,
        body: '<?xml version="1.0"?><Error><Code>AuthenticationFailed</Code></Error>',
        headers: { 'content-type': 'application/xml' },
      },
    ];
    await expect(client([]).putBlob(`${base}/chunks/abc?sig=1`, Buffer.from('x'))).rejects.toMatchObject({
      code: 'upload_forbidden',
      status: 403,
      body: { storageCode: 'AuthenticationFailed' },
    });
    expect(seen).toHaveLength(1);
  });
});
