/**
 * Chunk repository (the `/api/chunks/...` routes, docs/decisions/chunk-*.md). A site's chunks are the
 * rows of `chunks` (recorded by publish once the stored size was checked); referrers are mount rows of
 * `chunk_referrers` plus the versions that list the chunk (`version_chunks` joined to `roost_versions`).
 * Every query names `site_id`: chunks of one site are never visible to another. SQL only: the blob side of
 * chunk presence is services/chunks.ts.
 */
import type { Pool } from 'pg';
import type { ReferrerEntry, ReferrerPosition } from '../domain/chunks';
import { ApiError } from '../domain/errors';
import { sha256Hex } from '../domain/hex';
import type { ChunkRef } from '../domain/version';
import { withTx, type Queryable } from './pool';
import { withUsage } from './quota';

/**
 * The subset of `hashes` the site holds with sound bytes (one indexed query on the `chunks` primary key).
 * A chunk whose stored bytes the verification sweep found wrong (`verify_failed_digest`) is not held:
 * `chunks/check` then asks the client to upload it again and download-urls does not hand it to agents,
 * until a publish re-hashes the re-uploaded bytes (services/chunks.ts findMissingChunks) or the sweep clears it.
 * `hashes` should already be distinct; order is irrelevant.
 */
export async function heldHashes(db: Queryable, siteId: string, hashes: string[]): Promise<Set<string>> {
  const { rows } = await db.query<{ hash: string }>(
    'SELECT hash FROM chunks WHERE site_id = $1 AND hash = ANY($2) AND verify_failed_digest IS NULL',
    [siteId, hashes],
  );
  return new Set(rows.map((r) => r.hash));
}

/** True when the site holds the chunk `hash`. */
export async function chunkHeld(db: Queryable, siteId: string, hash: string): Promise<boolean> {
  const { rows } = await db.query('SELECT 1 FROM chunks WHERE site_id = $1 AND hash = $2', [siteId, hash]);
  return rows.length > 0;
}

/**
 * A recorded chunk: size in bytes, when its bytes were last re-hashed (null: never) and, when
 * verification found its bytes wrong, the digest it saw.
 */
export interface ChunkRow {
  hash: string;
  size: number;
  verified_at: Date | null;
  verify_failed_digest: string | null;
}

const CHUNK_ROWS_SQL = 'SELECT hash, size, verified_at, verify_failed_digest FROM chunks WHERE site_id = $1 AND hash = ANY($2::text[])';

/**
 * The `chunks` rows of the site among `hashes` (any verification state). The covering index
 * `chunks_check` (migration 020) answers it without reading the table.
 */
export async function chunkRows(db: Queryable, siteId: string, hashes: string[]): Promise<ChunkRow[]> {
  const { rows } = await db.query<ChunkRow>(CHUNK_ROWS_SQL, [siteId, hashes]);
  return rows;
}

const CHECK_ROWS_SQL = `SELECT c.hash, c.size, c.verified_at, c.verify_failed_digest, false AS reserved
    FROM chunks c WHERE c.site_id = $1 AND c.hash = ANY($2::text[])
  UNION ALL
  SELECT r.hash, NULL::BIGINT, NULL::TIMESTAMPTZ, NULL::TEXT, true FROM upload_reservations r
   WHERE r.site_id = $1 AND r.hash = ANY($2::text[])`;

/**
 * What `POST /api/chunks/check` reads, in one statement: the `chunks` rows of the site among `hashes` (as
 * `chunkRows`) and which of `hashes` have an `upload_reservations` row of the site (unexpired, or expired and
 * not yet deleted: upload URLs were issued, so the bytes may be in storage without a `chunks` row). One round
 * trip and one pass over the hash list instead of two statements side by side on two backends
 * (docs/benchmarks.md "On a quiet machine").
 */
export async function checkRows(db: Queryable, siteId: string, hashes: string[]): Promise<{ rows: ChunkRow[]; reserved: string[] }> {
  const { rows } = await db.query<ChunkRow & { reserved: boolean }>(CHECK_ROWS_SQL, [siteId, hashes]);
  const out: ChunkRow[] = [];
  const reserved: string[] = [];
  for (const { reserved: isReservation, ...row } of rows) {
    if (isReservation) reserved.push(row.hash);
    else out.push(row);
  }
  return { rows: out, reserved };
}

/**
 * How PostgreSQL ran `checkRows` for these arguments (EXPLAIN ANALYZE, PostgreSQL only; the benchmarks
 * report it): of the plan node that reads `chunks`, its type, the index it used and the rows it had to
 * fetch from the table.
 */
export async function explainCheckRows(
  db: Queryable,
  siteId: string,
  hashes: string[],
): Promise<{ nodeType: string; indexName: string | null; heapFetches: number | null }> {
  const { rows } = await db.query<{ 'QUERY PLAN': { Plan: Record<string, unknown> }[] }>(
    `EXPLAIN (ANALYZE, FORMAT JSON) ${CHECK_ROWS_SQL}`,
    [siteId, hashes],
  );
  const find = (node: Record<string, unknown>): Record<string, unknown> | undefined => {
    if (node['Relation Name'] === 'chunks') return node;
    for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) {
      const hit = find(child);
      if (hit) return hit;
    }
    return undefined;
  };
  const top = rows[0]['QUERY PLAN'][0].Plan;
  const plan = find(top) ?? top;
  return {
    nodeType: String(plan['Node Type']),
    indexName: typeof plan['Index Name'] === 'string' ? plan['Index Name'] : null,
    heapFetches: typeof plan['Heap Fetches'] === 'number' ? plan['Heap Fetches'] : null,
  };
}

/** Clears the verification-failure mark of chunks whose stored bytes were re-hashed sound (sets verified_at). */
export async function clearVerifyFailed(db: Queryable, siteId: string, hashes: string[]): Promise<void> {
  await db.query(
    `UPDATE chunks SET verify_failed_digest = NULL, verify_failed_at = NULL, verified_at = now()
      WHERE site_id = $1 AND hash = ANY($2::text[])`,
    [siteId, hashes],
  );
}

/**
 * Records chunks the site holds (sizes in bytes) without the quota check; rows already present are kept.
 * The site's used bytes grow by the rows added (db/quota.ts withUsage).
 */
export async function insertChunks(db: Queryable, siteId: string, refs: ChunkRef[]): Promise<void> {
  await db.query(
    withUsage(
      `INSERT INTO chunks (site_id, hash, size) SELECT $1, t.hash, t.size FROM UNNEST($2::text[], $3::bigint[]) AS t(hash, size)
       ON CONFLICT (site_id, hash) DO NOTHING RETURNING size`,
      1,
    ),
    [siteId, refs.map((r) => r.hash), refs.map((r) => r.size)],
  );
}

/**
 * Up to `limit` chunks of version (site, roost, version) the service has not verified yet: never
 * re-hashed (`verified_at` null) or marked bad (`verify_failed_digest`), in hash order (`order`), after
 * hash `after` (keyset). Chunks of the version without a `chunks` row are not listed (nothing to ship).
 */
export async function unverifiedVersionChunks(
  db: Queryable,
  v: { siteId: string; roostId: string; versionId: string },
  page: { order: 'asc' | 'desc'; after?: string; limit: number },
): Promise<string[]> {
  const cmp = page.order === 'asc' ? '>' : '<';
  const { rows } = await db.query<{ hash: string }>(
    `SELECT vc.hash FROM version_chunks vc
       JOIN chunks c ON c.site_id = vc.site_id AND c.hash = vc.hash
      WHERE vc.site_id = $1 AND vc.roost_id = $2 AND vc.version_id = $3
        AND (c.verified_at IS NULL OR c.verify_failed_digest IS NOT NULL)
        AND ($4::TEXT IS NULL OR vc.hash ${cmp} $4::TEXT)
      ORDER BY vc.hash ${page.order === 'asc' ? 'ASC' : 'DESC'} LIMIT $5`,
    [v.siteId, v.roostId, v.versionId, page.after ?? null, page.limit],
  );
  return rows.map((r) => r.hash);
}

/**
 * Up to `limit` chunks of version (site, roost, version) whose stored bytes verification found wrong
 * (marked, not healed yet), in hash order. Starts from the marked chunks of the site (partial index
 * `chunks_marked_bad`, migration 014), so a version of 17,000 chunks with none marked costs one probe.
 */
export async function badVersionChunks(
  db: Queryable,
  v: { siteId: string; roostId: string; versionId: string },
  limit: number,
): Promise<string[]> {
  const { rows } = await db.query<{ hash: string }>(
    `SELECT c.hash FROM chunks c
      WHERE c.site_id = $1 AND c.verify_failed_digest IS NOT NULL
        AND EXISTS (SELECT 1 FROM version_chunks vc
                     WHERE vc.site_id = c.site_id AND vc.hash = c.hash AND vc.roost_id = $2 AND vc.version_id = $3)
      ORDER BY c.hash LIMIT $4`,
    [v.siteId, v.roostId, v.versionId, limit],
  );
  return rows.map((r) => r.hash);
}

/** How many chunks the site has recorded: the count kept in `site_usage` (db/quota.ts withUsage), one row read. */
export async function countChunks(db: Queryable, siteId: string): Promise<number> {
  const { rows } = await db.query<{ n: string }>('SELECT chunk_count AS n FROM site_usage WHERE site_id = $1', [siteId]);
  return Number(rows[0]?.n ?? 0);
}

/**
 * Deterministic id of a mount referrer entry: SHA-256 hex of `digest|siteId|from|to`, so a retried
 * `POST /api/chunks/{digest}/mount` lands on the same row.
 */
export function mountEntryId(digest: string, siteId: string, from: string, to: string): string {
  return sha256Hex(`${digest}|${siteId}|${from}|${to}`);
}

/** Deterministic id of a version referrer entry: SHA-256 hex of `version|digest|siteId|roostId|versionId`. */
export function versionEntryId(digest: string, siteId: string, roostId: string, versionId: string): string {
  return sha256Hex(`version|${digest}|${siteId}|${roostId}|${versionId}`);
}

export interface MountInput {
  siteId: string;
  digest: string;
  from: string;
  to: string;
  /** Acting user id. */
  createdBy: string;
}

/**
 * Records a cross-roost mount of chunk `digest` from roost `from` into roost `to` (no bytes move).
 * One serializable transaction: both roosts must exist and not be tombstoned, and the site must hold
 * the chunk; the entry is inserted with `ON CONFLICT DO NOTHING`, so a repeat is a no-op.
 * @returns the entry id and whether this call created the row.
 * @throws ApiError 404 not_found (param `from`, `to` or `digest`) when a roost or the chunk is missing.
 */
export async function mountChunk(pool: Pool, m: MountInput): Promise<{ entryId: string; created: boolean }> {
  const entryId = mountEntryId(m.digest, m.siteId, m.from, m.to);
  return withTx(pool, async (tx) => {
    const roosts = await tx.query<{ roost_id: string }>(
      'SELECT roost_id FROM roosts WHERE site_id = $1 AND roost_id = ANY($2) AND deleted_at IS NULL',
      [m.siteId, [m.from, m.to]],
    );
    const found = new Set(roosts.rows.map((r) => r.roost_id));
    for (const [param, roostId] of [
      ['from', m.from],
      ['to', m.to],
    ] as const) {
      if (!found.has(roostId)) throw new ApiError('not_found', `roost ${roostId} not found in this site`, { extras: { param } });
    }
    if (!(await chunkHeld(tx, m.siteId, m.digest))) {
      throw new ApiError('not_found', 'chunk not stored for this site', { extras: { param: 'digest' } });
    }
    const ins = await tx.query(
      `INSERT INTO chunk_referrers (site_id, hash, entry_id, source, roost_id, from_roost_id, to_roost_id, created_by)
       VALUES ($1, $2, $3, 'mount', $4, $5, $4, $6)
       ON CONFLICT (site_id, hash, entry_id) DO NOTHING`,
      [m.siteId, m.digest, entryId, m.to, m.from, m.createdBy],
    );
    return { entryId, created: ins.rowCount === 1 };
  });
}

interface ReferrerRow {
  entry_id: string | null;
  source: string;
  roost_id: string | null;
  from_roost_id: string | null;
  to_roost_id: string | null;
  version_id: string | null;
  version_number: number | null;
  file_count: number | null;
  total_bytes: number | null;
  created_at: Date;
  created_by: string;
  k_roost: string;
  k_num: number;
  k_text: string;
}

const REFERRERS_SQL = `
SELECT * FROM (
  SELECT r.entry_id, r.source, r.roost_id, r.from_roost_id, r.to_roost_id,
         CAST(NULL AS TEXT) AS version_id, CAST(NULL AS INT) AS version_number, CAST(NULL AS INT) AS file_count,
         CAST(NULL AS BIGINT) AS total_bytes, r.created_at, r.created_by,
         COALESCE(r.roost_id, r.to_roost_id, '') AS k_roost, 0 AS k_num, r.entry_id AS k_text
    FROM chunk_referrers r
   WHERE r.site_id = $1 AND r.hash = $2
  UNION ALL
  SELECT CAST(NULL AS TEXT), 'version', v.roost_id, CAST(NULL AS TEXT), CAST(NULL AS TEXT),
         v.version_id, v.version_number, vc.file_count, v.total_size, v.created_at, v.created_by,
         v.roost_id, v.version_number, v.version_id
    FROM version_chunks vc
    JOIN roost_versions v ON v.site_id = vc.site_id AND v.roost_id = vc.roost_id AND v.version_id = vc.version_id
   WHERE vc.site_id = $1 AND vc.hash = $2
) e`;
const REFERRERS_ORDER = 'ORDER BY e.k_roost, e.source, e.k_num, e.k_text';

/**
 * One page of the referrers of chunk `digest` in the site: mount entries and version entries.
 * `after` is the last position of the previous page. Returns the entries and the next position
 * (undefined on the last page). Does not check that the chunk is held (see `chunkHeld`).
 */
export async function listReferrers(
  db: Queryable,
  siteId: string,
  digest: string,
  page: { pageSize: number; after?: ReferrerPosition },
): Promise<{ entries: ReferrerEntry[]; next: ReferrerPosition | undefined }> {
  const params: unknown[] = [siteId, digest];
  let where = '';
  if (page.after) {
    params.push(...page.after);
    where = 'WHERE (e.k_roost, e.source, e.k_num, e.k_text) > (CAST($3 AS TEXT), CAST($4 AS TEXT), CAST($5 AS INT), CAST($6 AS TEXT))';
  }
  params.push(page.pageSize + 1);
  const { rows } = await db.query<ReferrerRow>(`${REFERRERS_SQL} ${where} ${REFERRERS_ORDER} LIMIT $${params.length}`, params);
  const more = rows.length > page.pageSize;
  const pageRows = more ? rows.slice(0, page.pageSize) : rows;
  const entries = pageRows.map((r) => toEntry(siteId, digest, r));
  const last = pageRows[pageRows.length - 1];
  return { entries, next: more && last ? [last.k_roost, last.source, last.k_num, last.k_text] : undefined };
}

function toEntry(siteId: string, digest: string, r: ReferrerRow): ReferrerEntry {
  const at = r.created_at.toISOString();
  if (r.source === 'version') {
    return {
      entryId: versionEntryId(digest, siteId, r.roost_id ?? '', r.version_id ?? ''),
      source: 'version',
      roostId: r.roost_id,
      fromRoostId: null,
      toRoostId: null,
      versionId: r.version_id,
      versionNumber: r.version_number,
      fileCount: r.file_count,
      pathCount: r.file_count,
      totalBytes: r.total_bytes,
      referencedAt: at,
      createdAt: at,
      createdBy: r.created_by,
      mountedAt: null,
      mountedBy: null,
    };
  }
  const mount = r.source === 'mount';
  return {
    entryId: r.entry_id ?? '',
    source: r.source,
    roostId: r.roost_id,
    fromRoostId: r.from_roost_id,
    toRoostId: r.to_roost_id,
    versionId: null,
    versionNumber: null,
    fileCount: null,
    pathCount: null,
    totalBytes: null,
    referencedAt: at,
    createdAt: at,
    createdBy: r.created_by,
    mountedAt: mount ? at : null,
    mountedBy: mount ? r.created_by : null,
  };
}
