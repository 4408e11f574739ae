/**
 * First-party session repository (`POST /api/auth/session`; docs/decisions/sessions.md). A session is an
 * opaque `sst_` token exchanged for a verified ID token; only its SHA-256 is stored. Times are epoch ms.
 */
import type { Pool } from 'pg';
import { newId, randomToken, sha256Hex } from '../domain/hex';
import type { UserRole } from '../domain/principal';
import type { Queryable } from './pool';

/** A `sessions` row. */
export interface SessionRow {
  session_id: string;
  uid: string;
  issuer: string;
  subject: string;
  created_at: number;
  expires_at: number;
  last_used_at: number | null;
  revoked_at: number | null;
}

/** Prefix of raw session tokens. */
export const SESSION_TOKEN_PREFIX = 'sst_';

/**
 * Creates a session for `uid` lasting `ttlMs` from now; returns the raw token (shown once) and the row.
 * One INSERT: nothing else changes.
 */
export async function createSession(
  db: Pool,
  s: { uid: string; issuer: string; subject: string; ttlMs: number; ip?: string | null; userAgent?: string | null },
): Promise<{ token: string; row: SessionRow }> {
  const token = `${SESSION_TOKEN_PREFIX}${randomToken(32)}`;
  const now = Date.now();
  const { rows } = await db.query<SessionRow>(
    `INSERT INTO sessions (session_id, uid, token_hash, issuer, subject, created_at, expires_at, ip, user_agent)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
     RETURNING session_id, uid, issuer, subject, created_at, expires_at, last_used_at, revoked_at`,
    [
      newId('ses'),
      s.uid,
      sha256Hex(token),
      s.issuer.slice(0, 512),
      s.subject.slice(0, 512),
      now,
      now + s.ttlMs,
      s.ip?.slice(0, 64) ?? null,
      s.userAgent?.slice(0, 256) ?? null,
    ],
  );
  return { token, row: rows[0] };
}

/** One session of `uid` by id; undefined when absent. */
export async function findSession(db: Queryable, sessionId: string, uid: string): Promise<SessionRow | undefined> {
  const { rows } = await db.query<SessionRow>(
    'SELECT session_id, uid, issuer, subject, created_at, expires_at, last_used_at, revoked_at FROM sessions WHERE session_id = $1 AND uid = $2',
    [sessionId, uid],
  );
  return rows[0];
}

/** Ends a session now (sign-out); returns the row, or undefined when it was not live. */
export async function revokeSession(db: Queryable, sessionId: string, uid: string): Promise<SessionRow | undefined> {
  const { rows } = await db.query<SessionRow>(
    `UPDATE sessions SET revoked_at = $3 WHERE session_id = $1 AND uid = $2 AND revoked_at IS NULL
     RETURNING session_id, uid, issuer, subject, created_at, expires_at, last_used_at, revoked_at`,
    [sessionId, uid, Date.now()],
  );
  return rows[0];
}

/** A session as authentication reads it: the row's state plus its user (times epoch ms). */
export interface AuthSessionRow {
  session_id: string;
  token_hash: string;
  expires_at: number;
  revoked_at: number | null;
  last_used_at: number | null;
  uid: string;
  email: string;
  role: UserRole;
  deleted: boolean;
}

/** The session whose token digest (SHA-256 hex) is `digest`, with its user; undefined when none. */
export async function sessionForAuth(db: Queryable, digest: string): Promise<AuthSessionRow | undefined> {
  const { rows } = await db.query<AuthSessionRow>(
    `SELECT s.session_id, s.token_hash, s.expires_at, s.revoked_at, s.last_used_at, u.uid, u.email, u.role, u.deleted
       FROM sessions s JOIN users u ON u.uid = s.uid WHERE s.token_hash = $1`,
    [digest],
  );
  return rows[0];
}

/** Sets a session's `last_used_at` to `at` (epoch ms). */
export async function touchSession(db: Queryable, sessionId: string, at: number): Promise<void> {
  await db.query('UPDATE sessions SET last_used_at = $2 WHERE session_id = $1', [sessionId, at]);
}

/** Signs out every live session of `uid` (in the caller's transaction); returns how many (0 when run again). */
export async function revokeUserSessions(tx: Queryable, uid: string, at = Date.now()): Promise<number> {
  const { rowCount } = await tx.query('UPDATE sessions SET revoked_at = $2 WHERE uid = $1 AND revoked_at IS NULL', [uid, at]);
  return rowCount ?? 0;
}
