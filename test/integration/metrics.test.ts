/**
 * Prometheus metrics of the API (docs/observability.md; api/plugins/metrics.ts, api/routes/observability.ts,
 * telemetry/metrics.ts): `GET /metrics` behind ROOST_METRICS_TOKEN, the separate ROOST_METRICS_PORT
 * listener of a real `startApi`, and the series after real requests: per route template and status class,
 * 429 refusals by bucket, idempotency replays, the pool and its 40001 retries, event-stream connections.
 */
import { withTx } from '../../db/pool';
import { startApi, type RunningApi } from '../../api/server';
import { createHarness, idemKey, type Harness } from '../support/harness';
import { testConfig } from '../support/env';
import { parseMetrics, type Exposition } from '../support/metrics';
import { testLogger } from '../support/test-log';

const TOKEN = 'metrics-token-0123456789abcdef';
let h: Harness;

beforeAll(async () => {
  h = await createHarness({
    ROOST_METRICS_TOKEN: TOKEN,
    ROOST_RATE_LIMIT_SCALE: '1',
    ROOST_RATE_LIMIT_OVERRIDES: JSON.stringify({
      auth: { points: 2, durationSeconds: 3600 },
      api: { points: 100000, durationSeconds: 60 },
    }),
  });
});
afterAll(async () => h.close());

async function scrape(): Promise<Exposition> {
  const res = await h.request({ method: 'GET', url: '/metrics', key: null, headers: { authorization: `Bearer ${TOKEN}` } });
  expect(res.statusCode).toBe(200);
  expect(res.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
  return parseMetrics(res.body);
}

describe('GET /metrics on the API listener', () => {
  it('needs the configured bearer token: 401 problem+json without it or with another', async () => {
    const attempts: Record<string, string>[] = [
      {},
      { authorization: 'Bearer wrong-token-0123456789abcdef' },
      { authorization: `Basic ${TOKEN}` },
    ];
    for (const headers of attempts) {
      const res = await h.request({ method: 'GET', url: '/metrics', key: null, headers });
      expect(res.statusCode).toBe(401);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.json().code).toBe('unauthorized');
      expect(res.body).not.toContain('roost_http_requests_total');
    }
  });
});

describe('request series', () => {
  it('counts requests by method, route template and status class, with a latency histogram', async () => {
    const before = await scrape();
    const roost = 'rst_0000000000000000000000';
    for (let i = 0; i < 3; i++) expect((await h.request({ method: 'GET', url: '/api/whoami' })).statusCode).toBe(200);
    const missing = await h.request({ method: 'GET', url: `/api/roosts/${roost}` });
    expect(missing.statusCode).toBeGreaterThanOrEqual(400);
    expect((await h.request({ method: 'GET', url: '/no/such/path/123' })).statusCode).toBe(404);
    const m = await scrape();

    expect(m.types.get('roost_http_requests_total')).toBe('counter');
    expect(m.types.get('roost_http_request_duration_seconds')).toBe('histogram');
    const whoami = { method: 'GET', route: '/api/whoami', status_class: '2xx' };
    expect(m.value('roost_http_requests_total', whoami) - before.value('roost_http_requests_total', whoami)).toBe(3);
    expect(
      m.value('roost_http_request_duration_seconds_count', whoami) - before.value('roost_http_request_duration_seconds_count', whoami),
    ).toBe(3);
    expect(m.value('roost_http_request_duration_seconds_bucket', { ...whoami, le: '+Inf' })).toBe(
      m.value('roost_http_request_duration_seconds_count', whoami),
    );
    expect(m.value('roost_http_request_duration_seconds_sum', whoami)).toBeGreaterThan(0);
    const byTemplate = { route: '/api/roosts/:roostId', status_class: `${Math.floor(missing.statusCode / 100)}xx` };
    expect(m.value('roost_http_requests_total', byTemplate) - before.value('roost_http_requests_total', byTemplate)).toBe(1);
    expect(m.value('roost_http_requests_total', { route: 'unmatched', status_class: '4xx' })).toBeGreaterThanOrEqual(1);
    // Never a raw URL or an id as a label value.
    const labelValues = m.samples.flatMap((s) => Object.values(s.labels));
    expect(labelValues.filter((v) => v.includes(roost) || v.includes('/no/such') || v.includes(h.siteId))).toEqual([]);
    // Process metrics come with it.
    expect(m.has('roost_process_resident_memory_bytes')).toBe(true);
  });

  it('counts 429 refusals by the bucket that refused', async () => {
    const before = await scrape();
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++)
      statuses.push((await h.request({ method: 'GET', url: '/api/whoami', key: 'rsk_not_a_real_key_000000000000' })).statusCode);
    expect(statuses).toEqual([401, 401, 429, 429]);
    const m = await scrape();
    expect(
      m.value('roost_rate_limit_refusals_total', { bucket: 'bucket:auth' }) -
        before.value('roost_rate_limit_refusals_total', { bucket: 'bucket:auth' }),
    ).toBe(2);
    expect(m.value('roost_http_requests_total', { route: '/api/whoami', status_class: '4xx' })).toBeGreaterThanOrEqual(4);
  });

  it('counts idempotency replays by route template', async () => {
    const route = '/api/sites/:siteId/enrolment-secret';
    const before = await scrape();
    const key = idemKey();
    const first = await h.request({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret`, idempotencyKey: key });
    const again = await h.request({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret`, idempotencyKey: key });
    expect(first.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    const m = await scrape();
    expect(m.value('roost_idempotency_replays_total', { route }) - before.value('roost_idempotency_replays_total', { route })).toBe(1);
  });
});

describe('database pool', () => {
  it('reports the API pool and counts 40001 retries of withTx', async () => {
    const other = await h.other();
    const before = await scrape();
    expect(before.value('roost_db_pool_connections', { pool: 'api', state: 'max' })).toBe(20);
    expect(before.value('roost_db_pool_connections', { pool: 'api', state: 'total' })).toBeGreaterThan(0);
    // Write skew under SERIALIZABLE: each transaction reads one row and writes the other, both read
    // before either writes, so one of them fails with 40001 and withTx runs it again.
    let waiting: (() => void)[] = [];
    let firstRound = true;
    const bothRead = () =>
      new Promise<void>((resolve) => {
        if (!firstRound) return resolve();
        waiting.push(resolve);
        if (waiting.length === 2) {
          firstRound = false;
          for (const r of waiting) r();
          waiting = [];
        }
      });
    const skew = (read: string, write: string) =>
      withTx(h.deps.db, async (tx) => {
        await tx.query('SELECT name FROM sites WHERE site_id = $1', [read]);
        await bothRead();
        await tx.query('UPDATE sites SET timezone = timezone WHERE site_id = $1', [write]);
      });
    await Promise.all([skew(h.siteId, other.siteId), skew(other.siteId, h.siteId)]);
    const m = await scrape();
    expect(m.types.get('roost_db_tx_retries_total')).toBe('counter');
    expect(
      m.value('roost_db_tx_retries_total', { pool: 'api', code: '40001' }) -
        before.value('roost_db_tx_retries_total', { pool: 'api', code: '40001' }),
    ).toBe(1);
  });
});

describe('withTx (db/pool.ts)', () => {
  it('rejects, with nothing written, a transaction whose callback caught a failed statement and returned', async () => {
    const zone = async () => (await h.deps.db.query('SELECT timezone FROM sites WHERE site_id = $1', [h.siteId])).rows[0].timezone;
    const before = await zone();
    const out = withTx(h.deps.db, async (tx) => {
      await tx.query(`UPDATE sites SET timezone = 'Pacific/Chatham' WHERE site_id = $1`, [h.siteId]);
      // A unique violation or any other error aborts the transaction; catching it does not un-abort it.
      await tx.query('SELECT 1 / 0').catch(() => undefined);
      return 'returned normally';
    });
    await expect(out).rejects.toThrow('the transaction was rolled back at COMMIT');
    expect(await zone()).toBe(before);
  });
});

describe('event stream', () => {
  it('reports connected stream clients', async () => {
    const base = await h.listen();
    const before = (await scrape()).value('roost_event_stream_connections');
    const ctl = new AbortController();
    const res = await fetch(`${base}/api/events/stream?siteId=${h.siteId}`, {
      headers: { authorization: `Bearer ${h.apiKey}`, accept: 'text/event-stream' },
      signal: ctl.signal,
    });
    expect(res.status).toBe(200);
    expect((await scrape()).value('roost_event_stream_connections')).toBe(before + 1);
    ctl.abort();
    await res.body?.cancel().catch(() => undefined);
    // The hub notices the closed socket on its own; poll for it rather than assert after a fixed time.
    let now = (await scrape()).value('roost_event_stream_connections');
    for (let i = 0; i < 100 && now !== before; i++) {
      await new Promise((r) => setTimeout(r, 20));
      now = (await scrape()).value('roost_event_stream_connections');
    }
    expect(now).toBe(before);
  });
});

describe('separate listener (ROOST_METRICS_PORT)', () => {
  let api: RunningApi;
  beforeAll(async () => {
    api = await startApi(testConfig({ ROOST_API_PORT: '0', ROOST_METRICS_PORT: '0', ROOST_TASK_QUEUE: 'metrics-listener' }), {
      loggerInstance: testLogger('roost-api'),
    });
  });
  afterAll(async () => api.close());

  it('serves the registry without a token on its own port, and nothing else', async () => {
    expect(api.metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    expect((await fetch(`${api.url}/api/version`)).status).toBe(200);
    const res = await fetch(api.metricsUrl!);
    expect(res.status).toBe(200);
    const m = parseMetrics(await res.text());
    expect(m.value('roost_http_requests_total', { route: '/api/version', status_class: '2xx' })).toBeGreaterThanOrEqual(1);
    expect(m.has('roost_db_pool_connections', { pool: 'api', state: 'max' })).toBe(true);
    expect((await fetch(api.metricsUrl!.replace('/metrics', '/api/version'))).status).toBe(404);
    // Without ROOST_METRICS_TOKEN the API listener itself answers 404 for /metrics.
    expect((await fetch(`${api.url}/metrics`)).status).toBe(404);
  });
});
