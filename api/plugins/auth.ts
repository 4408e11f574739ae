/**
 * Authentication (SPEC.md "Authentication"). Credentials, all as `Authorization: Bearer <credential>`:
 * - API keys `svk_live_…`/`svk_test_…`, looked up by SHA-256 digest (also accepted as `x-api-key` and, on
 *   routes with `config.allowQueryKey`, `?api_key=`); revoked and retired keys → 401 unauthorized, expired
 *   → 401 token_expired;
 * - first-party sessions `sst_…` (api/routes/sessions.ts), digest lookup, expired → token_expired;
 * - OIDC ID tokens (compact JWTs) verified against the configured issuer's JWKS (iss, aud, exp, nbf;
 *   config/oidc.ts names the issuer), mapped to a user by `sub` (= uid) or verified `email`;
 * - agent tokens `sat_…` bound to one site and machine.
 * The route's `config.auth` says which kinds it accepts. A deleted user's credentials are unauthorized.
 *
 * Authorisation helpers: `authorizeSite` (membership, then exact scopes), `requireUser`, `requireAgent`,
 * `requireInteractive` (session or ID token; the key lifecycle), `requireSuperadmin`.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { createLocalJWKSet, createRemoteJWKSet, errors as joseErrors, jwtVerify, type JWTPayload, type JWTVerifyGetKey } from 'jose';
import { ApiError } from '../../domain/errors';
import { hexEqual, sha256Hex } from '../../domain/hex';
import { API_KEY_RE, keyRejection } from '../../domain/keys';
import { type Requirement, scopesAllow } from '../../domain/scopes';
import type { Config } from '../../config/env';
import { localJwks, oidcSettings } from '../../config/oidc';
import type { AgentPrincipal, Principal, UserPrincipal } from '../context';
import type { KeyRow } from '../../db/keys';
import { SITE_ID_RE } from '../../domain/schemas';

export { API_KEY_RE };

declare module 'fastify' {
  interface FastifyRequest {
    /** The site `authorizeSite` last let this request act on (the audit log's site: api/plugins/audit.ts). */
    authorizedSiteId?: string;
  }
}
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

type Via = 'bearer' | 'x-api-key' | 'query';

function credentialOf(request: FastifyRequest): { raw: string; via: Via } | undefined {
  const h = request.headers.authorization;
  if (typeof h === 'string' && h.length > 0) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    if (!m) throw new ApiError('unauthorized', 'Authorization header must be "Bearer <credential>"');
    return { raw: m[1], via: 'bearer' };
  }
  const x = request.headers['x-api-key'];
  if (typeof x === 'string' && x.length > 0) return { raw: x.trim(), via: 'x-api-key' };
  if (request.routeOptions.config?.allowQueryKey) {
    const q = (request.query as Record<string, unknown> | undefined)?.api_key;
    if (typeof q === 'string' && q.length > 0) return { raw: q, via: 'query' };
  }
  return undefined;
}

/** The key row authentication reads: the repository's KeyRow columns it needs, plus the digest and the owner's role. */
type AuthKeyRow = Pick<
  KeyRow,
  | 'key_id'
  | 'name'
  | 'key_prefix'
  | 'scopes'
  | 'environment'
  | 'is_legacy'
  | 'primary_site_id'
  | 'status'
  | 'expires_at'
  | 'grace_until'
  | 'last_used_at'
  | 'uid'
  | 'email'
> & { key_hash: string; role: 'member' | 'admin' | 'superadmin'; deleted: boolean };

/** BIGINT epoch-ms columns (db/pool.ts parses int8 as number; tolerate text too). */
function ms(v: string | number | null): number | null {
  return v === null ? null : Number(v);
}

async function resolveApiKey(app: FastifyInstance, raw: string): Promise<UserPrincipal> {
  const digest = sha256Hex(raw);
  const { rows } = await app.deps.db.query<AuthKeyRow>(
    `SELECT k.key_id, k.key_hash, k.name, k.key_prefix, k.scopes, k.environment, k.is_legacy, k.primary_site_id, k.status,
            k.expires_at, k.grace_until, k.last_used_at, u.uid, u.email, u.role, u.deleted
       FROM api_keys k JOIN users u ON u.uid = k.uid WHERE k.key_hash = $1`,
    [digest],
  );
  const row = rows[0];
  if (!row || !hexEqual(row.key_hash, digest)) throw new ApiError('unauthorized', 'unknown API key');
  if (row.deleted) throw new ApiError('unauthorized', "this API key's user was deleted");
  const now = Date.now();
  const expiresAt = ms(row.expires_at);
  const rejection = keyRejection({ status: row.status, expiresAt, graceUntil: ms(row.grace_until) }, now);
  if (rejection) throw new ApiError(rejection.code, rejection.detail);
  let lastUsedAt = ms(row.last_used_at);
  if (lastUsedAt === null || now - lastUsedAt > LAST_USED_RESOLUTION_MS) {
    await app.deps.db.query('UPDATE api_keys SET last_used_at = $2 WHERE key_id = $1', [row.key_id, now]);
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

async function resolveSession(app: FastifyInstance, raw: string): Promise<UserPrincipal> {
  const digest = sha256Hex(raw);
  const { rows } = await app.deps.db.query<{
    session_id: string;
    token_hash: string;
    expires_at: string;
    revoked_at: string | null;
    last_used_at: string | null;
    uid: string;
    email: string;
    role: UserPrincipal['role'];
    deleted: boolean;
  }>(
    `SELECT s.session_id, s.token_hash, s.expires_at, s.revoked_at, s.last_used_at, u.uid, u.email, u.role, u.deleted
       FROM sessions s JOIN users u ON u.uid = s.uid WHERE s.token_hash = $1`,
    [digest],
  );
  const row = rows[0];
  if (!row || !hexEqual(row.token_hash, digest)) throw new ApiError('unauthorized', 'unknown session');
  if (row.revoked_at !== null) throw new ApiError('unauthorized', 'this session was signed out');
  if (row.deleted) throw new ApiError('unauthorized', "this session's user was deleted");
  const now = Date.now();
  if (Number(row.expires_at) <= now) throw new ApiError('token_expired', 'this session has expired; exchange a new ID token');
  const lastUsedAt = ms(row.last_used_at);
  if (lastUsedAt === null || now - lastUsedAt > LAST_USED_RESOLUTION_MS) {
    await app.deps.db.query('UPDATE sessions SET last_used_at = $2 WHERE session_id = $1', [row.session_id, now]);
  }
  return { kind: 'user', credential: 'session', sessionId: row.session_id, userId: row.uid, email: row.email, role: row.role, key: null };
}

/** Verifies a compact ID token's signature, iss, aud, exp and nbf; returns its claims. */
export type IdTokenVerifier = (token: string) => Promise<JWTPayload>;

const verifiers = new WeakMap<object, IdTokenVerifier>();

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

/** The verifier of this app (created once, on first use, from `app.deps.cfg`). */
function verifierOf(app: FastifyInstance): IdTokenVerifier {
  let v = verifiers.get(app.deps);
  if (!v) {
    v = createIdTokenVerifier(app.deps.cfg);
    verifiers.set(app.deps, v);
  }
  return v;
}

/**
 * Verifies an ID token and returns its claims. JWT failures are 401 (`token_expired` when exp passed,
 * else `unauthorized`); an unreachable JWKS endpoint is 503 service_unavailable.
 */
export async function verifyIdToken(app: FastifyInstance, raw: string): Promise<JWTPayload> {
  try {
    return await verifierOf(app)(raw);
  } catch (err) {
    if (err instanceof joseErrors.JWTExpired) throw new ApiError('token_expired', 'this ID token has expired');
    if (err instanceof joseErrors.JWKSTimeout)
      throw new ApiError('service_unavailable', 'the identity provider did not answer in time', { headers: { 'Retry-After': '5' } });
    if (err instanceof joseErrors.JOSEError) throw new ApiError('unauthorized', `ID token rejected (${err.code})`);
    if (err instanceof ApiError) throw err;
    throw new ApiError('service_unavailable', 'the identity provider could not be reached', { headers: { 'Retry-After': '5' } });
  }
}

/**
 * The Roost user an ID token names: `sub` equal to a uid, else its `email` (unless `email_verified` is
 * false), compared case-insensitively. Unknown or deleted users → 401 unauthorized.
 */
export async function userForIdToken(
  app: FastifyInstance,
  claims: JWTPayload,
): Promise<{ uid: string; email: string; role: UserPrincipal['role'] }> {
  const sub = typeof claims.sub === 'string' ? claims.sub : '';
  const email = typeof claims.email === 'string' && claims.email_verified !== false ? claims.email : null;
  const { rows } = await app.deps.db.query<{ uid: string; email: string; role: UserPrincipal['role']; deleted: boolean }>(
    `SELECT uid, email, role, deleted FROM users
      WHERE uid = $1 OR ($2::text IS NOT NULL AND lower(email) = lower($2::text))
      ORDER BY (uid = $1) DESC LIMIT 1`,
    [sub, email],
  );
  const u = rows[0];
  if (!u) throw new ApiError('unauthorized', 'no Roost user matches this ID token');
  if (u.deleted) throw new ApiError('unauthorized', 'the user of this ID token was deleted');
  return { uid: u.uid, email: u.email, role: u.role };
}

async function resolveIdToken(app: FastifyInstance, raw: string): Promise<UserPrincipal> {
  const claims = await verifyIdToken(app, raw);
  const u = await userForIdToken(app, claims);
  return { kind: 'user', credential: 'id_token', userId: u.uid, email: u.email, role: u.role, key: null };
}

async function resolveAgentToken(app: FastifyInstance, raw: string): Promise<AgentPrincipal> {
  const digest = sha256Hex(raw);
  const { rows } = await app.deps.db.query<{ site_id: string; machine_id: string; agent_token_hash: string }>(
    'SELECT site_id, machine_id, agent_token_hash FROM machines WHERE agent_token_hash = $1',
    [digest],
  );
  const row = rows[0];
  if (!row || !hexEqual(row.agent_token_hash, digest)) throw new ApiError('unauthorized', 'unknown agent token');
  return { kind: 'agent', siteId: row.site_id, machineId: row.machine_id };
}

/**
 * Resolves the request's credential to a principal (undefined when none was sent). Throws 401 problems;
 * `x-api-key` and `?api_key=` carry API keys only.
 */
export async function authenticate(app: FastifyInstance, request: FastifyRequest): Promise<Principal | undefined> {
  const cred = credentialOf(request);
  if (cred === undefined) return undefined;
  const { raw, via } = cred;
  if (API_KEY_RE.test(raw)) return resolveApiKey(app, raw);
  if (via !== 'bearer')
    throw new ApiError(
      'unauthorized',
      `${via === 'query' ? 'api_key' : 'x-api-key'} carries API keys only; send other credentials as Authorization: Bearer`,
    );
  if (SESSION_TOKEN_RE.test(raw)) return resolveSession(app, raw);
  if (AGENT_TOKEN_RE.test(raw)) return resolveAgentToken(app, raw);
  if (JWT_RE.test(raw)) return resolveIdToken(app, raw);
  throw new ApiError('unauthorized', 'malformed or unsupported credential');
}

export default fp(async function authPlugin(app: FastifyInstance) {
  // Fail at start-up, not on the first request, when the OIDC configuration is inconsistent.
  oidcSettings(app.deps.cfg);
  app.addHook('preValidation', async (request) => {
    const mode = request.routeOptions.config?.auth ?? 'user';
    if (mode === 'none') return;
    const principal = await authenticate(app, request);
    if (!principal)
      throw new ApiError('unauthorized', 'missing credential: send Authorization: Bearer <API key, session token or ID token>');
    if (mode === 'user' && principal.kind !== 'user')
      throw new ApiError('unauthorized', 'this route needs a user credential (API key, session or ID token), not an agent token');
    if (mode === 'agent' && principal.kind !== 'agent') throw new ApiError('unauthorized', 'this route needs an agent token');
    request.principal = principal;
  });
});

/** The user principal of a request; throws 401 when the request is not a user's. */
export function requireUser(request: FastifyRequest): UserPrincipal {
  const p = request.principal;
  if (!p || p.kind !== 'user') throw new ApiError('unauthorized', 'this route needs a user credential (API key, session or ID token)');
  return p;
}

/**
 * The user principal of a request made with a first-party session or an ID token (SPEC.md
 * Authentication 4 and 8: the key lifecycle needs a signed-in user). An API key gets 403 forbidden: it
 * is a valid credential that lacks this capability (docs/decisions/api-key-lifecycle.md).
 */
export function requireInteractive(request: FastifyRequest): UserPrincipal {
  const user = requireUser(request);
  if (user.credential === 'api_key') {
    throw new ApiError('forbidden', 'API keys cannot manage API keys; sign in with a session or an ID token (roost admin token)');
  }
  return user;
}

/** Throws 403 forbidden unless the user is a superadmin (platform routes). */
export function requireSuperadmin(user: UserPrincipal): UserPrincipal {
  if (user.role !== 'superadmin') throw new ApiError('forbidden', 'this route is for superadmins');
  return user;
}

/** The agent principal of a request; throws 401 when the request is not an agent's. */
export function requireAgent(request: FastifyRequest): AgentPrincipal {
  const p = request.principal;
  if (!p || p.kind !== 'agent') throw new ApiError('unauthorized', 'this route needs an agent token');
  return p;
}

/**
 * Checks that the user may act on `siteId`: the site exists and the user is its owner, a member, or a
 * superadmin (else 404 not_found, the site stays hidden), and the key's scopes grant one of `anyOf`
 * (else 403 scope_insufficient with `required`). Legacy keys and credentials without a key skip the scope
 * check. Returns the principal.
 */
export async function authorizeSite(request: FastifyRequest, siteId: string, anyOf: Requirement[]): Promise<UserPrincipal> {
  const user = requireUser(request);
  if (!SITE_ID_RE.test(siteId)) throw new ApiError('validation_failed', 'siteId is malformed', { extras: { param: 'siteId' } });
  const { rows } = await request.server.deps.db.query<{ ok: boolean }>(
    `SELECT (s.owner_uid = $2 OR $3 OR EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = s.site_id AND m.uid = $2)) AS ok
       FROM sites s WHERE s.site_id = $1`,
    [siteId, user.userId, user.role === 'superadmin'],
  );
  if (!rows[0] || !rows[0].ok) throw new ApiError('not_found', 'site not found');
  requireScopes(user, anyOf);
  request.authorizedSiteId = siteId;
  return user;
}

/** Throws 403 scope_insufficient unless the key grants one of `anyOf`. */
export function requireScopes(user: UserPrincipal, anyOf: Requirement[]): void {
  if (!user.key || user.key.isLegacy) return;
  if (!scopesAllow(user.key.scopes, anyOf)) {
    const r = anyOf[0];
    throw new ApiError('scope_insufficient', `this key lacks ${r.resource}=${r.id}:${r.permission}`, {
      extras: { required: { resource: r.resource, id: r.id, permission: r.permission } },
    });
  }
}

/**
 * Roost-level requirement: a roost scope for this roost (or `*`), or the same permission on the site.
 * (docs/decisions/scopes.md: site scopes cover the resources of the site.)
 */
export function roostRequirement(siteId: string, roostId: string, permission: Requirement['permission']): Requirement[] {
  return [
    { resource: 'roost', id: roostId, permission },
    { resource: 'site', id: siteId, permission },
  ];
}
