/**
 * Identity helpers for tests: users, memberships, API keys inserted the way db/bootstrap.ts does (with
 * chosen scopes and state), ID tokens from the local issuer, and sessions through the API.
 */
import { randomBytes } from 'node:crypto';
import type { Pool } from 'pg';
import { newId, sha256Hex } from '../../domain/hex';
import { generateApiKey, keyPrefix } from '../../domain/keys';
import type { Scope } from '../../domain/scopes';
import { signLocalIdToken, type LocalIdTokenClaims } from '../../config/oidc';
import type { Harness } from './harness';

/** Creates a user (member unless `role` says otherwise); returns uid and email. */
export async function makeUser(
  db: Pool,
  opts: { role?: 'member' | 'admin' | 'superadmin'; email?: string } = {},
): Promise<{ uid: string; email: string }> {
  const uid = newId('usr');
  const email = opts.email ?? `user-${randomBytes(4).toString('hex')}@example.test`;
  await db.query('INSERT INTO users (uid, email, role) VALUES ($1, $2, $3)', [uid, email, opts.role ?? 'member']);
  return { uid, email };
}

/** Makes `uid` a member of `siteId`. */
export async function addMember(db: Pool, siteId: string, uid: string): Promise<void> {
  await db.query('INSERT INTO site_members (site_id, uid) VALUES ($1, $2) ON CONFLICT DO NOTHING', [siteId, uid]);
}

/** Inserts an API key row with the given scopes and state; returns the raw key and its id. */
export async function insertKey(
  db: Pool,
  opts: {
    uid: string;
    scopes: Scope[];
    environment?: 'live' | 'test';
    status?: 'active' | 'rotated' | 'revoked';
    expiresAt?: number | null;
    graceUntil?: number | null;
    primarySiteId?: string | null;
    isLegacy?: boolean;
    name?: string;
  },
): Promise<{ raw: string; keyId: string }> {
  const raw = generateApiKey(opts.environment ?? 'live');
  const keyId = newId('key');
  await db.query(
    `INSERT INTO api_keys (key_id, uid, name, key_prefix, key_hash, scopes, environment, is_legacy, primary_site_id, status, expires_at, grace_until, lifetime_days)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 90)`,
    [
      keyId,
      opts.uid,
      opts.name ?? 'test key',
      keyPrefix(raw),
      sha256Hex(raw),
      JSON.stringify(opts.scopes),
      opts.environment ?? 'live',
      opts.isLegacy ?? false,
      opts.primarySiteId ?? null,
      opts.status ?? 'active',
      opts.expiresAt === undefined ? Date.now() + 86_400_000 : opts.expiresAt,
      opts.graceUntil ?? null,
    ],
  );
  return { raw, keyId };
}

/** An ID token from the local issuer for `sub`/`email` (claims may override ttl, nbf, aud, iss). */
export async function idTokenFor(
  h: Harness,
  who: { uid: string; email: string },
  claims: Partial<LocalIdTokenClaims> = {},
): Promise<string> {
  return (await signLocalIdToken(h.deps.cfg, { sub: who.uid, email: who.email, ...claims })).idToken;
}

/** Exchanges an ID token for a session through the API; returns the raw `sst_` token and the body. */
export async function sessionFor(
  h: Harness,
  who: { uid: string; email: string },
): Promise<{ token: string; body: Record<string, unknown> }> {
  const res = await h.request({ method: 'POST', url: '/api/auth/session', key: null, body: { idToken: await idTokenFor(h, who) } });
  if (res.statusCode !== 201) throw new Error(`session exchange failed: ${res.statusCode} ${res.body}`);
  const body = res.json();
  return { token: body.sessionToken, body };
}

/**
 * A live key of the harness user carrying only `scopes`, with the harness site as its primary site (the
 * missing-scope cases of every route test: 403 scope_insufficient with `required`).
 */
export async function scopedKey(h: Harness, scopes: Scope[], name = 'scoped test key'): Promise<string> {
  return (await insertKey(h.deps.db, { uid: h.userId, scopes, primarySiteId: h.siteId, name })).raw;
}
