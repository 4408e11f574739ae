/**
 * Users (docs/decisions/users.md, docs/decisions/user-sign-in.md): first sign-in creates a member,
 * the Users routes (superadmin only) with their errors, membership taking effect on the next request,
 * and the user-delete cascade run by a real worker. Real PostgreSQL and Temporal, through HTTP.
 */
import { importJWK, SignJWT } from 'jose';
import { localIssuer, localSigningKey } from '../../config/oidc';
import { newId } from '../../domain/hex';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { addMember, idTokenFor, insertKey, makeUser, sessionFor } from '../support/identity';
import { startTestWorker, type TestWorker } from './rollout-fixtures';
import { closeWorkerConnections } from '../../worker/worker';

let h: Harness;
let w: TestWorker;
let superToken: string;
let other: { siteId: string; userId: string; apiKey: string };

type Res = Awaited<ReturnType<Harness['request']>>;
function expectProblem(res: Res, status: number, code: string): any {
  expect({ status: res.statusCode, code: res.json().code }).toEqual({ status, code });
  return res.json();
}

beforeAll(async () => {
  h = await createHarness();
  w = await startTestWorker(h, 'users-test-worker');
  const owner = (await h.deps.db.query('SELECT uid, email FROM users WHERE uid = $1', [h.userId])).rows[0];
  superToken = await idTokenFor(h, owner);
  other = await h.other();
});
afterAll(async () => {
  await w?.stop();
  await closeWorkerConnections();
  await h?.close();
});

/** An ID token from the local issuer with any claims (names, a missing email…). */
async function customToken(claims: Record<string, unknown>, sub: string): Promise<string> {
  const key = await localSigningKey(h.deps.cfg);
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT(claims)
    .setProtectedHeader({ alg: key.alg, kid: key.kid })
    .setIssuer(localIssuer(h.deps.cfg))
    .setAudience(h.deps.cfg.ROOST_OIDC_AUDIENCE)
    .setSubject(sub)
    .setIssuedAt(now)
    .setExpirationTime(now + 600)
    .sign(await importJWK(key.privateJwk, key.alg));
}

const su = (method: string, url: string, body?: unknown, idem: string | true | undefined = method === 'GET' ? undefined : true) =>
  h.request({ method, url, body, key: superToken, idempotencyKey: idem });

async function userRow(uid: string) {
  return (await h.deps.db.query('SELECT uid, email, role, deleted, first_name, last_name, display_name FROM users WHERE uid = $1', [uid]))
    .rows[0];
}

async function pendingCommand(siteId: string, uid: string, rolloutId: string | null = null): Promise<string> {
  const commandId = newId('cmd');
  await h.deps.db.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, created_by, rollout_id) VALUES ($1, 'mach-u', $2, 'reboot_machine', 'pending', $3, $4)`,
    [siteId, commandId, uid, rolloutId],
  );
  return commandId;
}

const commandStatus = async (siteId: string, commandId: string) =>
  (await h.deps.db.query('SELECT status FROM commands WHERE site_id = $1 AND command_id = $2', [siteId, commandId])).rows[0].status;

describe('first sign-in', () => {
  it('creates a member with no sites from a verified email, with the names of the token', async () => {
    const email = `New.Person-${newId('x')}@Example.test`;
    const token = await customToken(
      { email, email_verified: true, given_name: 'Ada', family_name: 'Lovelace', name: 'Ada L.' },
      `ext|${email}`,
    );
    const res = await h.request({ method: 'POST', url: '/api/auth/session', key: null, body: { idToken: token } });
    expect(res.statusCode).toBe(201);
    const who = await h.request({ method: 'GET', url: '/api/whoami', key: res.json().sessionToken });
    expect(who.json()).toMatchObject({ email, role: 'member', primarySiteId: null });
    const u = await userRow(who.json().userId);
    expect(u).toMatchObject({ role: 'member', deleted: false, first_name: 'Ada', last_name: 'Lovelace', display_name: 'Ada L.' });
    expect((await h.deps.db.query('SELECT count(*)::int AS n FROM site_members WHERE uid = $1', [u.uid])).rows[0].n).toBe(0);
    // The same person again, by another route and another subject with the same email: the same user.
    const again = await h.request({
      method: 'GET',
      url: '/api/whoami',
      key: await customToken({ email: email.toLowerCase() }, 'other-sub'),
    });
    expect(again.json().userId).toBe(u.uid);
    // Linked: the first subject finds the user even after the email changed at the issuer.
    const moved = await h.request({
      method: 'GET',
      url: '/api/whoami',
      key: await customToken({ email: 'changed@example.test' }, `ext|${email}`),
    });
    expect(moved.json().userId).toBe(u.uid);
  });

  it('makes one user of concurrent first sign-ins', async () => {
    const email = `race-${newId('x')}@example.test`;
    const tokens = await Promise.all([1, 2, 3, 4].map((i) => customToken({ email, email_verified: true }, `race-${i}-${email}`)));
    const answers = await Promise.all(tokens.map((t) => h.request({ method: 'GET', url: '/api/whoami', key: t })));
    expect(answers.map((a) => a.statusCode)).toEqual([200, 200, 200, 200]);
    expect(new Set(answers.map((a) => a.json().userId)).size).toBe(1);
  });

  it('refuses tokens without a usable email, and deleted users', async () => {
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: await customToken({}, 'no-email-sub') }), 401, 'unauthorized');
    const unverified = await customToken({ email: `unverified-${newId('x')}@example.test`, email_verified: false }, 'unverified-sub');
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: unverified }), 401, 'unauthorized');
    const bad = await customToken({ email: 'not an email' }, 'bad-email-sub');
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: bad }), 401, 'unauthorized');
    const gone = await makeUser(h.deps.db);
    await h.deps.db.query('UPDATE users SET deleted = true WHERE uid = $1', [gone.uid]);
    expectProblem(
      await h.request({ method: 'GET', url: '/api/whoami', key: await customToken({ email: gone.email }, 'gone-sub') }),
      401,
      'unauthorized',
    );
    expect((await h.deps.db.query('SELECT count(*)::int AS n FROM users WHERE email = $1', ['not an email'])).rows[0].n).toBe(0);
  });
});

describe('the Users routes: who may call them', () => {
  it('are for superadmins: members get 403 forbidden, keys need user scopes, nothing changes', async () => {
    const member = await makeUser(h.deps.db);
    await addMember(h.deps.db, h.siteId, member.uid);
    const memberToken = await idTokenFor(h, member);
    expectProblem(await h.request({ method: 'GET', url: '/api/users', key: memberToken }), 403, 'forbidden');
    expectProblem(
      await h.request({
        method: 'POST',
        url: `/api/users/${member.uid}/promote`,
        key: memberToken,
        body: { role: 'superadmin' },
        idempotencyKey: true,
      }),
      403,
      'forbidden',
    );
    expect((await userRow(member.uid)).role).toBe('member');
    expectProblem(await h.request({ method: 'GET', url: '/api/users', key: null }), 401, 'unauthorized');
    // A superadmin's key without the user scope, and with read only.
    const siteOnly = (
      await insertKey(h.deps.db, { uid: h.userId, scopes: [{ resource: 'site', id: '*', permissions: ['read', 'admin'] }] })
    ).raw;
    expect(expectProblem(await h.request({ method: 'GET', url: '/api/users', key: siteOnly }), 403, 'scope_insufficient').required).toEqual(
      {
        resource: 'user',
        id: '*',
        permission: 'read',
      },
    );
    const readOnly = (await insertKey(h.deps.db, { uid: h.userId, scopes: [{ resource: 'user', id: '*', permissions: ['read'] }] })).raw;
    expect((await h.request({ method: 'GET', url: `/api/users/${member.uid}`, key: readOnly })).statusCode).toBe(200);
    // `required` names a scope a key can hold: user scopes take only the id `*`.
    expect(
      expectProblem(
        await h.request({ method: 'POST', url: `/api/users/${member.uid}/demote`, key: readOnly, idempotencyKey: true }),
        403,
        'scope_insufficient',
      ).required,
    ).toEqual({ resource: 'user', id: '*', permission: 'admin' });
  });

  it("stop working for a demoted superadmin's keys at once (the scope holds only while the owner keeps the role)", async () => {
    const admin = await makeUser(h.deps.db, { role: 'superadmin' });
    const key = (await insertKey(h.deps.db, { uid: admin.uid, scopes: [{ resource: 'user', id: '*', permissions: ['read', 'admin'] }] }))
      .raw;
    expect((await h.request({ method: 'GET', url: '/api/users', key })).statusCode).toBe(200);
    expect((await su('POST', `/api/users/${admin.uid}/demote`)).json()).toMatchObject({
      previousRole: 'superadmin',
      role: 'member',
      changed: true,
    });
    expectProblem(await h.request({ method: 'GET', url: '/api/users', key }), 403, 'forbidden');
  });
});

describe('GET /api/users and /api/users/{uid}', () => {
  it('pages oldest first with role, siteId and includeDeleted filters', async () => {
    const a = await makeUser(h.deps.db, { role: 'admin' });
    const b = await makeUser(h.deps.db, { role: 'admin' });
    const c = await makeUser(h.deps.db, { role: 'admin' });
    for (const u of [a, b, c]) await addMember(h.deps.db, other.siteId, u.uid);
    await h.deps.db.query('UPDATE users SET deleted = true WHERE uid = $1', [c.uid]);
    const seen: string[] = [];
    let token = '';
    for (let i = 0; i < 10; i++) {
      const res = await su('GET', `/api/users?role=admin&siteId=${other.siteId}&page_size=1${token ? `&page_token=${token}` : ''}`);
      expect(res.statusCode).toBe(200);
      seen.push(...res.json().users.map((u: { uid: string }) => u.uid));
      token = res.json().next_page_token;
      expect(res.json().nextPageToken).toBe(token);
      if (!token) break;
    }
    expect(seen).toEqual([a.uid, b.uid]);
    const all = (await su('GET', `/api/users?siteId=${other.siteId}&includeDeleted=true`)).json().users;
    expect(all.map((u: { uid: string }) => u.uid)).toEqual([other.userId, a.uid, b.uid, c.uid]);
    expect(all[3]).toMatchObject({ deleted: true, siteIds: [other.siteId] });
    expect(all[0]).toMatchObject({ role: 'member', ownedSiteIds: [other.siteId], siteIds: [other.siteId], deletion: null });
  });

  it('refuses bad paging, filters and ids with 400, unknown users with 404', async () => {
    for (const q of [
      'page_size=0',
      'page_size=101',
      'page_size=x',
      'page_token=garbage',
      'role=owner',
      'includeDeleted=yes',
      'siteId=bad%20id',
    ]) {
      expectProblem(await su('GET', `/api/users?${q}`), 400, 'validation_failed');
    }
    expectProblem(await su('GET', '/api/users/bad%20uid'), 400, 'validation_failed');
    expectProblem(await su('GET', `/api/users/${'x'.repeat(65)}`), 400, 'validation_failed');
    expectProblem(await su('GET', '/api/users/usr_nobody'), 404, 'not_found');
  });
});

describe('promote and demote', () => {
  it('promote raises, never lowers, answers changed false on a no-op and replays', async () => {
    const u = await makeUser(h.deps.db);
    const key = idemKey();
    const first = await su('POST', `/api/users/${u.uid}/promote`, { role: 'admin' }, key);
    expect(first.json()).toEqual({ uid: u.uid, previousRole: 'member', role: 'admin', changed: true });
    const replay = await su('POST', `/api/users/${u.uid}/promote`, { role: 'admin' }, key);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(first.json());
    expectProblem(await su('POST', `/api/users/${u.uid}/promote`, { role: 'superadmin' }, key), 422, 'idempotency_key_mismatch');
    expect((await su('POST', `/api/users/${u.uid}/promote`, { role: 'admin' })).json()).toMatchObject({ changed: false, role: 'admin' });
    expect((await su('POST', `/api/users/${u.uid}/promote`, { role: 'superadmin' })).json()).toMatchObject({
      previousRole: 'admin',
      role: 'superadmin',
      changed: true,
    });
    expect((await su('POST', `/api/users/${u.uid}/promote`, { role: 'admin' })).json()).toMatchObject({
      previousRole: 'superadmin',
      role: 'superadmin',
      changed: false,
    });
    for (const body of [{ role: 'member' }, { role: 'owner' }, {}, { role: 'admin', extra: 1 }]) {
      expectProblem(await su('POST', `/api/users/${u.uid}/promote`, body), 400, 'validation_failed');
    }
    expectProblem(
      await h.request({ method: 'POST', url: `/api/users/${u.uid}/promote`, key: superToken, body: { role: 'admin' } }),
      400,
      'idempotency_key_required',
    );
    expectProblem(await su('POST', '/api/users/usr_nobody/promote', { role: 'admin' }), 404, 'not_found');
  });

  it('demote keeps the active-superadmin floor; of two concurrent demotes that would cross it exactly one wins', async () => {
    const x = await makeUser(h.deps.db, { role: 'superadmin' });
    const y = await makeUser(h.deps.db, { role: 'superadmin' });
    const active = (await h.deps.db.query(`SELECT count(*)::int AS n FROM users WHERE role = 'superadmin' AND NOT deleted`)).rows[0].n;
    const floor = h.deps.cfg.ROOST_SUPERADMIN_FLOOR;
    h.deps.cfg.ROOST_SUPERADMIN_FLOOR = active - 1; // one more demote is allowed, not two
    try {
      const [rx, ry] = await Promise.all([su('POST', `/api/users/${x.uid}/demote`), su('POST', `/api/users/${y.uid}/demote`)]);
      expect([rx.statusCode, ry.statusCode].sort()).toEqual([200, 409]);
      const refused = rx.statusCode === 409 ? rx : ry;
      expect(expectProblem(refused, 409, 'last_superadmin')).toMatchObject({ floor: active - 1, activeSuperadmins: active - 1 });
      const roles = [(await userRow(x.uid)).role, (await userRow(y.uid)).role].sort();
      expect(roles).toEqual(['member', 'superadmin']);
    } finally {
      h.deps.cfg.ROOST_SUPERADMIN_FLOOR = floor;
    }
    const m = await makeUser(h.deps.db);
    expect((await su('POST', `/api/users/${m.uid}/demote`)).json()).toEqual({
      uid: m.uid,
      previousRole: 'member',
      role: 'member',
      changed: false,
    });
  });
});

describe('demote a site owner', () => {
  it('is 409 conflict with ownedSiteIds and changes nothing, until the sites are moved', async () => {
    const owner = await makeUser(h.deps.db, { role: 'admin' });
    const sites: string[] = [];
    for (let i = 0; i < 2; i++) {
      const res = await su('POST', '/api/sites', { name: newId('demote'), ownerUid: owner.uid });
      sites.push(res.json().siteId);
    }
    const refused = expectProblem(await su('POST', `/api/users/${owner.uid}/demote`), 409, 'conflict');
    expect(refused.ownedSiteIds).toEqual([...sites].sort());
    expect((await userRow(owner.uid)).role).toBe('admin');
    // Once the sites have another owner, the demote goes through.
    for (const siteId of sites) expect((await su('PATCH', `/api/sites/${siteId}`, { ownerUid: h.userId })).statusCode).toBe(200);
    expect((await su('POST', `/api/users/${owner.uid}/demote`)).json()).toMatchObject({
      previousRole: 'admin',
      role: 'member',
      changed: true,
    });
  });
});

describe('assign-sites and remove-sites', () => {
  it('assigns atomically: an unknown id is 400 unknown_site listing the unknown ids and changes nothing', async () => {
    const u = await makeUser(h.deps.db);
    const bad = await su('POST', `/api/users/${u.uid}/assign-sites`, { siteIds: [h.siteId, 'site_nope2', 'site_nope1'] });
    expect(expectProblem(bad, 400, 'unknown_site').unknownSiteIds).toEqual(['site_nope1', 'site_nope2']);
    expect((await su('GET', `/api/users/${u.uid}`)).json().siteIds).toEqual([]);
    const ok = await su('POST', `/api/users/${u.uid}/assign-sites`, { siteIds: [h.siteId, other.siteId, h.siteId] });
    expect(ok.json()).toEqual({ uid: u.uid, siteIds: [h.siteId, other.siteId].sort(), addedSiteIds: [h.siteId, other.siteId].sort() });
    const again = await su('POST', `/api/users/${u.uid}/assign-sites`, { siteIds: [h.siteId] });
    expect(again.json().addedSiteIds).toEqual([]);
    for (const body of [{ siteIds: [] }, { siteIds: ['bad id'] }, { siteIds: Array.from({ length: 101 }, (_, i) => `s${i}`) }, {}]) {
      expectProblem(await su('POST', `/api/users/${u.uid}/assign-sites`, body), 400, 'validation_failed');
    }
    // The audit log of the site names the change.
    const log = await h.request({ method: 'GET', url: `/api/sites/${other.siteId}/audit-log?kind=site_member_added`, key: other.apiKey });
    expect(log.json().records.some((r: any) => r.attributes.uid === u.uid)).toBe(true);
  });

  it("removes memberships, cancels the user's own pending commands there, and access ends on the next request", async () => {
    const u = await makeUser(h.deps.db);
    await su('POST', `/api/users/${u.uid}/assign-sites`, { siteIds: [h.siteId, other.siteId] });
    const key = (await insertKey(h.deps.db, { uid: u.uid, scopes: [{ resource: 'site', id: '*', permissions: ['read'] }] })).raw;
    expect((await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/quota`, key })).statusCode).toBe(200);
    const mine = await pendingCommand(h.siteId, u.uid);
    const rollout = await pendingCommand(h.siteId, u.uid, 'rol_keep');
    const elsewhere = await pendingCommand(other.siteId, u.uid);
    const res = await su('POST', `/api/users/${u.uid}/remove-sites`, { siteIds: [h.siteId] });
    expect(res.json()).toEqual({ uid: u.uid, removedSiteIds: [h.siteId], cancelledCommandCount: 1 });
    expect([
      await commandStatus(h.siteId, mine),
      await commandStatus(h.siteId, rollout),
      await commandStatus(other.siteId, elsewhere),
    ]).toEqual(['cancelled', 'pending', 'pending']);
    expectProblem(await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/quota`, key }), 404, 'not_found');
    expect((await h.request({ method: 'GET', url: `/api/sites/${other.siteId}/quota`, key })).statusCode).toBe(200);
    expect((await su('POST', `/api/users/${u.uid}/remove-sites`, { siteIds: [h.siteId] })).json()).toMatchObject({
      removedSiteIds: [],
      cancelledCommandCount: 0,
    });
    expect(
      expectProblem(await su('POST', `/api/users/${u.uid}/remove-sites`, { siteIds: ['site_gone'] }), 400, 'unknown_site').unknownSiteIds,
    ).toEqual(['site_gone']);
  });

  it("refuses to remove a site's owner from it (409 conflict with ownedSiteIds)", async () => {
    const res = await su('POST', `/api/users/${other.userId}/remove-sites`, { siteIds: [other.siteId] });
    expect(expectProblem(res, 409, 'conflict').ownedSiteIds).toEqual([other.siteId]);
    expect((await h.request({ method: 'GET', url: `/api/sites/${other.siteId}/quota`, key: other.apiKey })).statusCode).toBe(200);
  });
});

describe('DELETE /api/users/{uid}', () => {
  async function waitCompleted(uid: string): Promise<any> {
    for (;;) {
      const u = (await su('GET', `/api/users/${uid}`)).json();
      if (u.deletion?.status === 'completed') return u;
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  it('checks the successor and orphaned sites before changing anything', async () => {
    const owner = await h.other();
    const member = await makeUser(h.deps.db);
    const gone = await makeUser(h.deps.db, { role: 'admin' });
    await h.deps.db.query('UPDATE users SET deleted = true WHERE uid = $1', [gone.uid]);
    expect(expectProblem(await su('DELETE', `/api/users/${owner.userId}`), 409, 'orphan_sites').ownedSiteIds).toEqual([owner.siteId]);
    for (const [successor, reason] of [
      ['usr_nobody', 'not_found'],
      [owner.userId, 'self'],
      [gone.uid, 'deleted'],
      [member.uid, 'role'],
    ]) {
      expect(
        expectProblem(await su('DELETE', `/api/users/${owner.userId}?successorUid=${successor}`), 400, 'successor_invalid').reason,
      ).toBe(reason);
    }
    expectProblem(await su('DELETE', `/api/users/${owner.userId}?successorUid=bad%20id`), 400, 'validation_failed');
    expect((await userRow(owner.userId)).deleted).toBe(false);
    expect((await h.request({ method: 'GET', url: `/api/sites/${owner.siteId}/quota`, key: owner.apiKey })).statusCode).toBe(200);
  });

  it('soft-deletes at once and the cascade revokes keys and sessions, cancels commands and hands the sites over', async () => {
    const owner = await h.other();
    const ownerUser = (await h.deps.db.query('SELECT uid, email FROM users WHERE uid = $1', [owner.userId])).rows[0];
    const session = await sessionFor(h, ownerUser);
    const cmd = await pendingCommand(owner.siteId, owner.userId);
    const successor = await makeUser(h.deps.db, { role: 'admin' });
    const key = idemKey();
    const res = await su('DELETE', `/api/users/${owner.userId}?successorUid=${successor.uid}`, undefined, key);
    expect(res.statusCode).toBe(202);
    expect(res.json()).toMatchObject({
      uid: owner.userId,
      deleted: true,
      alreadyDeleted: false,
      deletion: { successorUid: successor.uid },
    });
    expect(res.json().workflowUrl).toContain(encodeURIComponent(`user-delete:${owner.userId}`));
    // Credentials are refused from the next request on, before the cascade has run.
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: owner.apiKey }), 401, 'unauthorized');
    expectProblem(await h.request({ method: 'GET', url: '/api/whoami', key: session.token }), 401, 'unauthorized');
    const done = await waitCompleted(owner.userId);
    expect(done).toMatchObject({
      deleted: true,
      ownedSiteIds: [],
      deletion: { status: 'completed', keysRevoked: 1, sessionsRevoked: 1, commandsCancelled: 1, sitesTransferred: [owner.siteId] },
    });
    expect(await commandStatus(owner.siteId, cmd)).toBe('cancelled');
    const keys = (await h.deps.db.query('SELECT status FROM api_keys WHERE uid = $1', [owner.userId])).rows;
    expect(keys.map((k) => k.status)).toEqual(['revoked']);
    const s = (await su('GET', `/api/users/${successor.uid}`)).json();
    expect(s).toMatchObject({ ownedSiteIds: [owner.siteId], siteIds: [owner.siteId] });
    // Repeats: the same key replays; a new key answers alreadyDeleted.
    expect(
      (await su('DELETE', `/api/users/${owner.userId}?successorUid=${successor.uid}`, undefined, key)).headers['idempotent-replayed'],
    ).toBe('true');
    const again = await su('DELETE', `/api/users/${owner.userId}`);
    expect(again.json()).toMatchObject({ alreadyDeleted: true, deletion: { status: 'completed' } });
    // Excluded from the list unless asked for.
    const listed = (await su('GET', `/api/users?siteId=${owner.siteId}`)).json().users.map((u: { uid: string }) => u.uid);
    expect(listed).toEqual([successor.uid]);
  });

  it('refuses to delete the last superadmins (409 last_superadmin)', async () => {
    const x = await makeUser(h.deps.db, { role: 'superadmin' });
    const active = (await h.deps.db.query(`SELECT count(*)::int AS n FROM users WHERE role = 'superadmin' AND NOT deleted`)).rows[0].n;
    const floor = h.deps.cfg.ROOST_SUPERADMIN_FLOOR;
    h.deps.cfg.ROOST_SUPERADMIN_FLOOR = active;
    try {
      expectProblem(await su('DELETE', `/api/users/${x.uid}`), 409, 'last_superadmin');
      expect((await userRow(x.uid)).deleted).toBe(false);
    } finally {
      h.deps.cfg.ROOST_SUPERADMIN_FLOOR = floor;
    }
  });
});
