/**
 * Rate limits over the real services (docs/contract.md Limits, Errors rate_limited): the shared store in a real
 * redis-server this test starts on a free port, the `RateLimit-*` and `X-RateLimit-*` headers, the 429
 * problem with `retryAfter`, `Retry-After` and `Roost-Rate-Limited-Reason`, the counters shared by two
 * API processes, a capability bucket on rollback, and, with Redis really stopped, the per-process
 * fallback of 15 requests per minute per identifier.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import type { LightMyRequestResponse } from 'fastify';
import { buildApp } from '../../api/app';
import { sha256Hex } from '../../domain/hex';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { freePort, type ServiceHandle, startRedisServer } from '../../stack/services';
import { testConfig } from '../support/env';
import { createHarness, type Harness } from '../support/harness';
import { scopedKey } from '../support/identity';
import { testLogger } from '../support/test-log';

/** A key of the harness user with `scopes` (inserted the way db/bootstrap.ts does). */

function limitHeaders(res: LightMyRequestResponse) {
  const pick = (name: string) => res.headers[name.toLowerCase()];
  return {
    limit: pick('RateLimit-Limit'),
    remaining: pick('RateLimit-Remaining'),
    reset: pick('RateLimit-Reset'),
    xLimit: pick('X-RateLimit-Limit'),
    xRemaining: pick('X-RateLimit-Remaining'),
    xReset: pick('X-RateLimit-Reset'),
  };
}

function expectRateLimited(res: LightMyRequestResponse, reason: string, maxRetryAfter: number): void {
  expect(res.statusCode).toBe(429);
  expect(res.headers['content-type']).toContain('application/problem+json');
  const body = res.json();
  expect(body).toMatchObject({ code: 'rate_limited', status: 429 });
  expect(Number.isInteger(body.retryAfter)).toBe(true);
  expect(body.retryAfter).toBeGreaterThanOrEqual(1);
  expect(body.retryAfter).toBeLessThanOrEqual(maxRetryAfter);
  expect(res.headers['retry-after']).toBe(String(body.retryAfter));
  expect(res.headers['roost-rate-limited-reason']).toBe(reason);
  expect(res.headers['ratelimit-remaining']).toBe('0');
  expect(res.headers['x-ratelimit-remaining']).toBe('0');
}

describe('with the shared store in Redis', () => {
  let redis: ServiceHandle;
  let redisDir: string;
  let h: Harness;
  const overrides = { api: { points: 5, durationSeconds: 3600 } };

  beforeAll(async () => {
    const port = await freePort();
    redisDir = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-redis-'));
    // Its files and log live in a temporary folder removed afterwards.
    redis = await startRedisServer(port, redisDir, { ...testConfig(), ROOST_DATA_DIR: redisDir });
    h = await createHarness({
      ROOST_RATE_LIMIT_STORE: 'redis',
      ROOST_REDIS_URL: `redis://127.0.0.1:${port}`,
      ROOST_RATE_LIMIT_SCALE: '1',
      ROOST_RATE_LIMIT_OVERRIDES: JSON.stringify(overrides),
    });
    expect(h.app.rateLimits.store.kind).toBe('redis');
    expect(h.app.rateLimits.store.status).toBe('ready');
  });

  afterAll(async () => {
    await h?.close();
    await redis?.stop();
    if (redisDir) fs.rmSync(redisDir, { recursive: true, force: true });
  });

  it('reports the api bucket of the key in RateLimit-* and X-RateLimit-* headers', async () => {
    const res = await h.request({ method: 'GET', url: '/api/whoami' });
    expect(res.statusCode).toBe(200);
    const hd = limitHeaders(res);
    expect([hd.limit, hd.remaining]).toEqual(['5', '4']);
    expect(Number(hd.reset)).toBeGreaterThan(0);
    expect(Number(hd.reset)).toBeLessThanOrEqual(3600);
    expect([hd.xLimit, hd.xRemaining, hd.xReset]).toEqual([hd.limit, hd.remaining, hd.reset]);
  });

  it('shares the counters between API processes', async () => {
    const second = await buildApp(h.deps, { loggerInstance: testLogger('roost-api') });
    await second.ready();
    try {
      const res = await second.inject({ method: 'GET', url: '/api/whoami', headers: { authorization: `Bearer ${h.apiKey}` } });
      expect(res.statusCode).toBe(200);
      expect(res.headers['ratelimit-remaining']).toBe('3');
    } finally {
      await second.close();
    }
  });

  it('refuses the key past its limit with 429 rate_limited, and counts other keys apart', async () => {
    for (const remaining of ['2', '1', '0']) {
      const ok = await h.request({ method: 'GET', url: '/api/whoami' });
      expect(ok.statusCode).toBe(200);
      expect(ok.headers['ratelimit-remaining']).toBe(remaining);
    }
    const refused = await h.request({ method: 'GET', url: '/api/whoami' });
    expectRateLimited(refused, 'key-rate', 3600);
    expect(refused.headers['ratelimit-limit']).toBe('5');
    // Another key of the same user has a bucket of its own.
    const other = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const fresh = await h.request({ method: 'GET', url: '/api/whoami', key: other });
    expect(fresh.statusCode).toBe(200);
    expect(fresh.headers['ratelimit-remaining']).toBe('4');
  });

  it('counts in the api bucket neither unauthenticated routes, refused credentials nor unknown URLs', async () => {
    const remaining = async () => (await h.request({ method: 'GET', url: '/api/whoami', key: other })).headers['ratelimit-remaining'];
    const other = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    expect(await remaining()).toBe('4');
    const version = await h.request({ method: 'GET', url: '/api/version', key: null });
    expect(version.statusCode).toBe(200);
    expect(version.headers['ratelimit-limit']).toBeUndefined();
    // A refused credential spends the auth bucket of its address (10 a minute), whose headers it carries.
    const anonymous = await h.request({ method: 'GET', url: '/api/whoami', key: null });
    expect(anonymous.statusCode).toBe(401);
    expect(anonymous.headers['ratelimit-limit']).toBe('10');
    // An unknown URL is 404 before the limiter: no headers, nothing counted.
    for (const url of ['/api/nonexistent', '/api/does/not/exist']) {
      const missing = await h.request({ method: 'GET', url, key: other });
      expect([missing.statusCode, missing.headers['ratelimit-limit']]).toEqual([404, undefined]);
    }
    expect(await remaining()).toBe('3');
  });

  it('falls back to 15 requests per minute per identifier in this process when Redis is stopped', async () => {
    await redis.stop();
    const key = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const statuses: number[] = [];
    const limits = new Set<unknown>();
    for (let i = 0; i < 15; i++) {
      const res = await h.request({ method: 'GET', url: '/api/whoami', key });
      statuses.push(res.statusCode);
      limits.add(res.headers['ratelimit-limit']);
      expect(res.headers['ratelimit-remaining']).toBe(String(14 - i));
    }
    expect(statuses).toEqual(Array(15).fill(200));
    expect([...limits]).toEqual(['15']);
    const refused = await h.request({ method: 'GET', url: '/api/whoami', key });
    expectRateLimited(refused, 'global-rate', 60);
    expect(refused.headers['ratelimit-limit']).toBe('15');
    // The fallback counts per identifier: the first key (refused by Redis before) starts afresh.
    const first = await h.request({ method: 'GET', url: '/api/whoami' });
    expect(first.statusCode).toBe(200);
    expect(first.headers['ratelimit-remaining']).toBe('14');
    expect(h.app.rateLimits.store.status).not.toBe('ready');
  });
});

describe('capability buckets', () => {
  let h: Harness;

  beforeAll(async () => {
    h = await createHarness({
      ROOST_RATE_LIMIT_SCALE: '1',
      ROOST_RATE_LIMIT_OVERRIDES: JSON.stringify({ api: { points: 1000, durationSeconds: 3600 }, DISTRIBUTION_MANAGE: { user: 2 } }),
    });
    expect(h.app.rateLimits.store.kind).toBe('memory');
  });
  afterAll(async () => h?.close());

  async function roostWithTwoVersions(): Promise<{ roostId: string; v1: string; v2: string }> {
    const created = await h.request({
      method: 'POST',
      url: '/api/roosts',
      body: { siteId: h.siteId, name: 'rl-app', targets: ['m-1'], extractPath: 'C:\\app' },
    });
    expect(created.statusCode).toBe(201);
    const roostId = created.json().roostId as string;
    const ids: string[] = [];
    for (const text of ['one', 'two']) {
      const content = Buffer.from(`${text} ${randomBytes(4).toString('hex')}`);
      const hash = sha256Hex(content);
      await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING', [
        h.siteId,
        hash,
        content.length,
      ]);
      const version = {
        schemaVersion: 2,
        mediaType: VERSION_MEDIA_TYPE,
        config: { producer: 'rate-limit-test' },
        files: [{ path: 'a.txt', size: content.length, chunks: [{ hash, size: content.length }] }],
      };
      const res = await h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/versions`,
        body: { siteId: h.siteId, version },
        idempotencyKey: true,
      });
      expect(res.statusCode).toBe(201);
      ids.push(res.json().versionId);
    }
    return { roostId, v1: ids[0], v2: ids[1] };
  }

  async function current(roostId: string): Promise<string | null> {
    const { rows } = await h.deps.db.query<{ current_version_id: string | null }>(
      'SELECT current_version_id FROM roosts WHERE site_id = $1 AND roost_id = $2',
      [h.siteId, roostId],
    );
    return rows[0].current_version_id;
  }

  it('limits rollbacks per key and site (DISTRIBUTION_MANAGE) and a refused rollback changes nothing', async () => {
    const { roostId, v1, v2 } = await roostWithTwoVersions();
    const rollback = () =>
      h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/rollback`,
        body: { siteId: h.siteId, targetVersion: 'previous' },
        idempotencyKey: true,
      });
    const first = await rollback();
    expect(first.statusCode).toBe(200);
    expect(first.headers['ratelimit-limit']).toBe('2');
    expect(first.headers['ratelimit-remaining']).toBe('1');
    expect(Number(first.headers['ratelimit-reset'])).toBeLessThanOrEqual(60);
    expect(await current(roostId)).toBe(v1);
    expect((await rollback()).statusCode).toBe(200);
    expect(await current(roostId)).toBe(v2);
    const events = async () =>
      Number(
        (
          await h.deps.db.query(
            `SELECT count(*) AS n FROM events WHERE site_id = $1 AND type = 'version.rolled_back' AND data->>'roostId' = $2`,
            [h.siteId, roostId],
          )
        ).rows[0].n,
      );
    const before = await events();

    const refused = await rollback();
    expectRateLimited(refused, 'endpoint-rate', 60);
    expect(refused.headers['ratelimit-limit']).toBe('2');
    expect(await current(roostId)).toBe(v2);
    expect(await events()).toBe(before);

    // Another key of the same user counts in its own bucket.
    const operator = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['rollback'] }]);
    const res = await h.request({
      method: 'POST',
      url: `/api/roosts/${roostId}/rollback`,
      body: { siteId: h.siteId, targetVersion: 'previous' },
      key: operator,
      idempotencyKey: true,
    });
    expect(res.statusCode).toBe(200);
    expect(await current(roostId)).toBe(v1);
  });

  it('counts only authorised requests: another site stays 404 and a missing scope 403 past the limit', async () => {
    const { roostId } = await roostWithTwoVersions();
    const other = await h.other();
    // Three tries each against a limit of 2: were they counted before authorisation, the third would be 429.
    for (let i = 0; i < 3; i++) {
      const hidden = await h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/rollback`,
        body: { siteId: h.siteId, targetVersion: 'previous' },
        key: other.apiKey,
        idempotencyKey: true,
      });
      expect(hidden.statusCode).toBe(404);
      expect(hidden.json().code).toBe('not_found');
    }
    const reader = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    for (let i = 0; i < 3; i++) {
      const res = await h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/rollback`,
        body: { siteId: h.siteId, targetVersion: 'previous' },
        key: reader,
        idempotencyKey: true,
      });
      expect(res.statusCode).toBe(403);
      expect(res.json()).toMatchObject({
        code: 'scope_insufficient',
        required: { resource: 'roost', id: roostId, permission: 'rollback' },
      });
    }
  });
});

describe('failed authentications spend the auth bucket of their address', () => {
  let h: Harness;

  beforeAll(async () => {
    // The production numbers: auth is 10 a minute per IP.
    h = await createHarness({ ROOST_RATE_LIMIT_SCALE: '1' });
  });
  afterAll(async () => h?.close());

  test('the 11th failure in a minute is 429 with the limit headers; other addresses and valid keys are unaffected', async () => {
    const bad = (remoteAddress: string) =>
      h.app.inject({ method: 'GET', url: '/api/whoami', remoteAddress, headers: { authorization: `Bearer svk_live_${'x'.repeat(43)}` } });
    // Each counted 401 carries the auth bucket's RateLimit-* headers, counting down.
    for (let i = 0; i < 10; i++) {
      const refused = await bad('192.0.2.10');
      expect([refused.statusCode, refused.headers['ratelimit-limit'], refused.headers['ratelimit-remaining']]).toEqual([
        401,
        '10',
        String(9 - i),
      ]);
      expect(refused.headers['x-ratelimit-remaining']).toBe(String(9 - i));
    }
    const limited = await bad('192.0.2.10');
    expect([limited.statusCode, limited.json().code]).toEqual([429, 'rate_limited']);
    // The contract's 429: body retryAfter, Retry-After and Roost-Rate-Limited-Reason, and the RateLimit-* headers of the auth bucket.
    expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
    expect(limited.json().retryAfter).toBe(Number(limited.headers['retry-after']));
    expect(['global-rate', 'endpoint-rate', 'key-rate', 'site-concurrency']).toContain(limited.headers['roost-rate-limited-reason']);
    expect([limited.headers['ratelimit-limit'], limited.headers['ratelimit-remaining']]).toEqual(['10', '0']);
    expect(limited.headers['x-ratelimit-limit']).toBe('10');
    expect((await h.app.inject({ method: 'GET', url: '/api/whoami', remoteAddress: '192.0.2.10' })).statusCode).toBe(429);
    expect((await bad('192.0.2.11')).statusCode).toBe(401);
    const ok = await h.app.inject({
      method: 'GET',
      url: '/api/whoami',
      remoteAddress: '192.0.2.10',
      headers: { authorization: `Bearer ${h.apiKey}` },
    });
    expect(ok.statusCode).toBe(200);
  });

  test("whoami's rateLimit hint describes the bucket its own RateLimit-* headers report", async () => {
    const res = await h.app.inject({
      method: 'GET',
      url: '/api/whoami',
      remoteAddress: '192.0.2.12',
      headers: { authorization: `Bearer ${h.apiKey}` },
    });
    expect(res.statusCode).toBe(200);
    const limit = Number(res.headers['ratelimit-limit']);
    const window = Number(res.headers['ratelimit-reset']);
    expect(limit).toBe(300); // production: 300 requests per hour per API key
    expect(window).toBeGreaterThan(60);
    const hint = res.json().rateLimit;
    expect(hint.limitPerMinute).toBe(Math.max(1, Math.round((limit * 60) / 3600)));
    expect(hint.note).toContain(`${limit} requests per 3600 s per API key`);
  });
});
