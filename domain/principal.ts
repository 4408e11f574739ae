/**
 * Who a request acts as, once authentication has resolved its credential (services/identity.ts resolves,
 * api/plugins/auth.ts puts the result on `request.principal`). Pure types.
 */
import type { KeyEnvironment } from './keys';
import type { Scope } from './scopes';

/** Roles of a user (migration `users.role`). */
export type UserRole = 'member' | 'admin' | 'superadmin';

/** The API key a user principal authenticated with (times in epoch ms). */
export interface PrincipalKey {
  keyId: string;
  name: string;
  keyPrefix: string;
  scopes: Scope[];
  environment: KeyEnvironment;
  expiresAt: number | null;
  lastUsedAt: number | null;
  isLegacy: boolean;
  primarySiteId: string | null;
}

/** A user acting through an API key, a first-party session (`sst_`) or an OIDC ID token. */
export interface UserPrincipal {
  kind: 'user';
  /** Which credential authenticated the request; the key lifecycle routes need 'session' or 'id_token'. */
  credential: 'api_key' | 'session' | 'id_token';
  /** The session id when `credential` is 'session'. */
  sessionId?: string;
  userId: string;
  email: string;
  role: UserRole;
  /** null when authenticated by session or ID token. */
  key: null | PrincipalKey;
}

/** A machine's agent acting through its `sat_` agent token. */
export interface AgentPrincipal {
  kind: 'agent';
  siteId: string;
  machineId: string;
}

export type Principal = UserPrincipal | AgentPrincipal;
