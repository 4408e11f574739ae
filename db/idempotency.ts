/**
 * Idempotency-Key reservations and stored responses (`idempotency_keys`; api/plugins/idempotency.ts and
 * services/idempotency.ts hold the rules; docs/decisions/idempotency-concurrency.md,
 * docs/decisions/idempotency-expiry.md). Rows are keyed by the scope hash; `created_at` as text is the
 * reservation token, so a request only finishes, renews or releases the reservation it made.
 *
 * `expires_at` is a lease while the row is `in_progress` (now + the lease, pushed forward by `renewIdempotencyKey`
 * while the request runs) and the end of the replay window once it is `done`; a row past it no longer counts.
 */
import type { Queryable } from './pool';

/** Stored responses replay for this long (ms): 24 h. */
export const REPLAY_WINDOW_MS = 24 * 60 * 60 * 1000;
const REPLAY_WINDOW_SQL = `INTERVAL '${REPLAY_WINDOW_MS / 1000} seconds'`;

/**
 * A row as a second request with the same scope reads it. `stale`: expired or abandoned (an `in_progress`
 * row whose lease was not renewed: its request's process died), no longer counts.
 */
export interface StoredIdempotencyRow {
  request_hash: string;
  state: string;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: string | null;
  stale: boolean;
}

/**
 * Reserves `keyHash` for a request with `fingerprint` under a lease of `leaseMs`; returns the reservation
 * token, or undefined when a row exists.
 */
export async function reserveIdempotencyKey(
  db: Queryable,
  keyHash: string,
  fingerprint: string,
  leaseMs: number,
): Promise<string | undefined> {
  const { rows } = await db.query<{ token: string }>(
    `INSERT INTO idempotency_keys (key_hash, request_hash, state, expires_at)
     VALUES ($1, $2, 'in_progress', now() + $3::float8 * INTERVAL '1 millisecond')
     ON CONFLICT (key_hash) DO NOTHING RETURNING CAST(created_at AS TEXT) AS token`,
    [keyHash, fingerprint, leaseMs],
  );
  return rows[0]?.token;
}

/**
 * Extends the lease of the reservation `token` of `keyHash` to now + `leaseMs`. Returns false when the
 * reservation is no longer this request's (finished, released, or taken over after it lapsed).
 */
export async function renewIdempotencyKey(db: Queryable, keyHash: string, token: string, leaseMs: number): Promise<boolean> {
  const r = await db.query(
    `UPDATE idempotency_keys SET expires_at = now() + $3::float8 * INTERVAL '1 millisecond'
      WHERE key_hash = $1 AND CAST(created_at AS TEXT) = $2 AND state = 'in_progress'`,
    [keyHash, token, leaseMs],
  );
  return (r.rowCount ?? 0) > 0;
}

/** The row of `keyHash`, or undefined. */
export async function findIdempotencyKey(db: Queryable, keyHash: string): Promise<StoredIdempotencyRow | undefined> {
  const { rows } = await db.query<StoredIdempotencyRow>(
    `SELECT request_hash, state, response_status, response_headers, response_body,
            expires_at < now() AS stale
       FROM idempotency_keys WHERE key_hash = $1`,
    [keyHash],
  );
  return rows[0];
}

/** Deletes the row of `keyHash` if it is (still) expired or abandoned (its lease lapsed). */
export async function deleteStaleIdempotencyKey(db: Queryable, keyHash: string): Promise<void> {
  await db.query(`DELETE FROM idempotency_keys WHERE key_hash = $1 AND expires_at < now()`, [keyHash]);
}

/** Releases a reservation (only the one with this `token`). */
export async function releaseIdempotencyKey(db: Queryable, keyHash: string, token: string): Promise<void> {
  await db.query('DELETE FROM idempotency_keys WHERE key_hash = $1 AND CAST(created_at AS TEXT) = $2', [keyHash, token]);
}

/** Marks the reservation `token` of `keyHash` done with its response (`body` already sealed), replayable for REPLAY_WINDOW_MS. */
export async function storeIdempotentResponse(
  db: Queryable,
  keyHash: string,
  token: string,
  response: { status: number; headers: Record<string, string>; body: string },
): Promise<void> {
  await db.query(
    `UPDATE idempotency_keys SET state = 'done', response_status = $3, response_headers = $4, response_body = $5,
            expires_at = now() + ${REPLAY_WINDOW_SQL}
      WHERE key_hash = $1 AND CAST(created_at AS TEXT) = $2`,
    [keyHash, token, response.status, JSON.stringify(response.headers), response.body],
  );
}

/**
 * Deletes expired rows: all of them, or only those whose key hash starts with `slice` (lowercase hex,
 * e.g. `'a7'`: 1/256 of the key space, a range scan of the primary key). Returns the number deleted.
 * @throws Error when `slice` is not 1..8 lowercase hex digits.
 */
export async function purgeExpiredIdempotencyKeys(db: Queryable, slice?: string): Promise<number> {
  if (slice === undefined) {
    const r = await db.query('DELETE FROM idempotency_keys WHERE expires_at < now()');
    return r.rowCount ?? 0;
  }
  if (!/^[0-9a-f]{1,8}$/.test(slice)) throw new Error(`bad key-space slice ${slice}`);
  // The successor of the last hex digit; 'g' sorts after 'f' and never occurs in a hex digest.
  const last = slice[slice.length - 1];
  const upper = slice.slice(0, -1) + (last === '9' ? 'a' : last === 'f' ? 'g' : String.fromCharCode(last.charCodeAt(0) + 1));
  const r = await db.query('DELETE FROM idempotency_keys WHERE key_hash >= $1 AND key_hash < $2 AND expires_at < now()', [slice, upper]);
  return r.rowCount ?? 0;
}
