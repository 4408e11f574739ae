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
