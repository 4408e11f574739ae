/**
 * Storage quotas per site (`GET /api/sites/{siteId}/quota`, the 402 quota_exceeded problem, the
 * quota.warning and quota.exceeded events). Decisions: docs/decisions/storage-quota.md.
 *
 * - usedBytes: the summed sizes of the distinct chunks the site holds (`chunks` rows), kept in
 *   `site_usage` by every statement that changes those rows (`withUsage`).
 * - pendingBytes: unexpired upload reservations of chunks the site does not hold yet. `POST
 *   /api/chunks/upload-urls` reserves CHUNK_SIZE per requested hash (the client sends no sizes) until
 *   the URL expires; recording the chunk at publish finalises it (the reservation row goes).
 * - limitBytes: the limit of the site's tier (configuration ROOST_QUOTA_TIERS over DEFAULT_QUOTA_TIERS).
 *
 * A write that adds bytes is refused with 402 quota_exceeded, changing nothing, when used + pending +
 * new would exceed the limit. `quota.warning` (50 %, 80 % of usedBytes) and `quota.exceeded` (100 %)
 * are recorded once per threshold per billing period (UTC calendar month) in the transaction of the
 * write that reaches them; the first refusal of a period also records `quota.exceeded` (with blockedAt),
 * in a transaction of its own since the refused write commits nothing.
 */
import type { Pool } from 'pg';
import type { Config } from '../config/env';
import { ApiError } from '../domain/errors';
import { newId } from '../domain/hex';
import { CHUNK_SIZE } from '../domain/version';
import { recordEvent } from './events';
import { type Queryable, withTx } from './pool';

const GiB = 1024 ** 3;

/** Storage limits in bytes per tier when ROOST_QUOTA_TIERS does not say otherwise. */
export const DEFAULT_QUOTA_TIERS: Readonly<Record<string, number>> = {
  free: 10 * GiB,
  standard: 100 * GiB,
  pro: 1024 * GiB,
  enterprise: 10 * 1024 * GiB,
};

/** The tier whose limit applies to a site whose tier has no entry. */
export const FALLBACK_TIER = 'standard';

/** Warning thresholds as fractions of the limit, then 1 for quota.exceeded (docs/decisions/storage-quota.md). */
export const WARNING_THRESHOLDS = [0.5, 0.8] as const;

/** Bytes reserved per requested upload URL (the client does not send chunk sizes). */
export const RESERVATION_BYTES = CHUNK_SIZE;

/** Tier name → storage limit in bytes. */
export type QuotaTiers = Readonly<Record<string, number>>;

/** The quota snapshot of a site (all sizes in bytes). */
export interface QuotaSnapshot {
  siteId: string;
  tier: string;
  usedBytes: number;
  pendingBytes: number;
  limitBytes: number;
}

const tiersCache = new Map<string, QuotaTiers>();

/**
 * Parses ROOST_QUOTA_TIERS (a JSON object of tier → non-negative integer bytes) merged over the
 * defaults. @throws Error naming the variable when it is not such an object.
 */
export function parseQuotaTiers(raw: string | undefined): QuotaTiers {
  if (raw === undefined || raw.trim() === '') return DEFAULT_QUOTA_TIERS;
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (err) {
    throw new Error(`invalid configuration: ROOST_QUOTA_TIERS is not JSON (${(err as Error).message})`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new Error('invalid configuration: ROOST_QUOTA_TIERS must be a JSON object of tier name to bytes');
  }
  for (const [tier, bytes] of Object.entries(value)) {
    if (!Number.isSafeInteger(bytes) || (bytes as number) < 0) {
      throw new Error(`invalid configuration: ROOST_QUOTA_TIERS.${tier} must be a non-negative integer number of bytes`);
    }
  }
  return { ...DEFAULT_QUOTA_TIERS, ...(value as Record<string, number>) };
}

/** The tier limits of a configuration (parsed once per distinct value). @throws Error like parseQuotaTiers. */
export function quotaTiers(cfg: Pick<Config, 'ROOST_QUOTA_TIERS'>): QuotaTiers {
  const key = cfg.ROOST_QUOTA_TIERS ?? '';
  let tiers = tiersCache.get(key);
  if (!tiers) {
    tiers = parseQuotaTiers(cfg.ROOST_QUOTA_TIERS);
    tiersCache.set(key, tiers);
  }
  return tiers;
}

/** The limit of `tier`; a tier without an entry gets the `standard` limit. */
export function tierLimit(tiers: QuotaTiers, tier: string): number {
  return tiers[tier] ?? tiers[FALLBACK_TIER] ?? DEFAULT_QUOTA_TIERS[FALLBACK_TIER];
}

/** The billing period of a moment: its UTC calendar month, `YYYY-MM`. */
export function billingPeriod(at: Date = new Date()): string {
  return at.toISOString().slice(0, 7);
}

/**
 * Wraps `change`, one INSERT into or DELETE from `chunks` whose `$1` is the site id and which ends in
 * `RETURNING size[, …]`, so that the same statement adds (`sign` 1) or subtracts (-1) the summed sizes and
 * the number of the rows it touched to the site's `site_usage` (`used_bytes`, migration 026;
 * `chunk_count`, migration 027); nothing is written there when
 * no row was touched. The statement returns `change`'s rows. Data-modifying CTEs run in CockroachDB too;
 * the final query names `counted` so that no engine may leave it out as unreferenced.
 */
export function withUsage(change: string, sign: 1 | -1): string {
  return `WITH changed AS (${change}),
     counted AS (
       INSERT INTO site_usage (site_id, used_bytes, chunk_count)
       SELECT CAST($1 AS TEXT), CAST(${sign < 0 ? '-' : ''}SUM(size) AS BIGINT), ${sign < 0 ? '-' : ''}count(*) FROM changed HAVING count(*) > 0
       ON CONFLICT (site_id) DO UPDATE
         SET used_bytes = site_usage.used_bytes + excluded.used_bytes, chunk_count = site_usage.chunk_count + excluded.chunk_count
       RETURNING 1)
SELECT * FROM changed WHERE (SELECT count(*) FROM counted) >= 0`;
}

/**
 * Sets a site's used bytes and chunk count from its `chunks` rows (one read of them all): for rows written
 * without `withUsage` (a bulk load, a restore from backup). Returns the bytes.
 */
export async function recountUsage(db: Queryable, siteId: string): Promise<number> {
  const { rows } = await db.query<{ used_bytes: string }>(
    `INSERT INTO site_usage (site_id, used_bytes, chunk_count)
     SELECT $1, CAST(COALESCE(SUM(size), 0) AS BIGINT), count(*) FROM chunks WHERE site_id = $1
     ON CONFLICT (site_id) DO UPDATE SET used_bytes = excluded.used_bytes, chunk_count = excluded.chunk_count
     RETURNING used_bytes`,
    [siteId],
  );
  return Number(rows[0].used_bytes);
}

/**
 * Current usage of a site. `excluding` names hashes being recorded by the caller: their reservations
 * do not count as pending (they are about to become used bytes).
 * @throws ApiError not_found when the site does not exist.
 */
async function usage(db: Queryable, siteId: string, tiers: QuotaTiers, excluding: string[] = []): Promise<QuotaSnapshot> {
  const { rows } = await db.query<{ tier: string; used_bytes: number; pending_bytes: number }>(
    `SELECT s.tier,
            COALESCE((SELECT u.used_bytes FROM site_usage u WHERE u.site_id = s.site_id), 0) AS used_bytes,
            CAST((SELECT COALESCE(SUM(r.bytes), 0) FROM upload_reservations r
                   WHERE r.site_id = s.site_id AND r.expires_at > now() AND NOT (r.hash = ANY($2::text[]))
                     AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.site_id = r.site_id AND c.hash = r.hash)) AS BIGINT) AS pending_bytes
       FROM sites s WHERE s.site_id = $1`,
    [siteId, excluding],
  );
  const row = rows[0];
  if (!row) throw new ApiError('not_found', 'site not found');
  return {
    siteId,
    tier: row.tier,
    usedBytes: Number(row.used_bytes),
    pendingBytes: Number(row.pending_bytes),
    limitBytes: tierLimit(tiers, row.tier),
  };
}

/**
 * The quota snapshot of a site (`GET /api/sites/{siteId}/quota`). Does not check access.
 * @throws ApiError not_found when the site does not exist.
 */
export function quotaSnapshot(db: Queryable, siteId: string, tiers: QuotaTiers): Promise<QuotaSnapshot> {
  return usage(db, siteId, tiers);
}

/** Thrown inside a quota transaction to roll it back; turned into the 402 problem outside. */
class QuotaRefusal extends Error {
  constructor(
    readonly snapshot: QuotaSnapshot,
    readonly requestedBytes: number,
  ) {
    super('quota exceeded');
  }
}

function checkRoom(u: QuotaSnapshot, requestedBytes: number): void {
  if (requestedBytes > 0 && u.usedBytes + u.pendingBytes + requestedBytes > u.limitBytes) throw new QuotaRefusal(u, requestedBytes);
}

/**
 * Records quota.exceeded for a refused write, once per billing period, in its own transaction (the
 * refused write itself rolled back), then returns the 402 problem to throw.
 */
async function refuse(pool: Pool, r: QuotaRefusal): Promise<ApiError> {
  const u = r.snapshot;
  await withTx(pool, (tx) => fireThreshold(tx, u, 1, u.usedBytes));
  return new ApiError(
    'quota_exceeded',
    `storage quota of tier ${u.tier} would be exceeded: ${u.usedBytes} used + ${u.pendingBytes} pending + ${r.requestedBytes} new > ${u.limitBytes} bytes`,
    { extras: { quota: { ...u, requestedBytes: r.requestedBytes } } },
  );
}

/** Runs a quota transaction; a refusal becomes 402 quota_exceeded after the rollback. */
async function withQuota<T>(pool: Pool, fn: (tx: Queryable) => Promise<T>): Promise<T> {
  try {
    return await withTx(pool, fn);
  } catch (err) {
    if (err instanceof QuotaRefusal) throw await refuse(pool, err);
    throw err;
  }
}

/**
 * Records `fraction` (0.5, 0.8 or 1) as fired for the site in this billing period and, the first time,
 * the matching event: quota.warning {siteId, tier, threshold, usedBytes, limitBytes} or quota.exceeded
 * {siteId, tier, usedBytes, limitBytes, blockedAt}. Returns whether it fired now.
 */
async function fireThreshold(tx: Queryable, u: QuotaSnapshot, fraction: number, usedBytes: number): Promise<boolean> {
  const eventId = newId('evt');
  const ins = await tx.query(
    `INSERT INTO quota_thresholds (site_id, period, percent, event_id) VALUES ($1, $2, $3, $4)
     ON CONFLICT (site_id, period, percent) DO NOTHING`,
    [u.siteId, billingPeriod(), Math.round(fraction * 100), eventId],
  );
  if (ins.rowCount !== 1) return false;
  if (fraction >= 1) {
    await recordEvent(
      tx,
      u.siteId,
      'quota.exceeded',
      { siteId: u.siteId, tier: u.tier, usedBytes, limitBytes: u.limitBytes, blockedAt: new Date().toISOString() },
      eventId,
    );
  } else {
    await recordEvent(
      tx,
      u.siteId,
      'quota.warning',
      { siteId: u.siteId, tier: u.tier, threshold: fraction, usedBytes, limitBytes: u.limitBytes },
      eventId,
    );
  }
  return true;
}

/** Fires every threshold `usedBytes` has reached that has not fired in this period. */
async function fireReached(tx: Queryable, u: QuotaSnapshot, usedBytes: number): Promise<void> {
  for (const fraction of [...WARNING_THRESHOLDS, 1]) {
    if (usedBytes >= fraction * u.limitBytes) await fireThreshold(tx, u, fraction, usedBytes);
  }
}

/** What `reserveUploads` did. */
export interface Reservation {
  /** Requested hashes the site does not hold (each now reserved until `expiresAt`). */
  reserved: string[];
  /** Bytes newly counted as pending by this call (hashes without an unexpired reservation). */
  newBytes: number;
}

/**
 * Reserves RESERVATION_BYTES per requested hash the site does not hold, until `expiresAt` (the upload
 * URLs' expiry). A hash already reserved keeps its reservation, extended to `expiresAt`, and counts no
 * new bytes. One serializable transaction.
 * @throws ApiError quota_exceeded (402) when used + pending + new bytes would exceed the limit (nothing
 *   is reserved); not_found when the site does not exist.
 */
export async function reserveUploads(
  pool: Pool,
  siteId: string,
  hashes: string[],
  expiresAt: Date,
  tiers: QuotaTiers,
): Promise<Reservation> {
  return withQuota(pool, async (tx) => {
    const held = await tx.query<{ hash: string }>('SELECT hash FROM chunks WHERE site_id = $1 AND hash = ANY($2::text[])', [
      siteId,
      hashes,
    ]);
    const heldSet = new Set(held.rows.map((r) => r.hash));
    const wanted = [...new Set(hashes)].filter((h) => !heldSet.has(h));
    if (wanted.length === 0) return { reserved: [], newBytes: 0 };
    const active = await tx.query<{ hash: string }>(
      'SELECT hash FROM upload_reservations WHERE site_id = $1 AND hash = ANY($2::text[]) AND expires_at > now()',
      [siteId, wanted],
    );
    const activeSet = new Set(active.rows.map((r) => r.hash));
    const newBytes = wanted.filter((h) => !activeSet.has(h)).length * RESERVATION_BYTES;
    if (newBytes > 0) checkRoom(await usage(tx, siteId, tiers), newBytes);
    await tx.query('DELETE FROM upload_reservations WHERE site_id = $1 AND expires_at <= now()', [siteId]);
    await tx.query(
      `INSERT INTO upload_reservations (site_id, hash, bytes, expires_at)
       SELECT $1, t.hash, $3, $4 FROM UNNEST($2::text[]) AS t(hash)
       ON CONFLICT (site_id, hash) DO UPDATE SET bytes = excluded.bytes, expires_at = GREATEST(upload_reservations.expires_at, excluded.expires_at)`,
      [siteId, wanted, RESERVATION_BYTES, expiresAt],
    );
    return { reserved: wanted, newBytes };
  });
}

/**
 * Records chunks the site now holds (their stored size was checked) and finalises their reservations,
 * in one serializable transaction that also fires the quota thresholds the new usage reaches. Hashes
 * already held are skipped. Returns the bytes added.
 * @throws ApiError quota_exceeded (402) when used + pending (other hashes) + the new sizes would exceed
 *   the limit (nothing is recorded); not_found when the site does not exist.
 */
export async function recordChunks(
  pool: Pool,
  siteId: string,
  chunks: { hash: string; size: number }[],
  tiers: QuotaTiers,
): Promise<number> {
  if (chunks.length === 0) return 0;
  return withQuota(pool, async (tx) => {
    const held = await tx.query<{ hash: string }>('SELECT hash FROM chunks WHERE site_id = $1 AND hash = ANY($2::text[])', [
      siteId,
      chunks.map((c) => c.hash),
    ]);
    const heldSet = new Set(held.rows.map((r) => r.hash));
    const fresh = new Map<string, number>();
    for (const c of chunks) if (!heldSet.has(c.hash)) fresh.set(c.hash, c.size);
    if (fresh.size === 0) return 0;
    const hashes = [...fresh.keys()];
    const sizes = [...fresh.values()];
    const added = sizes.reduce((a, b) => a + b, 0);
    const u = await usage(tx, siteId, tiers, hashes);
    checkRoom(u, added);
    await tx.query(
      withUsage(
        `INSERT INTO chunks (site_id, hash, size) SELECT $1, t.hash, t.size FROM UNNEST($2::text[], $3::bigint[]) AS t(hash, size)
         ON CONFLICT (site_id, hash) DO NOTHING RETURNING size`,
        1,
      ),
      [siteId, hashes, sizes],
    );
    await tx.query('DELETE FROM upload_reservations WHERE site_id = $1 AND hash = ANY($2::text[])', [siteId, hashes]);
    await fireReached(tx, u, u.usedBytes + added);
    return added;
  });
}
