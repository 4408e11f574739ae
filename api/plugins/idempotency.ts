/**
 * Idempotency-Key (SPEC.md Conventions), one mechanism for every route. A route declares
 * `config.idempotency`: 'required' | 'optional' | 'ignored' (the default; the header is then not even
 * looked at). Rules:
 *
 * - missing or blank where required → 400 idempotency_key_required (blank on an optional route counts
 *   as absent); over 255 characters → 400 idempotency_key_invalid. Checked after authentication and
 *   schema validation, before the handler.
 * - Scope: user, key environment (live, test, unknown), API key id, method, path and the Idempotency-Key.
 *   Within a scope the request fingerprint (query string and body hash) must match: a different one →
 *   422 idempotency_key_mismatch.
 * - The first request reserves the scope (an `in_progress` row). Successful (2xx) non-streaming
 *   responses are stored for 24 h and replayed with `Idempotent-Replayed: true`, same status, body and
 *   content headers. Errors and streams are not stored: the reservation is released, so a corrected
 *   request with the same key runs. A request arriving while the first still runs gets 409
 *   idempotency_key_in_use (Retry-After: 1), so the mutation runs once
 *   (docs/decisions/idempotency-concurrency.md).
 * - Stored bodies are sealed (AES-256-GCM) under a key derived from the Idempotency-Key itself, which
 *   the server never stores: only a request presenting the same key can read the replay, so responses
 *   carrying a secret (the enrolment secret) are not kept in clear text (docs/decisions/idempotency-scope.md).
 * - Expired rows (24 h) and reservations abandoned by a dead process (older than 5 minutes) no longer
 *   count: the key is usable again. Each process purges expired rows of one slice of the key space at
 *   most once a minute, after a keyed response has been sent (docs/decisions/idempotency-expiry.md).
 */
import fp from 'fastify-plugin';
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Queryable } from '../../db/pool';
import { ApiError } from '../../domain/errors';
import { sha256Hex } from '../../domain/hex';
import { canonicalJson } from '../../domain/version';

export const IDEMPOTENCY_MAX_LENGTH = 255;
export const REPLAY_WINDOW_MS = 24 * 60 * 60 * 1000;
/** An `in_progress` reservation older than this is taken as abandoned (its process died) and may be taken over. */
export const ABANDONED_AFTER_MS = 5 * 60 * 1000;
/** Each API process purges one slice of expired rows at most this often. */
export const PURGE_INTERVAL_MS = 60 * 1000;
/** Response headers stored with a response and sent again on replay. */
const REPLAYED_HEADERS = ['content-type', 'location', 'x-roost-workflow-url'];

const REPLAY_WINDOW_SQL = `INTERVAL '${REPLAY_WINDOW_MS / 1000} seconds'`;
const ABANDONED_SQL = `INTERVAL '${ABANDONED_AFTER_MS / 1000} seconds'`;

/** The parts of an idempotency scope (SPEC.md: user, key environment, key, method, path). */
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

/** The scope of a request: user (or agent), the API key's environment and id (session/ID token: unknown, ''). */
export function scopeOf(request: FastifyRequest, idempotencyKey: string): IdempotencyScope {
  const p = request.principal;
  const path = request.url.split('?', 1)[0];
  const base = { method: request.method, path, idempotencyKey };
  if (p?.kind === 'user') return { ...base, user: p.userId, environment: p.key?.environment ?? 'unknown', keyId: p.key?.keyId ?? '' };
  if (p?.kind === 'agent') return { ...base, user: `agent:${p.siteId}:${p.machineId}`, environment: 'unknown', keyId: '' };
  return { ...base, user: 'anonymous', environment: 'unknown', keyId: '' };
}

/**
 * Fingerprint of what must match within a scope: the raw query string and the body hash (JSON bodies
 * in RFC 8785 canonical form, so key order and whitespace do not matter; binary bodies by their bytes).
 */
export function requestFingerprint(request: FastifyRequest): string {
  const q = request.url.indexOf('?');
  const query = q < 0 ? '' : request.url.slice(q + 1);
  const b = request.body;
  let body = '';
  if (Buffer.isBuffer(b)) body = `bytes:${sha256Hex(b)}`;
  else if (typeof b === 'string') body = `text:${b}`;
  else if (b !== undefined && b !== null) {
    try {
      body = `json:${canonicalJson(b)}`;
    } catch {
      body = `text:${String(b)}`;
    }
  }
  return sha256Hex(`${query}\n${body}`);
}

/**
 * Deletes expired rows: all of them, or only those whose key hash starts with `slice` (lowercase hex,
 * e.g. `'a7'`: 1/256 of the key space, a range scan of the primary key). Returns the number deleted.
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

interface StoredRow {
  request_hash: string;
  state: string;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: string | null;
  stale: boolean;
}

/**
 * Reserves the request's scope, or answers it: a replay (done), 409 (in progress), 422 (other
 * fingerprint). Sets `request.idempotency` when the handler is to run.
 */
async function begin(db: Queryable, request: FastifyRequest, reply: FastifyReply, key: string): Promise<FastifyReply | void> {
  const keyHash = idempotencyScopeHash(scopeOf(request, key));
  const fingerprint = requestFingerprint(request);
  for (let attempt = 0; attempt < 3; attempt++) {
    const ins = await db.query<{ token: string }>(
      `INSERT INTO idempotency_keys (key_hash, request_hash, state, expires_at) VALUES ($1, $2, 'in_progress', now() + ${REPLAY_WINDOW_SQL})
       ON CONFLICT (key_hash) DO NOTHING RETURNING CAST(created_at AS TEXT) AS token`,
      [keyHash, fingerprint],
    );
    if (ins.rows.length === 1) {
      request.idempotency = { keyHash, token: ins.rows[0].token, key };
      return;
    }
    const { rows } = await db.query<StoredRow>(
      `SELECT request_hash, state, response_status, response_headers, response_body,
              (expires_at < now() OR (state = 'in_progress' AND created_at < now() - ${ABANDONED_SQL})) AS stale
         FROM idempotency_keys WHERE key_hash = $1`,
      [keyHash],
    );
    const row = rows[0];
    if (!row) continue; // released between our insert and select
    if (row.stale) {
      await db.query(
        `DELETE FROM idempotency_keys WHERE key_hash = $1
           AND (expires_at < now() OR (state = 'in_progress' AND created_at < now() - ${ABANDONED_SQL}))`,
        [keyHash],
      );
      continue;
    }
    if (row.request_hash !== fingerprint) {
      throw new ApiError('idempotency_key_mismatch', 'this Idempotency-Key was used with a different request body or query on this route', {
        extras: { param: 'Idempotency-Key' },
      });
    }
    if (row.state !== 'done') {
      throw new ApiError('idempotency_key_in_use', 'a request with this Idempotency-Key is still being processed; retry later', {
        headers: { 'Retry-After': '1' },
        extras: { param: 'Idempotency-Key' },
      });
    }
    const body = openResponseBody(row.response_body ?? '', key, keyHash);
    if (body === undefined) {
      request.log.error({ keyHash }, 'stored idempotent response does not open');
      throw new ApiError('internal_error', 'the stored response of this Idempotency-Key is unreadable', { status: 500 });
    }
    for (const [k, v] of Object.entries(row.response_headers ?? {})) reply.header(k, v);
    reply.header('Idempotent-Replayed', 'true');
    return reply.code(row.response_status ?? 200).send(body);
  }
  throw new ApiError('idempotency_key_in_use', 'could not reserve the Idempotency-Key; retry', {
    headers: { 'Retry-After': '1' },
    extras: { param: 'Idempotency-Key' },
  });
}

/** Releases a reservation (only the one this request made). */
async function release(db: Queryable, idem: { keyHash: string; token: string }): Promise<void> {
  await db.query('DELETE FROM idempotency_keys WHERE key_hash = $1 AND CAST(created_at AS TEXT) = $2', [idem.keyHash, idem.token]);
}

export default fp(async function idempotencyPlugin(app: FastifyInstance) {
  let lastPurge = Date.now();
  let slice = Math.floor(Math.random() * 256);

  app.addHook('preHandler', async (request, reply) => {
    const mode = request.routeOptions.config?.idempotency ?? 'ignored';
    if (mode === 'ignored') return;
    const raw = request.headers['idempotency-key'];
    const key = Array.isArray(raw) ? raw.join(', ') : raw;
    if (key === undefined || key.trim() === '') {
      if (mode === 'required') {
        throw new ApiError('idempotency_key_required', 'this route requires an Idempotency-Key header (at most 255 characters)', {
          extras: { param: 'Idempotency-Key' },
        });
      }
      return;
    }
    if (key.length > IDEMPOTENCY_MAX_LENGTH) {
      throw new ApiError(
        'idempotency_key_invalid',
        `Idempotency-Key must be at most ${IDEMPOTENCY_MAX_LENGTH} characters (got ${key.length})`,
        {
          extras: { param: 'Idempotency-Key' },
        },
      );
    }
    return begin(app.deps.db, request, reply, key);
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const idem = request.idempotency;
    if (!idem) return payload;
    request.idempotency = undefined;
    const status = reply.statusCode;
    const storable = typeof payload === 'string' || Buffer.isBuffer(payload) || payload === null || payload === undefined;
    if (status >= 200 && status < 300 && storable) {
      const headers: Record<string, string> = {};
      for (const h of REPLAYED_HEADERS) {
        const v = reply.getHeader(h);
        if (typeof v === 'string') headers[h] = v;
      }
      try {
        await app.deps.db.query(
          `UPDATE idempotency_keys SET state = 'done', response_status = $3, response_headers = $4, response_body = $5
            WHERE key_hash = $1 AND CAST(created_at AS TEXT) = $2`,
          [
            idem.keyHash,
            idem.token,
            status,
            JSON.stringify(headers),
            sealResponseBody(payload === null || payload === undefined ? '' : payload.toString(), idem.key, idem.keyHash),
          ],
        );
      } catch (err) {
        // The mutation happened; the client gets its answer. The reservation stays in progress until it is
        // taken as abandoned, so a retry meanwhile gets 409 rather than running the mutation again.
        request.log.error({ err }, 'could not store the idempotent response');
      }
    } else {
      await release(app.deps.db, idem);
    }
    return payload;
  });

  app.addHook('onResponse', async (request) => {
    // A request that ended before onSend (aborted connection) must not leave the key reserved.
    const idem = request.idempotency;
    if (idem) {
      request.idempotency = undefined;
      await release(app.deps.db, idem).catch((err) => request.log.error({ err }, 'could not release an Idempotency-Key'));
    }
    if ((request.routeOptions.config?.idempotency ?? 'ignored') === 'ignored' || !request.headers['idempotency-key']) return;
    const now = Date.now();
    if (now - lastPurge < PURGE_INTERVAL_MS) return;
    lastPurge = now;
    slice = (slice + 1) % 256;
    await purgeExpiredIdempotencyKeys(app.deps.db, slice.toString(16).padStart(2, '0')).catch((err) =>
      request.log.warn({ err }, 'idempotency purge failed'),
    );
  });
});
