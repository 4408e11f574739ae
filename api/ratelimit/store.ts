/**
 * Counter stores for the rate limits (docs/contract.md "Limits"), on rate-limiter-flexible: fixed windows counted
 * in Redis (shared by every API process) or in process memory (the embedded default). A Redis store
 * that cannot answer (down, unreachable, not yet connected, slow past the command timeout) does not fail
 * the request: the per-process fallback limiter decides instead, per identifier
 * (docs/decisions/rate-limit-store.md).
 */
import Redis from 'ioredis';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { RateLimiterAbstract } from 'rate-limiter-flexible';
import type { BucketLimit } from './buckets';

/** Prefix of every counter key in Redis. */
export const KEY_PREFIX = 'roost:rl';

/** Outcome of counting one request against one limit. */
export interface Decision {
  allowed: boolean;
  /** The limit that decided (the fallback's when `fallback`). */
  limit: number;
  /** Requests left in the current window (0 when refused). */
  remaining: number;
  /** Whole seconds until the window resets (at least 1). */
  resetSeconds: number;
  /** true when the shared store could not answer and the per-process fallback decided. */
  fallback: boolean;
}

/** Options of a Redis-backed store. */
export interface RedisStoreOptions {
  /** Called on each store failure (connection errors, refused or timed-out commands). */
  onError?: (err: Error) => void;
  /** Milliseconds a counter command may take before the fallback decides (default 1000). */
  commandTimeoutMs?: number;
  /** Milliseconds `connect` waits for the first connection before giving up (default 2000). */
  connectTimeoutMs?: number;
}

function toDecision(allowed: boolean, limit: number, res: RateLimiterRes, fallback: boolean): Decision {
  return {
    allowed,
    limit,
    remaining: allowed ? Math.max(0, res.remainingPoints) : 0,
    resetSeconds: Math.max(1, Math.ceil(res.msBeforeNext / 1000)),
    fallback,
  };
}

/**
 * Counts requests per key in fixed windows. One instance per API process; `consume` never throws for a
 * store failure (the fallback decides), only for programming errors.
 */
export class CounterStore {
  private readonly limiters = new Map<string, RateLimiterAbstract>();
  private readonly fallbackLimiter: RateLimiterMemory;

  private constructor(
    readonly kind: 'memory' | 'redis',
    private readonly redis: Redis | null,
    readonly fallback: BucketLimit,
    private readonly onError: (err: Error) => void,
  ) {
    this.fallbackLimiter = new RateLimiterMemory({
      keyPrefix: `${KEY_PREFIX}:fallback`,
      points: fallback.points,
      duration: fallback.durationSeconds,
    });
  }

  /** A per-process store (counters die with the process). */
  static memory(fallback: BucketLimit): CounterStore {
    return new CounterStore('memory', null, fallback, () => undefined);
  }

  /**
   * A store in the Redis at `url` (ioredis). Waits up to `connectTimeoutMs` for the first connection;
   * when Redis is not reachable the store is still returned (the fallback decides until it connects, and
   * the client keeps reconnecting). Commands are never queued while disconnected.
   */
  static async redis(url: string, fallback: BucketLimit, opts: RedisStoreOptions = {}): Promise<CounterStore> {
    const onError = opts.onError ?? (() => undefined);
    const client = new Redis(url, {
      lazyConnect: true,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 1,
      connectTimeout: opts.connectTimeoutMs ?? 2000,
      commandTimeout: opts.commandTimeoutMs ?? 1000,
      retryStrategy: (times) => Math.min(100 * times, 2000),
      // A closed socket never emits close again: do not keep the process alive 2 s on shutdown.
      disconnectTimeout: 100,
    });
    client.on('error', (err: Error) => onError(err));
    await client.connect().catch((err: Error) => onError(err));
    return new CounterStore('redis', client, fallback, onError);
  }

  /** The limiter instance counting `limit` (one per distinct points/window; keys carry the bucket). */
  private limiterFor(limit: BucketLimit): RateLimiterAbstract {
    const id = `${limit.points}/${limit.durationSeconds}`;
    let limiter = this.limiters.get(id);
    if (!limiter) {
      const common = { keyPrefix: KEY_PREFIX, points: limit.points, duration: limit.durationSeconds };
      limiter = this.redis
        ? new RateLimiterRedis({ ...common, storeClient: this.redis, rejectIfRedisNotReady: true })
        : new RateLimiterMemory(common);
      this.limiters.set(id, limiter);
    }
    return limiter;
  }

  /**
   * Counts one request for `key` against `limit`. When the store fails, counts it against the
   * per-process fallback (same key) and says so in `fallback`.
   */
  async consume(key: string, limit: BucketLimit): Promise<Decision> {
    try {
      const res = await this.limiterFor(limit).consume(key, 1);
      return toDecision(true, limit.points, res, false);
    } catch (err) {
      if (err instanceof RateLimiterRes) return toDecision(false, limit.points, err, false);
      this.onError(err instanceof Error ? err : new Error(String(err)));
      return this.consumeFallback(key);
    }
  }

  private async consumeFallback(key: string): Promise<Decision> {
    try {
      const res = await this.fallbackLimiter.consume(key, 1);
      return toDecision(true, this.fallback.points, res, true);
    } catch (err) {
      if (err instanceof RateLimiterRes) return toDecision(false, this.fallback.points, err, true);
      throw err;
    }
  }

  /** ioredis connection state (`ready`, `reconnecting`, …); `memory` for the in-process store. */
  get status(): string {
    return this.redis ? this.redis.status : 'memory';
  }

  /** Drops the Redis connection (no reconnects afterwards). */
  async close(): Promise<void> {
    this.redis?.disconnect(false);
  }
}
