/**
 * Users: lookups for authentication (by uid, email, or an ID token's issuer and subject), creation on
 * first sign-in, the Users routes' reads and role changes, site assignment, and the user-delete
 * cascade's progress row (`user_deletions`). Site membership rows (`site_members`) are written here for
 * one user at a time; the access rule that reads them is db/sites.ts. docs/decisions/users.md.
 */
import type { UserRole } from '../domain/principal';
import { newId } from '../domain/hex';
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
 * The user an ID token names, in this order: the user linked to (`issuer`, `sub`) in user_identities,
 * the one whose uid is `sub`, the one whose email is `email` (case-insensitive; pass null when the
 * token's email is absent or unverified). Deleted users are returned too (the caller refuses them).
 * Undefined when none matches.
 */
export async function userForIdTokenClaims(
  db: Queryable,
  claims: { issuer: string; sub: string; email: string | null },
): Promise<(KeyOwner & { linked: boolean }) | undefined> {
  const { rows } = await db.query<KeyOwner & { linked: boolean; rank: number }>(
    `SELECT u.uid, u.email, u.role, u.deleted, (i.uid IS NOT NULL) AS linked,
            CASE WHEN i.uid IS NOT NULL THEN 0 WHEN u.uid = $2 THEN 1 ELSE 2 END AS rank
       FROM users u
       LEFT JOIN user_identities i ON i.uid = u.uid AND i.issuer = $1 AND i.subject = $2
      WHERE i.uid IS NOT NULL OR u.uid = $2 OR ($3::text IS NOT NULL AND lower(u.email) = lower($3::text))
      ORDER BY rank LIMIT 1`,
    [claims.issuer, claims.sub, claims.email],
  );
  const r = rows[0];
  return r ? { uid: r.uid, email: r.email, role: r.role, deleted: r.deleted, linked: r.linked } : undefined;
}

/** Links an issuer's subject to a user (nothing when the subject is linked already). */
export async function linkIdentity(db: Queryable, issuer: string, subject: string, uid: string): Promise<void> {
  await db.query('INSERT INTO user_identities (issuer, subject, uid) VALUES ($1, $2, $3) ON CONFLICT (issuer, subject) DO NOTHING', [
    issuer,
    subject,
    uid,
  ]);
}

/** What a first sign-in knows of the person (from the ID token's claims). */
export interface SignInProfile {
  issuer: string;
  subject: string;
  email: string;
  firstName: string | null;
  lastName: string | null;
  displayName: string | null;
}

/**
 * Creates a `member` with no sites for a first sign-in and links (issuer, subject) to it. Two first
 * sign-ins of one email at once make one user: the email is unique, the loser's insert does nothing and
 * it reads the winner's row. Returns the user (possibly one made concurrently, possibly deleted).
 */
export async function createSignInUser(db: Queryable, p: SignInProfile): Promise<KeyOwner> {
  await db.query(
    `INSERT INTO users (uid, email, role, first_name, last_name, display_name) VALUES ($1, $2, 'member', $3, $4, $5)
     ON CONFLICT (email) DO NOTHING`,
    [newId('usr'), p.email, p.firstName, p.lastName, p.displayName],
  );
  const u = await findUser(db, { email: p.email });
  if (!u) throw new Error(`user ${p.email} vanished after its creation`);
  await linkIdentity(db, p.issuer, p.subject, u.uid);
  return u;
}

// ---------------------------------------------------------------------------------------------------
// The Users routes

/** A user record as the Users routes show it (times as Date). */
export interface UserRow {
  uid: string;
  email: string;
  role: UserRole;
  first_name: string | null;
  last_name: string | null;
  display_name: string | null;
  deleted: boolean;
  deleted_at: Date | null;
  created_at: Date;
  updated_at: Date;
  /** Sites the user is a member of, ascending. */
  site_ids: string[];
  /** Sites the user owns, ascending. */
  owned_site_ids: string[];
}

const USER_COLUMNS = `u.uid, u.email, u.role, u.first_name, u.last_name, u.display_name, u.deleted, u.deleted_at, u.created_at, u.updated_at,
  coalesce((SELECT array_agg(m.site_id ORDER BY m.site_id) FROM site_members m WHERE m.uid = u.uid), ARRAY[]::text[]) AS site_ids,
  coalesce((SELECT array_agg(s.site_id ORDER BY s.site_id) FROM sites s WHERE s.owner_uid = u.uid), ARRAY[]::text[]) AS owned_site_ids`;

/** One user by uid (deleted users too), or undefined. */
export async function getUserRow(db: Queryable, uid: string): Promise<UserRow | undefined> {
  const { rows } = await db.query<UserRow>(`SELECT ${USER_COLUMNS} FROM users u WHERE u.uid = $1`, [uid]);
  return rows[0];
}

/** List position: `[created_at as the database prints it, uid]` of the last user of a page. */
export type UserPosition = [string, string];

/**
 * A page of users, oldest first by (created_at, uid): `limit` rows after `after`, filtered by `role`,
 * membership of `siteId` (member or owner) and, unless `includeDeleted`, active users only. Returns the
 * rows and, per row, its position text.
 */
export async function listUserRows(
  db: Queryable,
  opts: { role?: UserRole; siteId?: string; includeDeleted: boolean; after?: UserPosition; limit: number },
): Promise<{ row: UserRow; position: UserPosition }[]> {
  const { rows } = await db.query<UserRow & { position_at: string }>(
    `SELECT ${USER_COLUMNS}, u.created_at::text AS position_at FROM users u
      WHERE ($1::text IS NULL OR u.role = $1)
        AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = $2 AND m.uid = u.uid)
                              OR EXISTS (SELECT 1 FROM sites s WHERE s.site_id = $2 AND s.owner_uid = u.uid))
        AND ($3 OR NOT u.deleted)
        AND ($4::timestamptz IS NULL OR (u.created_at, u.uid) > ($4::timestamptz, $5::text))
      ORDER BY u.created_at, u.uid LIMIT $6`,
    [opts.role ?? null, opts.siteId ?? null, opts.includeDeleted, opts.after?.[0] ?? null, opts.after?.[1] ?? null, opts.limit],
  );
  return rows.map(({ position_at, ...row }) => ({ row, position: [position_at, row.uid] as UserPosition }));
}

/** The role of `uid` read for update in the caller's transaction (undefined when absent). */
export async function lockUser(tx: Queryable, uid: string): Promise<KeyOwner | undefined> {
  const { rows } = await tx.query<KeyOwner>('SELECT uid, email, role, deleted FROM users WHERE uid = $1 FOR UPDATE', [uid]);
  return rows[0];
}

/** Active (not deleted) superadmins, counted in the caller's transaction. */
export async function countActiveSuperadmins(tx: Queryable): Promise<number> {
  const { rows } = await tx.query<{ n: number }>(`SELECT count(*)::int AS n FROM users WHERE role = 'superadmin' AND NOT deleted`);
  return rows[0].n;
}

/** Sets the role of `uid`. */
export async function setRole(tx: Queryable, uid: string, role: UserRole): Promise<void> {
  await tx.query('UPDATE users SET role = $2, updated_at = now() WHERE uid = $1', [uid, role]);
}

/** Of `siteIds`, those that exist. */
export async function existingSiteIds(tx: Queryable, siteIds: string[]): Promise<Set<string>> {
  if (siteIds.length === 0) return new Set();
  const { rows } = await tx.query<{ site_id: string }>('SELECT site_id FROM sites WHERE site_id = ANY($1::text[])', [siteIds]);
  return new Set(rows.map((r) => r.site_id));
}

/** Makes `uid` a member of each of `siteIds` (existing memberships stay); returns the sites newly joined, ascending. */
export async function addMemberships(tx: Queryable, uid: string, siteIds: string[]): Promise<string[]> {
  if (siteIds.length === 0) return [];
  const { rows } = await tx.query<{ site_id: string }>(
    `INSERT INTO site_members (site_id, uid) SELECT s, $1 FROM unnest($2::text[]) AS s
     ON CONFLICT (site_id, uid) DO NOTHING RETURNING site_id`,
    [uid, siteIds],
  );
  return rows.map((r) => r.site_id).sort();
}

/** Ends the membership of `uid` in each of `siteIds`; returns the sites it was a member of, ascending. */
export async function removeMemberships(tx: Queryable, uid: string, siteIds: string[]): Promise<string[]> {
  if (siteIds.length === 0) return [];
  const { rows } = await tx.query<{ site_id: string }>(
    'DELETE FROM site_members WHERE uid = $1 AND site_id = ANY($2::text[]) RETURNING site_id',
    [uid, siteIds],
  );
  return rows.map((r) => r.site_id).sort();
}

/** Of `siteIds`, those `uid` owns. */
export async function ownedAmong(tx: Queryable, uid: string, siteIds: string[]): Promise<string[]> {
  const { rows } = await tx.query<{ site_id: string }>(
    'SELECT site_id FROM sites WHERE owner_uid = $1 AND site_id = ANY($2::text[]) ORDER BY site_id',
    [uid, siteIds],
  );
  return rows.map((r) => r.site_id);
}

// ---------------------------------------------------------------------------------------------------
// The user-delete cascade

/** The cascade's progress row (`user_deletions`); step columns are null until the step ran. */
export interface DeletionRow {
  uid: string;
  successor_uid: string | null;
  requested_by: string;
  workflow_id: string;
  status: 'running' | 'completed';
  keys_revoked: number | null;
  sessions_revoked: number | null;
  commands_cancelled: number | null;
  sites_transferred: string[] | null;
  requested_at: Date;
  completed_at: Date | null;
}

/** The deletion of `uid`, or undefined when it was never deleted. */
export async function getDeletion(db: Queryable, uid: string): Promise<DeletionRow | undefined> {
  const { rows } = await db.query<DeletionRow>('SELECT * FROM user_deletions WHERE uid = $1', [uid]);
  return rows[0];
}

/** Soft-deletes `uid` and writes its cascade row, in the caller's transaction (credentials stop working at commit). */
export async function markDeleted(
  tx: Queryable,
  d: { uid: string; successorUid: string | null; requestedBy: string; workflowId: string },
): Promise<void> {
  await tx.query('UPDATE users SET deleted = true, deleted_at = coalesce(deleted_at, now()), updated_at = now() WHERE uid = $1', [d.uid]);
  await tx.query(
    `INSERT INTO user_deletions (uid, successor_uid, requested_by, workflow_id) VALUES ($1, $2, $3, $4) ON CONFLICT (uid) DO NOTHING`,
    [d.uid, d.successorUid, d.requestedBy, d.workflowId],
  );
}

/** The cascade row of `uid` read for update in the caller's transaction. */
export async function lockDeletion(tx: Queryable, uid: string): Promise<DeletionRow | undefined> {
  const { rows } = await tx.query<DeletionRow>('SELECT * FROM user_deletions WHERE uid = $1 FOR UPDATE', [uid]);
  return rows[0];
}

/** Records one step's result on the cascade row (column names are fixed here, never from input). */
export async function recordDeletionStep(
  tx: Queryable,
  uid: string,
  step: { keysRevoked: number; sessionsRevoked: number } | { commandsCancelled: number } | { sitesTransferred: string[] } | 'completed',
): Promise<void> {
  if (step === 'completed') {
    await tx.query(`UPDATE user_deletions SET status = 'completed', completed_at = coalesce(completed_at, now()) WHERE uid = $1`, [uid]);
  } else if ('keysRevoked' in step) {
    await tx.query('UPDATE user_deletions SET keys_revoked = $2, sessions_revoked = $3 WHERE uid = $1', [
      uid,
      step.keysRevoked,
      step.sessionsRevoked,
    ]);
  } else if ('commandsCancelled' in step) {
    await tx.query('UPDATE user_deletions SET commands_cancelled = $2 WHERE uid = $1', [uid, step.commandsCancelled]);
  } else {
    await tx.query('UPDATE user_deletions SET sites_transferred = $2 WHERE uid = $1', [uid, JSON.stringify(step.sitesTransferred)]);
  }
}
