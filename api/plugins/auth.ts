/**
 * Authentication (SPEC.md "Authentication"): `Authorization: Bearer <credential>`, plus `x-api-key` and,
 * on routes that allow it, `?api_key=`. API keys (`svk_live_…`/`svk_test_…`) are looked up by their
 * SHA-256 digest; agent tokens (`sat_…`) bind a request to one site and machine. The route's
 * `config.auth` says which credential kinds it accepts.
 *
 * Authorisation helpers (`authorizeSite`, `requireUser`) enforce site membership and exact scopes.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../../domain/errors';
import { hexEqual, sha256Hex } from '../../domain/hex';
import { Requirement, Scope, scopesAllow } from '../../domain/scopes';
import type { AgentPrincipal, Principal, UserPrincipal } from '../context';

export const API_KEY_RE = /^svk_(live|test)_[A-Za-z0-9_-]{43}$/;
export const AGENT_TOKEN_RE = /^sat_[A-Za-z0-9_-]{43}$/;

function credentialOf(request: FastifyRequest): string | undefined {
  const h = request.headers.authorization;
  if (typeof h === 'string' && h.length > 0) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    if (!m) throw new ApiError('unauthorized', 'Authorization header must be "Bearer <credential>"');
    return m[1];
  }
  const x = request.headers['x-api-key'];
  if (typeof x === 'string' && x.length > 0) return x.trim();
  if (request.routeOptions.config?.allowQueryKey) {
    const q = (request.query as Record<string, unknown> | undefined)?.api_key;
    if (typeof q === 'string' && q.length > 0) return q;
  }
  return undefined;
}

interface KeyRow {
  key_id: string;
  key_hash: string;
  name: string;
  key_prefix: string;
  scopes: Scope[];
  environment: 'live' | 'test';
  is_legacy: boolean;
  primary_site_id: string | null;
  status: string;
  expires_at: number | null;
  grace_until: number | null;
  last_used_at: number | null;
  uid: string;
  email: string;
  role: 'member' | 'admin' | 'superadmin';
  deleted: boolean;
}

async function resolveApiKey(app: FastifyInstance, raw: string): Promise<UserPrincipal> {
  const digest = sha256Hex(raw);
  const { rows } = await app.deps.db.query<KeyRow>(
    `SELECT k.key_id, k.key_hash, k.name, k.key_prefix, k.scopes, k.environment, k.is_legacy, k.primary_site_id, k.status,
            k.expires_at, k.grace_until, k.last_used_at, u.uid, u.email, u.role, u.deleted
       FROM api_keys k JOIN users u ON u.uid = k.uid WHERE k.key_hash = $1`,
    [digest],
  );
  const row = rows[0];
  if (!row || !hexEqual(row.key_hash, digest) || row.deleted || row.status === 'revoked') {
    throw new ApiError('unauthorized', 'unknown or revoked API key');
  }
  const now = Date.now();
  if (row.status === 'rotated' && (row.grace_until === null || row.grace_until < now)) {
    throw new ApiError('unauthorized', 'this key was rotated and its grace period has ended');
  }
  if (row.expires_at !== null && row.expires_at < now) throw new ApiError('token_expired', 'API key has expired');
  if (row.last_used_at === null || now - row.last_used_at > 60_000) {
    await app.deps.db.query('UPDATE api_keys SET last_used_at = $2 WHERE key_id = $1', [row.key_id, now]);
    row.last_used_at = now;
  }
  return {
    kind: 'user',
    userId: row.uid,
    email: row.email,
    role: row.role,
    key: {
      keyId: row.key_id,
      name: row.name,
      keyPrefix: row.key_prefix,
      scopes: row.scopes,
      environment: row.environment,
      expiresAt: row.expires_at,
      lastUsedAt: row.last_used_at,
      isLegacy: row.is_legacy,
      primarySiteId: row.primary_site_id,
    },
  };
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

/** Resolves the request's credential to a principal. Throws 401 problems. */
export async function authenticate(app: FastifyInstance, request: FastifyRequest): Promise<Principal | undefined> {
  const raw = credentialOf(request);
  if (raw === undefined) return undefined;
  if (API_KEY_RE.test(raw)) return resolveApiKey(app, raw);
  if (AGENT_TOKEN_RE.test(raw)) return resolveAgentToken(app, raw);
  throw new ApiError('unauthorized', 'malformed or unsupported credential');
}

export default fp(async function authPlugin(app: FastifyInstance) {
  app.addHook('preValidation', async (request) => {
    const mode = request.routeOptions.config?.auth ?? 'user';
    if (mode === 'none') return;
    const principal = await authenticate(app, request);
    if (!principal) throw new ApiError('unauthorized', 'missing credential: send Authorization: Bearer <API_KEY>');
    if (mode === 'user' && principal.kind !== 'user') throw new ApiError('unauthorized', 'this route needs an API key, not an agent token');
    if (mode === 'agent' && principal.kind !== 'agent') throw new ApiError('unauthorized', 'this route needs an agent token');
    request.principal = principal;
  });
});

/** The user principal of a request; throws 401 when the request is not a user's. */
export function requireUser(request: FastifyRequest): UserPrincipal {
  const p = request.principal;
  if (!p || p.kind !== 'user') throw new ApiError('unauthorized', 'this route needs an API key');
  return p;
}

/** The agent principal of a request; throws 401 when the request is not an agent's. */
export function requireAgent(request: FastifyRequest): AgentPrincipal {
  const p = request.principal;
  if (!p || p.kind !== 'agent') throw new ApiError('unauthorized', 'this route needs an agent token');
  return p;
}

/** Site ids look like `site_<24 hex>` or any 1..64 chars of [A-Za-z0-9_-]. */
export const SITE_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;

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
