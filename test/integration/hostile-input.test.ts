/**
 * The one input rule (api/plugins/input.ts, docs/decisions/hostile-input.md) over the fields that used to reach
 * PostgreSQL and fail with 500: U+0000 and lone surrogates in any string, JSON nested too deep, prototype
 * keys. Every refusal is 400 validation_failed naming the field, and nothing changes.
 */
import net from 'node:net';
import { gzipSync } from 'node:zlib';
import { createHarness, type Harness } from '../support/harness';
import { makeUser, sessionFor } from '../support/identity';

let h: Harness;
let agentToken: string;
let roostId: string;
let webhookId: string;
let session: string;

const NUL = 'bad\u0000name';
const LONE = 'bad\ud800name';

/** A URL component carrying `bad`: a lone surrogate has no UTF-8 form, so it travels as the bytes a careless encoder makes. */
function urlPart(bad: string): string {
  return bad === LONE ? 'bad%ED%A0%80name' : encodeURIComponent(bad);
}

beforeAll(async () => {
  // Webhooks on loopback are allowed so no test here ever resolves a public name.
  h = await createHarness({ ROOST_WEBHOOK_ALLOW_PRIVATE: 'true' });
  const secret = await h.enrolmentSecret();
  const enrol = await h.request({
    method: 'POST',
    url: '/api/agent/enrol',
    key: null,
    idempotencyKey: true,
    body: { siteId: h.siteId, enrolmentSecret: secret, machineId: 'hostile-1', hostname: 'hostile-1.local', agentVersion: '3.1.0' },
  });
  expect(enrol.statusCode).toBe(201);
  agentToken = enrol.json().agentToken;
  const roost = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: h.siteId, name: 'hostile', targets: ['hostile-1'] },
  });
  expect(roost.statusCode).toBe(201);
  roostId = roost.json().roostId;
  const hook = await h.request({
    method: 'POST',
    url: `/api/sites/${h.siteId}/webhooks`,
    idempotencyKey: true,
    body: { url: 'http://127.0.0.1:9/roost', name: 'hostile hook', events: ['version.published'] },
  });
  expect(hook.statusCode).toBe(201);
  webhookId = hook.json().webhookId ?? hook.json().id;
  const owner = await makeUser(h.deps.db, { role: 'superadmin' });
  session = (await sessionFor(h, owner)).token;
});

afterAll(async () => {
  await h.close();
});

function expectRefused(res: { statusCode: number; headers: Record<string, unknown>; json: () => any }, param: string): void {
  expect(res.statusCode).toBe(400);
  expect(String(res.headers['content-type'])).toContain('application/problem+json');
  const body = res.json();
  expect(body.code).toBe('validation_failed');
  expect(body.param).toBe(param);
  expect(body.errors[param]).toEqual([expect.any(String)]);
}

describe.each([
  ['U+0000', NUL],
  ['a lone surrogate', LONE],
])('%s in a string is refused everywhere', (_what, bad) => {
  test('roost name on create and PATCH; nothing is created or renamed', async () => {
    const before = (await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}&includeDeleted=true` })).json().roosts.length;
    expectRefused(await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: bad } }), 'name');
    expectRefused(
      await h.request({ method: 'PATCH', url: `/api/roosts/${roostId}`, idempotencyKey: true, body: { siteId: h.siteId, name: bad } }),
      'name',
    );
    const after = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}&includeDeleted=true` });
    expect(after.json().roosts.length).toBe(before);
    expect((await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` })).json().name).toBe('hostile');
  });

  test('webhook name on create and PATCH', async () => {
    expectRefused(
      await h.request({
        method: 'POST',
        url: `/api/sites/${h.siteId}/webhooks`,
        idempotencyKey: true,
        body: { url: 'http://127.0.0.1:9/x', name: bad, events: ['version.published'] },
      }),
      'name',
    );
    expectRefused(
      await h.request({ method: 'PATCH', url: `/api/sites/${h.siteId}/webhooks/${webhookId}`, idempotencyKey: true, body: { name: bad } }),
      'name',
    );
    const hooks = (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/webhooks` })).json();
    expect((hooks.webhooks ?? hooks.items).map((w: { name: string }) => w.name)).toEqual(['hostile hook']);
  });

  test('API key name', async () => {
    expectRefused(await h.request({ method: 'POST', url: '/api/keys', key: session, body: { name: bad, preset: 'readonly' } }), 'name');
  });

  test('audit-log actor and kind queries', async () => {
    const enc = urlPart(bad);
    expectRefused(await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/audit-log?actor=${enc}` }), 'actor');
    expectRefused(await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/audit-log?kind=${enc}` }), 'kind');
  });

  test('enrol and heartbeat hostname, heartbeat metrics and capabilities maps', async () => {
    const secret = await h.enrolmentSecret();
    expectRefused(
      await h.request({
        method: 'POST',
        url: '/api/agent/enrol',
        key: null,
        idempotencyKey: true,
        body: { siteId: h.siteId, enrolmentSecret: secret, machineId: 'hostile-2', hostname: bad, agentVersion: '3.1.0' },
      }),
      'hostname',
    );
    const hb = (body: unknown) => h.request({ method: 'POST', url: '/api/agent/heartbeat', key: agentToken, body });
    expectRefused(await hb({ hostname: bad }), 'hostname');
    expectRefused(await hb({ metrics: { schemaVersion: 2, primary: { label: bad } } }), 'metrics.primary.label');
    expectRefused(await hb({ capabilities: { [bad]: true } }), 'capabilities');
    const machines = (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines` })).json();
    expect((machines.machines ?? machines.items).map((m: { machineId: string }) => m.machineId)).toEqual(['hostile-1']);
  });

  test('command and target-state error', async () => {
    expectRefused(
      await h.request({
        method: 'POST',
        url: '/api/agent/commands/cmd_0000000000000000',
        key: agentToken,
        body: { status: 'failed', error: bad },
      }),
      'error',
    );
    expectRefused(
      await h.request({
        method: 'PUT',
        url: `/api/agent/roosts/${roostId}/state`,
        key: agentToken,
        body: { versionId: 'a'.repeat(64), status: 'failed', error: bad },
      }),
      'error',
    );
  });

  test('path parameters', async () => {
    const res = await h.request({ method: 'GET', url: `/api/roosts/${urlPart(bad)}?siteId=${h.siteId}` });
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe('validation_failed');
  });
});

describe('documented maximums work over real HTTP', () => {
  test('GET /api/chunks/download-urls with 1,000 repeated hash parameters', async () => {
    const base = await h.listen();
    const hashes = Array.from({ length: 1000 }, (_, i) => i.toString(16).padStart(64, '0'));
    const url = `${base}/api/chunks/download-urls?siteId=${h.siteId}&${hashes.map((x) => `hash=${x}`).join('&')}`;
    expect(url.length).toBeGreaterThan(16 * 1024 * 4);
    const res = await fetch(url, { headers: { authorization: `Bearer ${h.apiKey}` } });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { urls: Record<string, string>; missing: string[] };
    expect(body.missing).toHaveLength(1000);
  });
});

describe('JSON shape', () => {
  function nested(depth: number): unknown {
    let v: unknown = 'leaf';
    for (let i = 0; i < depth; i++) v = { a: v };
    return v;
  }

  test('a version config nested 100,000 levels deep is 400, not a stack overflow', async () => {
    // Built as text: JSON.stringify itself would overflow on such a value.
    const config = '{"a":'.repeat(100_000) + '1' + '}'.repeat(100_000);
    const body =
      `{"siteId":"${h.siteId}","version":{"schemaVersion":2,"mediaType":"application/vnd.svc.version.v1+json",` +
      `"config":${config},"files":[{"path":"a.txt","size":0,"chunks":[]}]}}`;
    const res = await h.app.inject({
      method: 'POST',
      url: `/api/roosts/${roostId}/versions`,
      headers: { authorization: `Bearer ${h.apiKey}`, 'content-type': 'application/json', 'idempotency-key': 'deep-config-1' },
      payload: body,
    });
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe('validation_failed');
    expect(res.json().detail).toMatch(/deeper than 64 levels/);
    const versions = await h.request({ method: 'GET', url: `/api/roosts/${roostId}/versions?siteId=${h.siteId}` });
    expect(versions.json().versions).toEqual([]);
  });

  test('a body 64 levels deep is accepted, 65 is not', async () => {
    // root (1) → version (2) → config (3) → … : nested(n) reaches depth n + 2.
    const publish = (config: unknown) =>
      h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/versions`,
        idempotencyKey: true,
        body: {
          siteId: h.siteId,
          version: {
            schemaVersion: 2,
            mediaType: 'application/vnd.svc.version.v1+json',
            config,
            files: [{ path: 'a.txt', size: 0, chunks: [] }],
          },
        },
      });
    expect((await publish(nested(63))).statusCode).toBe(400);
    expect((await publish(nested(62))).statusCode).toBe(201);
  });

  test('a number beyond the double range (1e400) is 400 naming it, anywhere in the body; nothing is published', async () => {
    const list = async () =>
      (await h.request({ method: 'GET', url: `/api/roosts/${roostId}/versions?siteId=${h.siteId}` })).json().versions;
    const before = await list();
    for (const [config, extra, field] of [
      ['{"n":1e400}', '', 'version.config.n'],
      ['{"a":[-1e999]}', '', 'version.config.a.0'],
      ['{}', ',"extra":1e400', 'extra'],
    ]) {
      const body =
        `{"siteId":"${h.siteId}"${extra},"version":{"schemaVersion":2,"mediaType":"application/vnd.svc.version.v1+json",` +
        `"config":${config},"files":[{"path":"a.txt","size":0,"chunks":[]}]}}`;
      const res = await h.app.inject({
        method: 'POST',
        url: `/api/roosts/${roostId}/versions`,
        headers: { authorization: `Bearer ${h.apiKey}`, 'content-type': 'application/json', 'idempotency-key': `inf-${field}` },
        payload: body,
      });
      expectRefused(res, field);
      expect(res.json().detail).toMatch(/outside the range of a double/);
    }
    expect(await list()).toEqual(before);
  });

  test('a __proto__ key is refused by name', async () => {
    const res = await h.app.inject({
      method: 'POST',
      url: '/api/roosts',
      headers: { authorization: `Bearer ${h.apiKey}`, 'content-type': 'application/json' },
      payload: `{"siteId":"${h.siteId}","name":"x","__proto__":{"admin":true}}`,
    });
    expectRefused(res, '__proto__');
    expect(res.json().detail).toMatch(/__proto__ is not allowed/);
  });

  test('an empty or malformed body is 400 problem+json', async () => {
    for (const payload of ['', '{"siteId":']) {
      const res = await h.app.inject({
        method: 'POST',
        url: '/api/roosts',
        headers: { authorization: `Bearer ${h.apiKey}`, 'content-type': 'application/json' },
        payload,
      });
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('validation_failed');
    }
  });
});

describe('paths that are unsafe on Windows are refused where they enter', () => {
  const body = (paths: string[]) => ({
    siteId: h.siteId,
    version: {
      schemaVersion: 2,
      mediaType: 'application/vnd.svc.version.v1+json',
      config: {},
      files: paths.map((path) => ({ path, size: 0, chunks: [] })),
    },
  });

  test.each([
    [['A.txt', 'a.txt'], 'version.files.1.path', /collides on Windows with "A.txt"/],
    [['bin/tool', 'BIN/tool/x'], 'version.files.1.path', /is a file/],
    [['x/C:y'], 'version.files.0.path', /":"/],
    [['file.txt:ads'], 'version.files.0.path', /alternate data stream/],
    [['aux.txt'], 'version.files.0.path', /device/],
    [['dir/COM1'], 'version.files.0.path', /device/],
    [['LPT9.log'], 'version.files.0.path', /device/],
    [['trailing.'], 'version.files.0.path', /dot or a space/],
    [['space /x'], 'version.files.0.path', /dot or a space/],
  ])('publish %j', async (paths, field, why) => {
    const res = await h.request({ method: 'POST', url: `/api/roosts/${roostId}/versions`, idempotencyKey: true, body: body(paths) });
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe('validation_failed');
    expect(res.json().errors[field].join(' ')).toMatch(why);
  });

  test.each(['state.', 'STATE', 'chunks\\x', 'C:\\staging', 'apps/aux', 'apps/x:y'])(
    'extractPath %j on create, update and publish',
    async (bad) => {
      const before = (await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` })).json().extractPath;
      const create = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'x', extractPath: bad } });
      const update = await h.request({
        method: 'PATCH',
        url: `/api/roosts/${roostId}`,
        idempotencyKey: true,
        body: { siteId: h.siteId, extractPath: bad },
      });
      const publish = await h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/versions`,
        idempotencyKey: true,
        body: { ...body(['ok.txt']), extractPath: bad },
      });
      for (const res of [create, update, publish]) {
        expect(res.statusCode).toBe(400);
        expect(res.json().param).toBe('extractPath');
      }
      expect((await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` })).json().extractPath).toBe(before);
    },
  );

  test('a Windows extract root with a drive is accepted', async () => {
    const res = await h.request({
      method: 'PATCH',
      url: `/api/roosts/${roostId}`,
      idempotencyKey: true,
      body: { siteId: h.siteId, extractPath: 'C:\\Program Files\\Acme' },
    });
    expect(res.statusCode).toBe(200);
  });
});

describe('rollouts of a roost answer like every other roost route', () => {
  test("another site's siteId, or a deleted roost, is 404 not_found rather than an empty list", async () => {
    const other = await h.other();
    const foreign = await h.request({ method: 'GET', url: `/api/roosts/${roostId}/rollouts?siteId=${other.siteId}`, key: other.apiKey });
    expect([foreign.statusCode, foreign.json().code]).toEqual([404, 'not_found']);
    const gone = (await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'to delete' } })).json().roostId;
    expect((await h.request({ method: 'GET', url: `/api/roosts/${gone}/rollouts?siteId=${h.siteId}` })).statusCode).toBe(200);
    const del = await h.request({ method: 'DELETE', url: `/api/roosts/${gone}?siteId=${h.siteId}`, idempotencyKey: true });
    expect(del.statusCode).toBeLessThan(300);
    for (const url of [`/api/roosts/${gone}/rollouts?siteId=${h.siteId}`, `/api/roosts/${gone}/rollouts/rol_0000?siteId=${h.siteId}`]) {
      const res = await h.request({ method: 'GET', url });
      expect([res.statusCode, res.json().code]).toEqual([404, 'not_found']);
    }
  });
});

describe('framework-level refusals are problem+json with the right status', () => {
  const auth = () => ({ authorization: `Bearer ${h.apiKey}` });

  test('a body in any media type but JSON is 415 unsupported_media_type', async () => {
    for (const [type, payload] of [
      ['text/plain', 'hello'],
      ['application/xml', '<a/>'],
    ]) {
      const res = await h.app.inject({ method: 'POST', url: '/api/roosts', headers: { ...auth(), 'content-type': type }, payload });
      expect([res.statusCode, res.json().code, res.json().param]).toEqual([415, 'unsupported_media_type', 'Content-Type']);
    }
  });

  test('a 1,000-character path parameter is 400 naming it', async () => {
    const res = await h.app.inject({ method: 'GET', url: `/api/roosts/${'a'.repeat(1000)}?siteId=${h.siteId}`, headers: auth() });
    expect([res.statusCode, res.json().code]).toEqual([400, 'validation_failed']);
    expect(Object.keys(res.json().errors)).toEqual(['params.roostId']);
  });

  test('a known path with another method is 405 with Allow', async () => {
    const res = await h.app.inject({ method: 'DELETE', url: '/api/version', headers: auth() });
    expect([res.statusCode, res.json().code]).toEqual([405, 'method_not_allowed']);
    expect(res.headers.allow).toBe('GET, HEAD');
    const roost = await h.app.inject({ method: 'PUT', url: `/api/roosts/${roostId}`, headers: auth() });
    expect(roost.statusCode).toBe(405);
    expect(String(roost.headers.allow).split(', ').sort()).toEqual(['DELETE', 'GET', 'HEAD', 'PATCH']);
    const none = await h.app.inject({ method: 'GET', url: '/api/nothing-here', headers: auth() });
    expect([none.statusCode, none.json().code]).toEqual([404, 'not_found']);
  });

  test('Allow lists the methods whose route fits the path: /api/installer/latest is not a DELETE /api/installer/{version}', async () => {
    const latest = await h.app.inject({ method: 'OPTIONS', url: '/api/installer/latest', headers: auth() });
    expect([latest.statusCode, latest.headers.allow]).toEqual([405, 'GET, HEAD']);
    const upload = await h.app.inject({ method: 'OPTIONS', url: '/api/installer/upload', headers: auth() });
    expect([upload.statusCode, upload.headers.allow]).toEqual([405, 'POST, PUT']);
    const version = await h.app.inject({ method: 'OPTIONS', url: '/api/installer/1.2.3', headers: auth() });
    expect([version.statusCode, version.headers.allow]).toEqual([405, 'DELETE']);
    // DELETE /api/installer/{version} does not take `latest` (no version), GET /api/installer/latest does: 405.
    const del = await h.app.inject({ method: 'DELETE', url: '/api/installer/latest', headers: auth() });
    expect([del.statusCode, del.json().code, del.headers.allow]).toEqual([405, 'method_not_allowed', 'GET, HEAD']);
    const badVersion = await h.app.inject({ method: 'DELETE', url: '/api/installer/not-a-version', headers: auth() });
    expect([badVersion.statusCode, badVersion.json().code]).toEqual([400, 'validation_failed']);
    // No route's parameters fit a malformed id: the path still has the roost routes' shape.
    const malformed = await h.app.inject({ method: 'PUT', url: '/api/roosts/not-a-roost-id', headers: auth() });
    expect(malformed.statusCode).toBe(405);
    expect(String(malformed.headers.allow).split(', ').sort()).toEqual(['DELETE', 'GET', 'HEAD', 'PATCH']);
  });

  test('a method no route has (QUERY) is 405 with Allow on a known path and 404 elsewhere, whatever its body', async () => {
    // The framework refuses a QUERY without Content-Type (400) and parses the body of unmatched requests before the not-found handler runs.
    const query = await h.app.inject({ method: 'QUERY' as 'GET', url: '/api/version', headers: auth() });
    expect([query.statusCode, query.json().code, query.headers.allow]).toEqual([405, 'method_not_allowed', 'GET, HEAD']);
    const typed = await h.app.inject({
      method: 'QUERY' as 'GET',
      url: `/api/roosts/${roostId}`,
      headers: { ...auth(), 'content-type': 'text/csv' },
      payload: 'a,b',
    });
    expect([typed.statusCode, typed.json().code]).toEqual([405, 'method_not_allowed']);
    const badJson = await h.app.inject({
      method: 'POST',
      url: '/api/nothing-here',
      headers: { ...auth(), 'content-type': 'application/json' },
      payload: '{',
    });
    expect([badJson.statusCode, badJson.json().code]).toEqual([404, 'not_found']);
  });

  test('a compressed body (Content-Encoding gzip) is 415 naming the header, and nothing is created; identity is plain', async () => {
    const body = JSON.stringify({ siteId: h.siteId, name: 'compressed' });
    const before = (await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` })).json().roosts.length;
    const gz = await h.app.inject({
      method: 'POST',
      url: '/api/roosts',
      headers: { ...auth(), 'content-type': 'application/json', 'content-encoding': 'gzip' },
      payload: gzipSync(body),
    });
    expect([gz.statusCode, gz.json().code, gz.json().param]).toEqual([415, 'unsupported_media_type', 'Content-Encoding']);
    expect((await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` })).json().roosts.length).toBe(before);
    const plain = await h.app.inject({
      method: 'POST',
      url: '/api/roosts',
      headers: { ...auth(), 'content-type': 'application/json', 'content-encoding': 'identity' },
      payload: body,
    });
    expect(plain.statusCode).toBe(201);
  });

  test('over real HTTP: oversized headers, a control character in a header, no Host, an unknown Expect, an empty Idempotency-Key', async () => {
    const base = await h.listen();
    const { port } = new URL(base);
    const raw = (text: string) =>
      new Promise<string>((resolve, reject) => {
        const s = net.connect(Number(port), '127.0.0.1', () => s.end(text));
        let out = '';
        s.on('data', (d) => (out += d.toString('utf8')));
        s.on('end', () => resolve(out));
        s.on('error', reject);
      });
    const big = await raw(`GET /api/version HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(200 * 1024)}\r\n\r\n`);
    expect(big).toMatch(/^HTTP\/1.1 431 /);
    expect(big).toContain('application/problem+json');
    expect(JSON.parse(big.slice(big.indexOf('\r\n\r\n') + 4)).code).toBe('request_header_too_large');
    const ctl = await raw(`GET /api/version HTTP/1.1\r\nHost: x\r\nX-Bad: a\u0001b\r\n\r\n`);
    expect(ctl).toMatch(/^HTTP\/1.1 400 /);
    expect(JSON.parse(ctl.slice(ctl.indexOf('\r\n\r\n') + 4)).code).toBe('validation_failed');
    // Answers written straight to the socket name their type and docs under the public URL, like every other.
    const publicUrl = h.deps.cfg.publicUrl;
    for (const answer of [big, ctl, await raw('GARBAGE\r\n\r\n')]) {
      const body = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4));
      expect(body.type).toBe(`${publicUrl}/problems/${body.code.replace(/_/g, '-')}`);
      expect(body.docsUrl).toBe(`${publicUrl}/docs#error-${body.code}`);
      expect(answer).toMatch(new RegExp(`X-Request-Id: ${body.requestId}\r\n`, 'i'));
    }
    // HTTP/1.1 without Host: a problem document naming the header; HTTP/1.0 needs none.
    const noHost = await raw('GET /api/version HTTP/1.1\r\nConnection: close\r\n\r\n');
    expect(noHost).toMatch(/^HTTP\/1.1 400 /);
    expect(noHost).toMatch(/content-type: application\/problem\+json/i);
    const noHostBody = JSON.parse(noHost.slice(noHost.indexOf('\r\n\r\n') + 4));
    expect([noHostBody.code, noHostBody.param, noHostBody.type]).toEqual([
      'validation_failed',
      'Host',
      `${publicUrl}/problems/validation-failed`,
    ]);
    expect(noHost).toMatch(new RegExp(`x-request-id: ${noHostBody.requestId}\r\n`, 'i'));
    expect(await raw('GET /api/version HTTP/1.0\r\n\r\n')).toMatch(/^HTTP\/1.1 200 /);
    // An Expect other than 100-continue: 417 expectation_failed, and the request is not run.
    const roostsBefore = (await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` })).json().roosts.length;
    const createBody = JSON.stringify({ siteId: h.siteId, name: 'sent with Expect: bogus' });
    const expect417 = await raw(
      `POST /api/roosts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${h.apiKey}\r\nContent-Type: application/json\r\n` +
        `Expect: bogus\r\nContent-Length: ${Buffer.byteLength(createBody)}\r\nConnection: close\r\n\r\n${createBody}`,
    );
    expect(expect417).toMatch(/^HTTP\/1.1 417 /);
    expect(expect417).toMatch(/content-type: application\/problem\+json/i);
    const e417 = JSON.parse(expect417.slice(expect417.indexOf('\r\n\r\n') + 4));
    expect([e417.status, e417.code, e417.param]).toEqual([417, 'expectation_failed', 'Expect']);
    expect(expect417).toMatch(new RegExp(`x-request-id: ${e417.requestId}\r\n`, 'i'));
    expect((await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` })).json().roosts.length).toBe(roostsBefore);
    const res = await fetch(`${base}/api/roosts/${roostId}/rollback`, {
      method: 'POST',
      headers: { ...auth(), 'content-type': 'application/json', 'idempotency-key': '' },
      body: JSON.stringify({ siteId: h.siteId }),
    });
    expect([res.status, ((await res.json()) as { code: string }).code]).toEqual([400, 'idempotency_key_required']);
  });
});

describe('credential forms (docs/decisions/credential-forms.md)', () => {
  test('x-api-key works on reads and is refused on mutations, which change nothing', async () => {
    const read = await h.request({ method: 'GET', url: '/api/whoami', key: null, headers: { 'x-api-key': h.apiKey } });
    expect(read.statusCode).toBe(200);
    const before = (await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` })).json().roosts.length;
    const write = await h.request({
      method: 'POST',
      url: '/api/roosts',
      key: null,
      headers: { 'x-api-key': h.apiKey },
      body: { siteId: h.siteId, name: 'via x-api-key' },
    });
    expect([write.statusCode, write.json().code]).toEqual([401, 'unauthorized']);
    expect(write.json().detail).toMatch(/Authorization: Bearer/);
    expect((await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` })).json().roosts.length).toBe(before);
  });
});
