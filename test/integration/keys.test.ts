/**
 * The API key lifecycle (docs/contract.md "API keys, identity, version, quota", "API key and scope",
 * Authentication 3–5, 8, 10): create (session or ID token only), list, rotate with a 24 h grace, revoke,
 * expiry, lastUsedAt, and the superadmin surface /api/account/api-keys.
 */
import { sha256Hex } from '../../domain/hex';
import { DAY_MS } from '../../domain/keys';
import { createHarness, type Harness } from '../support/harness';
import { addMember, idTokenFor, insertKey, makeUser, sessionFor } from '../support/identity';

let h: Harness;
let member: { uid: string; email: string };
let memberToken: string;
let superToken: string;
let roostId: string;
const machineId = 'mach-keys-test-1';

beforeAll(async () => {
  h = await createHarness();
  member = await makeUser(h.deps.db);
  await addMember(h.deps.db, h.siteId, member.uid);
  memberToken = await idTokenFor(h, member);
  const owner = (await h.deps.db.query('SELECT uid, email FROM users WHERE uid = $1', [h.userId])).rows[0];
  superToken = await idTokenFor(h, owner);
  const roost = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'keys-test-roost' } });
  expect(roost.statusCode).toBe(201);
  roostId = roost.json().roostId;
  await h.deps.db.query('INSERT INTO machines (site_id, machine_id) VALUES ($1, $2)', [h.siteId, machineId]);
});
afterAll(async () => h.close());

type Res = Awaited<ReturnType<Harness['request']>>;
function expectProblem(res: Res, status: number, code: string): any {
  expect({ status: res.statusCode, code: res.json().code }).toEqual({ status, code });
  return res.json();
}

const create = (key: string | null, body: unknown) => h.request({ method: 'POST', url: '/api/keys', key, body });
const readSite = (siteId: string) => [{ resource: 'site', id: siteId, permissions: ['read'] }];

describe('POST /api/keys', () => {
  it('needs a session or ID token: API keys get 403 forbidden, nothing gets 401', async () => {
    expectProblem(await create(h.apiKey, { name: 'x', preset: 'readonly' }), 403, 'forbidden');
    // The capability check comes before body validation: an API key learns nothing about the body rules.
    expectProblem(await create(h.apiKey, { bogus: true }), 403, 'forbidden');
    expectProblem(await create(null, { name: 'x', preset: 'readonly' }), 401, 'unauthorized');
  });

  it('creates a key from a preset with an ID token: raw key once, stored as a digest, usable at once', async () => {
    const res = await create(memberToken, { name: 'ci', preset: 'publisher' });
    expect(res.statusCode).toBe(201);
    expect(res.headers['cache-control']).toBe('no-store');
    const body = res.json();
    expect(body.key).toMatch(/^svk_live_[A-Za-z0-9_-]{43}$/);
    expect(body).toMatchObject({
      name: 'ci',
      environment: 'live',
      status: 'active',
      isLegacy: false,
      lastUsedAt: null,
      keyPrefix: body.key.slice(0, 12),
    });
    expect(body.scopes).toEqual(
      ['roost', 'site', 'machine', 'chat'].map((resource) => ({ resource, id: '*', permissions: ['read', 'write'] })),
    );
    expect(body.expiresAt - body.createdAt).toBe(90 * DAY_MS);
    const { rows } = await h.deps.db.query('SELECT * FROM api_keys WHERE key_id = $1', [body.keyId]);
    expect(rows[0].key_hash).toBe(sha256Hex(body.key));
    expect(JSON.stringify(rows[0])).not.toContain(body.key.slice(9));
    const who = await h.request({ method: 'GET', url: '/api/whoami', key: body.key });
    expect(who.json()).toMatchObject({ userId: member.uid, key: { keyId: body.keyId, environment: 'live' } });
    // Presets cover reading the member's site, not admin on it.
    expect((await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}`, key: body.key })).statusCode).toBe(200);
  });

  it('creates test keys, explicit scopes on own site, roost and machine ids, with a lifetime and a primary site', async () => {
    const { token } = await sessionFor(h, member);
    const res = await create(token, {
      name: 'sandbox',
      environment: 'test',
      lifetimeDays: 1,
      scopes: [
        { resource: 'site', id: h.siteId, permissions: ['read', 'read'] },
        { resource: 'roost', id: roostId, permissions: ['deploy'] },
        { resource: 'machine', id: machineId, permissions: ['write'] },
        { resource: 'chat', id: machineId, permissions: ['read'] },
      ],
    });
    expect(res.statusCode).toBe(201);
    const body = res.json();
    expect(body.key).toMatch(/^svk_test_/);
    expect(body.expiresAt - body.createdAt).toBe(DAY_MS);
    expect(body.primarySiteId).toBe(h.siteId);
    expect(body.scopes[0]).toEqual({ resource: 'site', id: h.siteId, permissions: ['read'] });
  });

  it('rejects scopes together with a preset, neither, and bad lifetimes with validation_failed', async () => {
    const both = expectProblem(
      await create(memberToken, { name: 'x', preset: 'admin', scopes: readSite(h.siteId) }),
      400,
      'validation_failed',
    );
    expect(Object.keys(both.errors)).toEqual(expect.arrayContaining(['preset', 'scopes']));
    expect(expectProblem(await create(memberToken, { name: 'x' }), 400, 'validation_failed').errors.scopes).toBeDefined();
    for (const lifetimeDays of [0, 366, 1.5]) {
      expect(
        expectProblem(await create(memberToken, { name: 'x', preset: 'readonly', lifetimeDays }), 400, 'validation_failed').errors
          .lifetimeDays,
      ).toBeDefined();
    }
    expectProblem(await create(memberToken, { name: 'x', preset: 'superuser' }), 400, 'validation_failed');
    expectProblem(await create(memberToken, { name: 'x', environment: 'prod', preset: 'readonly' }), 400, 'validation_failed');
    expectProblem(
      await create(memberToken, { name: 'x', scopes: [{ resource: 'site', id: h.siteId, permissions: [] }] }),
      400,
      'validation_failed',
    );
    expectProblem(
      await create(memberToken, { name: 'x', scopes: [{ resource: 'planet', id: '*', permissions: ['read'] }] }),
      400,
      'validation_failed',
    );
    const many = Array.from({ length: 51 }, () => ({ resource: 'site', id: '*', permissions: ['read'] }));
    expectProblem(await create(memberToken, { name: 'x', scopes: many }), 400, 'validation_failed');
    expectProblem(await create(memberToken, { preset: 'readonly' }), 400, 'validation_failed');
  });

  it('rejects scope ids the user cannot access, naming the dotted path', async () => {
    const other = await h.other();
    const res = await create(memberToken, {
      name: 'x',
      scopes: [
        { resource: 'site', id: h.siteId, permissions: ['read'] },
        { resource: 'site', id: other.siteId, permissions: ['read'] },
        { resource: 'roost', id: 'rst_nope', permissions: ['read'] },
        { resource: 'machine', id: 'nope', permissions: ['read'] },
      ],
    });
    const p = expectProblem(res, 400, 'validation_failed');
    expect(Object.keys(p.errors).sort()).toEqual(['scopes.1.id', 'scopes.2.id', 'scopes.3.id']);
    expect(
      expectProblem(await create(memberToken, { name: 'x', preset: 'readonly', primarySiteId: other.siteId }), 400, 'validation_failed')
        .errors.primarySiteId,
    ).toBeDefined();
  });

  it('keeps platform scopes (user, installer) for superadmins, with id *', async () => {
    expectProblem(
      await create(memberToken, { name: 'x', scopes: [{ resource: 'installer', id: '*', permissions: ['read'] }] }),
      403,
      'forbidden',
    );
    const bad = expectProblem(
      await create(superToken, { name: 'x', scopes: [{ resource: 'user', id: member.uid, permissions: ['admin'] }] }),
      400,
      'validation_failed',
    );
    expect(bad.errors['scopes.0.id']).toBeDefined();
    const ok = await create(superToken, {
      name: 'platform',
      scopes: [
        { resource: 'user', id: '*', permissions: ['admin'] },
        { resource: 'installer', id: '*', permissions: ['read', 'write'] },
      ],
    });
    expect(ok.statusCode).toBe(201);
    // A superadmin may name any site.
    const other = await h.other();
    expect((await create(superToken, { name: 'any-site', scopes: readSite(other.siteId) })).statusCode).toBe(201);
  });

  it('creates nothing on a refused request', async () => {
    const count = async () => (await h.deps.db.query('SELECT count(*)::int AS n FROM api_keys WHERE uid = $1', [member.uid])).rows[0].n;
    const before = await count();
    await create(h.apiKey, { name: 'x', preset: 'readonly' });
    await create(memberToken, { name: 'x', scopes: [{ resource: 'site', id: 'site_elsewhere', permissions: ['read'] }] });
    await create(memberToken, { name: 'x', scopes: [{ resource: 'user', id: '*', permissions: ['read'] }] });
    expect(await count()).toBe(before);
  });
});

describe('GET /api/keys', () => {
  it("lists only the caller's keys with status fields, never the raw key, paged", async () => {
    const u = await makeUser(h.deps.db);
    await addMember(h.deps.db, h.siteId, u.uid);
    const token = await idTokenFor(h, u);
    const made: { keyId: string; key: string }[] = [];
    for (const name of ['one', 'two', 'three']) made.push((await create(token, { name, preset: 'readonly' })).json());
    const all = await h.request({ method: 'GET', url: '/api/keys', key: token });
    expect(all.statusCode).toBe(200);
    const body = all.json();
    expect(body.keys.map((k: any) => k.name)).toEqual(['three', 'two', 'one']);
    for (const k of body.keys) {
      expect(Object.keys(k).sort()).toEqual(
        [
          'createdAt',
          'environment',
          'expiresAt',
          'graceUntil',
          'isLegacy',
          'keyId',
          'keyPrefix',
          'lastUsedAt',
          'name',
          'primarySiteId',
          'replacedBy',
          'revokedAt',
          'rotatedAt',
          'rotatedFrom',
          'scopes',
          'status',
        ].sort(),
      );
    }
    for (const m of made) expect(all.body).not.toContain(m.key.slice(9));
    expect(body.next_page_token).toBe('');
    // Paging round-trips the opaque token.
    const p1 = (await h.request({ method: 'GET', url: '/api/keys?page_size=2', key: token })).json();
    expect(p1.keys).toHaveLength(2);
    expect(p1.nextPageToken).toBe(p1.next_page_token);
    const p2 = (await h.request({ method: 'GET', url: `/api/keys?page_size=2&page_token=${p1.next_page_token}`, key: token })).json();
    expect(p2.keys.map((k: any) => k.name)).toEqual(['one']);
    expect(p2.next_page_token).toBe('');
    expectProblem(await h.request({ method: 'GET', url: '/api/keys?page_size=101', key: token }), 400, 'validation_failed');
    expectProblem(await h.request({ method: 'GET', url: '/api/keys?page_token=garbage', key: token }), 400, 'validation_failed');
    expectProblem(await h.request({ method: 'GET', url: '/api/keys' }), 403, 'forbidden');
  });

  it('records lastUsedAt when a key is used', async () => {
    const made = (await create(memberToken, { name: 'used', preset: 'readonly' })).json();
    await h.request({ method: 'GET', url: '/api/whoami', key: made.key });
    const keys = (await h.request({ method: 'GET', url: '/api/keys?page_size=100', key: memberToken })).json().keys;
    expect(keys.find((k: any) => k.keyId === made.keyId).lastUsedAt).toEqual(expect.any(Number));
  });
});

describe('rotate, revoke, expire', () => {
  it('rotates: same scopes and environment, raw key once, the old key works during the 24 h grace then 401', async () => {
    const old = (await create(memberToken, { name: 'rot', environment: 'test', lifetimeDays: 30, scopes: readSite(h.siteId) })).json();
    const res = await h.request({ method: 'POST', url: `/api/keys/${old.keyId}/rotate`, key: memberToken });
    expect(res.statusCode).toBe(201);
    const next = res.json();
    expect(next.key).toMatch(/^svk_test_/);
    expect(next.key).not.toBe(old.key);
    expect(next).toMatchObject({ name: 'rot', environment: 'test', scopes: old.scopes, status: 'active', rotatedFrom: old.keyId });
    expect(next.expiresAt - next.createdAt).toBe(30 * DAY_MS);
    expect(next.previous.keyId).toBe(old.keyId);
    expect(next.previous.status).toBe('rotated');
    expect(next.previous.graceUntil - Date.now()).toBeGreaterThan(DAY_MS - 60_000);
    expect(next.previous.graceUntil - Date.now()).toBeLessThanOrEqual(DAY_MS);
    // Both keys work during the grace window.
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: old.key })).statusCode).toBe(200);
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: next.key })).statusCode).toBe(200);
    let list = (await h.request({ method: 'GET', url: '/api/keys?page_size=100', key: memberToken })).json().keys;
    expect(list.find((k: any) => k.keyId === old.keyId)).toMatchObject({ status: 'rotated', replacedBy: next.keyId });
    // A second rotation of the rotated key is refused.
    const again = expectProblem(
      await h.request({ method: 'POST', url: `/api/keys/${old.keyId}/rotate`, key: memberToken }),
      409,
      'conflict',
    );
    expect(again.status).toBe(409);
    // Grace over: the old key is retired and unauthorized (not token_expired).
    await h.deps.db.query('UPDATE api_keys SET grace_until = $2 WHERE key_id = $1', [old.keyId, Date.now() - 1]);
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: old.key }), 401, 'unauthorized');
    list = (await h.request({ method: 'GET', url: '/api/keys?page_size=100', key: memberToken })).json().keys;
    expect(list.find((k: any) => k.keyId === old.keyId).status).toBe('retired');
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: next.key })).statusCode).toBe(200);
  });

  it("rotation honours a lifetimeDays override, and another user's key is not_found", async () => {
    const old = (await create(memberToken, { name: 'rot2', preset: 'readonly' })).json();
    const res = await h.request({ method: 'POST', url: `/api/keys/${old.keyId}/rotate`, key: memberToken, body: { lifetimeDays: 7 } });
    expect(res.json().expiresAt - res.json().createdAt).toBe(7 * DAY_MS);
    expectProblem(await h.request({ method: 'POST', url: `/api/keys/${res.json().keyId}/rotate`, key: superToken }), 404, 'not_found');
    expectProblem(
      await h.request({ method: 'POST', url: `/api/keys/${res.json().keyId}/rotate`, key: memberToken, body: { lifetimeDays: 400 } }),
      400,
      'validation_failed',
    );
    expectProblem(await h.request({ method: 'POST', url: `/api/keys/key_missing/rotate`, key: memberToken }), 404, 'not_found');
    expectProblem(await h.request({ method: 'POST', url: `/api/keys/${res.json().keyId}/rotate`, key: res.json().key }), 403, 'forbidden');
  });

  it('concurrent rotations of one key: exactly one succeeds', async () => {
    const old = (await create(memberToken, { name: 'race', preset: 'readonly' })).json();
    const results = await Promise.all(
      [0, 1, 2].map(() => h.request({ method: 'POST', url: `/api/keys/${old.keyId}/rotate`, key: memberToken })),
    );
    expect(results.map((r) => r.statusCode).sort()).toEqual([201, 409, 409]);
    const { rows } = await h.deps.db.query('SELECT count(*)::int AS n FROM api_keys WHERE rotated_from = $1', [old.keyId]);
    expect(rows[0].n).toBe(1);
  });

  it('revokes immediately and for good; a repeat reports alreadyRevoked', async () => {
    const k = (await create(memberToken, { name: 'rev', preset: 'readonly' })).json();
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: k.key })).statusCode).toBe(200);
    expectProblem(await h.request({ method: 'DELETE', url: `/api/keys/${k.keyId}`, key: superToken }), 404, 'not_found');
    const res = await h.request({ method: 'DELETE', url: `/api/keys/${k.keyId}`, key: memberToken });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ keyId: k.keyId, status: 'revoked', alreadyRevoked: false, revokedAt: expect.any(Number) });
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: k.key }), 401, 'unauthorized');
    expect((await h.request({ method: 'DELETE', url: `/api/keys/${k.keyId}`, key: memberToken })).json()).toMatchObject({
      status: 'revoked',
      alreadyRevoked: true,
    });
    expectProblem(await h.request({ method: 'POST', url: `/api/keys/${k.keyId}/rotate`, key: memberToken }), 409, 'conflict');
  });

  it('answers token_expired for an expired key; rotating renews it', async () => {
    const k = (await create(memberToken, { name: 'exp', preset: 'readonly' })).json();
    await h.deps.db.query('UPDATE api_keys SET expires_at = $2 WHERE key_id = $1', [k.keyId, Date.now() - 1]);
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: k.key }), 401, 'token_expired');
    const list = (await h.request({ method: 'GET', url: '/api/keys?page_size=100', key: memberToken })).json().keys;
    expect(list.find((x: any) => x.keyId === k.keyId).status).toBe('expired');
    const renewed = await h.request({ method: 'POST', url: `/api/keys/${k.keyId}/rotate`, key: memberToken });
    expect(renewed.statusCode).toBe(201);
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: renewed.json().key })).statusCode).toBe(200);
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: k.key }), 401, 'token_expired');
  });

  it("a deleted user's keys stop working", async () => {
    const u = await makeUser(h.deps.db);
    const { raw } = await insertKey(h.deps.db, { uid: u.uid, scopes: [] });
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: raw })).statusCode).toBe(200);
    await h.deps.db.query('UPDATE users SET deleted = true WHERE uid = $1', [u.uid]);
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: raw }), 401, 'unauthorized');
  });
});

describe('/api/account/api-keys (superadmin)', () => {
  it('is for superadmins signed in with a session or ID token', async () => {
    expectProblem(await h.request({ method: 'GET', url: '/api/account/api-keys', key: memberToken }), 403, 'forbidden');
    expectProblem(await h.request({ method: 'GET', url: '/api/account/api-keys' }), 403, 'forbidden');
    expectProblem(await h.request({ method: 'GET', url: '/api/account/api-keys', key: null }), 401, 'unauthorized');
    expectProblem(
      await h.request({
        method: 'POST',
        url: '/api/account/api-keys',
        key: memberToken,
        body: { userId: member.uid, name: 'x', preset: 'readonly' },
      }),
      403,
      'forbidden',
    );
  });

  it("lists every user's keys, filters by userId, creates for a user and revokes any key", async () => {
    const u = await makeUser(h.deps.db);
    await addMember(h.deps.db, h.siteId, u.uid);
    const made = await h.request({
      method: 'POST',
      url: '/api/account/api-keys',
      key: superToken,
      body: { email: u.email, name: 'for-u', scopes: readSite(h.siteId) },
    });
    expect(made.statusCode).toBe(201);
    const body = made.json();
    expect(body).toMatchObject({ userId: u.uid, email: u.email, createdBy: h.userId, status: 'active' });
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: body.key })).json().userId).toBe(u.uid);
    const list = (await h.request({ method: 'GET', url: `/api/account/api-keys?userId=${u.uid}`, key: superToken })).json();
    expect(list.keys.map((k: any) => k.keyId)).toEqual([body.keyId]);
    expect(JSON.stringify(list)).not.toContain(body.key.slice(9));
    const everyone = (await h.request({ method: 'GET', url: '/api/account/api-keys?page_size=100', key: superToken })).json();
    expect(new Set(everyone.keys.map((k: any) => k.userId)).size).toBeGreaterThan(1);
    const rev = await h.request({ method: 'DELETE', url: `/api/account/api-keys/${body.keyId}`, key: superToken });
    expect(rev.json()).toMatchObject({ keyId: body.keyId, status: 'revoked', alreadyRevoked: false, userId: u.uid });
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: body.key }), 401, 'unauthorized');
  });

  it('validates the owner and the scopes against the owner', async () => {
    expectProblem(
      await h.request({ method: 'POST', url: '/api/account/api-keys', key: superToken, body: { name: 'x', preset: 'readonly' } }),
      400,
      'validation_failed',
    );
    expectProblem(
      await h.request({
        method: 'POST',
        url: '/api/account/api-keys',
        key: superToken,
        body: { userId: member.uid, email: member.email, name: 'x', preset: 'readonly' },
      }),
      400,
      'validation_failed',
    );
    expectProblem(
      await h.request({
        method: 'POST',
        url: '/api/account/api-keys',
        key: superToken,
        body: { userId: 'usr_missing', name: 'x', preset: 'readonly' },
      }),
      404,
      'not_found',
    );
    const other = await h.other();
    const p = expectProblem(
      await h.request({
        method: 'POST',
        url: '/api/account/api-keys',
        key: superToken,
        body: { userId: member.uid, name: 'x', scopes: readSite(other.siteId) },
      }),
      400,
      'validation_failed',
    );
    expect(p.errors['scopes.0.id']).toBeDefined();
    expectProblem(
      await h.request({
        method: 'POST',
        url: '/api/account/api-keys',
        key: superToken,
        body: { userId: member.uid, name: 'x', scopes: [{ resource: 'user', id: '*', permissions: ['read'] }] },
      }),
      403,
      'forbidden',
    );
    expectProblem(await h.request({ method: 'DELETE', url: '/api/account/api-keys/key_missing', key: superToken }), 404, 'not_found');
  });
});
