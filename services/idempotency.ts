/**
 * Idempotency-Key reservations and replays (the rules are documented in api/plugins/idempotency.ts, which
 * runs them around every keyed request; rows in db/idempotency.ts; docs/decisions/idempotency-scope.md,
 * docs/decisions/idempotency-concurrency.md, docs/decisions/idempotency-expiry.md).
 *
 * Stored bodies are sealed (AES-256-GCM) under a key derived from the Idempotency-Key itself, which the
 * server never stores: only a request presenting the same key can read the replay.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import {
  deleteStaleIdempotencyKey,
  findIdempotencyKey,
  purgeExpiredIdempotencyKeys,
  releaseIdempotencyKey,
  renewIdempotencyKey,
  reserveIdempotencyKey,
  storeIdempotentResponse,
} from '../db/idempotency';
import { withoutTxObserver } from '../db/pool';
import { ApiError } from '../domain/errors';
import { sha256Hex } from '../domain/hex';
import type { ServiceDeps } from './deps';

export { purgeExpiredIdempotencyKeys, REPLAY_WINDOW_MS } from '../db/idempotency';

/** The parts of an idempotency scope: user, key environment, key, method, path and the Idempotency-Key. */
export interface IdempotencyScope {
  user: string;
  environment: 'live' | 'test' | 'unknown';
  keyId: string;
  method: string;
  path: string;
  idempotencyKey: string;
}

/** Primary key of a scope's row: SHA-256 hex of its parts. */
export function idempotencyScopeHash(s: IdempotencyScope): string {
  return sha256Hex(JSON.stringify([s.user, s.environment, s.keyId, s.method.toUpperCase(), s.path, s.idempotencyKey]));
}

const SEAL_PREFIX = 'sealed:v1:';

function sealingKey(idempotencyKey: string, keyHash: string): Buffer {
  return Buffer.from(
    hkdfSync('sha256', Buffer.from(idempotencyKey, 'utf8'), Buffer.from(keyHash, 'hex'), 'roost.idempotency.response.v1', 32),
  );
}

/** Encrypts a response body for storage: `sealed:v1:` + base64(iv ‖ tag ‖ ciphertext). */
export function sealResponseBody(body: string, idempotencyKey: string, keyHash: string): string {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', sealingKey(idempotencyKey, keyHash), iv);
  const ct = Buffer.concat([cipher.update(body, 'utf8'), cipher.final()]);
  return SEAL_PREFIX + Buffer.concat([iv, cipher.getAuthTag(), ct]).toString('base64');
}

/** Decrypts a stored body; undefined when it does not open under this key. */
export function openResponseBody(stored: string, idempotencyKey: string, keyHash: string): string | undefined {
  if (!stored.startsWith(SEAL_PREFIX)) return undefined;
  try {
    const raw = Buffer.from(stored.slice(SEAL_PREFIX.length), 'base64');
    const decipher = createDecipheriv('aes-256-gcm', sealingKey(idempotencyKey, keyHash), raw.subarray(0, 12));
    decipher.setAuthTag(raw.subarray(12, 28));
    return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString('utf8');
  } catch {
    return undefined;
  }
}

/** A reservation this request holds: finish it with `finishIdempotent` or give it back with `releaseIdempotent`. */
export interface IdempotencyReservation {
  keyHash: string;
  token: string;
  key: string;
}

/** What `beginIdempotent` decided. */
export type IdempotencyStart =
  | { kind: 'reserved'; reservation: IdempotencyReservation }
  | { kind: 'replay'; status: number; headers: Record<string, string>; body: string }
  /** A stored response that does not open under the key (the caller logs it and answers 500). */
  | { kind: 'unreadable'; keyHash: string };

const inUse = (detail: string) =>
  new ApiError('idempotency_key_in_use', detail, { headers: { 'Retry-After': '1' }, extras: { param: 'Idempotency-Key' } });

/**
 * Reserves the scope of a keyed request under a lease of ROOST_IDEMPOTENCY_LEASE_MS (the caller renews it with
 * `renewIdempotent` while the request runs), or answers it: the stored response of a finished request with
 * the same fingerprint (`replay`); expired rows and lapsed leases are cleared and the reservation retried.
 * @throws ApiError idempotency_key_mismatch (422: another fingerprint), idempotency_key_in_use (409, Retry-After 1:
 *   the first request still runs, or the reservation could not be taken in 3 tries)
 */
export async function beginIdempotent(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: { scope: IdempotencyScope; fingerprint: string },
): Promise<IdempotencyStart> {
  const key = input.scope.idempotencyKey;
  const keyHash = idempotencyScopeHash(input.scope);
  for (let attempt = 0; attempt < 3; attempt++) {
    const token = await reserveIdempotencyKey(deps.db, keyHash, input.fingerprint, deps.cfg.ROOST_IDEMPOTENCY_LEASE_MS);
    if (token !== undefined) return { kind: 'reserved', reservation: { keyHash, token, key } };
    const row = await findIdempotencyKey(deps.db, keyHash);
    if (!row) continue; // released between our insert and select
    if (row.stale) {
      await deleteStaleIdempotencyKey(deps.db, keyHash);
      continue;
    }
    if (row.request_hash !== input.fingerprint) {
      throw new ApiError('idempotency_key_mismatch', 'this Idempotency-Key was used with a different request body or query on this route', {
        extras: { param: 'Idempotency-Key' },
      });
    }
    if (row.state !== 'done') throw inUse('a request with this Idempotency-Key is still being processed; retry later');
    const body = openResponseBody(row.response_body ?? '', key, keyHash);
    if (body === undefined) return { kind: 'unreadable', keyHash };
    return { kind: 'replay', status: row.response_status ?? 200, headers: row.response_headers ?? {}, body };
  }
  throw inUse('could not reserve the Idempotency-Key; retry');
}

/** Stores the successful response of a reservation (body sealed under the Idempotency-Key) for replay. */
export async function finishIdempotent(
  deps: Pick<ServiceDeps, 'db'>,
  reservation: IdempotencyReservation,
  response: { status: number; headers: Record<string, string>; body: string },
): Promise<void> {
  const body = sealResponseBody(response.body, reservation.key, reservation.keyHash);
  // Bookkeeping of the request, never part of its audited mutation (services/audit.ts).
  await withoutTxObserver(() =>
    storeIdempotentResponse(deps.db, reservation.keyHash, reservation.token, { status: response.status, headers: response.headers, body }),
  );
}

/**
 * Extends the reservation's lease by ROOST_IDEMPOTENCY_LEASE_MS from now (the request is still running).
 * @returns false when the reservation is no longer this request's
 */
export function renewIdempotent(deps: Pick<ServiceDeps, 'db' | 'cfg'>, reservation: IdempotencyReservation): Promise<boolean> {
  return withoutTxObserver(() => renewIdempotencyKey(deps.db, reservation.keyHash, reservation.token, deps.cfg.ROOST_IDEMPOTENCY_LEASE_MS));
}

/** Gives a reservation back (only the one this request made), so a corrected request with the same key runs. */
export async function releaseIdempotent(deps: Pick<ServiceDeps, 'db'>, reservation: IdempotencyReservation): Promise<void> {
  await withoutTxObserver(() => releaseIdempotencyKey(deps.db, reservation.keyHash, reservation.token));
}

/** Deletes the expired rows of one slice of the key space (`slice`: lowercase hex prefix); returns how many. */
export function purgeExpiredSlice(deps: Pick<ServiceDeps, 'db'>, slice: string): Promise<number> {
  return purgeExpiredIdempotencyKeys(deps.db, slice);
}
