/**
 * First-party sessions (`POST|GET|DELETE /api/auth/session`; docs/decisions/sessions.md): a verified ID
 * token is exchanged for an opaque `sst_…` token (shown once, stored as a SHA-256 digest) that
 * authenticates as `Authorization: Bearer` until it expires or is signed out. Rows: db/sessions.ts.
 */
import { oidcSettings } from '../config/oidc';
import { createSession, findSession, revokeSession, type SessionRow } from '../db/sessions';
import { ApiError } from '../domain/errors';
import type { UserRole } from '../domain/principal';
import type { ServiceDeps } from './deps';
import { userForIdToken, verifyIdToken } from './identity';

export type { SessionRow } from '../db/sessions';

/** A new session: its row, the raw token (return it once, never store it) and the user's email and role. */
export interface ExchangedSession {
  row: SessionRow;
  token: string;
  email: string;
  role: UserRole;
}

/**
 * Exchanges an ID token for a session lasting ROOST_SESSION_TTL_MINUTES. `ip` (≤ 64 chars kept) and
 * `userAgent` (≤ 256) are stored for the user's own review.
 * @throws ApiError unauthorized / token_expired (the token or its user), service_unavailable (the issuer's JWKS)
 */
export async function exchangeIdToken(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: { idToken: string; ip: string | null; userAgent: string | null },
): Promise<ExchangedSession> {
  const claims = await verifyIdToken(deps.cfg, input.idToken);
  const user = await userForIdToken(deps, claims);
  const { token, row } = await createSession(deps.db, {
    uid: user.uid,
    issuer: String(claims.iss ?? oidcSettings(deps.cfg).issuer),
    subject: String(claims.sub ?? ''),
    ttlMs: deps.cfg.ROOST_SESSION_TTL_MINUTES * 60_000,
    ip: input.ip,
    userAgent: input.userAgent,
  });
  return { row, token, email: user.email, role: user.role };
}

/**
 * The session `sessionId` of `userId`.
 * @throws ApiError unauthorized when it does not exist
 */
export async function getSession(deps: Pick<ServiceDeps, 'db'>, userId: string, sessionId: string): Promise<SessionRow> {
  const row = await findSession(deps.db, sessionId, userId);
  if (!row) throw new ApiError('unauthorized', 'unknown session');
  return row;
}

/**
 * Signs the session out now; returns its row with `revoked_at` (epoch ms) set.
 * @throws ApiError unauthorized when it was no longer live (a concurrent sign-out won)
 */
export async function signOut(deps: Pick<ServiceDeps, 'db'>, userId: string, sessionId: string): Promise<SessionRow> {
  const row = await revokeSession(deps.db, sessionId, userId);
  if (!row) throw new ApiError('unauthorized', 'this session was signed out');
  return row;
}
