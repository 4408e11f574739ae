/**
 * Shared types of the API: the dependencies every route reaches through `app.deps`, the authenticated
 * principal on `request.principal`, and the per-route config keys the plugins read.
 */
import type { ServiceDeps } from '../services/deps';
import type { Principal } from '../domain/principal';

/** The API's dependencies are the services' (services/deps.ts). */
export type AppDeps = ServiceDeps;

/** The authenticated principal (domain/principal.ts), re-exported for the routes. */
export type { AgentPrincipal, Principal, UserPrincipal } from '../domain/principal';

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
    /** A POST without a body is taken as `{}` (the OpenAPI document marks the request body optional). */
    bodyOptional?: boolean;
    /**
     * A GET/HEAD route naming `:roostId` that uses the roost's row: authentication by API key reads it in
     * the key's statement (api/plugins/auth.ts `roostReadFor`). Other routes do not pay for that join.
     */
    readsRoost?: boolean;
  }
}
