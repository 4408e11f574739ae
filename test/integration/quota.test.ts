/**
 * Storage quotas over the real services (docs/contract.md "Quota snapshot", Errors quota_exceeded, Events
 * quota.warning / quota.exceeded): `GET /api/sites/{siteId}/quota`, upload reservations counted as
 * pending until publish records the chunks or they expire, 402 on upload-urls and publish past the
 * limit with nothing changed, warnings at 50 % and 80 % once per threshold per billing period, and
 * quota.exceeded at 100 %. The site runs on a 10 MiB tier given by ROOST_QUOTA_TIERS.
 */
import { randomBytes } from 'node:crypto';
import { sha256Hex } from '../../domain/hex';
import type { Scope } from '../../domain/scopes';
import { CHUNK_SIZE, VERSION_MEDIA_TYPE } from '../../domain/version';
import { billingPeriod, DEFAULT_QUOTA_TIERS, parseQuotaTiers, quotaTiers, recordChunks, recountUsage, tierLimit } from '../../db/quota';
import { countChunks, insertChunks } from '../../db/chunks';
import { chunkBlobName } from '../../storage/blob';
import { createHarness, type Harness } from '../support/harness';
import { scopedKey as scopedKeyOf } from '../support/identity';

const MiB = 1024 * 1024;
const LIMIT = 10 * MiB;

let h: Harness;
beforeAll(async () => {
  h = await createHarness({ ROOST_QUOTA_TIERS: JSON.stringify({ tiny: LIMIT }) });
  await h.deps.db.query(`UPDATE sites SET tier = 'tiny' WHERE site_id = $1`, [h.siteId]);
});
afterAll(async () => h?.close());

// ---------------------------------------------------------------------------------------------------
// Fixtures

interface Chunk {
  name: string;
  bytes: Buffer;
  hash: string;
}

function chunk(name: string, size: number): Chunk {
  const bytes = randomBytes(size);
  return { name, bytes, hash: sha256Hex(bytes) };
}

const A = chunk('a.bin', 3 * MiB);
const B = chunk('b.bin', 2.5 * MiB);
const C = chunk('c.bin', 3 * MiB);
const E = chunk('e.bin', 2 * MiB);
const G = chunk('g.bin', 0.5 * MiB);
const H = chunk('h.bin', 1 * MiB);

const scopedKey = (scopes: Scope[]) => scopedKeyOf(h, scopes);

async function snapshot(siteId = h.siteId, key?: string) {
  const res = await h.request({ method: 'GET', url: `/api/sites/${siteId}/quota`, key });
  expect(res.statusCode).toBe(200);
  return res.json() as { siteId: string; tier: string; usedBytes: number; pendingBytes: number; limitBytes: number };
}

function uploadUrls(hashes: string[]) {
  return h.request({ method: 'POST', url: '/api/chunks/upload-urls', body: { siteId: h.siteId, hashes } });
}

/** Puts the chunk's bytes in the site's blob storage (what a client's PUT to the signed URL does). */
async function store(c: Chunk): Promise<void> {
  await h.deps.blob.put('chunks', chunkBlobName(h.siteId, c.hash), c.bytes, 'application/octet-stream');
}

async function reservations(): Promise<Map<string, { bytes: number; expires_at: Date }>> {
  const { rows } = await h.deps.db.query<{ hash: string; bytes: number; expires_at: Date }>(
    'SELECT hash, bytes, expires_at FROM upload_reservations WHERE site_id = $1',
    [h.siteId],
  );
  return new Map(rows.map((r) => [r.hash, r]));
}

async function events(type: 'quota.warning' | 'quota.exceeded'): Promise<Record<string, unknown>[]> {
  const { rows } = await h.deps.db.query<{ data: Record<string, unknown> }>(
    'SELECT data FROM events WHERE site_id = $1 AND type = $2 ORDER BY occurred_at',
    [h.siteId, type],
  );
  return rows.map((r) => r.data);
}

async function held(c: Chunk): Promise<boolean> {
  const { rows } = await h.deps.db.query('SELECT 1 FROM chunks WHERE site_id = $1 AND hash = $2', [h.siteId, c.hash]);
  return rows.length === 1;
}

let roostId = '';

function publish(chunks: Chunk[]) {
  const version = {
    schemaVersion: 2,
    mediaType: VERSION_MEDIA_TYPE,
    config: { producer: 'quota-test' },
    files: chunks.map((c) => ({ path: c.name, size: c.bytes.length, chunks: [{ hash: c.hash, size: c.bytes.length }] })),
  };
  return h.request({ method: 'POST', url: `/api/roosts/${roostId}/versions`, body: { siteId: h.siteId, version }, idempotencyKey: true });
}

async function versionCount(): Promise<number> {
  const { rows } = await h.deps.db.query('SELECT count(*) AS n FROM roost_versions WHERE site_id = $1 AND roost_id = $2', [
    h.siteId,
    roostId,
  ]);
  return Number(rows[0].n);
}

// ---------------------------------------------------------------------------------------------------

describe('tier limits from configuration', () => {
  it('merge ROOST_QUOTA_TIERS over the defaults; a tier without an entry gets the standard limit', () => {
    const tiers = parseQuotaTiers('{"tiny": 1024, "free": 2048}');
    expect(tierLimit(tiers, 'tiny')).toBe(1024);
    expect(tierLimit(tiers, 'free')).toBe(2048);
    expect(tierLimit(tiers, 'standard')).toBe(DEFAULT_QUOTA_TIERS.standard);
    expect(tierLimit(tiers, 'no-such-tier')).toBe(DEFAULT_QUOTA_TIERS.standard);
    expect(parseQuotaTiers(undefined)).toEqual(DEFAULT_QUOTA_TIERS);
    expect(() => parseQuotaTiers('[1]')).toThrow(/ROOST_QUOTA_TIERS/);
    expect(() => parseQuotaTiers('{"tiny": -1}')).toThrow(/ROOST_QUOTA_TIERS.tiny/);
    expect(() => parseQuotaTiers('{"tiny": 1.5}')).toThrow(/ROOST_QUOTA_TIERS.tiny/);
    expect(() => parseQuotaTiers('{tiny')).toThrow(/ROOST_QUOTA_TIERS is not JSON/);
    expect(billingPeriod(new Date('2026-03-31T23:59:59Z'))).toBe('2026-03');
  });
});

describe('GET /api/sites/{siteId}/quota', () => {
  it('returns the snapshot of the site', async () => {
    expect(await snapshot()).toEqual({ siteId: h.siteId, tier: 'tiny', usedBytes: 0, pendingBytes: 0, limitBytes: LIMIT });
  });

  it('gives a site of the default tier the standard limit', async () => {
    const other = await h.other();
    expect(await snapshot(other.siteId, other.apiKey)).toEqual({
      siteId: other.siteId,
      tier: 'standard',
      usedBytes: 0,
      pendingBytes: 0,
      limitBytes: DEFAULT_QUOTA_TIERS.standard,
    });
  });

  it('refuses a malformed site id, another site, a key without site read, and no credential', async () => {
    const bad = await h.request({ method: 'GET', url: '/api/sites/not%20a%20site/quota' });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().code).toBe('validation_failed');

    const other = await h.other();
    const hidden = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/quota`, key: other.apiKey });
    expect(hidden.statusCode).toBe(404);
    expect(hidden.json().code).toBe('not_found');

    const writer = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    const denied = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/quota`, key: writer });
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: h.siteId, permission: 'read' } });

    const reader = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    expect((await snapshot(h.siteId, reader)).siteId).toBe(h.siteId);

    const anonymous = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/quota`, key: null });
    expect(anonymous.statusCode).toBe(401);
  });
});

describe('storage accounting and enforcement', () => {
  beforeAll(async () => {
    const res = await h.request({
      method: 'POST',
      url: '/api/roosts',
      body: { siteId: h.siteId, name: 'quota-app', targets: ['m-1'], extractPath: 'C:\\app' },
    });
    expect(res.statusCode).toBe(201);
    roostId = res.json().roostId;
  });

  it('reserves CHUNK_SIZE per requested hash the site lacks, once, until the upload URLs expire', async () => {
    const before = Date.now();
    const res = await uploadUrls([A.hash, B.hash, A.hash]);
    expect(res.statusCode).toBe(200);
    expect(Object.keys(res.json().urls).sort()).toEqual([A.hash, B.hash].sort());
    expect(await snapshot()).toMatchObject({ usedBytes: 0, pendingBytes: 2 * CHUNK_SIZE });
    const rows = await reservations();
    expect([...rows.keys()].sort()).toEqual([A.hash, B.hash].sort());
    for (const r of rows.values()) {
      expect(r.bytes).toBe(CHUNK_SIZE);
      expect(r.expires_at.getTime()).toBeGreaterThanOrEqual(before + 59 * 60_000);
      expect(r.expires_at.getTime()).toBeLessThanOrEqual(Date.now() + 61 * 60_000);
    }
    // Asking again (a refreshed URL) counts nothing new.
    expect((await uploadUrls([B.hash])).statusCode).toBe(200);
    expect((await snapshot()).pendingBytes).toBe(2 * CHUNK_SIZE);
  });

  it('refuses upload URLs past the limit with 402 quota_exceeded, reserving nothing, and records quota.exceeded once', async () => {
    const res = await uploadUrls([A.hash, C.hash]);
    expect(res.statusCode).toBe(402);
    expect(res.headers['content-type']).toContain('application/problem+json');
    expect(res.json()).toMatchObject({
      code: 'quota_exceeded',
      status: 402,
      quota: { siteId: h.siteId, tier: 'tiny', usedBytes: 0, pendingBytes: 2 * CHUNK_SIZE, limitBytes: LIMIT, requestedBytes: CHUNK_SIZE },
    });
    expect(res.json().urls).toBeUndefined();
    expect([...(await reservations()).keys()].sort()).toEqual([A.hash, B.hash].sort());
    expect((await snapshot()).pendingBytes).toBe(2 * CHUNK_SIZE);

    expect((await uploadUrls([C.hash])).statusCode).toBe(402);
    const exceeded = await events('quota.exceeded');
    expect(exceeded).toHaveLength(1);
    expect(Object.keys(exceeded[0]).sort()).toEqual(['blockedAt', 'limitBytes', 'siteId', 'tier', 'usedBytes']);
    expect(exceeded[0]).toMatchObject({ siteId: h.siteId, tier: 'tiny', usedBytes: 0, limitBytes: LIMIT });
    expect(Number.isNaN(Date.parse(exceeded[0].blockedAt as string))).toBe(false);
  });

  it('stops counting an expired reservation', async () => {
    await h.deps.db.query(`UPDATE upload_reservations SET expires_at = now() - interval '1 minute' WHERE site_id = $1 AND hash = $2`, [
      h.siteId,
      B.hash,
    ]);
    expect((await snapshot()).pendingBytes).toBe(CHUNK_SIZE);
    const res = await uploadUrls([C.hash]);
    expect(res.statusCode).toBe(200);
    expect((await snapshot()).pendingBytes).toBe(2 * CHUNK_SIZE);
    // The expired row was swept.
    expect([...(await reservations()).keys()].sort()).toEqual([A.hash, C.hash].sort());
  });

  it('records chunks at publish, finalising their reservations, and warns once at 50 %', async () => {
    await store(A);
    await store(B);
    const res = await publish([A, B]);
    expect(res.statusCode).toBe(201);
    const used = A.bytes.length + B.bytes.length;
    expect(await snapshot()).toMatchObject({ usedBytes: used, pendingBytes: CHUNK_SIZE });
    expect([...(await reservations()).keys()]).toEqual([C.hash]);
    const warnings = await events('quota.warning');
    expect(warnings).toEqual([{ siteId: h.siteId, tier: 'tiny', threshold: 0.5, usedBytes: used, limitBytes: LIMIT }]);
  });

  it('reserves nothing for a hash the site already holds', async () => {
    const res = await uploadUrls([A.hash]);
    expect(res.statusCode).toBe(200);
    expect(Object.keys(res.json().urls)).toEqual([A.hash]);
    expect((await snapshot()).pendingBytes).toBe(CHUNK_SIZE);
    expect((await reservations()).has(A.hash)).toBe(false);
  });

  it('warns at 80 % once, without repeating the 50 % warning', async () => {
    await store(C);
    expect((await publish([A, B, C])).statusCode).toBe(201);
    const used = A.bytes.length + B.bytes.length + C.bytes.length;
    expect(await snapshot()).toMatchObject({ usedBytes: used, pendingBytes: 0 });
    const warnings = await events('quota.warning');
    expect(warnings.map((w) => w.threshold)).toEqual([0.5, 0.8]);
    expect(warnings[1]).toEqual({ siteId: h.siteId, tier: 'tiny', threshold: 0.8, usedBytes: used, limitBytes: LIMIT });
  });

  it('refuses a publish past the limit with 402 quota_exceeded and changes nothing', async () => {
    await store(E);
    const versions = await versionCount();
    const current = (
      await h.deps.db.query('SELECT current_version_id FROM roosts WHERE site_id = $1 AND roost_id = $2', [h.siteId, roostId])
    ).rows[0].current_version_id;
    const before = await snapshot();
    const res = await publish([A, B, C, E]);
    expect(res.statusCode).toBe(402);
    expect(res.json()).toMatchObject({
      code: 'quota_exceeded',
      quota: { usedBytes: before.usedBytes, pendingBytes: 0, limitBytes: LIMIT, requestedBytes: E.bytes.length },
    });
    expect(await held(E)).toBe(false);
    expect(await versionCount()).toBe(versions);
    expect(
      (await h.deps.db.query('SELECT current_version_id FROM roosts WHERE site_id = $1 AND roost_id = $2', [h.siteId, roostId])).rows[0]
        .current_version_id,
    ).toBe(current);
    expect(await snapshot()).toEqual(before);
    // quota.exceeded already fired in this billing period.
    expect(await events('quota.exceeded')).toHaveLength(1);
  });

  it('fires each threshold again in a new billing period, and quota.exceeded when a write reaches 100 %', async () => {
    // The thresholds fired so far belong to an earlier period now.
    await h.deps.db.query(`UPDATE quota_thresholds SET period = '2000-01' WHERE site_id = $1`, [h.siteId]);
    await store(G);
    expect((await publish([A, B, C, G])).statusCode).toBe(201);
    const used = A.bytes.length + B.bytes.length + C.bytes.length + G.bytes.length;
    expect((await events('quota.warning')).slice(2)).toEqual([
      { siteId: h.siteId, tier: 'tiny', threshold: 0.5, usedBytes: used, limitBytes: LIMIT },
      { siteId: h.siteId, tier: 'tiny', threshold: 0.8, usedBytes: used, limitBytes: LIMIT },
    ]);
    expect(await events('quota.exceeded')).toHaveLength(1);

    // Exactly the limit is allowed, and it is 100 %.
    await store(H);
    expect((await publish([A, B, C, G, H])).statusCode).toBe(201);
    expect(await snapshot()).toMatchObject({ usedBytes: LIMIT, pendingBytes: 0 });
    const exceeded = await events('quota.exceeded');
    expect(exceeded).toHaveLength(2);
    expect(exceeded[1]).toMatchObject({ siteId: h.siteId, tier: 'tiny', usedBytes: LIMIT, limitBytes: LIMIT });
    const { rows } = await h.deps.db.query<{ period: string; percent: number }>(
      'SELECT period, percent FROM quota_thresholds WHERE site_id = $1 AND period = $2 ORDER BY percent',
      [h.siteId, billingPeriod()],
    );
    expect(rows.map((r) => r.percent)).toEqual([50, 80, 100]);

    // Every write that adds bytes is now refused; no second quota.exceeded in the period.
    expect((await uploadUrls([E.hash])).statusCode).toBe(402);
    expect(await events('quota.exceeded')).toHaveLength(2);
    // A publish that adds no bytes (a version of chunks the site holds) still goes through.
    expect((await publish([A, H])).statusCode).toBe(201);
  });
});

describe('used bytes are kept, not summed (site_usage, db/quota.ts withUsage)', () => {
  const rowsSum = async (siteId: string): Promise<number> => {
    const { rows } = await h.deps.db.query<{ n: string }>('SELECT COALESCE(SUM(size), 0) AS n FROM chunks WHERE site_id = $1', [siteId]);
    return Number(rows[0].n);
  };

  it('match the sum of the rows after recordings, repeats, concurrent recordings and a plain insert; a recount agrees', async () => {
    const other = await h.other();
    const tiers = quotaTiers(h.deps.cfg);
    const ref = (size: number) => ({ hash: sha256Hex(randomBytes(16)), size });
    const first = [ref(100), ref(200)];
    expect(await recordChunks(h.deps.db, other.siteId, first, tiers)).toBe(300);
    // Recording the same chunks again adds nothing.
    expect(await recordChunks(h.deps.db, other.siteId, [...first, ref(50)], tiers)).toBe(50);
    // Twenty recordings at once, one chunk each plus a shared one: the serializable transactions retry,
    // the count ends exact.
    const shared = ref(7);
    await Promise.all(Array.from({ length: 20 }, (_, i) => recordChunks(h.deps.db, other.siteId, [ref(1000 + i), shared], tiers)));
    await insertChunks(h.deps.db, other.siteId, [ref(11), first[0]]);
    const sum = await rowsSum(other.siteId);
    expect(sum).toBe(300 + 50 + 7 + 20 * 1000 + 190 + 11);
    expect((await snapshot(other.siteId, other.apiKey)).usedBytes).toBe(sum);
    // A row written behind the count's back shows only after a recount.
    await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, 5)', [other.siteId, sha256Hex(randomBytes(8))]);
    expect((await snapshot(other.siteId, other.apiKey)).usedBytes).toBe(sum);
    const kept = await countChunks(h.deps.db, other.siteId);
    expect(await recountUsage(h.deps.db, other.siteId)).toBe(sum + 5);
    expect((await snapshot(other.siteId, other.apiKey)).usedBytes).toBe(sum + 5);
    // The kept chunk count (services/chunks.ts listingIsCheaper reads it) followed every recording too.
    const { rows } = await h.deps.db.query<{ n: string }>('SELECT count(*) AS n FROM chunks WHERE site_id = $1', [other.siteId]);
    expect([kept, await countChunks(h.deps.db, other.siteId)]).toEqual([Number(rows[0].n) - 1, Number(rows[0].n)]);
  });
});
