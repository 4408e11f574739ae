/**
 * Repository of the background sweeps (events machine.offline, chunk.garbage_collected, chunk.verify_failed,
 * api_key.expired; the chunk garbage-collection grace; docs/decisions/sweeps.md).
 *
 * Every sweep works the same way: a bounded candidate query (across sites: a sweep serves the whole
 * deployment), then one small SERIALIZABLE transaction per candidate that re-checks the condition on
 * that row, naming its `site_id`, changes the state and records the event with `recordEvent` in the same
 * transaction. The re-check makes every step idempotent: a re-run, a concurrent run or an Activity retry
 * finds the state already changed and emits nothing. Event ids are deterministic as a second guard.
 *
 * Times: machine heartbeats are TIMESTAMPTZ judged by the database clock (lastHeartbeat in events is
 * RFC 3339 UTC, like `machine.online`); key times are epoch ms (like every api_keys time and the key
 * routes' expiresAt).
 */
import type { Pool } from 'pg';
import { createHash } from 'node:crypto';
import { recordEvent } from './events';
import { type Queryable, withTx } from './pool';
import { withUsage } from './quota';
import type { ChunkCursor } from '../domain/sweeps';

/** `evt_` + 24 hex of SHA-256 over `parts` joined by `|`: the same fact always gets the same event id. */
export function sweepEventId(...parts: string[]): string {
  return `evt_${createHash('sha256').update(parts.join('|')).digest('hex').slice(0, 24)}`;
}

/** A (site, id) pair as the candidate queries return them. */
export interface SiteRow {
  siteId: string;
  id: string;
}

// ---------------------------------------------------------------------------------------------------
// Heartbeat staleness

/** SQL: heartbeat older than `$n` seconds (or never). */
function staleExpr(alias: string, param: string): string {
  return `(${alias}.last_heartbeat IS NULL OR ${alias}.last_heartbeat <= now() - (${param}::INT * INTERVAL '1 second'))`;
}

/**
 * Up to `limit` machines still flagged online whose heartbeat is older than `staleSeconds` (or absent),
 * oldest heartbeat first.
 */
export async function findStaleMachines(db: Queryable, staleSeconds: number, limit: number): Promise<SiteRow[]> {
  const { rows } = await db.query<{ site_id: string; machine_id: string }>(
    `SELECT m.site_id, m.machine_id FROM machines m
      WHERE m.online AND ${staleExpr('m', '$1')}
      ORDER BY m.last_heartbeat NULLS FIRST, m.site_id, m.machine_id LIMIT $2`,
    [staleSeconds, limit],
  );
  return rows.map((r) => ({ siteId: r.site_id, id: r.machine_id }));
}

/**
 * Flags one machine offline when it is still flagged online and its heartbeat is still stale, and
 * records `machine.offline` (machineId, siteId, lastHeartbeat: RFC 3339 or null) in the same
 * transaction. A heartbeat that landed meanwhile wins (nothing changes).
 * @returns true when this call flagged the machine (and recorded the event).
 */
export async function markMachineOffline(pool: Pool, siteId: string, machineId: string, staleSeconds: number): Promise<boolean> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ last_heartbeat: Date | null }>(
      `UPDATE machines m SET online = false, updated_at = now()
        WHERE m.site_id = $1 AND m.machine_id = $2 AND m.online AND ${staleExpr('m', '$3')}
        RETURNING m.last_heartbeat`,
      [siteId, machineId, staleSeconds],
    );
    if (!rows[0]) return false;
    const lastHeartbeat = rows[0].last_heartbeat ? rows[0].last_heartbeat.toISOString() : null;
    await recordEvent(
      tx,
      siteId,
      'machine.offline',
      { machineId, siteId, lastHeartbeat },
      sweepEventId('machine.offline', siteId, machineId, lastHeartbeat ?? 'never'),
    );
    return true;
  });
}

// ---------------------------------------------------------------------------------------------------
// Chunk garbage collection

/**
 * SQL (correlated on `c.site_id`, `c.hash`; `$cutoff` is the placeholder of now() - grace): the chunk has
 * a referrer that keeps it. A referrer is a `version_chunks` row or a `chunk_referrers` (mount) row; it
 * keeps the chunk while its roost is live, and for the grace after the roost was deleted (the moment
 * its reference ended). A row whose roost row is missing keeps the chunk (never guess it away).
 */
function keptByReferrer(cutoff: string): string {
  return `(EXISTS (SELECT 1 FROM version_chunks vc
                   LEFT JOIN roosts r ON r.site_id = vc.site_id AND r.roost_id = vc.roost_id
                  WHERE vc.site_id = c.site_id AND vc.hash = c.hash
                    AND (r.roost_id IS NULL OR r.deleted_at IS NULL OR r.deleted_at > ${cutoff}))
        OR EXISTS (SELECT 1 FROM chunk_referrers cr
                   LEFT JOIN roosts r ON r.site_id = cr.site_id AND r.roost_id = COALESCE(cr.to_roost_id, cr.roost_id)
                  WHERE cr.site_id = c.site_id AND cr.hash = c.hash
                    AND (r.roost_id IS NULL OR r.deleted_at IS NULL OR r.deleted_at > ${cutoff})))`;
}

/**
 * Scans up to `limit` chunk rows after `after` in (site_id, hash) order and returns the collectable
 * ones: recorded more than `graceSeconds` ago and not kept by a referrer (see `keptByReferrer`).
 * `scanned` counts the rows looked at; `next` is the last scanned position, undefined when the scan reached the end.
 */
export async function scanCollectableChunks(
  db: Queryable,
  graceSeconds: number,
  limit: number,
  after?: ChunkCursor,
): Promise<{ scanned: number; collectable: SiteRow[]; next: ChunkCursor | undefined }> {
  const { rows } = await db.query<{ site_id: string; hash: string; collectable: boolean }>(
    `SELECT c.site_id, c.hash,
            (c.created_at <= now() - ($1::INT * INTERVAL '1 second')
             AND NOT ${keptByReferrer(`now() - ($1::INT * INTERVAL '1 second')`)}) AS collectable
       FROM chunks c
      WHERE ($2::TEXT IS NULL OR (c.site_id, c.hash) > ($2::TEXT, $3::TEXT))
      ORDER BY c.site_id, c.hash LIMIT $4`,
    [graceSeconds, after?.[0] ?? null, after?.[1] ?? null, limit],
  );
  const last = rows[rows.length - 1];
  return {
    scanned: rows.length,
    collectable: rows.filter((r) => r.collectable).map((r) => ({ siteId: r.site_id, id: r.hash })),
    next: rows.length === limit && last ? [last.site_id, last.hash] : undefined,
  };
}

/**
 * GC phase 1 for one chunk: re-checks that it is still collectable, deletes its `chunks` row (usage
 * drops; publish and chunk checks no longer count it present) and writes a tombstone keeping its size.
 * The blob stays until phase 2. @returns true when this call condemned the chunk.
 */
export async function condemnChunk(pool: Pool, siteId: string, hash: string, graceSeconds: number): Promise<boolean> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ size: number; created_at: Date }>(
      withUsage(
        `DELETE FROM chunks c
          WHERE c.site_id = $1 AND c.hash = $2 AND c.created_at <= now() - ($3::INT * INTERVAL '1 second')
            AND NOT ${keptByReferrer(`now() - ($3::INT * INTERVAL '1 second')`)}
          RETURNING c.size, c.created_at`,
        -1,
      ),
      [siteId, hash, graceSeconds],
    );
    if (!rows[0]) return false;
    await tx.query(
      `INSERT INTO chunk_gc_tombstones (site_id, hash, size, chunk_created_at, condemned_at) VALUES ($1, $2, $3, $4, now())
       ON CONFLICT (site_id, hash) DO UPDATE SET size = excluded.size, chunk_created_at = excluded.chunk_created_at, condemned_at = excluded.condemned_at`,
      [siteId, hash, rows[0].size, rows[0].created_at],
    );
    return true;
  });
}

/** A tombstone due for phase 2. */
export interface Tombstone {
  siteId: string;
  hash: string;
  size: number;
  condemnedAt: string;
}

/** Up to `limit` tombstones condemned at least `safetySeconds` ago, oldest first. */
export async function dueTombstones(db: Queryable, safetySeconds: number, limit: number): Promise<Tombstone[]> {
  const { rows } = await db.query<{ site_id: string; hash: string; size: number; condemned_at: Date }>(
    `SELECT site_id, hash, size, condemned_at FROM chunk_gc_tombstones
      WHERE condemned_at <= now() - ($1::INT * INTERVAL '1 second')
      ORDER BY condemned_at, site_id, hash LIMIT $2`,
    [safetySeconds, limit],
  );
  return rows.map((r) => ({ siteId: r.site_id, hash: r.hash, size: Number(r.size), condemnedAt: r.condemned_at.toISOString() }));
}

/**
 * What phase 2 decided for a tombstone before touching the blob:
 * - `restored`: a referrer appeared after phase 1 (a publish that had checked the chunk present
 *   committed later): the `chunks` row is put back and the tombstone dropped; the blob stays.
 * - `adopted`: a `chunks` row exists again (a publish found the blob in storage and recorded it): the
 *   tombstone is dropped; the blob stays.
 * - `deferred`: an unexpired upload reservation names the hash (a client is uploading it again): decide
 *   on a later run.
 * - `reclaim`: nothing wants it: delete the blob, then `finishReclaim`.
 * - `gone`: the tombstone no longer exists (another run handled it).
 */
export type TombstoneDecision = 'restored' | 'adopted' | 'deferred' | 'reclaim' | 'gone';

/** SQL (correlated on `c.site_id`, `c.hash`): a live roost references the chunk (version or mount). */
const LIVE_REFERRER = `(EXISTS (SELECT 1 FROM version_chunks vc
                   LEFT JOIN roosts r ON r.site_id = vc.site_id AND r.roost_id = vc.roost_id
                  WHERE vc.site_id = c.site_id AND vc.hash = c.hash AND (r.roost_id IS NULL OR r.deleted_at IS NULL))
        OR EXISTS (SELECT 1 FROM chunk_referrers cr
                   LEFT JOIN roosts r ON r.site_id = cr.site_id AND r.roost_id = COALESCE(cr.to_roost_id, cr.roost_id)
                  WHERE cr.site_id = c.site_id AND cr.hash = c.hash AND (r.roost_id IS NULL OR r.deleted_at IS NULL)))`;

/** GC phase 2, first step (one transaction): decides a tombstone's fate (see TombstoneDecision). */
export async function decideTombstone(pool: Pool, siteId: string, hash: string): Promise<TombstoneDecision> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ size: number; chunk_created_at: Date; has_row: boolean; referenced: boolean; reserved: boolean }>(
      `SELECT c.size, c.chunk_created_at,
              EXISTS (SELECT 1 FROM chunks k WHERE k.site_id = c.site_id AND k.hash = c.hash) AS has_row,
              ${LIVE_REFERRER} AS referenced,
              EXISTS (SELECT 1 FROM upload_reservations u WHERE u.site_id = c.site_id AND u.hash = c.hash AND u.expires_at > now()) AS reserved
         FROM chunk_gc_tombstones c WHERE c.site_id = $1 AND c.hash = $2`,
      [siteId, hash],
    );
    const t = rows[0];
    if (!t) return 'gone';
    if (t.has_row || t.referenced) {
      if (!t.has_row) {
        await tx.query(
          withUsage(
            `INSERT INTO chunks (site_id, hash, size, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT (site_id, hash) DO NOTHING RETURNING size`,
            1,
          ),
          [siteId, hash, t.size, t.chunk_created_at],
        );
      }
      await tx.query('DELETE FROM chunk_gc_tombstones WHERE site_id = $1 AND hash = $2', [siteId, hash]);
      return t.has_row ? 'adopted' : 'restored';
    }
    return t.reserved ? 'deferred' : 'reclaim';
  });
}

/**
 * GC phase 2, last step, after the blob was deleted: drops the tombstone and records
 * `chunk.garbage_collected` (siteId, hash, sizeBytes) in the same transaction; only the call that drops
 * the tombstone records it. A `chunks` row recorded in the instant between `decideTombstone` and the
 * blob deletion names bytes that are gone: it is removed too, so the chunk reads as missing and the next
 * check or publish asks for it again (docs/decisions/sweeps.md, residual race).
 * @returns true when this call recorded the event.
 */
export async function finishReclaim(pool: Pool, siteId: string, hash: string): Promise<boolean> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ size: number; condemned_at: Date }>(
      'DELETE FROM chunk_gc_tombstones WHERE site_id = $1 AND hash = $2 RETURNING size, condemned_at',
      [siteId, hash],
    );
    if (!rows[0]) return false;
    await tx.query(withUsage('DELETE FROM chunks WHERE site_id = $1 AND hash = $2 RETURNING size', -1), [siteId, hash]);
    await recordEvent(
      tx,
      siteId,
      'chunk.garbage_collected',
      { siteId, hash, sizeBytes: Number(rows[0].size) },
      sweepEventId('chunk.garbage_collected', siteId, hash, rows[0].condemned_at.toISOString()),
    );
    return true;
  });
}

// ---------------------------------------------------------------------------------------------------
// Chunk verification

/** A chunk to re-hash. */
export interface ChunkToVerify {
  siteId: string;
  hash: string;
  size: number;
}

/**
 * Up to `limit` chunks not verified since `notVerifiedSince` (epoch ms), never-verified first, then the
 * oldest verification.
 */
export async function chunksToVerify(db: Queryable, notVerifiedSince: number, limit: number): Promise<ChunkToVerify[]> {
  const { rows } = await db.query<{ site_id: string; hash: string; size: number }>(
    `SELECT site_id, hash, size FROM chunks
      WHERE verified_at IS NULL OR verified_at < $1
      ORDER BY verified_at NULLS FIRST, site_id, hash LIMIT $2`,
    [new Date(notVerifiedSince), limit],
  );
  return rows.map((r) => ({ siteId: r.site_id, hash: r.hash, size: Number(r.size) }));
}

/** Stored digest of a missing blob in `chunks.verify_failed_digest`. */
export const MISSING_BLOB = 'missing';

/**
 * Records the outcome of re-hashing one chunk (`actualDigest`: SHA-256 hex of the stored bytes, or null
 * when the blob is missing). A match sets verified_at and clears any failure mark. A mismatch sets
 * verified_at and, when these bad bytes were not reported yet (the stored failure digest differs),
 * marks the chunk and records `chunk.verify_failed` (siteId, hash, expectedDigest, actualDigest: hex, or
 * null for a missing blob) in the same transaction. A missing blob of a chunk already marked is not a new
 * failure: its bad bytes were quarantined (storage/blob.ts quarantineChunk) and await a fresh upload.
 * A chunk row that vanished (collected) changes nothing.
 * @returns true when this call recorded the event.
 */
export async function recordVerifyResult(pool: Pool, siteId: string, hash: string, actualDigest: string | null): Promise<boolean> {
  return withTx(pool, async (tx) => {
    if (actualDigest === hash) {
      await tx.query(
        'UPDATE chunks SET verified_at = now(), verify_failed_digest = NULL, verify_failed_at = NULL WHERE site_id = $1 AND hash = $2',
        [siteId, hash],
      );
      return false;
    }
    const mark = actualDigest ?? MISSING_BLOB;
    const { rows } = await tx.query<{ hash: string }>(
      `UPDATE chunks SET verified_at = now(), verify_failed_digest = $3, verify_failed_at = now()
        WHERE site_id = $1 AND hash = $2
          AND (verify_failed_digest IS NULL OR (verify_failed_digest <> $3 AND $3 <> '${MISSING_BLOB}'))
        RETURNING hash`,
      [siteId, hash, mark],
    );
    if (!rows[0]) {
      await tx.query('UPDATE chunks SET verified_at = now() WHERE site_id = $1 AND hash = $2', [siteId, hash]);
      return false;
    }
    await recordEvent(
      tx,
      siteId,
      'chunk.verify_failed',
      { siteId, hash, expectedDigest: hash, actualDigest },
      sweepEventId('chunk.verify_failed', siteId, hash, mark),
    );
    return true;
  });
}

// ---------------------------------------------------------------------------------------------------
// Key expiry

/** Up to `limit` active keys whose expiresAt (epoch ms) is at or before `nowMs` and not announced yet, oldest expiry first. */
export async function unannouncedExpiredKeys(db: Queryable, nowMs: number, limit: number): Promise<string[]> {
  const { rows } = await db.query<{ key_id: string }>(
    `SELECT key_id FROM api_keys
      WHERE expiry_announced_at IS NULL AND status = 'active' AND expires_at IS NOT NULL AND expires_at <= $1
      ORDER BY expires_at, key_id LIMIT $2`,
    [nowMs, limit],
  );
  return rows.map((r) => r.key_id);
}

/**
 * Announces one expired key: sets expiry_announced_at (once) and records `api_key.expired` (keyId,
 * keyPrefix, name, expiresAt: epoch ms) in the same transaction, in the key's primary site, or, without
 * one, in each existing site its scopes name by a concrete id. A key tied to no site is marked without an
 * event (no site stream or webhook could receive it). Auth is not affected (it already answers
 * `token_expired`). @returns how many events this call recorded.
 */
export async function announceKeyExpiry(pool: Pool, keyId: string, nowMs: number): Promise<number> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{
      key_prefix: string;
      name: string;
      expires_at: number;
      primary_site_id: string | null;
      scopes: { resource: string; id: string }[];
    }>(
      `UPDATE api_keys SET expiry_announced_at = $2
        WHERE key_id = $1 AND expiry_announced_at IS NULL AND status = 'active' AND expires_at IS NOT NULL AND expires_at <= $2
        RETURNING key_prefix, name, expires_at, primary_site_id, scopes`,
      [keyId, nowMs],
    );
    const k = rows[0];
    if (!k) return 0;
    const named = k.primary_site_id
      ? [k.primary_site_id]
      : [...new Set((Array.isArray(k.scopes) ? k.scopes : []).filter((s) => s.resource === 'site' && s.id !== '*').map((s) => s.id))];
    if (named.length === 0) return 0;
    const sites = await tx.query<{ site_id: string }>('SELECT site_id FROM sites WHERE site_id = ANY($1::TEXT[]) ORDER BY site_id', [
      named,
    ]);
    for (const { site_id: siteId } of sites.rows) {
      await recordEvent(
        tx,
        siteId,
        'api_key.expired',
        { keyId, keyPrefix: k.key_prefix, name: k.name, expiresAt: Number(k.expires_at) },
        sweepEventId('api_key.expired', siteId, keyId),
      );
    }
    return sites.rows.length;
  });
}
