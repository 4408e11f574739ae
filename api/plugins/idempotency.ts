/**
 * Idempotency-Key, one mechanism for every route (services/idempotency.ts holds the reservations). A route declares
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
 *   responses are stored for 24 h and replayed with `Idempotent-Replayed: true`, same status, body,
 *   content headers and Cache-Control (REPLAYED_HEADERS). Errors and streams are not stored: the
 *   reservation is released, so a corrected request with the same key runs. A request arriving while the
 *   first still runs gets 409 idempotency_key_in_use (Retry-After: 1), so the mutation runs once
 *   (docs/decisions/idempotency-concurrency.md).
 * - Stored bodies are sealed (AES-256-GCM) under a key derived from the Idempotency-Key itself, which
 *   the server never stores: only a request presenting the same key can read the replay, so responses
 *   carrying a secret (the enrolment secret) are not kept in clear text (docs/decisions/idempotency-scope.md).
 * - The reservation is a lease tied to the live request (ROOST_IDEMPOTENCY_LEASE_MS, default 10 s): the
 *   request renews it every third of the lease until its response is stored or the key released. A process
 *   that dies mid-request stops renewing, so a retry with the same key runs a few seconds later instead
 *   of answering 409 for minutes. Expired rows (24 h) and lapsed leases no longer count: the key is usable
 *   again. Each process purges expired rows of one slice of the key space at
 *   most once a minute, after a keyed response has been sent (docs/decisions/idempotency-expiry.md).
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../domain/errors';
import { sha256Hex } from '../../domain/hex';
import { canonicalJson } from '../../domain/version';
import {
  beginIdempotent,
  finishIdempotent,
  type IdempotencyReservation,
  type IdempotencyScope,
  purgeExpiredSlice,
  releaseIdempotent,
  renewIdempotent,
} from '../../services/idempotency';

export { idempotencyScopeHash, REPLAY_WINDOW_MS } from '../../services/idempotency';
export type { IdempotencyScope } from '../../services/idempotency';

/** Longest Idempotency-Key accepted, characters. */
export const IDEMPOTENCY_MAX_LENGTH = 255;
/** Each API process purges one slice of expired rows at most this often. */
export const PURGE_INTERVAL_MS = 60 * 1000;
/** Response headers stored with a response and sent again on replay (`cache-control`: a replayed secret stays no-store). */
const REPLAYED_HEADERS = ['content-type', 'location', 'x-roost-workflow-url', 'cache-control'];

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
 * Reserves the request's scope, or answers it: a replay (done), 409 (in progress), 422 (other
 * fingerprint). Sets `request.idempotency` when the handler is to run.
 */
async function begin(app: FastifyInstance, request: FastifyRequest, reply: FastifyReply, key: string): Promise<FastifyReply | void> {
  const start = await beginIdempotent(app.deps, { scope: scopeOf(request, key), fingerprint: requestFingerprint(request) });
  switch (start.kind) {
    case 'reserved':
      request.idempotency = start.reservation;
      holdLease(app, request, start.reservation);
      return;
    case 'unreadable':
      request.log.error({ keyHash: start.keyHash }, 'stored idempotent response does not open');
      throw new ApiError('internal_error', 'the stored response of this Idempotency-Key is unreadable', { status: 500 });
    case 'replay':
      for (const [k, v] of Object.entries(start.headers)) reply.header(k, v);
      reply.header('Idempotent-Replayed', 'true');
      return reply.code(start.status).send(start.body);
  }
}

/** The lease renewal timer of each request holding a reservation. */
const renewals = new WeakMap<FastifyRequest, NodeJS.Timeout>();

/** Renews the reservation's lease every third of ROOST_IDEMPOTENCY_LEASE_MS until `dropLease`. */
function holdLease(app: FastifyInstance, request: FastifyRequest, reservation: IdempotencyReservation): void {
  const every = Math.max(100, Math.floor(app.deps.cfg.ROOST_IDEMPOTENCY_LEASE_MS / 3));
  const timer = setInterval(() => {
    renewIdempotent(app.deps, reservation)
      .then((held) => {
        if (!held) {
          clearInterval(timer);
          if (request.idempotency === reservation) request.log.warn('the Idempotency-Key reservation of this request was lost');
        }
      })
      .catch((err: unknown) => request.log.warn({ err }, 'could not renew an Idempotency-Key lease'));
  }, every);
  timer.unref();
  renewals.set(request, timer);
}

/** Stops renewing the request's lease (its response is stored, or the key released). */
function dropLease(request: FastifyRequest): void {
  const timer = renewals.get(request);
  if (timer) clearInterval(timer);
  renewals.delete(request);
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
    return begin(app, request, reply, key);
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const idem = request.idempotency;
    if (!idem) return payload;
    request.idempotency = undefined;
    dropLease(request);
    const status = reply.statusCode;
    const storable = typeof payload === 'string' || Buffer.isBuffer(payload) || payload === null || payload === undefined;
    if (status >= 200 && status < 300 && storable) {
      const headers: Record<string, string> = {};
      for (const h of REPLAYED_HEADERS) {
        const v = reply.getHeader(h);
        if (typeof v === 'string') headers[h] = v;
      }
      try {
        await finishIdempotent(app.deps, idem, {
          status,
          headers,
          body: payload === null || payload === undefined ? '' : payload.toString(),
        });
      } catch (err) {
        // The mutation happened; the client gets its answer. The reservation stays in progress until its
        // lease lapses, so a retry meanwhile gets 409 rather than running the mutation again.
        request.log.error({ err }, 'could not store the idempotent response');
      }
    } else {
      await releaseIdempotent(app.deps, idem);
    }
    return payload;
  });

  app.addHook('onResponse', async (request) => {
    // A request that ended before onSend (aborted connection) must not leave the key reserved.
    const idem = request.idempotency;
    dropLease(request);
    if (idem) {
      request.idempotency = undefined;
      await releaseIdempotent(app.deps, idem).catch((err) => request.log.error({ err }, 'could not release an Idempotency-Key'));
    }
    if ((request.routeOptions.config?.idempotency ?? 'ignored') === 'ignored' || !request.headers['idempotency-key']) return;
    const now = Date.now();
    if (now - lastPurge < PURGE_INTERVAL_MS) return;
    lastPurge = now;
    slice = (slice + 1) % 256;
    await purgeExpiredSlice(app.deps, slice.toString(16).padStart(2, '0')).catch((err) =>
      request.log.warn({ err }, 'idempotency purge failed'),
    );
  });
});
