/**
 * The OpenAPI 3.1 document (issue 3 "OpenAPI"; api/openapi.ts): every route the server registers is in
 * /api/openapi.json with its path parameters, querystring, body, a documented success response and the
 * problem+json error responses, security from its credential kind, and the Roost-Version and
 * Idempotency-Key headers; real responses validate against what the document says; the reference page
 * renders.
 */
import fs from 'node:fs';
import path from 'node:path';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { ERROR_STATUS } from '../../domain/errors';
import { CURRENT_API_VERSION, SUPPORTED_API_VERSIONS } from '../../api/plugins/api-version';
import { type RouteEntry, securityFor } from '../../api/openapi';
import { createHarness, type Harness } from '../support/harness';

let h: Harness;
let doc: any;
let routes: RouteEntry[];

beforeAll(async () => {
  h = await createHarness();
  const res = await h.request({ method: 'GET', url: '/api/openapi.json', key: null });
  expect(res.statusCode).toBe(200);
  doc = res.json();
  routes = h.app.routeTable.filter((r) => !r.docsUi);
});
afterAll(async () => h.close());

/** `/api/roosts/:roostId` → `/api/roosts/{roostId}`. */
const openapiPath = (url: string) => url.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
const operation = (r: RouteEntry) => doc.paths[openapiPath(r.url)]?.[r.method.toLowerCase()];
const label = (r: RouteEntry) => `${r.method} ${r.url}`;

/** Resolves a local `$ref` of the document. */
function deref(node: any): any {
  if (node && typeof node.$ref === 'string') {
    return node.$ref
      .replace(/^#\//, '')
      .split('/')
      .reduce((n: any, part: string) => n?.[part], doc);
  }
  return node;
}

/** Replaces every local `$ref` by its target (response schemas are not recursive; request bodies may hold the recursive JsonValue). */
function inline(node: any): any {
  if (Array.isArray(node)) return node.map(inline);
  if (node && typeof node === 'object') {
    if (typeof node.$ref === 'string') return inline(deref(node));
    return Object.fromEntries(Object.entries(node).map(([k, v]) => [k, inline(v)]));
  }
  return node;
}

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

/** Checks a real response against the document's schema for its route and status. */
function conforms(method: string, path: string, res: { statusCode: number; headers: Record<string, unknown>; json: () => unknown }): void {
  const op = doc.paths[path]?.[method.toLowerCase()];
  expect(op).toBeDefined();
  const documented = op.responses[String(res.statusCode)] ?? op.responses[`${String(res.statusCode)[0]}XX`];
  expect(documented).toBeDefined();
  const mediaType = String(res.headers['content-type']).split(';')[0];
  const schema = documented.content?.[mediaType]?.schema;
  expect(schema).toBeDefined();
  const validate = ajv.compile(inline(schema));
  const ok = validate(res.json());
  if (!ok) throw new Error(`${method} ${path} ${res.statusCode} does not match its documented schema: ${ajv.errorsText(validate.errors)}`);
}

describe('route coverage', () => {
  it('is an OpenAPI 3.1 document at the current API date', () => {
    expect(doc.openapi).toBe('3.1.0');
    expect(doc.info.version).toBe(CURRENT_API_VERSION);
    expect(routes.length).toBeGreaterThan(20);
  });

  it('lists every registered route (nothing is hidden but the reference page itself)', () => {
    const missing = routes.filter((r) => !operation(r)).map(label);
    expect(missing).toEqual([]);
    expect(routes.filter((r) => r.hidden).map(label)).toEqual([]);
    // …and nothing that is not registered.
    const registered = new Set(routes.map((r) => `${r.method.toLowerCase()} ${openapiPath(r.url)}`));
    const extra: string[] = [];
    for (const [path, item] of Object.entries<any>(doc.paths))
      for (const m of Object.keys(item)) if (!registered.has(`${m} ${path}`)) extra.push(`${m} ${path}`);
    expect(extra).toEqual([]);
  });

  it('contains the routes of the spec that this server implements', () => {
    const spec = [
      'post /api/roosts/{roostId}/versions',
      'patch /api/roosts/{roostId}/versions/{versionRef}',
      'get /api/roosts/{roostId}/versions',
      'get /api/roosts/{roostId}/versions/{versionRef}',
      'get /api/roosts/{roostId}/versions/{versionRef}/files',
      'get /api/roosts/{roostId}/versions/{versionRef}/diff',
      'post /api/roosts/{roostId}/rollback',
      'post /api/roosts/{roostId}/deploy',
      'get /api/roosts',
      'get /api/roosts/{roostId}',
      'post /api/roosts',
      'patch /api/roosts/{roostId}',
      'delete /api/roosts/{roostId}',
      'post /api/chunks/check',
      'post /api/chunks/upload-urls',
      'post /api/chunks/download-urls',
      'get /api/chunks/download-urls',
      'post /api/chunks/{digest}/mount',
      'get /api/chunks/{digest}/referrers',
      'get /api/sites/{siteId}/machines',
      'get /api/sites/{siteId}/machines/{machineId}',
      'get /api/sites/{siteId}/machines/{machineId}/deployments',
      'post /api/sites/{siteId}/machines/{machineId}/commands',
      'get /api/sites/{siteId}/machines/{machineId}/commands/{commandId}',
      'get /api/version',
      'get /api/whoami',
    ];
    const absent = spec.filter((s) => {
      const [m, p] = s.split(' ');
      return !doc.paths[p]?.[m];
    });
    expect(absent).toEqual([]);
  });

  it('gives every operation a documented success response and problem+json error responses', () => {
    const problems: string[] = [];
    for (const r of routes) {
      const op = operation(r);
      const statuses = Object.keys(op.responses);
      const success = statuses.filter((s) => /^2/.test(s));
      if (success.length === 0) problems.push(`${label(r)}: no 2xx response`);
      for (const s of success) {
        const res = op.responses[s];
        if (s !== '204' && !res.content) problems.push(`${label(r)}: ${s} has no content schema`);
        if (!res.headers?.['X-Request-Id'] || !res.headers?.['Roost-Version'])
          problems.push(`${label(r)}: ${s} lacks the standard headers`);
      }
      const errors = statuses.filter((s) => /^[45]/.test(s));
      if (!errors.some((s) => /^4/.test(s))) problems.push(`${label(r)}: no 4xx response`);
      for (const s of errors) {
        const content = op.responses[s].content;
        if (
          Object.keys(content ?? {}).join() !== 'application/problem+json' ||
          content['application/problem+json'].schema.$ref !== '#/components/schemas/Problem'
        ) {
          problems.push(`${label(r)}: ${s} is not the shared Problem`);
        }
      }
      // What every route can answer through the shared mechanisms.
      for (const s of ['400', '500']) if (!op.responses[s]) problems.push(`${label(r)}: no ${s}`);
      if (r.auth !== 'none' && !op.responses['401']) problems.push(`${label(r)}: no 401`);
      if ((r.auth === 'user' || r.auth === 'userOrAgent') && !op.responses['403']) problems.push(`${label(r)}: no 403`);
      if (r.idempotency !== 'ignored' && (!op.responses['409'] || !op.responses['422']))
        problems.push(`${label(r)}: keyed route lacks 409/422`);
      if (r.idempotency !== 'ignored' && !op.responses[statuses.find((s) => /^2/.test(s))!].headers['Idempotent-Replayed']) {
        problems.push(`${label(r)}: keyed route does not document Idempotent-Replayed`);
      }
    }
    expect(problems).toEqual([]);
  });

  it('documents path parameters, querystring and body from the route schemas', () => {
    const problems: string[] = [];
    for (const r of routes) {
      const op = operation(r);
      const params: any[] = op.parameters ?? [];
      for (const name of [...r.url.matchAll(/:([A-Za-z0-9_]+)/g)].map((m) => m[1])) {
        const p = params.find((x) => x.in === 'path' && x.name === name);
        if (!p || p.required !== true || !p.schema) problems.push(`${label(r)}: path parameter ${name}`);
      }
      for (const name of r.query) {
        // A credential in the query is documented as a security scheme, not as a parameter.
        if (name === 'api_key' && r.allowQueryKey) continue;
        if (!params.some((x) => x.in === 'query' && x.name === name && x.schema)) problems.push(`${label(r)}: query parameter ${name}`);
      }
      if (r.hasBody && !op.requestBody?.content) problems.push(`${label(r)}: request body`);
      // A query alias of a body field (rollout actions' and chunk mount's siteId…) is documented as that body field.
      const bodySchema = op.requestBody?.content?.['application/json']?.schema;
      for (const name of r.queryAliases) {
        if (params.some((x) => x.in === 'query' && x.name === name))
          problems.push(`${label(r)}: alias ${name} listed as a query parameter`);
        if (!bodySchema?.properties?.[name] || !bodySchema.required?.includes(name))
          problems.push(`${label(r)}: alias ${name} not a required body field`);
      }
    }
    expect(problems).toEqual([]);
    expect(routes.filter((r) => r.queryAliases.length > 0).map(label)).toEqual(
      expect.arrayContaining(['POST /api/chunks/:digest/mount', 'POST /api/roosts/:roostId/rollouts/:rolloutId/pause']),
    );
  });

  it('states security, Roost-Version and Idempotency-Key per operation', () => {
    const problems: string[] = [];
    const operationIds = new Set<string>();
    for (const r of routes) {
      const op = operation(r);
      if (JSON.stringify(op.security) !== JSON.stringify(securityFor(r.auth, r.allowQueryKey, r.method)))
        problems.push(`${label(r)}: security ${JSON.stringify(op.security)}`);
      // The compatibility forms only where docs/decisions/credential-forms.md selects them: x-api-key on reads,
      // ?api_key= on routes with allowQueryKey (the event stream).
      const schemes = (op.security ?? []).flatMap((s: object) => Object.keys(s));
      if (schemes.includes('apiKeyHeader') && r.method !== 'GET' && r.method !== 'HEAD')
        problems.push(`${label(r)}: x-api-key on a mutation`);
      if (schemes.includes('apiKeyQuery') && !r.allowQueryKey) problems.push(`${label(r)}: ?api_key= not selected`);
      const header = (name: string) => (op.parameters ?? []).find((p: any) => p.in === 'header' && p.name === name);
      const version = header('Roost-Version');
      if (!version || version.required !== false || JSON.stringify(version.schema.enum) !== JSON.stringify([...SUPPORTED_API_VERSIONS]))
        problems.push(`${label(r)}: Roost-Version`);
      const idem = header('Idempotency-Key');
      if (r.idempotency === 'ignored' ? idem : !idem || idem.required !== (r.idempotency === 'required') || idem.schema.maxLength !== 255) {
        problems.push(`${label(r)}: Idempotency-Key (${r.idempotency})`);
      }
      if (r.method !== 'GET' && op['x-idempotency'] !== r.idempotency) problems.push(`${label(r)}: x-idempotency`);
      if (!op.operationId || operationIds.has(op.operationId)) problems.push(`${label(r)}: operationId ${op.operationId}`);
      operationIds.add(op.operationId);
      if (!op.tags?.length || !op.summary) problems.push(`${label(r)}: tags/summary`);
    }
    expect(problems).toEqual([]);
    const declared = new Set(doc.tags.map((t: { name: string }) => t.name));
    for (const r of routes) for (const t of operation(r).tags) expect(declared).toContain(t);
  });

  it('defines the shared Problem component with the envelope of docs/contract.md "Errors", and every $ref resolves', () => {
    const problem = doc.components.schemas.Problem;
    expect(problem.required).toEqual(expect.arrayContaining(['type', 'title', 'status', 'detail', 'code', 'docsUrl', 'requestId']));
    expect(Object.keys(problem.properties)).toEqual(expect.arrayContaining(['param', 'errors']));
    expect(problem.additionalProperties).toBe(true);
    const refs: string[] = [];
    const walk = (n: any) => {
      if (Array.isArray(n)) n.forEach(walk);
      else if (n && typeof n === 'object') {
        if (typeof n.$ref === 'string') refs.push(n.$ref);
        Object.values(n).forEach(walk);
      }
    };
    walk(doc);
    expect(refs.length).toBeGreaterThan(0);
    for (const ref of new Set(refs)) expect([ref, deref({ $ref: ref })]).toEqual([ref, expect.anything()]);
    for (const scheme of doc.security.flatMap((s: object) => Object.keys(s))) expect(doc.components.securitySchemes[scheme]).toBeDefined();
  });

  it('documents 429 rate_limited where a rate-limit bucket counts the request', () => {
    const roosts = doc.paths['/api/roosts'].get.responses['429'];
    expect(roosts.description).toContain('rate_limited');
    expect(Object.keys(roosts.headers)).toEqual(expect.arrayContaining(['Retry-After', 'Roost-Rate-Limited-Reason']));
    expect(doc.paths['/api/version'].get.responses['429']).toBeUndefined();
  });

  it('lists every error code of the catalogue in the description, with an anchor docsUrl can point at', () => {
    for (const code of Object.keys(ERROR_STATUS)) expect(doc.info.description).toContain(`id="error-${code}"`);
  });

  it("lists every error code of the catalogue, with its status, in docs/contract.md's Errors table", () => {
    const text = fs.readFileSync(path.join(__dirname, '..', '..', 'docs', 'contract.md'), 'utf8');
    const table = text.slice(text.indexOf('| code | status | when |'), text.indexOf('\nClients retry 429'));
    const documented = new Map<string, string>();
    for (const row of table.split('\n').slice(2)) {
      const [codes, status] = row
        .split('|')
        .slice(1, 3)
        .map((c) => c.trim());
      for (const code of codes?.split(',') ?? []) documented.set(code.trim(), status ?? '');
    }
    for (const [code, status] of Object.entries(ERROR_STATUS))
      expect([code, documented.get(code)?.includes(String(status))]).toEqual([code, true]);
  });
});

describe('real responses match the document', () => {
  it('success bodies validate against their documented schemas', async () => {
    conforms('GET', '/api/version', await h.request({ method: 'GET', url: '/api/version', key: null }));
    conforms('GET', '/api/whoami', await h.request({ method: 'GET', url: '/api/whoami' }));
    const created = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'documented' } });
    expect(created.statusCode).toBe(201);
    conforms('POST', '/api/roosts', created);
    conforms('GET', '/api/roosts', await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` }));
    conforms(
      'GET',
      '/api/roosts/{roostId}',
      await h.request({ method: 'GET', url: `/api/roosts/${created.json().roostId}?siteId=${h.siteId}` }),
    );
    conforms('GET', '/api/sites/{siteId}/machines', await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines` }));
  });

  it('error bodies are the documented Problem for each kind of failure', async () => {
    const cases = [
      { method: 'GET', path: '/api/roosts', url: '/api/roosts', status: 400, code: 'validation_failed' },
      { method: 'GET', path: '/api/roosts', url: `/api/roosts?siteId=${h.siteId}`, key: null, status: 401, code: 'unauthorized' },
      { method: 'GET', path: '/api/roosts/{roostId}', url: `/api/roosts/rst_missing?siteId=${h.siteId}`, status: 404, code: 'not_found' },
      {
        method: 'GET',
        path: '/api/version',
        url: '/api/version',
        key: null,
        headers: { 'roost-version': '1999-01-01' },
        status: 400,
        code: 'unsupported_version',
      },
      {
        method: 'POST',
        path: '/api/roosts/{roostId}/rollback',
        url: '/api/roosts/rst_x/rollback',
        body: { siteId: h.siteId },
        status: 400,
        code: 'idempotency_key_required',
      },
    ];
    for (const c of cases) {
      const res = await h.request({ method: c.method, url: c.url, key: c.key, headers: c.headers, body: c.body });
      expect([c.url, res.statusCode, res.json().code]).toEqual([c.url, c.status, c.code]);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      conforms(c.method, c.path, res);
    }
  });
});

describe('reference page', () => {
  it('renders without credentials and loads the same document', async () => {
    const page = await h.request({ method: 'GET', url: '/docs/', key: null });
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toMatch(/text\/html/);
    expect(page.body).toMatch(/swagger-ui/i);
    const init = await h.request({ method: 'GET', url: '/docs/static/swagger-initializer.js', key: null });
    expect(init.statusCode).toBe(200);
    const json = await h.request({ method: 'GET', url: '/docs/json', key: null });
    expect(json.statusCode).toBe(200);
    expect(json.json()).toEqual(doc);
    const yaml = await h.request({ method: 'GET', url: '/docs/yaml', key: null });
    expect(yaml.statusCode).toBe(200);
    expect(yaml.body).toContain('openapi: 3.1.0');
  });
});

describe('the document says what the server enforces', () => {
  const NO_NUL = '^[^\\u0000]*$';
  const param = (path: string, method: string, name: string) =>
    doc.paths[path][method].parameters.find((p: any) => p.in === 'query' && p.name === name)?.schema;
  const body = (path: string, method: string) => doc.paths[path][method].requestBody.content['application/json'].schema;

  it("types every paged route's page_size and limit as integers with the route's bounds", () => {
    const paged = routes.filter((r) => r.paged);
    expect(paged.length).toBeGreaterThan(10);
    for (const r of paged) {
      const op = operation(r);
      for (const name of ['page_size', 'limit']) {
        const p = op.parameters.find((x: any) => x.in === 'query' && x.name === name);
        const s = p.schema;
        // Routes that clamp instead of refusing (the conversation lists) take any text and say so.
        if (s.type === 'string' && /clamped/.test(`${p.description ?? ''} ${s.description ?? ''}`)) continue;
        expect([label(r), name, s.type, s.minimum, typeof s.maximum, typeof s.default]).toEqual([
          label(r),
          name,
          'integer',
          1,
          'number',
          'number',
        ]);
      }
    }
    expect(param('/api/roosts/{roostId}/versions/{versionRef}/files', 'get', 'page_size')).toMatchObject({ maximum: 500, default: 100 });
    expect(param('/api/sites/{siteId}/audit-log', 'get', 'limit')).toMatchObject({ maximum: 200, default: 50 });
    // The limits the handler pages with, not a shared default (docs/contract.md Limits: deployments 1..100, default 25).
    for (const path of ['/api/sites/{siteId}/deployments', '/api/sites/{siteId}/installer-templates']) {
      for (const name of ['page_size', 'limit'])
        expect([path, name, param(path, 'get', name)]).toMatchObject([path, name, { maximum: 100, default: 25 }]);
    }
    for (const name of ['page_size', 'limit']) expect(param('/api/cortex/conversations', 'get', name)).toMatchObject({ type: 'string' });
  });

  it('states the input rule: no U+0000 in request strings and object keys; free-form JSON is JsonValue', () => {
    expect(param('/api/sites/{siteId}/audit-log', 'get', 'kind').pattern).toBe(NO_NUL);
    const hb = body('/api/agent/heartbeat', 'post');
    expect(hb.properties.hostname.pattern).toBe(NO_NUL);
    expect(hb.propertyNames).toEqual({ pattern: NO_NUL });
    expect(hb.properties.metrics.propertyNames).toEqual({ pattern: NO_NUL });
    expect(doc.components.schemas.JsonValue.anyOf).toContainEqual({ type: 'string', pattern: NO_NUL });
    // The pattern is the server's rule: a string it matches is accepted, U+0000 is refused (api/plugins/input.ts).
    expect(new RegExp(NO_NUL).test('plain')).toBe(true);
    expect(new RegExp(NO_NUL).test('a\u0000b')).toBe(false);
  });

  it('states the input rule in every pattern of a request string: none admits U+0000', () => {
    const found: string[] = [];
    const walk = (node: unknown, where: string): void => {
      if (Array.isArray(node)) node.forEach((n, i) => walk(n, `${where}[${i}]`));
      else if (node && typeof node === 'object') {
        const n = node as Record<string, unknown>;
        if (n.type === 'string' && typeof n.pattern === 'string') {
          const re = new RegExp(n.pattern, 'u');
          if (re.test('a\u0000b') || re.test('\u0000')) found.push(`${where}: ${n.pattern}`);
        }
        for (const [k, v] of Object.entries(n)) walk(v, `${where}.${k}`);
      }
    };
    for (const [path, ops] of Object.entries<any>(doc.paths))
      for (const [method, op] of Object.entries<any>(ops)) {
        walk(op.parameters, `${method} ${path} parameters`);
        walk(op.requestBody, `${method} ${path} body`);
      }
    expect(found).toEqual([]);
  });

  it('documents the screenshot upload as image/png bytes of at most 10 MiB, with its 413 and 415', () => {
    const op = doc.paths['/api/agent/commands/{commandId}/screenshot'].put;
    expect(op.requestBody).toEqual({
      required: true,
      content: {
        'image/png': {
          schema: {
            type: 'string',
            format: 'binary',
            contentMediaType: 'image/png',
            description: 'the PNG (starts with the PNG signature), at most 10485760 bytes (10 MiB)',
          },
        },
      },
    });
    expect(Object.keys(op.responses)).toEqual(['200', '400', '401', '404', '409', '413', '415', '500']);
    expect(op.responses['413'].description).toMatch(/^Payload too large \(problem\+json; code `payload_too_large`.*10 MiB/);
    expect(op.responses['415'].description).toMatch(/^Unsupported media type \(problem\+json; code `unsupported_media_type`.*image\/png/);
    // The route table knows the route takes bytes, and every JSON route documents 415 with its real code.
    const entry = routes.find((r) => r.method === 'PUT' && r.url === '/api/agent/commands/:commandId/screenshot');
    expect(entry?.consumes).toEqual(['image/png']);
    for (const r of routes.filter((x) => x.hasBody && x !== entry)) {
      expect([label(r), r.consumes]).toEqual([label(r), ['application/json']]);
      expect([label(r), Object.keys(operation(r).requestBody.content)]).toEqual([label(r), ['application/json']]);
      expect([label(r), operation(r).responses['415']?.description]).toEqual([
        label(r),
        expect.stringContaining('`unsupported_media_type`'),
      ]);
    }
  });

  it('closes bodies whose unknown fields are refused, and PATCH bodies need a change', () => {
    expect(body('/api/roosts', 'post').additionalProperties).toBe(false);
    const patchRoost = body('/api/roosts/{roostId}', 'patch');
    expect([patchRoost.additionalProperties, patchRoost.minProperties]).toEqual([false, 2]);
    const patchHook = body('/api/sites/{siteId}/webhooks/{webhookId}', 'patch');
    expect([patchHook.additionalProperties, patchHook.minProperties]).toEqual([false, 1]);
    const patchVersion = body('/api/roosts/{roostId}/versions/{versionRef}', 'patch');
    expect([patchVersion.additionalProperties, [...patchVersion.required].sort()]).toEqual([false, ['description', 'siteId']]);
    // No custom annotation leaks into the document.
    expect(JSON.stringify(doc)).not.toMatch(/x-roost-/);
  });

  it('states the formats, enums and shapes that handlers check with codes of their own', async () => {
    const pathParam = (path: string, method: string, name: string) =>
      doc.paths[path][method].parameters.find((p: any) => p.in === 'path' && p.name === name)?.schema;
    const ref = new RegExp(pathParam('/api/roosts/{roostId}/versions/{versionRef}', 'get', 'versionRef').pattern);
    for (const ok of ['current', 'v3', '#3', '2147483647', 'a'.repeat(64), `vrs_${'a'.repeat(8)}`])
      expect([ok, ref.test(ok)]).toEqual([ok, true]);
    for (const bad of ['0', '2147483648', ' 3', 'latest', '']) expect([bad, ref.test(bad)]).toEqual([bad, false]);
    // ...and the server answers what the pattern refuses with its own code.
    const malformed = await h.request({ method: 'GET', url: `/api/roosts/rst_none/versions/0?siteId=${h.siteId}` });
    expect([malformed.statusCode, malformed.json().code]).toEqual([400, 'version_ref_malformed']);
    const since = new RegExp(param('/api/sites/{siteId}/audit-log', 'get', 'since').pattern);
    for (const ok of ['', '2024-02-29', '2026-01-31T12:00:00.5+05:30']) expect([ok, since.test(ok)]).toEqual([ok, true]);
    for (const bad of ['2026-02-29', '2026-01-31T24:00', '1.w']) {
      expect([bad, since.test(bad)]).toEqual([bad, false]);
      const res = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/audit-log?since=${encodeURIComponent(bad)}` });
      expect([bad, res.statusCode, res.json().param]).toEqual([bad, 400, 'since']);
    }
    // A command body's params depend on its type; an unknown type is 400 unsupported_command_type.
    const command = body('/api/sites/{siteId}/machines/{machineId}/commands', 'post');
    expect(command.anyOf).toHaveLength(2);
    for (const variant of command.anyOf) expect([variant.additionalProperties, variant.required]).toEqual([false, ['type']]);
    for (const t of ['reboot_machine', 'shutdown_machine', 'capture_screenshot'])
      expect(JSON.stringify(command.anyOf)).toContain(`"enum":["${t}"]`);
    expect(body('/api/sites/{siteId}/webhooks', 'post').properties.events.items.enum).toContain('version.published');
    expect(body('/api/sites/{siteId}/machines/{machineId}/processes', 'post').properties.id).toEqual({
      description: expect.any(String),
      not: {},
    });
    expect(body('/api/sites/{siteId}/deployments', 'post').anyOf).toEqual([
      { required: ['name', 'installer_url', 'installer_name', 'silent_flags'] },
      { required: ['template_id'] },
    ]);
    // Rollout actions: siteId documented in the body (required); the query form is an undocumented alias.
    const pause = doc.paths['/api/roosts/{roostId}/rollouts/{rolloutId}/pause'].post;
    expect(body('/api/roosts/{roostId}/rollouts/{rolloutId}/pause', 'post').required).toContain('siteId');
    expect(pause.parameters.some((p: any) => p.in === 'query' && p.name === 'siteId')).toBe(false);
    expect(Object.keys(doc.paths['/metrics'].get.responses)).toEqual(expect.arrayContaining(['200', '401', '404']));
  });

  it('the server refuses what the document refuses: sizes past the bound, an empty or non-integer limit', async () => {
    for (const q of ['page_size=101', 'limit=', 'limit=1.5', 'page_size=2&limit=x']) {
      const res = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}&${q}` });
      expect([q, res.statusCode, res.json().code]).toEqual([q, 400, 'validation_failed']);
    }
    const ok = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}&page_size=100&limit=1` });
    expect(ok.statusCode).toBe(200);
    const patch = await h.request({ method: 'PATCH', url: '/api/roosts/rst_none', body: { siteId: h.siteId } });
    expect([patch.statusCode, patch.json().code]).toEqual([400, 'validation_failed']);
  });

  it('a JSON body is not coerced: null or false where a string is required is 400 and nothing is created', async () => {
    for (const [field, value] of [
      ['extractPath', null],
      ['name', false],
      ['name', 5],
    ] as const) {
      const name = `coerced-${field}-${String(value)}`;
      const res = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name, [field]: value } });
      expect([field, value, res.statusCode, res.json().code, res.json().param]).toEqual([field, value, 400, 'validation_failed', field]);
    }
    const listed = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}&page_size=100` });
    expect(listed.json().roosts.filter((r: { name: string }) => r.name.startsWith('coerced-'))).toEqual([]);
    // Query parameters are text and still coerced to their type (?includeDeleted=true, ?page_size=5).
    const q = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}&includeDeleted=true&page_size=5` });
    expect(q.statusCode).toBe(200);
  });
});
