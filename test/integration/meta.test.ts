import { createHarness, type Harness } from '../support/harness';

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => h.close());

describe('GET /api/version', () => {
  it('is unauthenticated and lists supported dates', async () => {
    const res = await h.request({ method: 'GET', url: '/api/version', key: null });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.supported).toContain(body.current);
    expect(res.headers['x-request-id']).toMatch(/^req_/);
  });
  it('rejects an unsupported Roost-Version with sent and supported', async () => {
    const res = await h.request({ method: 'GET', url: '/api/version', key: null, headers: { 'roost-version': '1999-01-01' } });
    expect(res.statusCode).toBe(400);
    expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
    const body = res.json();
    expect(body).toMatchObject({ code: 'unsupported_version', status: 400, sent: '1999-01-01' });
    expect(body.requestId).toBe(res.headers['x-request-id']);
  });
});

describe('GET /api/whoami', () => {
  it('needs a credential', async () => {
    const res = await h.request({ method: 'GET', url: '/api/whoami', key: null });
    expect(res.statusCode).toBe(401);
    expect(res.json().code).toBe('unauthorized');
  });
  it('rejects a malformed and an unknown key', async () => {
    for (const key of ['nope', 'svk_live_' + 'A'.repeat(43)]) {
      const res = await h.request({ method: 'GET', url: '/api/whoami', key });
      expect(res.statusCode).toBe(401);
      expect(res.json().code).toBe('unauthorized');
    }
  });
  it('resolves the key and its user', async () => {
    const res = await h.request({ method: 'GET', url: '/api/whoami' });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.userId).toBe(h.userId);
    expect(body.role).toBe('superadmin');
    expect(body.key.keyPrefix).toBe(h.apiKey.slice(0, 12));
    expect(body.key.environment).toBe('live');
    expect(body.primarySiteId).toBe(h.siteId);
  });
  it('accepts x-api-key', async () => {
    const res = await h.request({ method: 'GET', url: '/api/whoami', key: null, headers: { 'x-api-key': h.apiKey } });
    expect(res.statusCode).toBe(200);
  });
});

describe('API reference', () => {
  it('serves the OpenAPI 3.1 document generated from the route schemas', async () => {
    const res = await h.request({ method: 'GET', url: '/api/openapi.json', key: null });
    expect(res.statusCode).toBe(200);
    const doc = res.json();
    expect(doc.openapi).toBe('3.1.0');
    expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/api/version', '/api/whoami']));
  });
  it('renders the reference page without credentials', async () => {
    const res = await h.request({ method: 'GET', url: '/docs/', key: null });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/text\/html/);
  });
});
