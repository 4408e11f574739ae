/**
 * Sites (docs/decisions/sites.md): create, list, get, PATCH (IANA time zones, tier, roostEnabled,
 * deployQuota, owner), the member list, who may do what, and roostEnabled false refusing the roost
 * routes with 403 roost_disabled. Real PostgreSQL through HTTP.
 */
import { randomBytes } from 'node:crypto';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { addMember, idTokenFor, insertKey, makeUser } from '../support/identity';

let h: Harness;
let superToken: string;

type Res = Awaited<ReturnType<Harness['request']>>;
function expectProblem(res: Res, status: number, code: string): any {
  expect({ status: res.statusCode, code: res.json().code }).toEqual({ status, code });
  return res.json();
}

beforeAll(async () => {
  h = await createHarness();
  const owner = (await h.deps.db.query('SELECT uid, email FROM users WHERE uid = $1', [h.userId])).rows[0];
  superToken = await idTokenFor(h, owner);
});
afterAll(async () => h.close());

const name = () => `site-${randomBytes(4).toString('hex')}`;
const su = (method: string, url: string, body?: unknown, idem: string | true | undefined = method === 'GET' ? undefined : true) =>
  h.request({ method, url, body, key: superToken, idempotencyKey: idem });
const count = async (sql: string, args: unknown[]) => (await h.deps.db.query(sql, args)).rows[0].n;

describe('POST /api/sites', () => {
  it('creates a site with defaults, owned by the caller, and replays', async () => {
    const n = name();
    const key = idemKey();
    const res = await su('POST', '/api/sites', { name: n, timezone: 'Europe/Berlin' }, key);
    expect(res.statusCode).toBe(201);
    expect(res.json()).toMatchObject({
      name: n,
      owner: h.userId,
      timezone: 'Europe/Berlin',
      tier: 'standard',
      roostEnabled: true,
      deployQuota: 100,
      environment: 'live',
    });
    const again = await su('POST', '/api/sites', { name: n, timezone: 'Europe/Berlin' }, key);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json().siteId).toBe(res.json().siteId);
    expect(await count('SELECT count(*)::int AS n FROM sites WHERE name = $1', [n])).toBe(1);
    expectProblem(await su('POST', '/api/sites', { name: n }), 409, 'conflict');
    // The creation is in the new site's audit log.
    const log = await h.request({ method: 'GET', url: `/api/sites/${res.json().siteId}/audit-log`, key: superToken });
    expect(log.json().records.map((r: any) => r.kind)).toContain('POST /api/sites');
  });

  it('takes every IANA name the runtime knows, current aliases included, and stores it as given', async () => {
    for (const timezone of [
      'Asia/Kolkata',
      'Europe/Kyiv',
      'America/Argentina/Buenos_Aires',
      'Etc/UTC',
      'GMT',
      'US/Eastern',
      'Asia/Calcutta',
    ]) {
      const res = await su('POST', '/api/sites', { name: name(), timezone });
      expect([timezone, res.statusCode, res.json().timezone]).toEqual([timezone, 201, timezone]);
      const patched = await su('PATCH', `/api/sites/${res.json().siteId}`, {
        timezone: timezone === 'GMT' ? 'Europe/Kiev' : 'Europe/Kyiv',
      });
      expect([timezone, patched.statusCode, patched.json().timezone]).toEqual([
        timezone,
        200,
        timezone === 'GMT' ? 'Europe/Kiev' : 'Europe/Kyiv',
      ]);
    }
    for (const timezone of ['+05:30', 'europe/berlin', 'garbage']) {
      const refused = expectProblem(await su('POST', '/api/sites', { name: name(), timezone }), 400, 'validation_failed');
      expect(refused.errors).toHaveProperty('timezone');
    }
  });

  it('refuses bad fields, non-superadmins and unsuitable owners, changing nothing', async () => {
    const n = name();
    for (const body of [
      { name: n, timezone: 'Mars/Olympus' },
      { name: n, timezone: '+02:00' },
      { name: n, tier: 'gold' },
      { name: n, deployQuota: 0 },
      { name: n, deployQuota: 10_001 }, // past MAX_DEPLOY_QUOTA: a list that long would not fit a request body
      { name: '' },
      { name: n, extra: true },
    ]) {
      expectProblem(await su('POST', '/api/sites', body), 400, 'validation_failed');
    }
    const member = await makeUser(h.deps.db);
    expectProblem(await su('POST', '/api/sites', { name: n, ownerUid: member.uid }), 400, 'validation_failed');
    expectProblem(await su('POST', '/api/sites', { name: n, ownerUid: 'usr_nobody' }), 400, 'validation_failed');
    expectProblem(
      await h.request({ method: 'POST', url: '/api/sites', key: await idTokenFor(h, member), body: { name: n }, idempotencyKey: true }),
      403,
      'forbidden',
    );
    expectProblem(
      await h.request({ method: 'POST', url: '/api/sites', key: superToken, body: { name: n } }),
      400,
      'idempotency_key_required',
    );
    expect(await count('SELECT count(*)::int AS n FROM sites WHERE name = $1', [n])).toBe(0);
  });
});

describe('reading sites', () => {
  it("lists the caller's sites (all for a superadmin), one by one across pages", async () => {
    const member = await makeUser(h.deps.db);
    const a = (await su('POST', '/api/sites', { name: name() })).json().siteId;
    const b = (await su('POST', '/api/sites', { name: name() })).json().siteId;
    await addMember(h.deps.db, a, member.uid);
    await addMember(h.deps.db, b, member.uid);
    const token = await idTokenFor(h, member);
    const seen: string[] = [];
    let next = '';
    for (let i = 0; i < 5; i++) {
      const res = await h.request({ method: 'GET', url: `/api/sites?page_size=1${next ? `&page_token=${next}` : ''}`, key: token });
      seen.push(...res.json().sites.map((s: any) => s.siteId));
      next = res.json().next_page_token;
      if (!next) break;
    }
    expect(seen).toEqual([a, b].sort());
    // A key sees only the sites its scopes grant read on.
    const keyed = (await insertKey(h.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: a, permissions: ['read'] }] })).raw;
    expect((await h.request({ method: 'GET', url: '/api/sites', key: keyed })).json().sites.map((s: any) => s.siteId)).toEqual([a]);
    expectProblem(await h.request({ method: 'GET', url: '/api/sites?page_size=101', key: token }), 400, 'validation_failed');
  });

  it('lists a key only the sites of its environment; sessions and ID tokens list both (docs/decisions/test-keys.md)', async () => {
    const member = await makeUser(h.deps.db);
    const live = (await su('POST', '/api/sites', { name: name() })).json().siteId;
    const sandbox = (await su('POST', '/api/sites', { name: name(), environment: 'test' })).json().siteId;
    for (const siteId of [live, sandbox]) await addMember(h.deps.db, siteId, member.uid);
    const scopes = [{ resource: 'site' as const, id: '*', permissions: ['read' as const] }];
    const liveKey = (await insertKey(h.deps.db, { uid: member.uid, scopes })).raw;
    const testKey = (await insertKey(h.deps.db, { uid: member.uid, scopes, environment: 'test' })).raw;
    const listed = async (key: string) =>
      (await h.request({ method: 'GET', url: '/api/sites?page_size=100', key })).json().sites.map((s: any) => s.siteId);
    expect(await listed(liveKey)).toEqual([live]);
    expect(await listed(testKey)).toEqual([sandbox]);
    expect(await listed(await idTokenFor(h, member))).toEqual([live, sandbox].sort());
    // Each key can act on what it lists, and on nothing it does not.
    expect((await h.request({ method: 'GET', url: `/api/sites/${sandbox}/quota`, key: testKey })).statusCode).toBe(200);
    expectProblem(await h.request({ method: 'GET', url: `/api/sites/${live}/quota`, key: testKey }), 403, 'forbidden');
    // A superadmin's test key pages through sandbox sites only.
    const suTestKey = (await insertKey(h.deps.db, { uid: h.userId, scopes, environment: 'test' })).raw;
    const seen: any[] = [];
    let next = '';
    for (let i = 0; i < 1000; i++) {
      const res = await h.request({ method: 'GET', url: `/api/sites?page_size=100${next ? `&page_token=${next}` : ''}`, key: suTestKey });
      seen.push(...res.json().sites);
      next = res.json().next_page_token;
      if (!next) break;
    }
    expect(seen.map((s) => s.siteId)).toContain(sandbox);
    expect(seen.filter((s) => s.environment !== 'test')).toEqual([]);
  });

  it('shows a site and its members to its owner, admins and superadmins, not to plain members or strangers', async () => {
    const admin = await makeUser(h.deps.db, { role: 'admin' });
    const member = await makeUser(h.deps.db);
    const siteId = (await su('POST', '/api/sites', { name: name(), ownerUid: admin.uid })).json().siteId;
    await addMember(h.deps.db, siteId, member.uid);
    const adminToken = await idTokenFor(h, admin);
    expect((await h.request({ method: 'GET', url: `/api/sites/${siteId}`, key: adminToken })).json()).toMatchObject({
      siteId,
      owner: admin.uid,
    });
    const members = (await h.request({ method: 'GET', url: `/api/sites/${siteId}/members`, key: adminToken })).json().members;
    expect(members.map((m: any) => [m.uid, m.isOwner]).sort()).toEqual(
      [
        [admin.uid, true],
        [member.uid, false],
      ].sort(),
    );
    expectProblem(await h.request({ method: 'GET', url: `/api/sites/${siteId}`, key: await idTokenFor(h, member) }), 403, 'forbidden');
    expectProblem(
      await h.request({ method: 'GET', url: `/api/sites/${siteId}/members`, key: await idTokenFor(h, member) }),
      403,
      'forbidden',
    );
    const stranger = await makeUser(h.deps.db, { role: 'admin' });
    expectProblem(await h.request({ method: 'GET', url: `/api/sites/${siteId}`, key: await idTokenFor(h, stranger) }), 404, 'not_found');
    expectProblem(await su('GET', '/api/sites/site_nope'), 404, 'not_found');
    expectProblem(await su('GET', '/api/sites/bad%20id'), 400, 'validation_failed');
  });
});

describe('PATCH /api/sites/{siteId}', () => {
  it('changes settings and the owner; validates the time zone; only superadmins', async () => {
    const siteId = (await su('POST', '/api/sites', { name: name() })).json().siteId;
    const res = await su('PATCH', `/api/sites/${siteId}`, { timezone: 'America/New_York', tier: 'pro', deployQuota: 250 });
    expect(res.json()).toMatchObject({ timezone: 'America/New_York', tier: 'pro', deployQuota: 250, roostEnabled: true });
    expectProblem(await su('PATCH', `/api/sites/${siteId}`, { timezone: 'Europe/Nowhere' }), 400, 'validation_failed');
    expectProblem(await su('PATCH', `/api/sites/${siteId}`, {}), 400, 'validation_failed');
    expectProblem(await su('PATCH', `/api/sites/${siteId}`, { owner: 'x' }), 400, 'validation_failed');
    const heir = await makeUser(h.deps.db, { role: 'admin' });
    expect((await su('PATCH', `/api/sites/${siteId}`, { ownerUid: heir.uid })).json().owner).toBe(heir.uid);
    expect(await count('SELECT count(*)::int AS n FROM site_members WHERE site_id = $1 AND uid = $2', [siteId, heir.uid])).toBe(1);
    // The owner, an admin, may read but not change it.
    expectProblem(
      await h.request({
        method: 'PATCH',
        url: `/api/sites/${siteId}`,
        key: await idTokenFor(h, heir),
        body: { tier: 'free' },
        idempotencyKey: true,
      }),
      403,
      'forbidden',
    );
    expect((await su('GET', `/api/sites/${siteId}`)).json().tier).toBe('pro');
  });

  it('audits membership gained by ownership (site_member_added) and what each PATCH changed (site_updated)', async () => {
    const audit = async (siteId: string, kind: string) =>
      (await su('GET', `/api/sites/${siteId}/audit-log?kind=${kind}`)).json().records as { actor: string; attributes: any }[];
    const first = await makeUser(h.deps.db, { role: 'admin' });
    const n = name();
    const siteId = (await su('POST', '/api/sites', { name: n, ownerUid: first.uid, timezone: 'Europe/Berlin' })).json().siteId;
    expect((await audit(siteId, 'site_member_added')).map((r) => [r.actor, r.attributes])).toEqual([
      [`user:${h.userId}`, { siteId, uid: first.uid, reason: 'site_owner' }],
    ]);
    // A new owner who was no member joins: one site_member_added; the record of the PATCH shows old and new values.
    const heir = await makeUser(h.deps.db, { role: 'admin' });
    await su('PATCH', `/api/sites/${siteId}`, { ownerUid: heir.uid, timezone: 'Asia/Kolkata', name: n });
    expect((await audit(siteId, 'site_member_added')).map((r) => r.attributes.uid)).toEqual([heir.uid, first.uid]); // newest first
    const [updated] = await audit(siteId, 'site_updated');
    expect(updated.attributes.changes).toEqual({
      ownerUid: { from: first.uid, to: heir.uid },
      timezone: { from: 'Europe/Berlin', to: 'Asia/Kolkata' },
    });
    // Back to the first owner, still a member: no new membership record.
    await su('PATCH', `/api/sites/${siteId}`, { ownerUid: first.uid, deployQuota: 7 });
    expect((await audit(siteId, 'site_member_added')).map((r) => r.attributes.uid)).toEqual([heir.uid, first.uid]); // newest first
    const records = await audit(siteId, 'site_updated');
    expect(records.map((r) => r.attributes.changes)).toEqual([
      { ownerUid: { from: heir.uid, to: first.uid }, deployQuota: { from: 100, to: 7 } },
      { ownerUid: { from: first.uid, to: heir.uid }, timezone: { from: 'Europe/Berlin', to: 'Asia/Kolkata' } },
    ]);
    const chain = await su('GET', `/api/sites/${siteId}/audit-log/${(records[0] as any).hash}`);
    expect(chain.json().verification).toMatchObject({ hashValid: true, linkageValid: true, ok: true });
  });

  it('refuses ownerUid from a svk_test_ key, even on a sandbox site (memberships are platform-wide)', async () => {
    const sandbox = (await su('POST', '/api/sites', { name: name(), environment: 'test' })).json().siteId;
    const testKey = (
      await insertKey(h.deps.db, { uid: h.userId, scopes: [{ resource: 'site', id: '*', permissions: ['admin'] }], environment: 'test' })
    ).raw;
    const heir = await makeUser(h.deps.db, { role: 'admin' });
    const patch = (body: unknown) => h.request({ method: 'PATCH', url: `/api/sites/${sandbox}`, key: testKey, body, idempotencyKey: true });
    for (const body of [{ ownerUid: heir.uid }, { ownerUid: heir.uid, tier: 'pro' }, { ownerUid: h.userId }]) {
      expect(expectProblem(await patch(body), 403, 'forbidden').detail).toContain('svk_test_');
    }
    expect((await su('GET', `/api/sites/${sandbox}`)).json()).toMatchObject({ owner: h.userId, tier: 'standard' });
    expect(await count('SELECT count(*)::int AS n FROM site_members WHERE site_id = $1 AND uid = $2', [sandbox, heir.uid])).toBe(0);
    // The sandbox site's own settings stay the test key's to change.
    expect((await patch({ tier: 'pro' })).json()).toMatchObject({ tier: 'pro', owner: h.userId });
  });

  it('refuses the roost routes of a site with roostEnabled false (403 roost_disabled) and allows them again', async () => {
    const body = { name: `roost-${randomBytes(3).toString('hex')}`, siteId: h.siteId };
    expect((await su('PATCH', `/api/sites/${h.siteId}`, { roostEnabled: false })).json().roostEnabled).toBe(false);
    try {
      const refused = await h.request({ method: 'POST', url: '/api/roosts', body });
      expect(expectProblem(refused, 403, 'roost_disabled').siteId).toBe(h.siteId);
      expectProblem(await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}` }), 403, 'roost_disabled');
      expect(await count('SELECT count(*)::int AS n FROM roosts WHERE site_id = $1', [h.siteId])).toBe(0);
      // Other site routes still work.
      expect((await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/quota` })).statusCode).toBe(200);
    } finally {
      await su('PATCH', `/api/sites/${h.siteId}`, { roostEnabled: true });
    }
    expect((await h.request({ method: 'POST', url: '/api/roosts', body })).statusCode).toBe(201);
  });
});
