/**
 * Identity: who a credential is, and what they may act on (the credential rules are documented in
 * api/plugins/auth.ts, which reads the credential off the request and calls `resolveCredential`).
 *
 * - API keys `svk_live_…`/`svk_test_…`, looked up by SHA-256 digest and compared in constant time;
 *   revoked and retired keys → 401 unauthorized, expired → 401 token_expired (domain/keys.ts `keyRejection`);
 * - first-party sessions `sst_…` (`POST /api/auth/session`, services/sessions.ts), digest lookup, signed
 *   out → unauthorized, expired → token_expired;
 * - OIDC ID tokens (compact JWTs) verified against the configured issuer's JWKS (iss, aud, exp, nbf;
 *   config/oidc.ts names the issuer), mapped to a user by `sub` (= uid) or verified `email`;
 * - agent tokens `sat_…` bound to one site and machine.
 * A deleted user's credentials are unauthorized. `lastUsedAt` of keys and sessions is written at most
 * once a minute. Site access (owner, member, superadmin) is db/sites.ts.
 */
import { createLocalJWKSet, createRemoteJWKSet, errors as joseErrors, jwtVerify, type JWTPayload, type JWTVerifyGetKey } from 'jose';
import type { Config } from '../config/env';
import { localJwks, oidcSettings } from '../config/oidc';
import { machineForAgentToken } from '../db/agent-tokens';
import { keyForAuth, keyStates, touchKey } from '../db/keys';
import { sessionForAuth, touchSession } from '../db/sessions';
import { accessibleSiteIds, canActOnSite, type SiteAccess, siteAccess, siteEnvironment } from '../db/sites';
import { pendingMigrations } from '../db/migrate';
import type { RoostRow } from '../db/roosts';
import { createSignInUser, linkIdentity, userForIdTokenClaims } from '../db/users';
import { ApiError, serviceUnavailable } from '../domain/errors';
import { hexEqual, sha256Hex } from '../domain/hex';
import { EMAIL_RE } from '../domain/users';
import { API_KEY_RE, keyMayActOnSiteEnvironment, keyMayChangePlatform, keyRejection, siteEnvironmentsFor } from '../domain/keys';
import type { AgentPrincipal, Principal, UserPrincipal, UserRole } from '../domain/principal';
import { pingTemporal } from '../workflows/client';
import type { ServiceDeps } from './deps';
import { type QuotaSnapshot, siteQuota } from './quota';

/** Agent token: `sat_` + 43 base64url chars. */
export const AGENT_TOKEN_RE = /^sat_[A-Za-z0-9_-]{43}$/;
/** First-party session token: `sst_` + 43 base64url chars. */
export const SESSION_TOKEN_RE = /^sst_[A-Za-z0-9_-]{43}$/;
/** A compact JWS (three base64url segments); only ID tokens take this shape. */
export const JWT_RE = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/;
/** Allowed clock skew when checking exp and nbf of ID tokens, seconds. */
export const ID_TOKEN_CLOCK_TOLERANCE_S = 30;
/** Signature algorithms accepted on ID tokens (never `none` or HMAC). */
export const ID_TOKEN_ALGS = ['EdDSA', 'RS256', 'RS384', 'RS512', 'PS256', 'ES256', 'ES384'];
/** lastUsedAt of keys and sessions is written at most once per this many milliseconds. */
const LAST_USED_RESOLUTION_MS = 60_000;

type IdentityDeps = Pick<ServiceDeps, 'db' | 'cfg'>;

/** Where a credential was found: `Authorization: Bearer`, `x-api-key`, or the `api_key` query parameter. */
export type CredentialSource = 'bearer' | 'x-api-key' | 'query';

/** BIGINT epoch-ms columns (db/pool.ts parses int8 as number; tolerate text too). */
function ms(v: string | number | null): number | null {
  return v === null ? null : Number(v);
}

/** The site (and, on routes with `config.readsRoost`, the roost) a request names; `read` receives what the credential's statement read of them. */
export interface SiteHint {
  siteId: string;
  roostId?: string;
  read?: SiteAccessRead;
}

/**
 * What the credential's own statement also read of the site the request names (`siteHint`), for
 * `authorizeSite` (api/plugins/auth.ts): `access` undefined when the site is absent or the user may not act on it.
 */
export interface SiteAccessRead {
  siteId: string;
  access: SiteAccess | undefined;
  /** The roost the request names (`roostHint`), read with the site: its live row, only when read and present. */
  roost?: RoostRow;
}

/**
 * Why a stored key no longer authenticates at `now` (epoch ms): its user deleted, or revoked, retired or
 * expired (domain/keys.ts `keyRejection`); null while it does. The one rule of `resolveApiKey` and `usableKeyIds`.
 */
function keyRowRejection(
  row: { deleted: boolean; status: string; expires_at: string | number | null; grace_until: string | number | null },
  now: number,
): { code: 'unauthorized' | 'token_expired'; detail: string } | null {
  if (row.deleted) return { code: 'unauthorized', detail: "this API key's user was deleted" };
  return keyRejection({ status: row.status, expiresAt: ms(row.expires_at), graceUntil: ms(row.grace_until) }, now);
}

async function resolveApiKey(deps: IdentityDeps, raw: string, site?: SiteHint): Promise<UserPrincipal> {
  const digest = sha256Hex(raw);
  const row = await keyForAuth(deps.db, digest, site?.siteId, site?.roostId);
  if (row && site) site.read = { siteId: site.siteId, access: row.site, ...(row.roost ? { roost: row.roost } : {}) };
  if (!row || !hexEqual(row.key_hash, digest)) throw new ApiError('unauthorized', 'unknown API key');
  const now = Date.now();
  const rejection = keyRowRejection(row, now);
  if (rejection) throw new ApiError(rejection.code, rejection.detail);
  const expiresAt = ms(row.expires_at);
  let lastUsedAt = ms(row.last_used_at);
  if (lastUsedAt === null || now - lastUsedAt > LAST_USED_RESOLUTION_MS) {
    await touchKey(deps.db, row.key_id, now);
    lastUsedAt = now;
  }
  return {
    kind: 'user',
    credential: 'api_key',
    userId: row.uid,
    email: row.email,
    role: row.role,
    key: {
      keyId: row.key_id,
      name: row.name,
      keyPrefix: row.key_prefix,
      scopes: row.scopes,
      environment: row.environment,
      expiresAt,
      lastUsedAt,
      isLegacy: row.is_legacy,
      primarySiteId: row.primary_site_id,
    },
  };
}

async function resolveSession(deps: IdentityDeps, raw: string): Promise<UserPrincipal> {
  const digest = sha256Hex(raw);
  const row = await sessionForAuth(deps.db, digest);
  if (!row || !hexEqual(row.token_hash, digest)) throw new ApiError('unauthorized', 'unknown session');
  if (row.revoked_at !== null) throw new ApiError('unauthorized', 'this session was signed out');
  if (row.deleted) throw new ApiError('unauthorized', "this session's user was deleted");
  const now = Date.now();
  if (Number(row.expires_at) <= now) throw new ApiError('token_expired', 'this session has expired; exchange a new ID token');
  const lastUsedAt = ms(row.last_used_at);
  if (lastUsedAt === null || now - lastUsedAt > LAST_USED_RESOLUTION_MS) await touchSession(deps.db, row.session_id, now);
  return { kind: 'user', credential: 'session', sessionId: row.session_id, userId: row.uid, email: row.email, role: row.role, key: null };
}

async function resolveAgentToken(deps: IdentityDeps, raw: string): Promise<AgentPrincipal> {
  const digest = sha256Hex(raw);
  const row = await machineForAgentToken(deps.db, digest);
  if (!row || !hexEqual(row.agent_token_hash, digest)) throw new ApiError('unauthorized', 'unknown agent token');
  return { kind: 'agent', siteId: row.site_id, machineId: row.machine_id };
}

async function resolveIdToken(deps: IdentityDeps, raw: string): Promise<UserPrincipal> {
  const claims = await verifyIdToken(deps.cfg, raw);
  const u = await userForIdToken(deps, claims);
  return { kind: 'user', credential: 'id_token', userId: u.uid, email: u.email, role: u.role, key: null };
}

/**
 * The principal of a raw credential, chosen by its shape (API key, session, agent token, ID token).
 * `x-api-key` and `?api_key=` carry API keys only. `site`: the site the request names; for an API key the
 * same statement reads the site's access facts for the key's owner into `site.read` (one database round
 * trip fewer for `authorizeSite`) and, with `site.roostId`, that roost's live row (one fewer for the route).
 * @throws ApiError unauthorized or token_expired (401), service_unavailable (503: the ID-token issuer's JWKS is unreachable)
 */
export async function resolveCredential(deps: IdentityDeps, raw: string, source: CredentialSource, site?: SiteHint): Promise<Principal> {
  if (API_KEY_RE.test(raw)) return resolveApiKey(deps, raw, site);
  if (source !== 'bearer')
    throw new ApiError(
      'unauthorized',
      `${source === 'query' ? 'api_key' : 'x-api-key'} carries API keys only; send other credentials as Authorization: Bearer`,
    );
  if (SESSION_TOKEN_RE.test(raw)) return resolveSession(deps, raw);
  if (AGENT_TOKEN_RE.test(raw)) return resolveAgentToken(deps, raw);
  if (JWT_RE.test(raw)) return resolveIdToken(deps, raw);
  throw new ApiError('unauthorized', 'malformed or unsupported credential');
}

// ---------------------------------------------------------------------------------------------------
// ID tokens

/** Verifies a compact ID token's signature, iss, aud, exp and nbf; returns its claims. */
export type IdTokenVerifier = (token: string) => Promise<JWTPayload>;

/**
 * The ID-token verifier of a configuration: `jwtVerify` against the local issuer's JWKS (embedded
 * default) or the remote JWKS of ROOST_OIDC_ISSUER (fetched and cached by jose). One code path.
 * @throws Error on an inconsistent OIDC configuration (see config/oidc.ts `oidcSettings`).
 */
export function createIdTokenVerifier(cfg: Config): IdTokenVerifier {
  const settings = oidcSettings(cfg);
  let keys: Promise<JWTVerifyGetKey> | undefined;
  const getKeys = (): Promise<JWTVerifyGetKey> =>
    (keys ??=
      settings.jwks.kind === 'remote'
        ? Promise.resolve(
            createRemoteJWKSet(new URL(settings.jwks.url), { timeoutDuration: 5000, cooldownDuration: 30_000, cacheMaxAge: 600_000 }),
          )
        : localJwks(cfg).then((jwks) => createLocalJWKSet(jwks)));
  return async (token) => {
    const { payload } = await jwtVerify(token, await getKeys(), {
      issuer: settings.issuer,
      audience: settings.audience,
      algorithms: ID_TOKEN_ALGS,
      clockTolerance: ID_TOKEN_CLOCK_TOLERANCE_S,
      requiredClaims: ['exp', 'sub'],
    });
    return payload;
  };
}

const verifiers = new WeakMap<Config, IdTokenVerifier>();

/** The verifier of a configuration object (created once, on first use). */
function verifierOf(cfg: Config): IdTokenVerifier {
  let v = verifiers.get(cfg);
  if (!v) {
    v = createIdTokenVerifier(cfg);
    verifiers.set(cfg, v);
  }
  return v;
}

/**
 * Verifies an ID token and returns its claims.
 * @throws ApiError token_expired (exp passed) or unauthorized (any other JWT failure), 401;
 *   service_unavailable (503, Retry-After 5) when the JWKS endpoint does not answer.
 */
export async function verifyIdToken(cfg: Config, raw: string): Promise<JWTPayload> {
  try {
    return await verifierOf(cfg)(raw);
  } catch (err) {
    if (err instanceof joseErrors.JWTExpired) throw new ApiError('token_expired', 'this ID token has expired');
    if (err instanceof joseErrors.JWKSTimeout) throw serviceUnavailable('the identity provider did not answer in time');
    if (err instanceof joseErrors.JOSEError) throw new ApiError('unauthorized', `ID token rejected (${err.code})`);
    if (err instanceof ApiError) throw err;
    throw serviceUnavailable('the identity provider could not be reached');
  }
}

/** Longest name claim kept, characters. */
const MAX_NAME_CLAIM = 200;

function nameClaim(v: unknown): string | null {
  return typeof v === 'string' && v.trim() !== '' ? v.trim().slice(0, MAX_NAME_CLAIM) : null;
}

/**
 * The Roost user an ID token's claims name, made on first sign-in (docs/decisions/user-sign-in.md):
 * the user linked to the token's (iss, sub), else the user whose uid is `sub`, else the user whose email
 * is the token's `email` (unless `email_verified` is false), compared case-insensitively; a match by uid
 * or email links (iss, sub) to it. When none matches and the token carries a usable email, a `member`
 * with no sites is created with the names of `given_name`, `family_name` and `name`.
 * @throws ApiError unauthorized (401) for a deleted user, or an unknown user whose token has no usable email
 */
export async function userForIdToken(
  deps: Pick<ServiceDeps, 'db'>,
  claims: JWTPayload,
): Promise<{ uid: string; email: string; role: UserRole; created: boolean }> {
  const issuer = typeof claims.iss === 'string' ? claims.iss : '';
  const sub = typeof claims.sub === 'string' ? claims.sub : '';
  const email = typeof claims.email === 'string' && claims.email_verified !== false ? claims.email.trim() : null;
  let created = false;
  let u = await userForIdTokenClaims(deps.db, { issuer, sub, email });
  if (u && !u.linked && !u.deleted && issuer && sub) await linkIdentity(deps.db, issuer, sub, u.uid);
  if (!u) {
    if (!email || !EMAIL_RE.test(email) || !issuer || !sub) {
      throw new ApiError('unauthorized', 'no Roost user matches this ID token, and it carries no verified email to sign up with');
    }
    const made = await createSignInUser(deps.db, {
      issuer,
      subject: sub,
      email,
      firstName: nameClaim(claims.given_name),
      lastName: nameClaim(claims.family_name),
      displayName: nameClaim(claims.name),
    });
    u = { ...made, linked: true };
    created = true;
  }
  if (u.deleted) throw new ApiError('unauthorized', 'the user of this ID token was deleted');
  return { uid: u.uid, email: u.email, role: u.role, created };
}

// ---------------------------------------------------------------------------------------------------
// Access and self-description

/** True when the site exists and `user` owns it, is a member of it, or is a superadmin. */
export function mayActOnSite(deps: Pick<ServiceDeps, 'db'>, user: UserPrincipal, siteId: string): Promise<boolean> {
  return canActOnSite(deps.db, { uid: user.userId, role: user.role }, siteId);
}

/**
 * Throws 403 forbidden when `user` authenticated with an API key whose environment differs from the site's
 * (docs/decisions/test-keys.md: `svk_test_` keys act on sandbox sites only, `svk_live_` keys on live sites
 * only). Sessions and ID tokens pass. Call after the membership check (the site exists).
 */
export async function requireKeyEnvironment(deps: Pick<ServiceDeps, 'db'>, user: UserPrincipal, siteId: string): Promise<void> {
  if (!user.key) return;
  checkKeyEnvironment(user, siteId, (await siteEnvironment(deps.db, siteId)) ?? 'live');
}

/** `requireKeyEnvironment` with the site's environment already read. @throws ApiError forbidden (403). */
export function checkKeyEnvironment(user: UserPrincipal, siteId: string, env: 'live' | 'test'): void {
  if (!user.key) return;
  if (keyMayActOnSiteEnvironment(user.key.environment, env)) return;
  throw new ApiError(
    'forbidden',
    env === 'test'
      ? `site ${siteId} is a sandbox site: use a svk_test_ key (this is a svk_live_ key)`
      : `svk_test_ keys act on sandbox sites only; site ${siteId} is live: use a svk_live_ key`,
  );
}

/**
 * Of `keyIds`, the keys that would still authenticate now and still reach `siteId`: not revoked, retired or
 * expired, their user not deleted (the rules of `resolveApiKey`), and that user still owner, member or
 * superadmin of the site (the rule of `authorizeSite`), in one database read. The event stream uses it to end
 * a stream before it writes it another event once its key is revoked ("Revocation is permanent and
 * immediate") or its user has lost the site.
 */
export async function usableKeyIds(deps: Pick<ServiceDeps, 'db'>, keyIds: string[], siteId: string): Promise<Set<string>> {
  if (keyIds.length === 0) return new Set();
  const now = Date.now();
  const usable = new Set<string>();
  for (const row of await keyStates(deps.db, keyIds, siteId)) if (row.may_act && !keyRowRejection(row, now)) usable.add(row.key_id);
  return usable;
}

/**
 * Throws 403 forbidden when `user` authenticated with a `svk_test_` key and the request changes platform-wide
 * state (users, memberships, the installer catalog; docs/decisions/test-keys.md). Sessions, ID tokens and
 * live keys pass.
 */
export function checkPlatformChange(user: UserPrincipal): void {
  if (!user.key || keyMayChangePlatform(user.key.environment)) return;
  throw new ApiError(
    'forbidden',
    'svk_test_ keys change nothing platform-wide (users, site memberships, the installer catalog have no sandbox); use a svk_live_ key',
  );
}

/**
 * The site's environment and roostEnabled flag when the site exists and `user` may act on it (owner,
 * member or superadmin), else undefined; one database read (db/sites.ts `siteAccess`).
 */
export function siteAccessOf(deps: Pick<ServiceDeps, 'db'>, user: UserPrincipal, siteId: string): Promise<SiteAccess | undefined> {
  return siteAccess(deps.db, { uid: user.userId, role: user.role }, siteId);
}

/** What `GET /api/whoami` reports beyond the principal itself. */
export interface WhoamiFacts {
  /** The key's primary site while the user can still act on it, else the user's first own or member site by id; null when none. */
  primarySiteId: string | null;
  /** The quota of `primarySiteId` (bytes), or null. */
  quota: QuotaSnapshot | null;
}

/** The primary site of `user` and its quota (`GET /api/whoami`; docs/decisions/whoami.md). */
export async function whoamiFacts(deps: Pick<ServiceDeps, 'db' | 'cfg'>, user: UserPrincipal): Promise<WhoamiFacts> {
  const preferred = user.key?.primarySiteId ?? null;
  // A key names only sites of its own environment (a svk_test_ key acts on sandbox sites only).
  const environments = siteEnvironmentsFor(user.key?.environment);
  let primarySiteId: string | null = null;
  if (
    preferred !== null &&
    (await accessibleSiteIds(deps.db, { uid: user.userId, role: user.role }, { siteIds: [preferred], limit: 1, environments })).length
  )
    primarySiteId = preferred;
  // Own and member sites only (a superadmin's fallback is not "every site").
  primarySiteId ??= (await accessibleSiteIds(deps.db, { uid: user.userId, role: 'member' }, { limit: 1, environments }))[0] ?? null;
  const quota = primarySiteId ? await siteQuota(deps, primarySiteId) : null;
  return { primarySiteId, quota };
}

/** Each dependency of the API and whether it answered (`GET /readyz`). */
export interface DependencyHealth {
  database: 'up' | 'down';
  blobStorage: 'up' | 'down';
  temporal: 'up' | 'down';
}

/** What `GET /readyz` found: each dependency, and whether this build's migrations are all applied. */
export interface Readiness {
  dependencies: DependencyHealth;
  /** `unknown` while the database does not answer. */
  migrations: 'applied' | 'pending' | 'unknown';
  /** Migration files of this build the database has not recorded (db/migrations), in order. */
  pendingMigrations: string[];
}

/** How long `GET /readyz` waits for each dependency (ms). */
export const HEALTH_TIMEOUT_MS = 3000;

/** Rejects after `ms` unless `p` settles first. */
function within<T>(p: Promise<T>, ms: number): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => (t = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)));
  return Promise.race([p, timeout]).finally(() => clearTimeout(t));
}

/**
 * Readiness (`GET /readyz`, docs/observability.md "Health and readiness"): asks the database (this build's
 * pending migrations, db/migrate.ts pendingMigrations, which is also the database's ping), blob storage (the
 * chunk container's properties) and Temporal (`GetSystemInfo`) at once, each within HEALTH_TIMEOUT_MS.
 * @returns the readiness when every dependency answers and no migration is pending
 * @throws ApiError service_unavailable (503, Retry-After) naming what is not ready, with `dependencies`,
 *   `migrations` and `pendingMigrations` (the Readiness fields) in the problem
 */
export async function checkReadiness(deps: Pick<ServiceDeps, 'db' | 'blob' | 'temporalProbe'>): Promise<Readiness> {
  const probe = async (p: () => Promise<unknown>): Promise<'up' | 'down'> => {
    try {
      await within(p(), HEALTH_TIMEOUT_MS);
      return 'up';
    } catch {
      return 'down';
    }
  };
  let pending: string[] | undefined;
  const [database, blobStorage, temporal] = await Promise.all([
    probe(async () => (pending = await pendingMigrations(deps.db))),
    probe(() => deps.blob.ping(HEALTH_TIMEOUT_MS)),
    probe(() => pingTemporal(deps.temporalProbe, HEALTH_TIMEOUT_MS)),
  ]);
  const dependencies: DependencyHealth = { database, blobStorage, temporal };
  const readiness: Readiness = {
    dependencies,
    migrations: database === 'down' || !pending ? 'unknown' : pending.length > 0 ? 'pending' : 'applied',
    pendingMigrations: database === 'down' ? [] : (pending ?? []),
  };
  const names = { database: 'the database', blobStorage: 'blob storage', temporal: 'Temporal' } as const;
  const down = (Object.keys(dependencies) as (keyof DependencyHealth)[]).filter((k) => dependencies[k] === 'down');
  const problems: string[] = down.map((k) => names[k]);
  if (readiness.migrations === 'pending') problems.push(`migrations not applied (${readiness.pendingMigrations.join(', ')})`);
  if (problems.length > 0) {
    throw new ApiError('service_unavailable', `not ready: ${problems.join(', ')}; retry shortly`, {
      headers: { 'Retry-After': String(HEALTH_RETRY_AFTER_SECONDS) },
      extras: { retryAfter: HEALTH_RETRY_AFTER_SECONDS, ...readiness },
    });
  }
  return readiness;
}

/** Retry-After of a `GET /readyz` that is not ready (seconds). */
const HEALTH_RETRY_AFTER_SECONDS = 5;
