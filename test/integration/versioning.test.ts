/**
 * Versioning (docs/contract.md "Versioning"; api/plugins/api-version.ts; docs/decisions/api-versioning.md):
 * `GET /api/version` unauthenticated; `Roost-Version` checked on every route — registered or not,
 * authenticated or not — before credentials, body validation and Idempotency-Key; 400
 * unsupported_version with `sent` and `supported`; an absent header is served at the current date and
 * every response names the date it was served at.
 */
import { CURRENT_API_VERSION, SUPPORTED_API_VERSIONS } from '../../api/plugins/api-version';
import { createHarness, type Harness } from '../support/harness';

let h: Harness;
let supported: string[];
let current: string;

beforeAll(async () => {
  h = await createHarness();
  const res = await h.request({ method: 'GET', url: '/api/version', key: null });
  expect(res.statusCode).toBe(200);
  ({ supported, current } = res.json());
});
afterAll(async () => h.close());

/** Asserts a 400 unsupported_version problem naming `sent`. */
function expectUnsupported(res: Awaited<ReturnType<Harness['request']>>, sent: string, what: string): void {
  const body = res.json();
  expect([what, res.statusCode, body.code, body.sent]).toEqual([what, 400, 'unsupported_version', sent]);
  expect(body.supported).toEqual(supported);
  expect(body.status).toBe(400);
  expect(body.requestId).toBe(res.headers['x-request-id']);
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  expect(res.headers['roost-version']).toBe(current);
}

describe('GET /api/version', () => {
  it('is unauthenticated and lists the supported dates, oldest first, the current one last', async () => {
    const res = await h.request({ method: 'GET', url: '/api/version', key: null });
    expect(res.statusCode).toBe(200);
    expect(Object.keys(res.json()).sort()).toEqual(['current', 'supported']);
    expect(current).toBe(CURRENT_API_VERSION);
    expect(supported).toEqual([...SUPPORTED_API_VERSIONS]);
    expect([...supported].sort()).toEqual(supported);
    expect(supported[supported.length - 1]).toBe(current);
    for (const d of supported) expect(d).toMatch(/^\d{4}-\d{2}-\d{2}$/);
  });

  it('ignores credentials, even bad ones', async () => {
    const res = await h.request({ method: 'GET', url: '/api/version', key: 'not-a-key' });
    expect(res.statusCode).toBe(200);
  });
});

describe('Roost-Version', () => {
  const sample = () => [
    { what: 'unauthenticated route', method: 'GET', url: '/api/version', key: null },
    { what: 'authenticated read', method: 'GET', url: `/api/roosts?siteId=${h.siteId}` },
    { what: 'unknown route', method: 'GET', url: '/api/no-such-route' },
    { what: 'agent route', method: 'POST', url: '/api/agent/heartbeat', key: null },
    { what: 'reference page', method: 'GET', url: '/docs/', key: null },
  ];

  it('absent: served at the current date, which every response names (errors included)', async () => {
    for (const s of sample()) {
      const res = await h.request({ method: s.method, url: s.url, key: s.key });
      expect([s.what, res.headers['roost-version']]).toEqual([s.what, current]);
    }
  });

  it('a supported date is accepted and echoed', async () => {
    for (const date of supported) {
      for (const s of sample()) {
        const res = await h.request({ method: s.method, url: s.url, key: s.key, headers: { 'roost-version': date } });
        expect([s.what, res.headers['roost-version']]).toEqual([s.what, date]);
        if (s.what !== 'unknown route' && s.what !== 'agent route') expect([s.what, res.statusCode]).toEqual([s.what, 200]);
      }
    }
  });

  it('an unsupported value is 400 unsupported_version with sent and supported', async () => {
    for (const sent of ['1999-01-01', '2099-01-01', `${current}x`, '2026-11-1', 'latest', '']) {
      const res = await h.request({ method: 'GET', url: '/api/version', key: null, headers: { 'roost-version': sent } });
      expectUnsupported(res, sent, `GET /api/version with "${sent}"`);
    }
    // Two headers are not one date.
    const twice = await h.app.inject({ method: 'GET', url: '/api/version', headers: { 'roost-version': [current, current] } });
    expectUnsupported(twice, `${current}, ${current}`, 'repeated header');
  });

  it('is checked before credentials, validation and Idempotency-Key', async () => {
    const sent = '1999-01-01';
    const cases = [
      { what: 'no credential', method: 'GET', url: `/api/roosts?siteId=${h.siteId}`, key: null },
      { what: 'bad credential', method: 'GET', url: `/api/roosts?siteId=${h.siteId}`, key: 'svk_live_nope' },
      { what: 'invalid query', method: 'GET', url: '/api/roosts' },
      { what: 'invalid body', method: 'POST', url: '/api/roosts', body: { nope: true } },
      { what: 'missing Idempotency-Key', method: 'POST', url: '/api/roosts/rst_x/rollback', body: { siteId: h.siteId } },
      { what: 'hidden site', method: 'GET', url: '/api/roosts?siteId=site_someone_else' },
      { what: 'unknown route', method: 'DELETE', url: '/api/nothing/here' },
    ];
    for (const c of cases) {
      const res = await h.request({ method: c.method, url: c.url, key: c.key, body: c.body, headers: { 'roost-version': sent } });
      expectUnsupported(res, sent, c.what);
    }
  });

  it('is checked on every registered route', async () => {
    const sent = '1999-01-01';
    const routes = h.app.routeTable.filter((r) => !r.url.includes('*'));
    expect(routes.length).toBeGreaterThan(20);
    for (const r of routes) {
      const url = r.url.replace(/:([A-Za-z0-9_]+)/g, 'x');
      const res = await h.request({ method: r.method, url, key: null, headers: { 'roost-version': sent } });
      expectUnsupported(res, sent, `${r.method} ${r.url}`);
    }
  });

  it('changes nothing when refused', async () => {
    const name = `versioned-${Date.now()}`;
    const res = await h.request({
      method: 'POST',
      url: '/api/roosts',
      body: { siteId: h.siteId, name },
      headers: { 'roost-version': '1999-01-01' },
    });
    expect(res.statusCode).toBe(400);
    const { rows } = await h.deps.db.query('SELECT 1 FROM roosts WHERE site_id = $1 AND name = $2', [h.siteId, name]);
    expect(rows).toHaveLength(0);
  });
});
