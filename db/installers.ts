/**
 * The agent-installer catalog (`installer_versions`, `installer_latest`; migration 017_b_installer_catalog.sql):
 * upload reservations, finalisation, the latest pointer, soft delete and the newest-first list.
 * Platform-wide (no site). The rules are services/installers.ts and activities/installers.ts;
 * docs/decisions/installer-catalog.md.
 */
import type { Semver } from '../domain/installers';
import type { Queryable } from './pool';

/** Lifecycle of a catalog row: reserved by step 1, finalised, soft-deleted. */
export type InstallerState = 'uploading' | 'active' | 'deleted';

/** One catalog row. */
export interface InstallerRow {
  version: string;
  state: InstallerState;
  sha256: string;
  release_notes: string | null;
  blob_name: string;
  /** bytes; null until finalised */
  size_bytes: number | null;
  upload_key_hash: string;
  upload_expires_at: Date;
  created_by: string;
  created_at: Date;
  finalized_by: string | null;
  finalized_at: Date | null;
  deleted_by: string | null;
  deleted_at: Date | null;
  /** true when the latest pointer names this version */
  is_latest: boolean;
}

/** A list position: the semver numbers of the last row of a page (newest first, so the next page is older). */
export type InstallerPosition = Semver;

const COLUMNS = `v.version, v.state, v.sha256, v.release_notes, v.blob_name, v.size_bytes::float8 AS size_bytes, v.upload_key_hash,
  v.upload_expires_at, v.created_by, v.created_at, v.finalized_by, v.finalized_at, v.deleted_by, v.deleted_at,
  (l.version IS NOT NULL) AS is_latest`;
const FROM = `installer_versions v LEFT JOIN installer_latest l ON l.id = 1 AND l.version = v.version`;

/** The row of `version` (any state), or undefined. */
export async function getInstallerRow(db: Queryable, version: string): Promise<InstallerRow | undefined> {
  const { rows } = await db.query<InstallerRow>(`SELECT ${COLUMNS} FROM ${FROM} WHERE v.version = $1`, [version]);
  return rows[0];
}

/** The row of `version` read for update in the caller's transaction, or undefined. */
export async function lockInstallerRow(tx: Queryable, version: string): Promise<InstallerRow | undefined> {
  const { rows } = await tx.query<InstallerRow>(`SELECT ${COLUMNS} FROM ${FROM} WHERE v.version = $1 FOR UPDATE OF v`, [version]);
  return rows[0];
}

/** The version the latest pointer names (its row), or undefined when no version was ever made latest. */
export async function latestInstallerRow(db: Queryable): Promise<InstallerRow | undefined> {
  const { rows } = await db.query<InstallerRow>(
    `SELECT ${COLUMNS} FROM installer_latest l JOIN installer_versions v ON v.version = l.version WHERE l.id = 1`,
  );
  return rows[0];
}

/**
 * Finalised versions newest first (semver order), soft-deleted ones only with `includeDeleted`; `after`
 * continues below a position. Returns at most `limit` rows.
 */
export async function listInstallerRows(
  db: Queryable,
  opts: { includeDeleted: boolean; after?: InstallerPosition; limit: number },
): Promise<{ row: InstallerRow; position: InstallerPosition }[]> {
  const a = opts.after;
  const { rows } = await db.query<InstallerRow & { major: number; minor: number; patch: number }>(
    `SELECT ${COLUMNS}, v.major, v.minor, v.patch FROM ${FROM}
      WHERE (v.state = 'active' OR ($1 AND v.state = 'deleted'))
        AND ($2::int IS NULL OR (v.major, v.minor, v.patch) < ($2::int, $3::int, $4::int))
      ORDER BY v.major DESC, v.minor DESC, v.patch DESC LIMIT $5`,
    [opts.includeDeleted, a?.[0] ?? null, a?.[1] ?? null, a?.[2] ?? null, opts.limit],
  );
  return rows.map(({ major, minor, patch, ...row }) => ({ row, position: [major, minor, patch] as InstallerPosition }));
}

/** Inserts a fresh upload reservation (state uploading). Throws the unique violation when the version exists. */
export async function insertReservation(
  tx: Queryable,
  r: {
    version: string;
    semver: Semver;
    sha256: string;
    releaseNotes: string | null;
    blobName: string;
    keyHash: string;
    expiresAt: Date;
    actor: string;
  },
): Promise<void> {
  await tx.query(
    `INSERT INTO installer_versions (version, major, minor, patch, sha256, release_notes, blob_name, upload_key_hash, upload_expires_at, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
    [r.version, r.semver[0], r.semver[1], r.semver[2], r.sha256, r.releaseNotes, r.blobName, r.keyHash, r.expiresAt, r.actor],
  );
}

/** Hands an expired, unfinalised reservation to a new upload (new checksum, notes, key and expiry). */
export async function renewReservation(
  tx: Queryable,
  r: { version: string; sha256: string; releaseNotes: string | null; keyHash: string; expiresAt: Date; actor: string },
): Promise<void> {
  await tx.query(
    `UPDATE installer_versions SET sha256 = $2, release_notes = $3, upload_key_hash = $4, upload_expires_at = $5, created_by = $6, created_at = now()
      WHERE version = $1 AND state = 'uploading'`,
    [r.version, r.sha256, r.releaseNotes, r.keyHash, r.expiresAt, r.actor],
  );
}

/** Marks an uploading version active with its measured size (bytes). */
export async function markInstallerActive(tx: Queryable, version: string, sizeBytes: number, actor: string): Promise<void> {
  await tx.query(
    `UPDATE installer_versions SET state = 'active', size_bytes = $2, finalized_by = $3, finalized_at = now() WHERE version = $1 AND state = 'uploading'`,
    [version, sizeBytes, actor],
  );
}

/** Points the latest pointer at `version`; returns the version it named before (null when none). */
export async function setLatestPointer(tx: Queryable, version: string, actor: string): Promise<string | null> {
  const before = await tx.query<{ version: string }>('SELECT version FROM installer_latest WHERE id = 1 FOR UPDATE');
  await tx.query(
    `INSERT INTO installer_latest (id, version, updated_by) VALUES (1, $1, $2)
     ON CONFLICT (id) DO UPDATE SET version = excluded.version, updated_by = excluded.updated_by, updated_at = now()`,
    [version, actor],
  );
  return before.rows[0]?.version ?? null;
}

/** Active versions counted in the caller's transaction. */
export async function countActiveInstallers(tx: Queryable): Promise<number> {
  const { rows } = await tx.query<{ n: number }>(`SELECT count(*)::int AS n FROM installer_versions WHERE state = 'active'`);
  return rows[0].n;
}

/** Soft-deletes an active version. */
export async function markInstallerDeleted(tx: Queryable, version: string, actor: string): Promise<void> {
  await tx.query(
    `UPDATE installer_versions SET state = 'deleted', deleted_by = $2, deleted_at = now() WHERE version = $1 AND state = 'active'`,
    [version, actor],
  );
}
