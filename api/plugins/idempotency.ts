/**
 * Idempotency-Key (SPEC.md Conventions). Routes declare `config.idempotency` = 'required' | 'optional'.
 * Rules: missing or blank where required → 400 idempotency_key_required; over 255 chars → 400
 * idempotency_key_invalid; the same key with a different query or body → 422 idempotency_key_mismatch.
 * Successful (2xx) non-streaming responses are stored for 24 h and replayed with `Idempotent-Replayed:
 * true` when user, key environment, key id, method, path, query and body hash are equal. Errors are not
 * cached (the row is released). A second request while the first still runs gets 409
 * idempotency_key_in_use, so the mutation executes once.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../domain/errors';
import { sha256Hex } from '../../domain/hex';
import { canonicalJson } from '../../domain/version';

export const IDEMPOTENCY_MAX_LENGTH = 255;
export const REPLAY_WINDOW_MS = 24 * 60 * 60 * 1000;
const REPLAYED_HEADERS = ['content-type', 'location', 'x-roost-workflow-url'];

function identity(request: FastifyRequest): [string, string, string] {
  const p = request.principal;
  if (p?.kind === 'user') return [p.userId, p.key?.environment ?? 'unknown', p.key?.keyId ?? ''];
  if (p?.kind === 'agent') return [`agent:${p.siteId}:${p.machineId}`, 'unknown', ''];
  return ['anonymous', 'unknown', ''];
}

function requestHash(request: FastifyRequest): string {
  const [, query = ''] = request.url.split('?', 2);
  let body = '';
  if (request.body !== undefined && request.body !== null) {
    try {
      body = canonicalJson(request.body);
    } catch {
      body = String(request.body);
    }
  }
  return sha256Hex(`${query}\n${body}`);
}

async function begin(app: FastifyInstance, request: FastifyRequest, reply: FastifyReply, key: string): Promise<FastifyReply | void> {
  const [user, env, keyId] = identity(request);
  const path = request.url.split('?', 1)[0];
  const keyHash = sha256Hex(JSON.stringify([user, env, keyId, request.method, path, key]));
  const reqHash = requestHash(request);
  const db = app.deps.db;
  for (let i = 0; i < 2; i++) {
    const ins = await db.query(
      `INSERT INTO idempotency_keys (key_hash, request_hash, state, expires_at) VALUES ($1, $2, 'in_progress', $3)
       ON CONFLICT (key_hash) DO NOTHING`,
      [keyHash, reqHash, new Date(Date.now() + REPLAY_WINDOW_MS)],
    );
    if (ins.rowCount === 1) {
      request.idempotency = { keyHash };
      return;
    }
    const { rows } = await db.query<{
      request_hash: string;
      state: string;
      response_status: number;
      response_headers: Record<string, string>;
      response_body: string;
      expires_at: Date;
    }>('SELECT request_hash, state, response_status, response_headers, response_body, expires_at FROM idempotency_keys WHERE key_hash = $1', [keyHash]);
    const row = rows[0];
    if (!row) continue; // released between our insert and select: try once more
    if (row.expires_at.getTime() < Date.now()) {
      await db.query('DELETE FROM idempotency_keys WHERE key_hash = $1 AND expires_at < now()', [keyHash]);
      continue;
    }
    if (row.request_hash !== reqHash) {
      throw new ApiError('idempotency_key_mismatch', 'this Idempotency-Key was used with a different request body or query');
    }
    if (row.state !== 'done') {
      throw new ApiError('idempotency_key_in_use', 'a request with this Idempotency-Key is still being processed; retry later', {
        headers: { 'Retry-After': '1' },
      });
    }
    for (const [k, v] of Object.entries(row.response_headers ?? {})) reply.header(k, v);
    reply.header('Idempotent-Replayed', 'true');
    return reply.code(row.response_status).send(row.response_body);
  }
  throw new ApiError('idempotency_key_in_use', 'could not reserve the Idempotency-Key; retry', { headers: { 'Retry-After': '1' } });
}

export default fp(async function idempotencyPlugin(app: FastifyInstance) {
  app.addHook('preHandler', async (request, reply) => {
    const mode = request.routeOptions.config?.idempotency ?? 'ignored';
    if (mode === 'ignored') return;
    const raw = request.headers['idempotency-key'];
    const key = Array.isArray(raw) ? raw[0] : raw;
    if (key === undefined || key.trim() === '') {
      if (mode === 'required') throw new ApiError('idempotency_key_required', 'this route requires an Idempotency-Key header');
      return;
    }
    if (key.length > IDEMPOTENCY_MAX_LENGTH) {
      throw new ApiError('idempotency_key_invalid', `Idempotency-Key must be at most ${IDEMPOTENCY_MAX_LENGTH} characters`);
    }
    return begin(app, request, reply, key);
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const idem = request.idempotency;
    if (!idem) return payload;
    request.idempotency = undefined;
    const status = reply.statusCode;
    if (status >= 200 && status < 300 && (typeof payload === 'string' || Buffer.isBuffer(payload) || payload === null || payload === undefined)) {
      const headers: Record<string, string> = {};
      for (const h of REPLAYED_HEADERS) {
        const v = reply.getHeader(h);
        if (typeof v === 'string') headers[h] = v;
      }
      await app.deps.db.query(
        `UPDATE idempotency_keys SET state = 'done', response_status = $2, response_headers = $3, response_body = $4 WHERE key_hash = $1`,
        [idem.keyHash, status, JSON.stringify(headers), payload === null || payload === undefined ? '' : payload.toString()],
      );
    } else {
      await app.deps.db.query('DELETE FROM idempotency_keys WHERE key_hash = $1', [idem.keyHash]);
    }
    return payload;
  });

  // A request that failed before onSend (aborted connection) must not leave the key reserved.
  app.addHook('onResponse', async (request) => {
    if (request.idempotency) await app.deps.db.query('DELETE FROM idempotency_keys WHERE key_hash = $1', [request.idempotency.keyHash]);
  });
});
