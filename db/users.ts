/** Users as identity needs them: lookups by uid, email, or the claims of an ID token. */
import type { UserRole } from '../domain/principal';
import type { Queryable } from './pool';

/** A user as the key routes and authentication need it. */
export interface KeyOwner {
  uid: string;
  email: string;
  role: UserRole;
  deleted: boolean;
}

/** A user by uid or email (case-insensitive); undefined when absent. */
export async function findUser(db: Queryable, by: { uid?: string; email?: string }): Promise<KeyOwner | undefined> {
  const { rows } = await db.query<KeyOwner>(
    `SELECT uid, email, role, deleted FROM users WHERE ($1::text IS NOT NULL AND uid = $1::text) OR ($2::text IS NOT NULL AND lower(email) = lower($2::text)) LIMIT 1`,
    [by.uid ?? null, by.email ?? null],
  );
  return rows[0];
}

/**
 * The user an ID token names: the one whose uid is `sub`, else the one whose email is `email`
 * (case-insensitive; pass null when the token's email is absent or unverified). Deleted users are
 * returned too (the caller refuses them). Undefined when none matches.
 */
export async function userForIdTokenClaims(db: Queryable, sub: string, email: string | null): Promise<KeyOwner | undefined> {
  const { rows } = await db.query<KeyOwner>(
    `SELECT uid, email, role, deleted FROM users
      WHERE uid = $1 OR ($2::text IS NOT NULL AND lower(email) = lower($2::text))
      ORDER BY (uid = $1) DESC LIMIT 1`,
    [sub, email],
  );
  return rows[0];
}
