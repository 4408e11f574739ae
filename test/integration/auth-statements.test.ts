/**
 * Authentication's per-request statements are prepared once per connection (db/pool.ts `prepared`, db/keys.ts
 * `keyForAuth`, db/sites.ts `siteAccess`), and nothing of what they read is kept between requests: two API
 * instances (two apps, two pools, one database, the shape of N API processes) see a revoked key, a removed
 * membership and a disabled roost site at once, on the very next request, even after both have authenticated
 * the same key often enough for PostgreSQL to switch the prepared statements to generic plans
 * (docs/contract.md "Authentication" 8: revocation is immediate).
 */
import { createHarness, type Harness } from '../support/harness';
import { addMember, idTokenFor, insertKey, makeUser } from '../support/identity';
import { VERSION_MEDIA_TYPE } from '../../domain/version';

let a: Harness;
let b: Harness;

beforeAll(async () => {
  a = await createHarness();
  b = await createHarness();
});
afterAll(async () => {
  await b?.close();
  await a?.close();
});

/** Both instances, the same request: status codes [a, b]. */
async function both(key: string, url: string): Promise<number[]> {
  const res = await Promise.all([a, b].map((h) => h.app.inject({ method: 'GET', url, headers: { authorization: `Bearer ${key}` } })));
  return res.map((r) => r.statusCode);
}

/** Six rounds on both instances (PostgreSQL plans a prepared statement generically after five executions). */
async function warm(key: string, urls: string[]): Promise<void> {
  for (let i = 0; i < 6; i++) for (const url of urls) expect(await both(key, url)).toEqual([200, 200]);
}

it('a key revoked through one instance is refused by the other at once', async () => {
  const member = await makeUser(a.deps.db);
  await addMember(a.deps.db, a.siteId, member.uid);
  const { raw, keyId } = await insertKey(a.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: '*', permissions: ['read'] }] });
  const siteUrl = `/api/roosts?siteId=${a.siteId}`;
  await warm(raw, [siteUrl, '/api/whoami']);

  const revoke = await a.app.inject({
    method: 'DELETE',
    url: `/api/keys/${keyId}`,
    headers: { authorization: `Bearer ${await idTokenFor(a, member)}` },
  });
  expect(revoke.statusCode).toBe(200);
  // The key statement with a site (db/keys.ts 'auth_key_site') and without one ('auth_key').
  expect(await both(raw, siteUrl)).toEqual([401, 401]);
  expect(await both(raw, '/api/whoami')).toEqual([401, 401]);
});

it('a removed membership and a disabled roost site are seen by both instances on the next request', async () => {
  const member = await makeUser(a.deps.db);
  await addMember(a.deps.db, a.siteId, member.uid);
  const { raw } = await insertKey(a.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: '*', permissions: ['read'] }] });
  const siteUrl = `/api/roosts?siteId=${a.siteId}`;
  await warm(raw, [siteUrl]);

  await b.deps.db.query('DELETE FROM site_members WHERE site_id = $1 AND uid = $2', [a.siteId, member.uid]);
  // The site is hidden from a non-member (404), whatever the instance.
  expect(await both(raw, siteUrl)).toEqual([404, 404]);

  await addMember(b.deps.db, a.siteId, member.uid);
  expect(await both(raw, siteUrl)).toEqual([200, 200]);
  await b.deps.db.query('UPDATE sites SET roost_enabled = false WHERE site_id = $1', [a.siteId]);
  try {
    expect(await both(raw, siteUrl)).toEqual([403, 403]);
  } finally {
    await b.deps.db.query('UPDATE sites SET roost_enabled = true WHERE site_id = $1', [a.siteId]);
  }
  expect(await both(raw, siteUrl)).toEqual([200, 200]);
});

it('a session user (no API key) is authorised through the prepared site-access statement, membership changes seen at once', async () => {
  const member = await makeUser(a.deps.db);
  await addMember(a.deps.db, a.siteId, member.uid);
  const token = await idTokenFor(a, member);
  const siteUrl = `/api/roosts?siteId=${a.siteId}`;
  await warm(token, [siteUrl]);
  await a.deps.db.query('DELETE FROM site_members WHERE site_id = $1 AND uid = $2', [a.siteId, member.uid]);
  expect(await both(token, siteUrl)).toEqual([404, 404]);
});

it('a version read reads its roost with the key (one statement for both), and a deleted roost is refused by both instances at once', async () => {
  const created = await a.request({ method: 'POST', url: '/api/roosts', body: { siteId: a.siteId, name: `auth-roost-${Date.now()}` } });
  expect(created.statusCode).toBe(201);
  const roostId: string = created.json().roostId;
  const body = {
    schemaVersion: 2,
    mediaType: VERSION_MEDIA_TYPE,
    config: { producer: 'auth-statements-test' },
    files: [{ path: 'empty.txt', size: 0, chunks: [] }],
  };
  const published = await a.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    idempotencyKey: true,
    body: { siteId: a.siteId, version: body },
  });
  expect(published.statusCode).toBe(201);
  const versionId: string = published.json().versionId;
  const member = await makeUser(a.deps.db);
  await addMember(a.deps.db, a.siteId, member.uid);
  const { raw } = await insertKey(a.deps.db, { uid: member.uid, scopes: [{ resource: 'roost', id: roostId, permissions: ['read'] }] });
  const url = `/api/roosts/${roostId}/versions/current?siteId=${a.siteId}`;
  await warm(raw, [url]);

  // Statements the read sends: the key with the site's access facts and the roost row (db/keys.ts
  // 'auth_key_site_roost'), then the version row; the roost is not read a second time.
  const sent: string[] = [];
  const query = a.deps.db.query.bind(a.deps.db) as (...args: unknown[]) => unknown;
  (a.deps.db as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    const q = args[0] as string | { name?: string; text: string };
    sent.push(typeof q === 'string' ? q : (q.name ?? q.text));
    return query(...args);
  };
  try {
    const res = await a.app.inject({ method: 'GET', url, headers: { authorization: `Bearer ${raw}` } });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ versionId, roostId, siteId: a.siteId });
  } finally {
    (a.deps.db as unknown as { query: unknown }).query = query;
  }
  expect(sent[0]).toBe('auth_key_site_roost');
  expect(sent).toHaveLength(2);
  expect(sent.filter((s) => typeof s === 'string' && /FROM roosts\b/.test(s))).toEqual([]);

  // A roost of another site named with this site: its row is never used; this key's scope (one roost)
  // refuses it first (403 scope_insufficient), and a site-wide key finds no such roost in its site (404).
  const other = await a.other();
  const foreign = await a.request({
    method: 'POST',
    url: '/api/roosts',
    key: other.apiKey,
    body: { siteId: other.siteId, name: 'foreign' },
  });
  expect(foreign.statusCode).toBe(201);
  const foreignUrl = `/api/roosts/${foreign.json().roostId}/versions/current?siteId=${a.siteId}`;
  const refused = await a.app.inject({ method: 'GET', url: foreignUrl, headers: { authorization: `Bearer ${raw}` } });
  expect([refused.statusCode, refused.json().code]).toEqual([403, 'scope_insufficient']);
  expect(await both(a.apiKey, foreignUrl)).toEqual([404, 404]);

  // Deleted (through instance a): both instances refuse the very next read.
  const del = await a.request({ method: 'DELETE', url: `/api/roosts/${roostId}?siteId=${a.siteId}` });
  expect(del.statusCode).toBeLessThan(300);
  expect(await both(raw, url)).toEqual([404, 404]);
});
