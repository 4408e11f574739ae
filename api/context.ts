/**
 * Shared types of the API: the dependencies every route reaches through `app.deps`, the authenticated
 * principal on `request.principal`, and the per-route config keys the plugins read.
 */
import type { ServiceDeps } from '../services/deps';
import type { Scope } from '../domain/scopes';

/** The API's dependencies are the services' (services/deps.ts). */
export type AppDeps = ServiceDeps;

/** A user acting through an API key, a first-party session (`sst_`) or an OIDC ID token (SPEC.md Authentication 1). */
export interface UserPrincipal {
  kind: 'user';
  /** Which credential authenticated the request; key lifecycle routes need 'session' or 'id_token'. */
  credential: 'api_key' | 'session' | 'id_token';
  /** The session id when `credential` is 'session'. */
  sessionId?: string;
  userId: string;
  email: string;
  role: 'member' | 'admin' | 'superadmin';
  /** null when authenticated by session or ID token. */
  key: null | {
    keyId: string;
    name: string;
    keyPrefix: string;
    scopes: Scope[];
    environment: 'live' | 'test';
    expiresAt: number | null;
    lastUsedAt: number | null;
    isLegacy: boolean;
    primarySiteId: string | null;
  };
}

/** A machine's agent acting through its `sat_` agent token. */
export interface AgentPrincipal {
  kind: 'agent';
  siteId: string;
  machineId: string;
}

export type Principal = UserPrincipal | AgentPrincipal;

/** Which credentials a route accepts. Default: 'user'. */
export type AuthMode = 'none' | 'user' | 'agent' | 'userOrAgent';

declare module 'fastify' {
  interface FastifyInstance {
    deps: AppDeps;
  }
  interface FastifyRequest {
    principal?: Principal;
    /** Set by the idempotency plugin while a keyed mutation runs. */
    idempotency?: { keyHash: string; token: string; key: string };
  }
  interface FastifyContextConfig {
    auth?: AuthMode;
    /** Idempotency-Key: required, optional (honoured when sent) or ignored (the default). */
    idempotency?: 'required' | 'optional' | 'ignored';
    /** Accept `?api_key=` (event-stream style clients). `x-api-key` is accepted everywhere keys are. */
    allowQueryKey?: boolean;
  }
}
