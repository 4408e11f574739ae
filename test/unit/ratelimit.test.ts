/**
 * Rate-limit rules without the HTTP layer (docs/contract.md Limits): the bucket tables and how configuration
 * changes them, the in-process counter store, the fallback when a Redis store cannot be reached (a real
 * ioredis client against a port nothing listens on), headers and the 429 problem.
 */
import net from 'node:net';
import { CAPABILITY_BUCKETS, parseOverrides, rateLimitSettings, type RateLimitConfig, wrapperReason } from '../../api/ratelimit/buckets';
import { RateLimits, rateLimitedError, rateLimitHeaders, rateLimitHint, redisUrlOf } from '../../api/ratelimit/limits';
import { CounterStore } from '../../api/ratelimit/store';

const base: RateLimitConfig = { ROOST_RATE_LIMIT_PROFILE: 'production', ROOST_RATE_LIMIT_SCALE: 1, ROOST_RATE_LIMIT_OVERRIDES: undefined };

function unusedPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

describe('bucket settings', () => {
  it('default to the numbers of docs/contract.md Limits', () => {
    const s = rateLimitSettings(base);
    expect(s.buckets.api).toEqual({ subject: 'keyOrIp', points: 300, durationSeconds: 3600 });
    expect(s.buckets.auth).toEqual({ subject: 'ip', points: 10, durationSeconds: 60 });
    expect(s.buckets.tokenExchange).toEqual({ subject: 'ip', points: 60, durationSeconds: 3600 });
    expect(s.buckets.tokenRefresh).toEqual({ subject: 'ip', points: 120, durationSeconds: 3600 });
    expect(s.buckets.user).toEqual({ subject: 'userOrIp', points: 60, durationSeconds: 3600 });
    expect(s.buckets.agentAlert).toEqual({ subject: 'ip', points: 5, durationSeconds: 3600 });
    expect(s.buckets.upload).toEqual({ subject: 'ip', points: 5, durationSeconds: 3600 });
    expect(s.fallback).toEqual({ points: 15, durationSeconds: 60 });
    expect(s.capabilities.MACHINE_EXEC_COMMAND).toEqual({ user: 60, system: 300 });
    expect(s.capabilities.DISTRIBUTION_MANAGE).toEqual({ user: 30, system: 150 });
    expect(s.capabilities.USER_SELF_DELETE).toEqual({ user: 1, system: 5 });
    expect(s.capabilities.USER_SELF_PREFS).toEqual({ user: 120, system: 600 });
    expect(Object.keys(s.capabilities)).toHaveLength(Object.keys(CAPABILITY_BUCKETS).length);
  });

  it('take the development numbers where the spec gives two', () => {
    const s = rateLimitSettings({ ...base, ROOST_RATE_LIMIT_PROFILE: 'development' });
    expect(s.buckets.tokenExchange.points).toBe(200);
    expect(s.buckets.upload.points).toBe(30);
    expect(s.buckets.api.points).toBe(300);
  });

  it('apply overrides, then scale every count but never a window', () => {
    const s = rateLimitSettings({
      ...base,
      ROOST_RATE_LIMIT_SCALE: 2,
      ROOST_RATE_LIMIT_OVERRIDES: JSON.stringify({
        api: { points: 5, durationSeconds: 60 },
        fallback: { points: 3 },
        MACHINE_REMOVE: { user: 1 },
      }),
    });
    expect(s.buckets.api).toEqual({ subject: 'keyOrIp', points: 10, durationSeconds: 60 });
    expect(s.buckets.auth.points).toBe(20);
    expect(s.fallback).toEqual({ points: 6, durationSeconds: 60 });
    expect(s.capabilities.MACHINE_REMOVE).toEqual({ user: 2, system: 50 });
  });

  it('reject overrides that are not JSON, name unknown buckets or give non-positive counts', () => {
    expect(() => parseOverrides('{api:')).toThrow(/ROOST_RATE_LIMIT_OVERRIDES is not JSON/);
    expect(() => parseOverrides('{"apii":{"points":1}}')).toThrow(/ROOST_RATE_LIMIT_OVERRIDES/);
    expect(() => parseOverrides('{"api":{"points":0}}')).toThrow(/ROOST_RATE_LIMIT_OVERRIDES \/api\/points/);
    expect(() => parseOverrides('{"DISTRIBUTION_MANAGE":{"points":3}}')).toThrow(/ROOST_RATE_LIMIT_OVERRIDES/);
    expect(parseOverrides(undefined)).toEqual({});
  });

  it('name the reason a refusal carries', () => {
    expect(wrapperReason('api', 'key:key_1')).toBe('key-rate');
    expect(wrapperReason('api', 'ip:127.0.0.1')).toBe('global-rate');
    expect(wrapperReason('user', 'user:u_1')).toBe('key-rate');
    expect(wrapperReason('auth', 'ip:127.0.0.1')).toBe('endpoint-rate');
    expect(wrapperReason('upload', 'ip:127.0.0.1')).toBe('endpoint-rate');
  });
});

describe('the in-process store', () => {
  it('counts per key in a fixed window and refuses past the limit', async () => {
    const store = CounterStore.memory({ points: 15, durationSeconds: 60 });
    const limit = { points: 3, durationSeconds: 30 };
    const seen = [];
    for (let i = 0; i < 4; i++) seen.push(await store.consume('b:api:key:a', limit));
    expect(seen.map((d) => [d.allowed, d.remaining, d.limit, d.fallback])).toEqual([
      [true, 2, 3, false],
      [true, 1, 3, false],
      [true, 0, 3, false],
      [false, 0, 3, false],
    ]);
    expect(seen[3].resetSeconds).toBeGreaterThanOrEqual(1);
    expect(seen[3].resetSeconds).toBeLessThanOrEqual(30);
    // Another key has its own counter.
    expect((await store.consume('b:api:key:b', limit)).remaining).toBe(2);
    await store.close();
  });
});

describe('a Redis store that cannot be reached', () => {
  it('lets the per-process fallback decide: 15 per minute per identifier', async () => {
    const port = await unusedPort();
    const errors: Error[] = [];
    const store = await CounterStore.redis(
      `redis://127.0.0.1:${port}`,
      { points: 15, durationSeconds: 60 },
      { onError: (e) => errors.push(e), connectTimeoutMs: 500 },
    );
    try {
      expect(store.kind).toBe('redis');
      expect(store.status).not.toBe('ready');
      const limit = { points: 300, durationSeconds: 3600 };
      const decisions = [];
      for (let i = 0; i < 16; i++) decisions.push(await store.consume('b:api:key:k1', limit));
      expect(decisions.every((d) => d.fallback && d.limit === 15)).toBe(true);
      expect(decisions.slice(0, 15).every((d) => d.allowed)).toBe(true);
      expect(decisions[14].remaining).toBe(0);
      expect(decisions[15].allowed).toBe(false);
      expect(decisions[15].resetSeconds).toBeLessThanOrEqual(60);
      // Per identifier: another key still has its 15.
      const other = await store.consume('b:api:key:k2', limit);
      expect([other.allowed, other.remaining, other.fallback]).toEqual([true, 14, true]);
      expect(errors.length).toBeGreaterThan(0);
    } finally {
      await store.close();
    }
  });
});

describe('capability buckets', () => {
  it('count per actor bucket, subject, site and capability with the user or system column', async () => {
    const settings = rateLimitSettings({ ...base, ROOST_RATE_LIMIT_OVERRIDES: JSON.stringify({ MACHINE_REMOVE: { user: 2, system: 3 } }) });
    const limits = new RateLimits(settings, CounterStore.memory(settings.fallback));
    const user = [];
    for (let i = 0; i < 3; i++) user.push(await limits.capability('user', 'key:k', 'site_a', 'MACHINE_REMOVE'));
    expect(user.map((d) => d.allowed)).toEqual([true, true, false]);
    expect(user[2]).toMatchObject({ limit: 2, scope: 'capability:MACHINE_REMOVE', reason: 'endpoint-rate' });
    expect(user[2].resetSeconds).toBeLessThanOrEqual(60);
    // Other site, other capability, system bucket: separate counters.
    expect((await limits.capability('user', 'key:k', 'site_b', 'MACHINE_REMOVE')).allowed).toBe(true);
    expect((await limits.capability('user', 'key:k', 'site_a', 'DISTRIBUTION_MANAGE')).limit).toBe(30);
    const system = await limits.capability('system', 'machine:m', 'site_a', 'MACHINE_REMOVE');
    expect([system.allowed, system.limit, system.remaining]).toEqual([true, 3, 2]);
    await limits.close();
  });
});

describe('headers and the 429 problem', () => {
  const refused = {
    allowed: false,
    limit: 5,
    remaining: 0,
    resetSeconds: 42,
    fallback: false,
    scope: 'bucket:api',
    reason: 'key-rate' as const,
  };

  it('report limit, remaining and reset seconds under both header names', () => {
    expect(rateLimitHeaders({ allowed: true, limit: 300, remaining: 299, resetSeconds: 3600, fallback: false })).toEqual({
      'RateLimit-Limit': '300',
      'RateLimit-Remaining': '299',
      'RateLimit-Reset': '3600',
      'X-RateLimit-Limit': '300',
      'X-RateLimit-Remaining': '299',
      'X-RateLimit-Reset': '3600',
    });
  });

  it('build rate_limited with retryAfter, Retry-After and Roost-Rate-Limited-Reason', () => {
    const err = rateLimitedError(refused);
    expect(err.code).toBe('rate_limited');
    expect(err.status).toBe(429);
    expect(err.extras).toEqual({ retryAfter: 42 });
    expect(err.headers).toMatchObject({
      'Retry-After': '42',
      'Roost-Rate-Limited-Reason': 'key-rate',
      'RateLimit-Remaining': '0',
      'X-RateLimit-Limit': '5',
    });
  });

  it('turn the api bucket into the per-minute hint of whoami', () => {
    expect(rateLimitHint(rateLimitSettings(base), 'standard')).toMatchObject({ tier: 'standard', limitPerMinute: 5 });
    expect(
      rateLimitHint(rateLimitSettings({ ...base, ROOST_RATE_LIMIT_OVERRIDES: '{"api":{"points":120,"durationSeconds":60}}' }), 'pro')
        .limitPerMinute,
    ).toBe(120);
  });

  it('point at the embedded redis-server unless ROOST_REDIS_URL is set', () => {
    expect(redisUrlOf({ ROOST_REDIS_URL: undefined, ROOST_REDIS_PORT: 56379 })).toBe('redis://127.0.0.1:56379');
    expect(redisUrlOf({ ROOST_REDIS_URL: 'rediss://cache.example:6380/2', ROOST_REDIS_PORT: 56379 })).toBe('rediss://cache.example:6380/2');
  });
});
