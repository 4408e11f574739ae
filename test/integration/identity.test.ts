/**
 * Identity (docs/contract.md Authentication 1, 2, 9, 10): ID tokens verified against the issuer's JWKS (the
 * embedded local issuer, and an external issuer configured by URL), first-party sessions, the
 * compatibility credential forms, and whoami per credential kind.
 */
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { createLocalJWKSet, exportJWK, generateKeyPair, jwtVerify, type KeyLike, SignJWT, UnsecuredJWT } from 'jose';
import { buildApp } from '../../api/app';
import { sha256Hex } from '../../domain/hex';
import { localIssuer } from '../../config/oidc';
import { createHarness, type Harness } from '../support/harness';
import { addMember, idTokenFor, insertKey, makeUser, sessionFor } from '../support/identity';
import { testLogger } from '../support/test-log';

let h: Harness;
let member: { uid: string; email: string };

beforeAll(async () => {
  h = await createHarness();
  member = await makeUser(h.deps.db);
  await addMember(h.deps.db, h.siteId, member.uid);
});
afterAll(async () => h.close());

const whoami = (key: string | null, headers: Record<string, string> = {}) => h.request({ method: 'GET', url: '/api/whoami', key, headers });

function expectProblem(res: { statusCode: number; json: () => any }, status: number, code: string): any {
  expect({ status: res.statusCode, code: res.json().code }).toEqual({ status, code });
  return res.json();
}

describe('ID tokens from the local issuer', () => {
  it('authenticate a user by sub; whoami has key null, the role and a primary site with its quota', async () => {
    const res = await whoami(await idTokenFor(h, member));
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toMatchObject({ userId: member.uid, email: member.email, role: 'member', key: null, primarySiteId: h.siteId });
    // The hint describes the enforced `api` bucket (per hour in production), as a per-minute figure.
    const api = h.app.rateLimits.settings.buckets.api;
    expect(body.rateLimit).toMatchObject({ limitPerMinute: Math.max(1, Math.round((api.points * 60) / api.durationSeconds)) });
    expect(body.rateLimit.note).toContain(`${api.points} requests per ${api.durationSeconds} s`);
    expect(body.quota).toMatchObject({
      siteId: h.siteId,
      tier: expect.any(String),
      usedBytes: expect.any(Number),
      pendingBytes: expect.any(Number),
      limitBytes: expect.any(Number),
    });
  });

  it('map to the user by email when sub is not a uid', async () => {
    const res = await whoami(await idTokenFor(h, { uid: 'external-subject-123', email: member.email.toUpperCase() }));
    expect(res.statusCode).toBe(200);
    expect(res.json().userId).toBe(member.uid);
  });

  it('are token_expired after exp, unauthorized before nbf', async () => {
    expectProblem(await whoami(await idTokenFor(h, member, { ttlSeconds: -120 })), 401, 'token_expired');
    expectProblem(await whoami(await idTokenFor(h, member, { notBeforeSeconds: 3600, ttlSeconds: 7200 })), 401, 'unauthorized');
  });

  it('are unauthorized with another audience or issuer', async () => {
    expectProblem(await whoami(await idTokenFor(h, member, { audience: 'someone-else' })), 401, 'unauthorized');
    expectProblem(await whoami(await idTokenFor(h, member, { issuer: 'https://evil.example' })), 401, 'unauthorized');
  });

  it('are unauthorized when signed by another key, unsigned, or tampered with', async () => {
    const { privateKey } = await generateKeyPair('EdDSA', { crv: 'Ed25519' });
    const now = Math.floor(Date.now() / 1000);
    const claims = { sub: member.uid, email: member.email };
    const forged = await new SignJWT(claims)
      .setProtectedHeader({ alg: 'EdDSA' })
      .setIssuer(localIssuer(h.deps.cfg))
      .setAudience(h.deps.cfg.ROOST_OIDC_AUDIENCE)
      .setExpirationTime(now + 600)
      .sign(privateKey);
    expectProblem(await whoami(forged), 401, 'unauthorized');
    const unsigned = new UnsecuredJWT(claims)
      .setIssuer(localIssuer(h.deps.cfg))
      .setAudience('roost')
      .setExpirationTime(now + 600)
      .encode();
    // `alg: none` tokens end with an empty signature segment: not even credential-shaped.
    expectProblem(await whoami(unsigned), 401, 'unauthorized');
    const good = await idTokenFor(h, member);
    const [head, , sig] = good.split('.');
    const otherPayload = Buffer.from(
      JSON.stringify({ ...claims, sub: h.userId, iss: localIssuer(h.deps.cfg), aud: 'roost', exp: now + 600 }),
    ).toString('base64url');
    expectProblem(await whoami(`${head}.${otherPayload}.${sig}`), 401, 'unauthorized');
  });

  it('sign up an unknown email as a member (test/integration/users.test.ts) and are unauthorized for deleted users', async () => {
    const fresh = await whoami(await idTokenFor(h, { uid: 'usr_nobody', email: `nobody-${Date.now()}@example.test` }));
    expect(fresh.json()).toMatchObject({ role: 'member', primarySiteId: null });
    const gone = await makeUser(h.deps.db);
    const token = await idTokenFor(h, gone);
    expect((await whoami(token)).statusCode).toBe(200);
    await h.deps.db.query('UPDATE users SET deleted = true WHERE uid = $1', [gone.uid]);
    expectProblem(await whoami(token), 401, 'unauthorized');
  });

  it('are accepted only as Authorization: Bearer (x-api-key carries API keys only)', async () => {
    const token = await idTokenFor(h, member);
    expectProblem(await whoami(null, { 'x-api-key': token }), 401, 'unauthorized');
    expectProblem(await whoami(null, { authorization: `Basic ${token}` }), 401, 'unauthorized');
  });

  it('verify against the JWKS the API serves at /.well-known/jwks.json', async () => {
    const jwks = await h.request({ method: 'GET', url: '/.well-known/jwks.json', key: null });
    expect(jwks.statusCode).toBe(200);
    const keys = jwks.json().keys;
    expect(keys).toHaveLength(1);
    expect(keys[0]).toMatchObject({ kty: 'OKP', crv: 'Ed25519', alg: 'EdDSA', use: 'sig', kid: expect.any(String) });
    expect(keys[0].d).toBeUndefined();
    const { payload } = await jwtVerify(await idTokenFor(h, member), createLocalJWKSet(jwks.json()), {
      issuer: localIssuer(h.deps.cfg),
      audience: 'roost',
    });
    expect(payload.sub).toBe(member.uid);
    const disco = await h.request({ method: 'GET', url: '/.well-known/openid-configuration', key: null });
    expect(disco.json()).toMatchObject({ issuer: localIssuer(h.deps.cfg), jwks_uri: `${localIssuer(h.deps.cfg)}/.well-known/jwks.json` });
  });
});

describe('an external issuer configured by URL (production path)', () => {
  let server: http.Server;
  let issuerApp: FastifyInstance;
  let signer: KeyLike;
  const issuer = 'https://login.example.test/tenant';

  beforeAll(async () => {
    const pair = await generateKeyPair('RS256');
    signer = pair.privateKey;
    const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'ext-1', alg: 'RS256', use: 'sig' };
    server = http.createServer((req, res) => {
      if (req.url === '/keys') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ keys: [jwk] }));
      } else {
        res.writeHead(404);
        res.end();
      }
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as AddressInfo).port;
    const cfg = {
      ...h.deps.cfg,
      ROOST_OIDC_ISSUER: issuer,
      ROOST_OIDC_JWKS_URL: `http://127.0.0.1:${port}/keys`,
      ROOST_OIDC_AUDIENCE: 'roost-prod',
    };
    issuerApp = await buildApp({ ...h.deps, cfg }, { loggerInstance: testLogger('roost-api') });
    await issuerApp.ready();
  });
  afterAll(async () => {
    await issuerApp.close();
    await new Promise((resolve) => server.close(resolve));
  });

  const sign = (claims: Record<string, unknown>, aud = 'roost-prod') =>
    new SignJWT(claims)
      .setProtectedHeader({ alg: 'RS256', kid: 'ext-1' })
      .setIssuer(issuer)
      .setAudience(aud)
      .setIssuedAt()
      .setExpirationTime('10m')
      .sign(signer);

  it('accepts its tokens (by verified email) and rejects the local issuer and wrong audiences', async () => {
    const ok = await issuerApp.inject({
      method: 'GET',
      url: '/api/whoami',
      headers: { authorization: `Bearer ${await sign({ sub: 'ext|42', email: member.email })}` },
    });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toMatchObject({ userId: member.uid, key: null });
    const unverified = await issuerApp.inject({
      method: 'GET',
      url: '/api/whoami',
      headers: { authorization: `Bearer ${await sign({ sub: 'ext|43', email: member.email, email_verified: false })}` },
    });
    // Another subject whose email is not verified matches no one and signs nobody up ('ext|42' is linked now).
    expect(unverified.statusCode).toBe(401);
    const wrongAud = await issuerApp.inject({
      method: 'GET',
      url: '/api/whoami',
      headers: { authorization: `Bearer ${await sign({ sub: member.uid }, 'roost')}` },
    });
    expect(wrongAud.json().code).toBe('unauthorized');
    const local = await issuerApp.inject({
      method: 'GET',
      url: '/api/whoami',
      headers: { authorization: `Bearer ${await idTokenFor(h, member)}` },
    });
    expect(local.json().code).toBe('unauthorized');
    expect((await issuerApp.inject({ method: 'GET', url: '/.well-known/jwks.json' })).statusCode).toBe(404);
  });

  it('exchanges its tokens for sessions', async () => {
    const res = await issuerApp.inject({ method: 'POST', url: '/api/auth/session', payload: { idToken: await sign({ sub: member.uid }) } });
    expect(res.statusCode).toBe(201);
    const who = await issuerApp.inject({
      method: 'GET',
      url: '/api/whoami',
      headers: { authorization: `Bearer ${res.json().sessionToken}` },
    });
    expect(who.json()).toMatchObject({ userId: member.uid, key: null });
  });

  it('answers 503 service_unavailable when the JWKS endpoint cannot be reached', async () => {
    const cfg = {
      ...h.deps.cfg,
      ROOST_OIDC_ISSUER: issuer,
      ROOST_OIDC_JWKS_URL: 'http://127.0.0.1:9/keys',
      ROOST_OIDC_AUDIENCE: 'roost-prod',
    };
    const down = await buildApp({ ...h.deps, cfg }, { loggerInstance: testLogger('roost-api') });
    try {
      await down.ready();
      const res = await down.inject({
        method: 'GET',
        url: '/api/whoami',
        headers: { authorization: `Bearer ${await sign({ sub: member.uid })}` },
      });
      expect(res.statusCode).toBe(503);
      expect(res.headers['retry-after']).toBe('5');
      expect(res.json()).toMatchObject({ code: 'service_unavailable', retryAfter: 5 });
    } finally {
      await down.close();
    }
  });

  it('refuses to start with an issuer but no JWKS URL', async () => {
    const cfg = { ...h.deps.cfg, ROOST_OIDC_ISSUER: issuer, ROOST_OIDC_JWKS_URL: undefined };
    await expect(buildApp({ ...h.deps, cfg }, { loggerInstance: testLogger('roost-api') }).then((a) => a.ready())).rejects.toThrow(
      /ROOST_OIDC_JWKS_URL/,
    );
  });
});

describe('sessions', () => {
  it('exchange an ID token for an sst_ token stored only as a digest', async () => {
    const { token, body } = await sessionFor(h, member);
    expect(token).toMatch(/^sst_[A-Za-z0-9_-]{43}$/);
    expect(body).toMatchObject({ userId: member.uid, email: member.email, tokenType: 'Bearer', lastUsedAt: null });
    expect((body.expiresAt as number) - (body.createdAt as number)).toBe(h.deps.cfg.ROOST_SESSION_TTL_MINUTES * 60_000);
    const { rows } = await h.deps.db.query('SELECT token_hash, uid FROM sessions WHERE session_id = $1', [body.sessionId]);
    expect(rows).toEqual([{ token_hash: sha256Hex(token), uid: member.uid }]);
    const stored = JSON.stringify((await h.deps.db.query('SELECT * FROM sessions WHERE session_id = $1', [body.sessionId])).rows);
    expect(stored).not.toContain(token.slice(4));
  });

  it('authenticate as the user (whoami key null), can be read, and sign out at once', async () => {
    const { token, body } = await sessionFor(h, member);
    const who = await whoami(token);
    expect(who.statusCode).toBe(200);
    expect(who.json()).toMatchObject({ userId: member.uid, key: null });
    const cur = await h.request({ method: 'GET', url: '/api/auth/session', key: token });
    expect(cur.statusCode).toBe(200);
    expect(cur.json()).toMatchObject({ sessionId: body.sessionId, userId: member.uid, lastUsedAt: expect.any(Number) });
    const out = await h.request({ method: 'DELETE', url: '/api/auth/session', key: token });
    expect(out.statusCode).toBe(200);
    expect(out.json()).toMatchObject({ sessionId: body.sessionId, revoked: true, revokedAt: expect.any(Number) });
    expectProblem(await whoami(token), 401, 'unauthorized');
    expectProblem(await h.request({ method: 'DELETE', url: '/api/auth/session', key: token }), 401, 'unauthorized');
  });

  it('expire with token_expired; a deleted user loses them', async () => {
    const { token, body } = await sessionFor(h, member);
    await h.deps.db.query('UPDATE sessions SET expires_at = $2 WHERE session_id = $1', [body.sessionId, Date.now() - 1]);
    expectProblem(await whoami(token), 401, 'token_expired');
    const gone = await makeUser(h.deps.db);
    const s2 = await sessionFor(h, gone);
    await h.deps.db.query('UPDATE users SET deleted = true WHERE uid = $1', [gone.uid]);
    expectProblem(await whoami(s2.token), 401, 'unauthorized');
  });

  it('refuse bad exchanges without creating anything', async () => {
    const before = (await h.deps.db.query('SELECT count(*)::int AS n FROM sessions WHERE uid = $1', [member.uid])).rows[0].n;
    expectProblem(await h.request({ method: 'POST', url: '/api/auth/session', key: null, body: {} }), 400, 'validation_failed');
    expectProblem(
      await h.request({ method: 'POST', url: '/api/auth/session', key: null, body: { idToken: 'not-a-jwt' } }),
      401,
      'unauthorized',
    );
    expectProblem(
      await h.request({
        method: 'POST',
        url: '/api/auth/session',
        key: null,
        body: { idToken: await idTokenFor(h, member, { ttlSeconds: -120 }) },
      }),
      401,
      'token_expired',
    );
    expectProblem(
      await h.request({ method: 'POST', url: '/api/auth/session', key: null, body: { idToken: h.apiKey } }),
      401,
      'unauthorized',
    );
    const after = (await h.deps.db.query('SELECT count(*)::int AS n FROM sessions WHERE uid = $1', [member.uid])).rows[0].n;
    expect(after).toBe(before);
  });

  it('sign-out and session view need a session credential (403 forbidden otherwise)', async () => {
    expectProblem(await h.request({ method: 'DELETE', url: '/api/auth/session' }), 403, 'forbidden');
    expectProblem(await h.request({ method: 'GET', url: '/api/auth/session', key: await idTokenFor(h, member) }), 403, 'forbidden');
    expectProblem(await h.request({ method: 'DELETE', url: '/api/auth/session', key: null }), 401, 'unauthorized');
  });
});

describe('API key credential forms and whoami', () => {
  it('accepts x-api-key; ?api_key= only on routes that allow it', async () => {
    const viaHeader = await whoami(null, { 'x-api-key': h.apiKey });
    expect(viaHeader.statusCode).toBe(200);
    expect(viaHeader.json().key.keyPrefix).toBe(h.apiKey.slice(0, 12));
    expectProblem(await h.request({ method: 'GET', url: `/api/whoami?api_key=${h.apiKey}`, key: null }), 401, 'unauthorized');
  });

  it('whoami with a key names the key (never the raw key) and its primary site', async () => {
    const { raw, keyId } = await insertKey(h.deps.db, {
      uid: member.uid,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
      environment: 'live',
      primarySiteId: h.siteId,
    });
    const res = await whoami(raw);
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.key).toEqual({
      keyId,
      name: 'test key',
      keyPrefix: raw.slice(0, 12),
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
      environment: 'live',
      expiresAt: expect.any(Number),
      lastUsedAt: expect.any(Number),
      isLegacy: false,
    });
    expect(body.primarySiteId).toBe(h.siteId);
    expect(res.body).not.toContain(raw);
  });

  it("names only a site of the key's environment: a svk_test_ key's live primary site falls back to a sandbox site", async () => {
    const user = await makeUser(h.deps.db);
    await addMember(h.deps.db, h.siteId, user.uid);
    const { raw } = await insertKey(h.deps.db, { uid: user.uid, scopes: [], environment: 'test', primarySiteId: h.siteId });
    expect((await whoami(raw)).json().primarySiteId).toBeNull();
    const sandbox = await h.request({
      method: 'POST',
      url: '/api/sites',
      body: { name: `sandbox ${user.uid}`, environment: 'test' },
      idempotencyKey: true,
    });
    expect(sandbox.statusCode).toBe(201);
    await addMember(h.deps.db, sandbox.json().siteId, user.uid);
    expect((await whoami(raw)).json().primarySiteId).toBe(sandbox.json().siteId);
    // The same user's live key keeps its live primary site.
    const live = await insertKey(h.deps.db, { uid: user.uid, scopes: [], environment: 'live', primarySiteId: h.siteId });
    expect((await whoami(live.raw)).json().primarySiteId).toBe(h.siteId);
  });

  it("falls back to the user's own site when the key's primary site is no longer accessible", async () => {
    const other = await h.other();
    const { raw } = await insertKey(h.deps.db, { uid: member.uid, scopes: [], primarySiteId: other.siteId });
    expect((await whoami(raw)).json().primarySiteId).toBe(h.siteId);
  });

  it('rejects malformed and unknown credentials as unauthorized', async () => {
    for (const key of ['svk_live_short', 'svk_prod_' + 'A'.repeat(43), 'sst_' + 'A'.repeat(43), 'a.b.c', 'sat_' + 'B'.repeat(43)]) {
      expectProblem(await whoami(key), 401, 'unauthorized');
    }
  });
});

describe('roost admin token', () => {
  const BIN = path.resolve(__dirname, '..', '..', 'bin', 'roost.js');
  const run = (...args: string[]) =>
    spawnSync(process.execPath, [BIN, 'admin', 'token', ...args], {
      env: { ...process.env, ROOST_PG_DATABASE: process.env.ROOST_TEST_DATABASE ?? 'roost_test', ROOST_LOG_LEVEL: 'silent' },
      encoding: 'utf8',
    });

  it('prints an ID token for an existing user that the key lifecycle accepts', async () => {
    const r = run('--email', member.email, '--json', '--ttl', '5');
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(out).toMatchObject({ userId: member.uid, email: member.email, issuer: localIssuer(h.deps.cfg) });
    expect(out.expiresAt - Date.now()).toBeLessThanOrEqual(5 * 60_000);
    const key = await h.request({ method: 'POST', url: '/api/keys', key: out.idToken, body: { name: 'from-cli', preset: 'readonly' } });
    expect(key.statusCode).toBe(201);
  });

  it('signs for the API the CLI points at (--api / ROOST_API_URL) when ROOST_PUBLIC_URL is unset: that API accepts it, whatever ROOST_API_PORT here says', async () => {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      ROOST_PG_DATABASE: process.env.ROOST_TEST_DATABASE ?? 'roost_test',
      ROOST_LOG_LEVEL: 'silent',
    };
    delete env.ROOST_PUBLIC_URL;
    delete env.ROOST_API_URL;
    const r = spawnSync(process.execPath, [BIN, '--api', `${h.deps.cfg.publicUrl}/`, 'admin', 'token', '--email', member.email, '--json'], {
      env: { ...env, ROOST_API_PORT: '1' },
      encoding: 'utf8',
    });
    expect([r.status, r.stderr]).toEqual([0, '']);
    const out = JSON.parse(r.stdout);
    expect(out.issuer).toBe(localIssuer(h.deps.cfg));
    const key = await h.request({ method: 'POST', url: '/api/keys', key: out.idToken, body: { name: 'from-cli-api', preset: 'readonly' } });
    expect(key.statusCode).toBe(201);
    // Without --api, the port set here names the issuer (and the API on another port refuses the token).
    const elsewhere = spawnSync(process.execPath, [BIN, 'admin', 'token', '--email', member.email, '--json'], {
      env: { ...env, ROOST_API_PORT: '1', ROOST_CONFIG: path.join(os.tmpdir(), `roost-no-config-${Date.now()}.json`) },
      encoding: 'utf8',
    });
    expect(JSON.parse(elsewhere.stdout).issuer).toBe('http://127.0.0.1:1');
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: JSON.parse(elsewhere.stdout).idToken })).statusCode).toBe(401);
  });

  it('prints a token for a new email whose first use signs the person up as a member with no sites', async () => {
    const email = `cli-new-${Date.now()}@example.test`;
    const r = run('--email', email, '--json');
    expect(r.stderr).toBe('');
    const out = JSON.parse(r.stdout);
    expect(out).toMatchObject({ userId: null, email, subject: expect.stringMatching(/^local:[0-9a-f]{32}$/) });
    expect((await h.deps.db.query('SELECT count(*)::int AS n FROM users WHERE email = $1', [email])).rows[0].n).toBe(0);
    const session = await h.request({ method: 'POST', url: '/api/auth/session', key: null, body: { idToken: out.idToken } });
    expect(session.statusCode).toBe(201);
    const who = await whoami(session.json().sessionToken);
    expect(who.json()).toMatchObject({ email, role: 'member', primarySiteId: null });
    // The next token for that email names the user that now exists.
    expect(JSON.parse(run('--email', email, '--json').stdout).userId).toBe(who.json().userId);
  });

  it('fails with a usage error for a malformed email', () => {
    const bad = run('--email', 'not-an-email');
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/not an email/);
  });
});
