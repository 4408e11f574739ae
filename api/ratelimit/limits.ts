/**
 * Rate limits as one service per API process (docs/contract.md "Limits"): wrapper buckets per request, capability
 * buckets per operation, the `RateLimit-*`/`X-RateLimit-*` headers, and the 429 `rate_limited` problem
 * (`retryAfter`, `Retry-After`, `Roost-Rate-Limited-Reason`).
 *
 * Routes call `enforceCapability(request, capability, siteId)` once, after authorisation and before the
 * mutation; the rate-limit plugin (api/plugins/rate-limit.ts) applies the wrapper bucket and writes the
 * headers of the most restrictive decision of the request.
 */
import type { FastifyRequest } from 'fastify';
import { ApiError } from '../../domain/errors';
import type { Config } from '../../config/env';
import {
  type BucketSubject,
  type Capability,
  type CapabilityActor,
  CAPABILITY_WINDOW_SECONDS,
  type RateLimitedReason,
  rateLimitSettings,
  type RateLimitSettings,
  type WrapperBucket,
  wrapperReason,
} from './buckets';
import { CounterStore, type Decision } from './store';

/** A decision with what it counted and the reason a refusal would carry. */
export interface LimitDecision extends Decision {
  /** The counter: `bucket:<name>` or `capability:<NAME>`. */
  scope: string;
  reason: RateLimitedReason;
}

declare module 'fastify' {
  interface FastifyInstance {
    /** The process's rate limits (api/plugins/rate-limit.ts). */
    rateLimits: RateLimits;
  }
  interface FastifyRequest {
    /** The most restrictive rate-limit decision taken for this request so far (reported in headers). */
    rateLimitDecision?: LimitDecision;
  }
  interface FastifyContextConfig {
    /**
     * Wrapper bucket of the route: a bucket name, or false for none. Default: `api` for routes that take
     * user credentials (agent-token requests are not counted), none for `auth: 'none'` routes.
     */
    rateLimit?: WrapperBucket | false;
  }
}

/** Redis URL of the shared store: ROOST_REDIS_URL, else the embedded redis-server on ROOST_REDIS_PORT. */
export function redisUrlOf(cfg: Pick<Config, 'ROOST_REDIS_URL' | 'ROOST_REDIS_PORT'>): string {
  return cfg.ROOST_REDIS_URL ?? `redis://127.0.0.1:${cfg.ROOST_REDIS_PORT}`;
}

/** The wrapper buckets and capability buckets over one counter store. */
export class RateLimits {
  constructor(
    readonly settings: RateLimitSettings,
    readonly store: CounterStore,
  ) {}

  /**
   * Builds the limits from configuration: the memory store, or Redis (ROOST_RATE_LIMIT_STORE=redis).
   * @throws Error when ROOST_RATE_LIMIT_OVERRIDES is invalid. An unreachable Redis is not an error.
   */
  static async create(cfg: Config, opts: { onStoreError?: (err: Error) => void } = {}): Promise<RateLimits> {
    const settings = rateLimitSettings(cfg);
    const store =
      cfg.ROOST_RATE_LIMIT_STORE === 'redis'
        ? await CounterStore.redis(redisUrlOf(cfg), settings.fallback, { onError: opts.onStoreError })
        : CounterStore.memory(settings.fallback);
    return new RateLimits(settings, store);
  }

  /** Counts one request of `identifier` (`key:<id>`, `user:<uid>` or `ip:<addr>`) in wrapper bucket `bucket`. */
  async bucket(bucket: WrapperBucket, identifier: string): Promise<LimitDecision> {
    const d = await this.store.consume(`b:${bucket}:${identifier}`, this.settings.buckets[bucket]);
    return { ...d, scope: `bucket:${bucket}`, reason: d.fallback ? 'global-rate' : wrapperReason(bucket, identifier) };
  }

  /**
   * Counts one `capability` operation by `subject` on `siteId` in the actor's bucket (60-second window;
   * the user/key column or the system column of the capability table).
   */
  async capability(actor: CapabilityActor, subject: string, siteId: string, capability: Capability): Promise<LimitDecision> {
    const limit = { points: this.settings.capabilities[capability][actor], durationSeconds: CAPABILITY_WINDOW_SECONDS };
    const d = await this.store.consume(`c:${actor}:${subject}:${siteId}:${capability}`, limit);
    return { ...d, scope: `capability:${capability}`, reason: d.fallback ? 'global-rate' : 'endpoint-rate' };
  }

  /** Closes the store's connection. */
  close(): Promise<void> {
    return this.store.close();
  }
}

/**
 * The identifier a wrapper bucket counts for this request: `key:<keyId>` for API-key requests on
 * `keyOrIp`, `user:<uid>` for user requests on `userOrIp`, otherwise `ip:<client address>`.
 */
export function bucketIdentifier(subject: BucketSubject, request: FastifyRequest): string {
  const p = request.principal;
  if (p?.kind === 'user') {
    if (subject === 'keyOrIp' && p.key) return `key:${p.key.keyId}`;
    if (subject === 'userOrIp') return `user:${p.userId}`;
  }
  return `ip:${request.ip}`;
}

/** `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds) and the same as `X-RateLimit-*`. */
export function rateLimitHeaders(d: Decision): Record<string, string> {
  const values = { Limit: String(d.limit), Remaining: String(d.remaining), Reset: String(d.resetSeconds) };
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(values)) {
    out[`RateLimit-${k}`] = v;
    out[`X-RateLimit-${k}`] = v;
  }
  return out;
}

/**
 * The `rateLimit` hint of `GET /api/whoami` (docs/contract.md "Authentication" 9): the `api` bucket as a per-minute
 * figure (300 per hour → 5). A hint only, not the enforced counter.
 */
export function rateLimitHint(settings: RateLimitSettings, tier: string): { tier: string; limitPerMinute: number; note: string } {
  const api = settings.buckets.api;
  return {
    tier,
    limitPerMinute: Math.max(1, Math.round((api.points * 60) / api.durationSeconds)),
    note: `hint only, not the enforced counter: ${api.points} requests per ${api.durationSeconds} s per API key (else per IP); see the RateLimit-* response headers`,
  };
}

/** The 429 problem of a refused decision: body `retryAfter` (seconds), headers `Retry-After` and `Roost-Rate-Limited-Reason`. */
export function rateLimitedError(d: LimitDecision): ApiError {
  const what = d.fallback ? 'the per-process fallback limit' : d.scope.replace(':', ' ');
  return new ApiError('rate_limited', `rate limit exceeded (${what}: ${d.limit} per window); retry after ${d.resetSeconds} s`, {
    extras: { retryAfter: d.resetSeconds },
    headers: { ...rateLimitHeaders(d), 'Retry-After': String(d.resetSeconds), 'Roost-Rate-Limited-Reason': d.reason },
  });
}

/** Keeps the more restrictive of the request's decisions (fewer remaining; a refusal always wins). */
export function noteDecision(request: FastifyRequest, d: LimitDecision): void {
  const cur = request.rateLimitDecision;
  if (!cur || (!d.allowed && cur.allowed) || (d.allowed === cur.allowed && d.remaining < cur.remaining)) request.rateLimitDecision = d;
}

/**
 * Counts one `capability` operation on `siteId` for the request's principal and throws 429 rate_limited
 * when its bucket is exhausted (docs/contract.md "Limits", capability buckets). Users count in the user/key bucket
 * (subject: the API key, else the user); agents count in the system bucket (subject: the machine). Call
 * it after authorisation, before the mutation: a refused request changes nothing.
 * @throws ApiError rate_limited (429)
 */
export async function enforceCapability(request: FastifyRequest, capability: Capability, siteId: string): Promise<void> {
  const p = request.principal;
  let actor: CapabilityActor = 'user';
  let subject = `ip:${request.ip}`;
  if (p?.kind === 'agent') {
    actor = 'system';
    subject = `machine:${p.machineId}`;
  } else if (p?.kind === 'user') {
    subject = p.key ? `key:${p.key.keyId}` : `user:${p.userId}`;
  }
  const d = await request.server.rateLimits.capability(actor, subject, siteId, capability);
  noteDecision(request, d);
  if (!d.allowed) throw rateLimitedError(d);
}
