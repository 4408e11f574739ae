/**
 * Roost repository (the `/api/roosts` and `/api/roosts/{roostId}/versions` routes): roost rows, version
 * rows, version-ref resolution (docs/decisions/version-refs.md), and the publish and rollback pointer
 * moves (docs/decisions/version-publish.md). SQL only: chunk presence against blob storage and the
 * version-body loader live in services/chunks.ts and services/version-bodies.ts.
 *
 * Every query names `site_id`. Multi-statement writes run in one `withTx` (SERIALIZABLE, 40001 retry);
 * the roost row is read `FOR UPDATE` first so concurrent publishes and rollbacks serialise on it.
 *
 * Functions other route families use: `getRoost`, `getVersion`, `resolveVersion`, `resolveVersionIn`.
 */
import type { Pool } from 'pg';
import { ApiError } from '../domain/errors';
import { type ChunkRef, MAX_MISSING_CHUNKS } from '../domain/version';
import { parseVersionRef, type VersionRef } from '../domain/versionRef';
import { recordEvent } from './events';
import { type Queryable, withTx } from './pool';

// ---------------------------------------------------------------------------------------------------
// Rows

/** A `roosts` row. `targets` are machine ids; `deleted_at` is set on a tombstoned roost. */
export interface RoostRow {
  site_id: string;
  roost_id: string;
  name: string;
  targets: string[];
  extract_path: string;
  version_counter: number;
  current_version_id: string | null;
  previous_version_id: string | null;
  created_at: Date;
  created_by: string;
  updated_at: Date;
  deleted_at: Date | null;
}

/** A `roost_versions` row (sizes in bytes). */
export interface VersionRow {
  site_id: string;
  roost_id: string;
  version_id: string;
  version_number: number;
  description: string | null;
  blob_name: string;
  total_size: number;
  total_files: number;
  parent_version_id: string | null;
  created_at: Date;
  created_by: string;
  updated_at: Date;
  /** Ed25519 signature of the version (base64url; services/signing.ts), null until signed. */
  signature: string | null;
  /** Key id of `signature`. */
  signing_key_id: string | null;
}

/** The summary fields of a version joined onto a roost (current or previous). */
export interface VersionSummaryRow {
  version_id: string;
  version_number: number;
  description: string | null;
  blob_name: string;
  total_size: number;
  total_files: number;
  created_by: string;
  created_at: Date;
}

/** A roost with its current and previous versions resolved (null when the pointer is null). */
export interface RoostView extends RoostRow {
  current: VersionSummaryRow | null;
  previous: VersionSummaryRow | null;
  /** Keyset position of the row in the roost list (created_at as server text, roost id). */
  position: [string, string];
}

/** The columns of a RoostRow. */
const ROOST_COLUMN_NAMES = [
  'site_id',
  'roost_id',
  'name',
  'targets',
  'extract_path',
  'version_counter',
  'current_version_id',
  'previous_version_id',
  'created_at',
  'created_by',
  'updated_at',
  'deleted_at',
] as const;
const ROOST_COLS = ROOST_COLUMN_NAMES.join(', ');

/**
 * The select list of a RoostRow read from table alias `alias` inside a larger statement, each column named
 * `<prefix><column>` (db/keys.ts `keyForAuth` reads the roost a request names beside its API key);
 * `roostFromPrefixed` turns such a row back into a RoostRow.
 */
export function prefixedRoostColumns(alias: string, prefix: string): string {
  return ROOST_COLUMN_NAMES.map((c) => `${alias}.${c} AS ${prefix}${c}`).join(', ');
}

/** The RoostRow in a row selected with `prefixedRoostColumns(…, prefix)`; undefined when its roost_id is null (no roost). */
export function roostFromPrefixed(row: Record<string, unknown>, prefix: string): RoostRow | undefined {
  if (row[`${prefix}roost_id`] === null || row[`${prefix}roost_id`] === undefined) return undefined;
  const out: Record<string, unknown> = {};
  for (const c of ROOST_COLUMN_NAMES) out[c] = row[`${prefix}${c}`];
  return out as unknown as RoostRow;
}
const VERSION_COLS = `site_id, roost_id, version_id, version_number, description, blob_name, total_size, total_files,
  parent_version_id, created_at, created_by, updated_at, signature, signing_key_id`;

// ---------------------------------------------------------------------------------------------------
// Roosts

/**
 * The roost row, or null when it does not exist in the site or is tombstoned (unless
 * `includeDeleted`). `forUpdate` locks the row (use inside `withTx`).
 */
export async function getRoost(
  db: Queryable,
  siteId: string,
  roostId: string,
  opts: { includeDeleted?: boolean; forUpdate?: boolean } = {},
): Promise<RoostRow | null> {
  const { rows } = await db.query<RoostRow>(
    `SELECT ${ROOST_COLS} FROM roosts WHERE site_id = $1 AND roost_id = $2${opts.forUpdate ? ' FOR UPDATE' : ''}`,
    [siteId, roostId],
  );
  const row = rows[0];
  if (!row || (row.deleted_at !== null && !opts.includeDeleted)) return null;
  return row;
}

/** Like `getRoost`, but a missing (or tombstoned) roost throws 404 not_found. */
export async function requireRoost(
  db: Queryable,
  siteId: string,
  roostId: string,
  opts: { includeDeleted?: boolean; forUpdate?: boolean } = {},
): Promise<RoostRow> {
  const row = await getRoost(db, siteId, roostId, opts);
  if (!row) throw new ApiError('not_found', 'roost not found', { extras: { param: 'roostId' } });
  return row;
}

function summaryCols(alias: string, as: string): string {
  return ['version_id', 'version_number', 'description', 'blob_name', 'total_size', 'total_files', 'created_by', 'created_at']
    .map((c) => `${alias}.${c} AS ${as}_${c}`)
    .join(', ');
}

const VIEW_SELECT = `SELECT r.site_id, r.roost_id, r.name, r.targets, r.extract_path, r.version_counter, r.current_version_id,
    r.previous_version_id, r.created_at, r.created_by, r.updated_at, r.deleted_at, r.created_at::text AS position_at,
    ${summaryCols('c', 'cur')}, ${summaryCols('p', 'prev')}
  FROM roosts r
  LEFT JOIN roost_versions c ON c.site_id = r.site_id AND c.roost_id = r.roost_id AND c.version_id = r.current_version_id
  LEFT JOIN roost_versions p ON p.site_id = r.site_id AND p.roost_id = r.roost_id AND p.version_id = r.previous_version_id`;

/** One row of VIEW_SELECT: the roost's columns plus `cur_*` and `prev_*` summary columns (null when absent). */
type ViewRow = Omit<RoostView, 'current' | 'previous' | 'position'> & { position_at: string } & Record<string, unknown>;

function pickSummary(row: ViewRow, as: 'cur' | 'prev'): VersionSummaryRow | null {
  const col = (c: keyof VersionSummaryRow) => row[`${as}_${c}`];
  if (col('version_id') === null || col('version_id') === undefined) return null;
  return {
    version_id: col('version_id') as string,
    version_number: col('version_number') as number,
    description: col('description') as string | null,
    blob_name: col('blob_name') as string,
    total_size: col('total_size') as number,
    total_files: col('total_files') as number,
    created_by: col('created_by') as string,
    created_at: col('created_at') as Date,
  };
}

function toView(row: ViewRow): RoostView {
  return {
    site_id: row.site_id,
    roost_id: row.roost_id,
    name: row.name,
    targets: row.targets,
    extract_path: row.extract_path,
    version_counter: row.version_counter,
    current_version_id: row.current_version_id,
    previous_version_id: row.previous_version_id,
    created_at: row.created_at,
    created_by: row.created_by,
    updated_at: row.updated_at,
    deleted_at: row.deleted_at,
    current: pickSummary(row, 'cur'),
    previous: pickSummary(row, 'prev'),
    position: [row.position_at, row.roost_id],
  };
}

/** One roost with resolved current/previous summaries, or null (missing, or tombstoned unless asked). */
export async function getRoostView(db: Queryable, siteId: string, roostId: string, includeDeleted = false): Promise<RoostView | null> {
  const { rows } = await db.query<ViewRow>(`${VIEW_SELECT} WHERE r.site_id = $1 AND r.roost_id = $2`, [siteId, roostId]);
  if (!rows[0] || (rows[0].deleted_at !== null && !includeDeleted)) return null;
  return toView(rows[0]);
}

/**
 * A page of a site's roosts, newest first (created_at, then roost id, descending). `after` is the
 * position of the last row of the previous page. Returns up to `limit` rows and whether more follow.
 */
export async function listRoosts(
  db: Queryable,
  siteId: string,
  opts: { limit: number; after?: [string, string]; includeDeleted?: boolean },
): Promise<{ rows: RoostView[]; more: boolean }> {
  const args: unknown[] = [siteId];
  let where = 'r.site_id = $1';
  if (!opts.includeDeleted) where += ' AND r.deleted_at IS NULL';
  if (opts.after) {
    args.push(opts.after[0], opts.after[1]);
    where += ` AND (r.created_at, r.roost_id) < ($2::timestamptz, $3)`;
  }
  args.push(opts.limit + 1);
  const { rows } = await db.query<ViewRow>(
    `${VIEW_SELECT} WHERE ${where} ORDER BY r.created_at DESC, r.roost_id DESC LIMIT $${args.length}`,
    args,
  );
  return { rows: rows.slice(0, opts.limit).map(toView), more: rows.length > opts.limit };
}

/** Inserts a new roost (no versions, counter 0). Returns the row. */
export async function createRoost(
  db: Queryable,
  input: { siteId: string; roostId: string; name: string; targets: string[]; extractPath: string; createdBy: string },
): Promise<RoostRow> {
  const { rows } = await db.query<RoostRow>(
    `INSERT INTO roosts (site_id, roost_id, name, targets, extract_path, created_by) VALUES ($1, $2, $3, $4, $5, $6)
     RETURNING ${ROOST_COLS}`,
    [input.siteId, input.roostId, input.name, JSON.stringify(input.targets), input.extractPath, input.createdBy],
  );
  return rows[0];
}

/** The roost fields a client may change (display name, target machines, extract root). */
export interface RoostChanges {
  name?: string;
  targets?: string[];
  extractPath?: string;
}

/** SET clause fragments for `changes`, numbering parameters from `start`. */
function changeSet(changes: RoostChanges, start: number): { sql: string[]; args: unknown[] } {
  const sql: string[] = [];
  const args: unknown[] = [];
  if (changes.name !== undefined) {
    args.push(changes.name);
    sql.push(`name = $${start + args.length - 1}`);
  }
  if (changes.targets !== undefined) {
    args.push(JSON.stringify(changes.targets));
    sql.push(`targets = $${start + args.length - 1}`);
  }
  if (changes.extractPath !== undefined) {
    args.push(changes.extractPath);
    sql.push(`extract_path = $${start + args.length - 1}`);
  }
  return { sql, args };
}

/** Applies `changes` to a live roost; throws 404 not_found when it is missing or tombstoned. */
export async function updateRoost(db: Queryable, siteId: string, roostId: string, changes: RoostChanges): Promise<void> {
  const set = changeSet(changes, 3);
  const { rowCount } = await db.query(
    `UPDATE roosts SET ${[...set.sql, 'updated_at = now()'].join(', ')} WHERE site_id = $1 AND roost_id = $2 AND deleted_at IS NULL`,
    [siteId, roostId, ...set.args],
  );
  if (!rowCount) throw new ApiError('not_found', 'roost not found', { extras: { param: 'roostId' } });
}

/**
 * Tombstones a roost (versions and blobs stay until a later purge). Repeating is harmless.
 * Returns the tombstone time and whether it was already deleted; throws 404 when the roost never existed.
 */
export async function softDeleteRoost(db: Pool, siteId: string, roostId: string): Promise<{ deletedAt: Date; alreadyDeleted: boolean }> {
  return withTx(db, async (tx) => {
    const roost = await requireRoost(tx, siteId, roostId, { includeDeleted: true, forUpdate: true });
    if (roost.deleted_at) return { deletedAt: roost.deleted_at, alreadyDeleted: true };
    const { rows } = await tx.query<{ deleted_at: Date }>(
      'UPDATE roosts SET deleted_at = now(), updated_at = now() WHERE site_id = $1 AND roost_id = $2 RETURNING deleted_at',
      [siteId, roostId],
    );
    return { deletedAt: rows[0].deleted_at, alreadyDeleted: false };
  });
}

// ---------------------------------------------------------------------------------------------------
// Versions and refs

/** A version row of the roost by its id, or null. */
export async function getVersion(db: Queryable, siteId: string, roostId: string, versionId: string): Promise<VersionRow | null> {
  const { rows } = await db.query<VersionRow>(
    `SELECT ${VERSION_COLS} FROM roost_versions WHERE site_id = $1 AND roost_id = $2 AND version_id = $3`,
    [siteId, roostId, versionId],
  );
  return rows[0] ?? null;
}

function versionNotFound(param: string, ref: string): ApiError {
  return new ApiError('version_not_found', `no version "${ref.slice(0, 80)}" in this roost`, { extras: { param } });
}

function describeRef(ref: VersionRef): string {
  switch (ref.kind) {
    case 'id':
      return ref.id;
    case 'idPrefix':
      return `vrs_${ref.prefix}`;
    case 'number':
      return `#${ref.number}`;
    case 'alias':
      return ref.alias;
  }
}

/**
 * Resolves a parsed ref within an already loaded roost row.
 * @throws ApiError version_not_found (404) when nothing matches, version_ref_malformed (400) when a
 *   legacy id prefix matches more than one version.
 */
export async function resolveVersionIn(db: Queryable, roost: RoostRow, ref: VersionRef, param = 'versionRef'): Promise<VersionRow> {
  const base = `SELECT ${VERSION_COLS} FROM roost_versions WHERE site_id = $1 AND roost_id = $2`;
  const args = [roost.site_id, roost.roost_id];
  let rows: VersionRow[] = [];
  switch (ref.kind) {
    case 'id':
      rows = (await db.query<VersionRow>(`${base} AND version_id = $3`, [...args, ref.id])).rows;
      break;
    case 'idPrefix':
      rows = (await db.query<VersionRow>(`${base} AND version_id LIKE $3 ORDER BY version_number LIMIT 2`, [...args, `${ref.prefix}%`]))
        .rows;
      if (rows.length > 1) {
        throw new ApiError('version_ref_malformed', `vrs_${ref.prefix} matches more than one version; send more of the id`, {
          extras: { param },
        });
      }
      break;
    case 'number':
      rows = (await db.query<VersionRow>(`${base} AND version_number = $3`, [...args, ref.number])).rows;
      break;
    case 'alias': {
      if (ref.alias === 'first') {
        rows = (await db.query<VersionRow>(`${base} ORDER BY version_number ASC LIMIT 1`, args)).rows;
      } else {
        const id = ref.alias === 'current' ? roost.current_version_id : roost.previous_version_id;
        if (id !== null) rows = (await db.query<VersionRow>(`${base} AND version_id = $3`, [...args, id])).rows;
      }
      break;
    }
  }
  if (!rows[0]) throw versionNotFound(param, describeRef(ref));
  return rows[0];
}

/**
 * Resolves a version ref (docs/decisions/version-refs.md: 64-hex id, `vrs_<hex>`, `3`/`#3`/`v3`,
 * `current`/`previous`/`first`) in a live roost and returns the version row. `readRoost`, the roost's live
 * row when the caller read it already in this request, saves reading it again.
 * @throws ApiError not_found (404) when the roost is missing or tombstoned, version_ref_malformed (400)
 *   for a string that is no ref, version_not_found (404) when a well-formed ref matches nothing.
 */
export async function resolveVersion(
  db: Queryable,
  siteId: string,
  roostId: string,
  ref: string | VersionRef,
  param = 'versionRef',
  readRoost?: RoostRow,
): Promise<VersionRow> {
  const parsed = typeof ref === 'string' ? parseVersionRef(ref, param) : ref;
  // `readRoost`: the live roost row this request already read (with its credential, db/keys.ts keyForAuth).
  const roost =
    readRoost && readRoost.site_id === siteId && readRoost.roost_id === roostId && readRoost.deleted_at === null
      ? readRoost
      : await requireRoost(db, siteId, roostId);
  return resolveVersionIn(db, roost, parsed, param);
}

/**
 * A page of a roost's versions, newest first. `beforeNumber` is the version number of the last row
 * of the previous page. Returns up to `limit` rows and whether more follow.
 */
export async function listVersions(
  db: Queryable,
  siteId: string,
  roostId: string,
  opts: { limit: number; beforeNumber?: number },
): Promise<{ rows: VersionRow[]; more: boolean }> {
  const args: unknown[] = [siteId, roostId];
  let where = 'site_id = $1 AND roost_id = $2';
  if (opts.beforeNumber !== undefined) {
    args.push(opts.beforeNumber);
    where += ' AND version_number < $3';
  }
  args.push(opts.limit + 1);
  const { rows } = await db.query<VersionRow>(
    `SELECT ${VERSION_COLS} FROM roost_versions WHERE ${where} ORDER BY version_number DESC LIMIT $${args.length}`,
    args,
  );
  return { rows: rows.slice(0, opts.limit), more: rows.length > opts.limit };
}

/**
 * Sets a version's description (null clears it) and returns the updated row.
 * @throws the errors of `resolveVersion`.
 */
export async function updateVersionDescription(
  db: Pool,
  siteId: string,
  roostId: string,
  ref: VersionRef,
  description: string | null,
): Promise<VersionRow> {
  return withTx(db, async (tx) => {
    const roost = await requireRoost(tx, siteId, roostId);
    const v = await resolveVersionIn(tx, roost, ref);
    const { rows } = await tx.query<VersionRow>(
      `UPDATE roost_versions SET description = $4, updated_at = now() WHERE site_id = $1 AND roost_id = $2 AND version_id = $3
       RETURNING ${VERSION_COLS}`,
      [siteId, roostId, v.version_id, description],
    );
    return rows[0];
  });
}

// ---------------------------------------------------------------------------------------------------
// Publish and rollback

/** What publish did: a new version, a pointer move to an existing one, or nothing (already current). */
export type PublishOutcome = 'created' | 'moved' | 'unchanged';

export interface PublishInput {
  siteId: string;
  roostId: string;
  versionId: string;
  /** Blob name of the body's canonical JSON text (already stored in blob storage). */
  blobName: string;
  totalSize: number;
  totalFiles: number;
  /** Distinct chunks of the body with how many files reference each (for version_chunks). */
  chunks: (ChunkRef & { fileCount: number })[];
  description: string | null;
  /** undefined: no guard; null: expect no current version; string: expect this id. */
  expectedCurrentVersionId?: string | null;
  changes: RoostChanges;
  userId: string;
  /** The service's signature of the new version (services/signing.ts signVersionFor); stored on insert only. */
  signature?: { signature: string; keyId: string };
}

export interface PublishResult {
  outcome: PublishOutcome;
  versionId: string;
  versionNumber: number;
  currentVersionId: string;
  previousVersionId: string | null;
}

function staleError(expected: string | null, current: string | null): ApiError {
  return new ApiError('version_stale', `the current version is ${current ?? 'none'}, not ${expected ?? 'none'}`, {
    extras: { currentVersionId: current, expectedCurrentVersionId: expected },
  });
}

/** Throws 412 version_stale when a guard is given and differs from the current pointer. */
export function checkExpectedCurrent(roost: RoostRow, expected: string | null | undefined): void {
  if (expected !== undefined && expected !== roost.current_version_id) throw staleError(expected, roost.current_version_id);
}

/**
 * The publish transaction of `POST /api/roosts/{roostId}/versions` (docs/decisions/version-publish.md).
 * Locks the roost, checks the expectedCurrentVersionId guard, then either
 * - inserts the version (number = counter + 1, parent = current), its distinct chunks, moves
 *   current/previous and records `version.published` ('created'); or, when the roost already holds a
 *   version with this id,
 * - moves the pointer to it like a rollback and records `version.rolled_back` ('moved'), or does
 *   nothing to the pointers when it is already current ('unchanged').
 * Roost `changes` (name, targets, extractPath) apply in every case.
 * @throws ApiError not_found, version_stale
 */
export async function publishVersion(db: Pool, input: PublishInput): Promise<PublishResult> {
  return withTx(db, async (tx) => {
    const roost = await requireRoost(tx, input.siteId, input.roostId, { forUpdate: true });
    checkExpectedCurrent(roost, input.expectedCurrentVersionId);
    const set = changeSet(input.changes, 3);
    const existing = await getVersion(tx, input.siteId, input.roostId, input.versionId);
    const base = [input.siteId, input.roostId];

    if (existing) {
      if (existing.version_id === roost.current_version_id) {
        if (set.sql.length) {
          await tx.query(`UPDATE roosts SET ${[...set.sql, 'updated_at = now()'].join(', ')} WHERE site_id = $1 AND roost_id = $2`, [
            ...base,
            ...set.args,
          ]);
        }
        return {
          outcome: 'unchanged',
          versionId: existing.version_id,
          versionNumber: existing.version_number,
          currentVersionId: existing.version_id,
          previousVersionId: roost.previous_version_id,
        };
      }
      await tx.query(
        `UPDATE roosts SET ${[`current_version_id = $${3 + set.args.length}`, `previous_version_id = $${4 + set.args.length}`, ...set.sql, 'updated_at = now()'].join(', ')}
         WHERE site_id = $1 AND roost_id = $2`,
        [...base, ...set.args, existing.version_id, roost.current_version_id],
      );
      await recordEvent(tx, input.siteId, 'version.rolled_back', {
        roostId: input.roostId,
        siteId: input.siteId,
        fromVersion: roost.current_version_id,
        toVersion: existing.version_id,
        triggeredBy: input.userId,
      });
      return {
        outcome: 'moved',
        versionId: existing.version_id,
        versionNumber: existing.version_number,
        currentVersionId: existing.version_id,
        previousVersionId: roost.current_version_id,
      };
    }

    const versionNumber = roost.version_counter + 1;
    await tx.query(
      `INSERT INTO roost_versions (site_id, roost_id, version_id, version_number, description, blob_name, total_size, total_files,
         parent_version_id, created_by, signature, signing_key_id)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
      [
        ...base,
        input.versionId,
        versionNumber,
        input.description,
        input.blobName,
        input.totalSize,
        input.totalFiles,
        roost.current_version_id,
        input.userId,
        input.signature?.signature ?? null,
        input.signature?.keyId ?? null,
      ],
    );
    if (input.chunks.length) {
      await tx.query(
        `INSERT INTO version_chunks (site_id, hash, roost_id, version_id, size, file_count)
         SELECT $1, t.hash, $2, $3, t.size, t.file_count FROM UNNEST($4::text[], $5::bigint[], $6::int[]) AS t(hash, size, file_count)
         ON CONFLICT (site_id, hash, roost_id, version_id) DO NOTHING`,
        [...base, input.versionId, input.chunks.map((c) => c.hash), input.chunks.map((c) => c.size), input.chunks.map((c) => c.fileCount)],
      );
    }
    if (input.chunks.length) {
      // The publish service (services/versions.ts) checked the chunks before this transaction; chunk GC (workflows/sweeps.ts) may have
      // condemned one since. Re-reading them here makes publish and GC conflict under SERIALIZABLE, so
      // a version never commits referencing a chunk whose row is gone.
      const present = await tx.query<{ hash: string }>('SELECT hash FROM chunks WHERE site_id = $1 AND hash = ANY($2::text[])', [
        input.siteId,
        input.chunks.map((c) => c.hash),
      ]);
      if (present.rows.length < input.chunks.length) {
        const have = new Set(present.rows.map((r) => r.hash));
        const missing = input.chunks.map((c) => c.hash).filter((h) => !have.has(h));
        throw new ApiError(
          'precondition_failed',
          `${missing.length} referenced chunk${missing.length > 1 ? 's are' : ' is'} not stored for this site; upload them, then publish again`,
          {
            extras: { missingChunks: missing.slice(0, MAX_MISSING_CHUNKS), missingCount: missing.length },
          },
        );
      }
    }
    const n = set.args.length;
    await tx.query(
      `UPDATE roosts SET ${[`version_counter = $${3 + n}`, `current_version_id = $${4 + n}`, `previous_version_id = $${5 + n}`, ...set.sql, 'updated_at = now()'].join(', ')}
       WHERE site_id = $1 AND roost_id = $2`,
      [...base, ...set.args, versionNumber, input.versionId, roost.current_version_id],
    );
    await recordEvent(tx, input.siteId, 'version.published', {
      roostId: input.roostId,
      siteId: input.siteId,
      versionId: input.versionId,
      versionNumber,
      description: input.description,
      totalFiles: input.totalFiles,
      totalSize: input.totalSize,
      createdBy: input.userId,
    });
    return {
      outcome: 'created',
      versionId: input.versionId,
      versionNumber,
      currentVersionId: input.versionId,
      previousVersionId: roost.current_version_id,
    };
  });
}

export interface RollbackResult {
  roostId: string;
  siteId: string;
  currentVersionId: string;
  currentVersionNumber: number;
  previousVersionId: string | null;
}

/**
 * Rollback (`POST /api/roosts/{roostId}/rollback`): resolves `target` in the locked roost, refuses the
 * current version (400 rollback_no_op), moves current = target and previous = old current, and
 * records `version.rolled_back`. No compare-and-swap guard, no new version, no bytes.
 * @throws ApiError not_found, version_not_found, version_ref_malformed, rollback_no_op
 */
export async function rollbackRoost(
  db: Pool,
  siteId: string,
  roostId: string,
  target: VersionRef,
  userId: string,
): Promise<RollbackResult> {
  return withTx(db, async (tx) => {
    const roost = await requireRoost(tx, siteId, roostId, { forUpdate: true });
    const v = await resolveVersionIn(tx, roost, target, 'targetVersion');
    if (v.version_id === roost.current_version_id) {
      throw new ApiError('rollback_no_op', `version ${v.version_number} is already current`, {
        extras: { param: 'targetVersion', currentVersionId: roost.current_version_id },
      });
    }
    await tx.query(
      `UPDATE roosts SET current_version_id = $3, previous_version_id = $4, updated_at = now() WHERE site_id = $1 AND roost_id = $2`,
      [siteId, roostId, v.version_id, roost.current_version_id],
    );
    await recordEvent(tx, siteId, 'version.rolled_back', {
      roostId,
      siteId,
      fromVersion: roost.current_version_id,
      toVersion: v.version_id,
      triggeredBy: userId,
    });
    return {
      roostId,
      siteId,
      currentVersionId: v.version_id,
      currentVersionNumber: v.version_number,
      previousVersionId: roost.current_version_id,
    };
  });
}
