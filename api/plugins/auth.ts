/**
 * Authentication and authorisation of requests. Credentials, all as `Authorization: Bearer <credential>`:
 * API keys (also accepted as `x-api-key` and, on routes with `config.allowQueryKey`, `?api_key=`),
 * first-party sessions `sst_…`, OIDC ID tokens and agent tokens `sat_…`; services/identity.ts
 * resolves them (rules and errors there). The route's `config.auth` says which kinds it accepts.
 *
 * Authorisation helpers: `authorizeSite` (membership, then exact scopes), `requireUser`, `requireAgent`,
 * `requireInteractive` (session or ID token; the key lifecycle), `requireSuperadmin`.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../../domain/errors';
import { API_KEY_RE } from '../../domain/keys';
import { type Requirement, scopesAllow } from '../../domain/scopes';
import { ROOST_ID_RE, SITE_ID_RE } from '../../domain/schemas';
import { oidcSettings } from '../../config/oidc';
import {
  checkKeyEnvironment,
  type CredentialSource,
  resolveCredential,
  siteAccessOf,
  type SiteAccessRead,
  type SiteHint,
} from '../../services/identity';
import type { RoostRow } from '../../services/versions';
import { checkRoostEnabled } from '../../services/sites';
import type { AgentPrincipal, AuthMode, Principal, UserPrincipal } from '../context';
import { noteDecision, rateLimitedError } from '../ratelimit/limits';

export { API_KEY_RE };
export {
  AGENT_TOKEN_RE,
  createIdTokenVerifier,
  ID_TOKEN_ALGS,
  ID_TOKEN_CLOCK_TOLERANCE_S,
  JWT_RE,
  SESSION_TOKEN_RE,
} from '../../services/identity';
export type { IdTokenVerifier } from '../../services/identity';

declare module 'fastify' {
  interface FastifyRequest {
    /** The site `authorizeSite` last let this request act on (the audit log's site: api/plugins/audit.ts). */
    authorizedSiteId?: string;
    /** What authentication already read of the site the request names (services/identity.ts `resolveCredential`). */
    siteAccessRead?: SiteAccessRead;
  }
}

/** Methods on which the `x-api-key` compatibility header is accepted. */
const READ_METHODS = new Set(['GET', 'HEAD']);

/** The credential a request carries and where (Authorization: Bearer, x-api-key, or `?api_key=` on routes that allow it). */
function credentialOf(request: FastifyRequest): { raw: string; via: CredentialSource } | undefined {
  const h = request.headers.authorization;
  if (typeof h === 'string' && h.length > 0) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    if (!m) throw new ApiError('unauthorized', 'Authorization header must be "Bearer <credential>"');
    return { raw: m[1], via: 'bearer' };
  }
  const x = request.headers['x-api-key'];
  if (typeof x === 'string' && x.length > 0) {
    // The compatibility header is for reads only (docs/decisions/credential-forms.md): a mutation names its
    // credential in Authorization, so a key pasted into a proxy's or a log's header list cannot change state.
    if (!READ_METHODS.has(request.method)) {
      throw new ApiError('unauthorized', 'x-api-key is accepted on reads (GET) only; send mutations with Authorization: Bearer <API key>');
    }
    return { raw: x.trim(), via: 'x-api-key' };
  }
  if (request.routeOptions.config?.allowQueryKey) {
    const q = (request.query as Record<string, unknown> | undefined)?.api_key;
    if (typeof q === 'string' && q.length > 0) return { raw: q, via: 'query' };
  }
  return undefined;
}

/**
 * Resolves the request's credential to a principal (undefined when none was sent). Throws 401 problems;
 * `x-api-key` and `?api_key=` carry API keys only.
 */
export async function authenticate(app: FastifyInstance, request: FastifyRequest): Promise<Principal | undefined> {
  const cred = credentialOf(request);
  if (cred === undefined) return undefined;
  const siteId = siteNamed(request);
  const roostId = request.routeOptions.config?.readsRoost && READ_METHODS.has(request.method) ? roostNamed(request) : undefined;
  const site: SiteHint | undefined = siteId === undefined ? undefined : { siteId, ...(roostId ? { roostId } : {}) };
  const principal = await resolveCredential(app.deps, cred.raw, cred.via, site);
  request.siteAccessRead = site?.read;
  return principal;
}

/**
 * The well-formed site id a request names (path parameter, query or JSON body `siteId`, as the site-scoped
 * routes take it), before validation; undefined when none. Only a hint: `authorizeSite` uses what was
 * read with the credential when it is asked about that same site, and reads the site itself otherwise.
 */
function siteNamed(request: FastifyRequest): string | undefined {
  for (const source of [request.params, request.query, request.body]) {
    const v = source !== null && typeof source === 'object' ? (source as Record<string, unknown>).siteId : undefined;
    if (typeof v === 'string' && SITE_ID_RE.test(v)) return v;
  }
  return undefined;
}

/** The well-formed roost id of the request's path (`/api/roosts/:roostId…`), before validation; undefined when none. */
function roostNamed(request: FastifyRequest): string | undefined {
  const v = (request.params as Record<string, unknown> | undefined)?.roostId;
  return typeof v === 'string' && ROOST_ID_RE.test(v) ? v : undefined;
}

/**
 * The live row of the roost the path names when authentication read it with the request's API key (routes
 * with `config.readsRoost`, services/identity.ts `SiteHint`) and `authorizeSite` has let the request act on
 * `siteId`; undefined otherwise (the service then reads it itself). db/roosts.ts `resolveVersion` uses it
 * only when it is the roost asked for.
 */
export function roostReadFor(request: FastifyRequest, siteId: string): RoostRow | undefined {
  const read = request.siteAccessRead;
  return request.authorizedSiteId === siteId && read?.siteId === siteId ? read.roost : undefined;
}

export default fp(async function authPlugin(app: FastifyInstance) {
  // Fail at start-up, not on the first request, when the OIDC configuration is inconsistent.
  oidcSettings(app.deps.cfg);
  app.addHook('preValidation', async (request) => {
    const mode = request.routeOptions.config?.auth ?? 'user';
    if (mode === 'none') return;
    try {
      await authenticateFor(app, request, mode);
    } catch (err) {
      // Failed authentications spend the `auth` bucket of the caller's address (10 a minute in production):
      // past it, guessing answers 429 with the rate-limit headers instead of 401 (docs/decisions/rate-limit-buckets.md).
      if (err instanceof ApiError && err.status === 401) {
        const d = await request.server.rateLimits.bucket('auth', `ip:${request.ip}`);
        // Counted, so the 401 carries the bucket's RateLimit-* headers too (api/plugins/rate-limit.ts onSend).
        noteDecision(request, d);
        if (!d.allowed) throw rateLimitedError(d);
      }
      throw err;
    }
  });
});

/** Resolves the request's credential for a route of `mode` onto `request.principal`; throws 401 ApiError. */
async function authenticateFor(app: FastifyInstance, request: FastifyRequest, mode: AuthMode): Promise<void> {
  const principal = await authenticate(app, request);
  if (!principal) throw new ApiError('unauthorized', 'missing credential: send Authorization: Bearer <API key, session token or ID token>');
  if (mode === 'user' && principal.kind !== 'user')
    throw new ApiError('unauthorized', 'this route needs a user credential (API key, session or ID token), not an agent token');
  if (mode === 'agent' && principal.kind !== 'agent') throw new ApiError('unauthorized', 'this route needs an agent token');
  request.principal = principal;
}

/** The user principal of a request; throws 401 when the request is not a user's. */
export function requireUser(request: FastifyRequest): UserPrincipal {
  const p = request.principal;
  if (!p || p.kind !== 'user') throw new ApiError('unauthorized', 'this route needs a user credential (API key, session or ID token)');
  return p;
}

/**
 * The user principal of a request made with a first-party session or an ID token (the key lifecycle,
 * `POST /api/keys` and the rest of api/routes/keys.ts, needs a signed-in user). An API key gets 403 forbidden: it
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
 * check. An API key acts only on sites of its environment (`svk_test_` on sandbox sites, `svk_live_` on
 * live ones; else 403 forbidden, docs/decisions/test-keys.md). On the roost routes (`/api/roosts…`) a site
 * whose roostEnabled is false answers 403 roost_disabled (docs/decisions/sites.md). Returns the principal.
 */
export async function authorizeSite(request: FastifyRequest, siteId: string, anyOf: Requirement[]): Promise<UserPrincipal> {
  const user = requireUser(request);
  if (!SITE_ID_RE.test(siteId)) throw new ApiError('validation_failed', 'siteId is malformed', { extras: { param: 'siteId' } });
  // Membership, the site's environment and its roostEnabled flag in one read (db/sites.ts siteAccess), or
  // read already with the API key by the same statement (db/keys.ts keyForAuth).
  const read = request.siteAccessRead;
  const site = read?.siteId === siteId ? read.access : await siteAccessOf(request.server.deps, user, siteId);
  if (!site) throw new ApiError('not_found', 'site not found');
  checkKeyEnvironment(user, siteId, site.environment);
  requireScopes(user, anyOf);
  if (isRoostRoute(request)) checkRoostEnabled(siteId, site.roost_enabled);
  request.authorizedSiteId = siteId;
  return user;
}

/** The roost routes (`/api/roosts…`), which a site with roostEnabled false refuses (403 roost_disabled; docs/decisions/sites.md). */
function isRoostRoute(request: FastifyRequest): boolean {
  const url = request.routeOptions.url ?? '';
  return url === '/api/roosts' || url.startsWith('/api/roosts/');
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

/** Site-level requirement: `permission` on the site (for `authorizeSite`). */
export function siteRequirement(siteId: string, permission: Requirement['permission']): Requirement[] {
  return [{ resource: 'site', id: siteId, permission }];
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
