/**
 * Chunk routes against the real services (docs/contract.md "Chunks"): existence check, signed upload and download
 * URLs with real bytes through Azurite, cross-roost mount, referrers, and tenant isolation.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { newId, randomToken, sha256Hex } from '../../domain/hex';
import { mountEntryId, versionEntryId } from '../../db/chunks';
import type { Scope } from '../../domain/scopes';
import { addMember, insertKey, makeUser, scopedKey as scopedKeyOf } from '../support/identity';
import { generateApiKey } from '../../domain/keys';

let h: Harness;
let b: { siteId: string; userId: string; apiKey: string };

beforeAll(async () => {
  h = await createHarness();
  b = await h.other();
});
afterAll(async () => h.close());

// ------------------------------------------------------------------------------------------- helpers

function chunk(size = 1024): { bytes: Buffer; hash: string } {
  const bytes = randomBytes(size);
  return { bytes, hash: sha256Hex(bytes) };
}
const fakeHash = () => sha256Hex(randomBytes(16));

/** Records a chunk as held by a site (publish does this in production after checking the stored size). */
async function hold(siteId: string, hash: string, size = 1024): Promise<void> {
  await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING', [siteId, hash, size]);
}

/** A live key of the main user limited to `scopes` (inserted the way db/bootstrap.ts does). */
const scopedKey = (scopes: Scope[]) => scopedKeyOf(h, scopes);

/** An enrolled machine of `siteId`; returns its raw `sat_` agent token. */
async function agentToken(siteId: string): Promise<string> {
  const raw = `sat_${randomToken(32)}`;
  await h.deps.db.query('INSERT INTO machines (site_id, machine_id, hostname, agent_token_hash) VALUES ($1, $2, $3, $4)', [
    siteId,
    newId('mch'),
    'test-host',
    sha256Hex(raw),
  ]);
  return raw;
}

async function roost(siteId: string, roostId = newId('rst'), deleted = false): Promise<string> {
  await h.deps.db.query(`INSERT INTO roosts (site_id, roost_id, name, created_by, deleted_at) VALUES ($1, $2, $3, $4, $5)`, [
    siteId,
    roostId,
    `roost ${roostId}`,
    h.userId,
    deleted ? new Date() : null,
  ]);
  return roostId;
}

/** A published version row referencing `hashes` (publish writes these in production). */
async function version(siteId: string, roostId: string, n: number, hashes: string[], fileCount: number | null = null): Promise<string> {
  const versionId = sha256Hex(randomBytes(16));
  await h.deps.db.query(
    `INSERT INTO roost_versions (site_id, roost_id, version_id, version_number, blob_name, total_size, total_files, created_by)
     VALUES ($1, $2, $3, $4, 'x', $5, 3, $6)`,
    [siteId, roostId, versionId, n, 1000 * n, h.userId],
  );
  for (const hash of hashes) {
    await h.deps.db.query(
      'INSERT INTO version_chunks (site_id, hash, roost_id, version_id, size, file_count) VALUES ($1, $2, $3, $4, 1024, $5)',
      [siteId, hash, roostId, versionId, fileCount],
    );
  }
  return versionId;
}

async function putBlob(url: string, bytes: Buffer): Promise<Response> {
  return fetch(url, {
    method: 'PUT',
    body: bytes,
    headers: { 'x-ms-blob-type': 'BlockBlob', 'Content-Type': 'application/octet-stream' },
  });
}

function expectProblem(res: { statusCode: number; headers: Record<string, unknown>; json: () => any }, status: number, code: string) {
  expect(res.statusCode).toBe(status);
  expect(String(res.headers['content-type'])).toMatch(/application\/problem\+json/);
  const body = res.json();
  expect(body.code).toBe(code);
  expect(body.status).toBe(status);
  expect(body.requestId).toBe(res.headers['x-request-id']);
  return body;
}

const post = (url: string, body: unknown, key?: string | null) => h.request({ method: 'POST', url, body, key });

// ------------------------------------------------------------------------------------------- check

describe('POST /api/chunks/check', () => {
  it('lists the digests the site lacks, in request order, duplicates collapsed', async () => {
    const [a, c, d] = [fakeHash(), fakeHash(), fakeHash()];
    await hold(h.siteId, c);
    const res = await post('/api/chunks/check', { siteId: h.siteId, hashes: [d, a, c, d, a] });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ missing: [d, a] });
  });

  it('returns an empty list when everything is held', async () => {
    const a = fakeHash();
    await hold(h.siteId, a);
    const res = await post('/api/chunks/check', { siteId: h.siteId, hashes: [a, a] });
    expect(res.json()).toEqual({ missing: [] });
  });

  it('accepts 1000 hashes and rejects 1001', async () => {
    const many = Array.from({ length: 1001 }, fakeHash);
    const ok = await post('/api/chunks/check', { siteId: h.siteId, hashes: many.slice(0, 1000) });
    expect(ok.statusCode).toBe(200);
    expect(ok.json().missing).toEqual(many.slice(0, 1000));
    const body = expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes: many }), 400, 'validation_failed');
    expect(Object.keys(body.errors)).toContain('hashes');
  });

  it('rejects an empty list, a missing list and malformed hashes with their index', async () => {
    expect(
      expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes: [] }), 400, 'validation_failed').errors,
    ).toHaveProperty('hashes');
    expect(expectProblem(await post('/api/chunks/check', { siteId: h.siteId }), 400, 'validation_failed').errors).toHaveProperty('hashes');
    const good = fakeHash();
    for (const bad of [good.toUpperCase(), `sha256:${good}`, good.slice(1), 42]) {
      const body = expectProblem(
        await post('/api/chunks/check', { siteId: h.siteId, hashes: [good, good, bad] }),
        400,
        'validation_failed',
      );
      expect(Object.keys(body.errors)).toEqual(['hashes.2']);
    }
  });

  it('rejects a missing or malformed siteId', async () => {
    const hashes = [fakeHash()];
    expect(expectProblem(await post('/api/chunks/check', { hashes }), 400, 'validation_failed').errors).toHaveProperty('siteId');
    expect(
      expectProblem(await post('/api/chunks/check', { siteId: 'no such/site', hashes }), 400, 'validation_failed').errors,
    ).toHaveProperty('siteId');
  });

  it('hides unknown and foreign sites (404) and needs a credential (401)', async () => {
    const hashes = [fakeHash()];
    expectProblem(await post('/api/chunks/check', { siteId: 'site_doesnotexist', hashes }), 404, 'not_found');
    expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes }, b.apiKey), 404, 'not_found');
    expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes }, null), 401, 'unauthorized');
    expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes }, await agentToken(h.siteId)), 401, 'unauthorized');
  });

  it('needs site write exactly: read does not suffice', async () => {
    const key = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const body = expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes: [fakeHash()] }, key), 403, 'scope_insufficient');
    expect(body.required).toEqual({ resource: 'site', id: h.siteId, permission: 'write' });
    const writer = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    expect((await post('/api/chunks/check', { siteId: h.siteId, hashes: [fakeHash()] }, writer)).statusCode).toBe(200);
  });

  it("never reports another site's chunks as held", async () => {
    const onlyA = fakeHash();
    await hold(h.siteId, onlyA);
    const res = await post('/api/chunks/check', { siteId: b.siteId, hashes: [onlyA] }, b.apiKey);
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ missing: [onlyA] });
  });
});

describe('POST /api/chunks/check: credentials and the body', () => {
  it('keeps the order of errors: malformed JSON is 400 whatever the credential, a bad or non-Bearer credential 401 before the schema', async () => {
    const unknown = generateApiKey('live');
    const bad = await h.app.inject({
      method: 'POST',
      url: '/api/chunks/check',
      headers: { authorization: `Bearer ${unknown}`, 'content-type': 'application/json' },
      payload: '{"siteId": ',
    });
    expectProblem(bad, 400, 'validation_failed');
    expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes: ['nope'] }, unknown), 401, 'unauthorized');
    const basic = await h.app.inject({
      method: 'POST',
      url: '/api/chunks/check',
      headers: { authorization: 'Basic dXNlcjpwYXNz' },
      payload: { siteId: h.siteId, hashes: ['nope'] },
    });
    expectProblem(basic, 401, 'unauthorized');
  });

  it('applies the site rules read with the key: 404 until a member, 403 for a key of the other environment', async () => {
    const stranger = await makeUser(h.deps.db);
    const outsider = await insertKey(h.deps.db, { uid: stranger.uid, scopes: [{ resource: 'site', id: '*', permissions: ['write'] }] });
    expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes: [fakeHash()] }, outsider.raw), 404, 'not_found');
    const testKey = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: '*', permissions: ['write'] }],
      environment: 'test',
    });
    expectProblem(await post('/api/chunks/check', { siteId: h.siteId, hashes: [fakeHash()] }, testKey.raw), 403, 'forbidden');
    await addMember(h.deps.db, h.siteId, stranger.uid);
    expect((await post('/api/chunks/check', { siteId: h.siteId, hashes: [fakeHash()] }, outsider.raw)).statusCode).toBe(200);
  });
});

// ------------------------------------------------------------------------------------------- upload and download

describe('signed upload and download URLs', () => {
  it('uploads real bytes, reads them back and the digests match', async () => {
    const parts = [chunk(4096), chunk(1), chunk(70_000)];
    const before = Date.now();
    const up = await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: [...parts.map((p) => p.hash), parts[0].hash] });
    expect(up.statusCode).toBe(200);
    const { urls, expiresAt } = up.json();
    expect(Object.keys(urls).sort()).toEqual(parts.map((p) => p.hash).sort());
    expect(expiresAt).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/);
    const ttl = Date.parse(expiresAt) - before;
    expect(ttl).toBeGreaterThan(59 * 60 * 1000);
    expect(ttl).toBeLessThanOrEqual(61 * 60 * 1000);
    for (const p of parts) {
      expect(urls[p.hash]).toContain(`/${h.deps.blob.containerName('chunks')}/sites/${h.siteId}/chunks/${p.hash}?`);
      const put = await putBlob(urls[p.hash], p.bytes);
      expect(put.status).toBe(201);
      await hold(h.siteId, p.hash, p.bytes.length);
    }

    const down = await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: parts.map((p) => p.hash) });
    expect(down.statusCode).toBe(200);
    const d = down.json();
    expect(d.missing).toEqual([]);
    const dttl = Date.parse(d.expiresAt) - before;
    expect(dttl).toBeGreaterThan(14 * 60 * 1000);
    expect(dttl).toBeLessThanOrEqual(16 * 60 * 1000);
    for (const p of parts) {
      const get = await fetch(d.urls[p.hash]);
      expect(get.status).toBe(200);
      const bytes = Buffer.from(await get.arrayBuffer());
      expect(createHash('sha256').update(bytes).digest('hex')).toBe(p.hash);
    }
  });

  it('enforces least privilege: an upload URL cannot read, a download URL cannot write, a URL serves one blob', async () => {
    const a = chunk(2048);
    const other = chunk(2048);
    const up = (await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: [a.hash] })).json();
    expect((await putBlob(up.urls[a.hash], a.bytes)).status).toBe(201);
    await hold(h.siteId, a.hash, a.bytes.length);

    expect((await fetch(up.urls[a.hash])).status).toBe(403);

    // The signature covers the blob name: the URL for A does not open B.
    const forged = up.urls[a.hash].replace(a.hash, other.hash);
    expect(forged).not.toBe(up.urls[a.hash]);
    expect((await putBlob(forged, other.bytes)).status).toBe(403);

    const down = (await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [a.hash] })).json();
    expect((await putBlob(down.urls[a.hash], other.bytes)).status).toBe(403);
    const stillA = Buffer.from(await (await fetch(down.urls[a.hash])).arrayBuffer());
    expect(sha256Hex(stillA)).toBe(a.hash);
    expect((await fetch(down.urls[a.hash].replace(a.hash, other.hash))).status).toBe(403);
  });

  it('upload-urls ignores Idempotency-Key (no replay) and validates like check', async () => {
    const key = idemKey();
    const first = await h.request({
      method: 'POST',
      url: '/api/chunks/upload-urls',
      body: { siteId: h.siteId, hashes: [fakeHash()] },
      idempotencyKey: key,
    });
    const second = await h.request({
      method: 'POST',
      url: '/api/chunks/upload-urls',
      body: { siteId: h.siteId, hashes: [fakeHash()] },
      idempotencyKey: key,
    });
    expect(first.statusCode).toBe(200);
    expect(second.statusCode).toBe(200);
    expect(second.headers['idempotent-replayed']).toBeUndefined();
    expect(Object.keys(second.json().urls)).not.toEqual(Object.keys(first.json().urls));

    expectProblem(
      await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: Array.from({ length: 1001 }, fakeHash) }),
      400,
      'validation_failed',
    );
    expectProblem(await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: [] }), 400, 'validation_failed');
    expect(
      expectProblem(await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: ['xyz'] }), 400, 'validation_failed').errors,
    ).toHaveProperty(['hashes.0']);
    expectProblem(await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: [fakeHash()] }, b.apiKey), 404, 'not_found');
    const reader = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    expect(
      expectProblem(await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: [fakeHash()] }, reader), 403, 'scope_insufficient')
        .required,
    ).toEqual({
      resource: 'site',
      id: h.siteId,
      permission: 'write',
    });
  });

  it('download-urls leaves out hashes the site does not hold and lists them in missing', async () => {
    const held = fakeHash();
    const absent = fakeHash();
    await hold(h.siteId, held);
    const res = await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [absent, held, absent] });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(Object.keys(body.urls)).toEqual([held]);
    expect(body.missing).toEqual([absent]);
  });

  it('GET download-urls takes siteId and repeated hash', async () => {
    const [x, y] = [fakeHash(), fakeHash()];
    await hold(h.siteId, x);
    await hold(h.siteId, y);
    const res = await h.request({ method: 'GET', url: `/api/chunks/download-urls?siteId=${h.siteId}&hash=${x}&hash=${y}` });
    expect(res.statusCode).toBe(200);
    expect(Object.keys(res.json().urls).sort()).toEqual([x, y].sort());
    const one = await h.request({ method: 'GET', url: `/api/chunks/download-urls?siteId=${h.siteId}&hash=${x}` });
    expect(Object.keys(one.json().urls)).toEqual([x]);
    expect(
      expectProblem(
        await h.request({ method: 'GET', url: `/api/chunks/download-urls?siteId=${h.siteId}&hash=${x}&hash=nope` }),
        400,
        'validation_failed',
      ).errors,
    ).toHaveProperty(['querystring.hash.1']);
    expectProblem(await h.request({ method: 'GET', url: `/api/chunks/download-urls?siteId=${h.siteId}` }), 400, 'validation_failed');
    expectProblem(await h.request({ method: 'GET', url: `/api/chunks/download-urls?hash=${x}` }), 400, 'validation_failed');
  });

  it('accepts an agent token of the same site and hides the site from other agents', async () => {
    const c = chunk(512);
    const up = (await post('/api/chunks/upload-urls', { siteId: h.siteId, hashes: [c.hash] })).json();
    await putBlob(up.urls[c.hash], c.bytes);
    await hold(h.siteId, c.hash, 512);

    const mine = await agentToken(h.siteId);
    const res = await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [c.hash] }, mine);
    expect(res.statusCode).toBe(200);
    const got = Buffer.from(await (await fetch(res.json().urls[c.hash])).arrayBuffer());
    expect(sha256Hex(got)).toBe(c.hash);
    const viaGet = await h.request({ method: 'GET', url: `/api/chunks/download-urls?siteId=${h.siteId}&hash=${c.hash}`, key: mine });
    expect(viaGet.statusCode).toBe(200);

    const theirs = await agentToken(b.siteId);
    expectProblem(await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [c.hash] }, theirs), 404, 'not_found');
    expectProblem(
      await h.request({ method: 'GET', url: `/api/chunks/download-urls?siteId=${h.siteId}&hash=${c.hash}`, key: theirs }),
      404,
      'not_found',
    );
    expectProblem(
      await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [c.hash] }, `sat_${randomToken(32)}`),
      401,
      'unauthorized',
    );
  });

  it("keeps one site's chunks from another site", async () => {
    const onlyA = fakeHash();
    await hold(h.siteId, onlyA);
    expectProblem(await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [onlyA] }, b.apiKey), 404, 'not_found');
    const own = await post('/api/chunks/download-urls', { siteId: b.siteId, hashes: [onlyA] }, b.apiKey);
    expect(own.statusCode).toBe(200);
    expect(own.json()).toMatchObject({ urls: {}, missing: [onlyA] });
    const agentB = await agentToken(b.siteId);
    expect((await post('/api/chunks/download-urls', { siteId: b.siteId, hashes: [onlyA] }, agentB)).json()).toMatchObject({
      urls: {},
      missing: [onlyA],
    });
  });

  it('download-urls needs site read exactly', async () => {
    const writer = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    const body = expectProblem(
      await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [fakeHash()] }, writer),
      403,
      'scope_insufficient',
    );
    expect(body.required).toEqual({ resource: 'site', id: h.siteId, permission: 'read' });
    const reader = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    expect((await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: [fakeHash()] }, reader)).statusCode).toBe(200);
    expectProblem(
      await post('/api/chunks/download-urls', { siteId: h.siteId, hashes: Array.from({ length: 1001 }, fakeHash) }),
      400,
      'validation_failed',
    );
  });
});

// ------------------------------------------------------------------------------------------- mount

describe('POST /api/chunks/{digest}/mount', () => {
  let from: string;
  let to: string;
  let digest: string;
  beforeAll(async () => {
    from = await roost(h.siteId);
    to = await roost(h.siteId);
    digest = fakeHash();
    await hold(h.siteId, digest);
  });

  const mountRows = async (d: string) =>
    (
      await h.deps.db.query(
        'SELECT entry_id, source, roost_id, from_roost_id, to_roost_id, created_by FROM chunk_referrers WHERE site_id = $1 AND hash = $2',
        [h.siteId, d],
      )
    ).rows;

  it('records one referrer entry with a deterministic id and is retry-safe', async () => {
    const expected = { digest, siteId: h.siteId, from, to, mounted: true, zeroByte: true };
    const first = await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId, from, to });
    expect(first.statusCode).toBe(201);
    expect(first.json()).toEqual(expected);
    const again = await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId, from, to });
    expect(again.statusCode).toBe(201);
    expect(again.json()).toEqual(expected);
    const rows = await mountRows(digest);
    expect(rows).toEqual([
      {
        entry_id: sha256Hex(`${digest}|${h.siteId}|${from}|${to}`),
        source: 'mount',
        roost_id: to,
        from_roost_id: from,
        to_roost_id: to,
        created_by: h.userId,
      },
    ]);
    expect(rows[0].entry_id).toBe(mountEntryId(digest, h.siteId, from, to));
  });

  it('accepts the fields in the query string', async () => {
    const d = fakeHash();
    await hold(h.siteId, d);
    const res = await h.request({ method: 'POST', url: `/api/chunks/${d}/mount?siteId=${h.siteId}&from=${from}&to=${to}` });
    expect(res.statusCode).toBe(201);
    expect(res.json()).toMatchObject({ digest: d, from, to });
    const mixed = await h.request({ method: 'POST', url: `/api/chunks/${d}/mount?siteId=${h.siteId}`, body: { from: to, to: from } });
    expect(mixed.statusCode).toBe(201);
    expect(await mountRows(d)).toHaveLength(2);
  });

  it('rejects from equal to to, missing fields and conflicting body and query', async () => {
    expect(
      expectProblem(await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId, from, to: from }), 400, 'validation_failed').errors,
    ).toHaveProperty('to');
    const missing = expectProblem(await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId }), 400, 'validation_failed');
    expect(Object.keys(missing.errors).sort()).toEqual(['from', 'to']);
    expect(
      expectProblem(await h.request({ method: 'POST', url: `/api/chunks/${digest}/mount` }), 400, 'validation_failed').errors,
    ).toHaveProperty('siteId');
    const clash = await h.request({ method: 'POST', url: `/api/chunks/${digest}/mount?to=${from}`, body: { siteId: h.siteId, from, to } });
    expect(expectProblem(clash, 400, 'validation_failed').errors).toHaveProperty('to');
    expectProblem(await post(`/api/chunks/${digest.toUpperCase()}/mount`, { siteId: h.siteId, from, to }), 400, 'validation_failed');
    expectProblem(await post(`/api/chunks/abc/mount`, { siteId: h.siteId, from, to }), 400, 'validation_failed');
    expectProblem(await post(`/api/chunks/${digest}/mount`, { siteId: 'bad site', from, to }), 400, 'validation_failed');
    expect(
      expectProblem(await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId, from: 'no/such roost', to }), 400, 'validation_failed')
        .errors,
    ).toHaveProperty('from');
    expect(await mountRows(digest)).toHaveLength(1);
  });

  it('404s a missing or tombstoned roost, a chunk the site does not hold, and a foreign site', async () => {
    const d = fakeHash();
    await hold(h.siteId, d);
    expect(expectProblem(await post(`/api/chunks/${d}/mount`, { siteId: h.siteId, from: 'rst_nope', to }), 404, 'not_found').param).toBe(
      'from',
    );
    expect(expectProblem(await post(`/api/chunks/${d}/mount`, { siteId: h.siteId, from, to: 'rst_nope' }), 404, 'not_found').param).toBe(
      'to',
    );
    const gone = await roost(h.siteId, undefined, true);
    expectProblem(await post(`/api/chunks/${d}/mount`, { siteId: h.siteId, from, to: gone }), 404, 'not_found');
    const notHeld = fakeHash();
    expect(expectProblem(await post(`/api/chunks/${notHeld}/mount`, { siteId: h.siteId, from, to }), 404, 'not_found').param).toBe(
      'digest',
    );

    // Site B holds the chunk and has roosts of the same ids: it still cannot mount into site A.
    await hold(b.siteId, d);
    expectProblem(await post(`/api/chunks/${d}/mount`, { siteId: h.siteId, from, to }, b.apiKey), 404, 'not_found');
    // A roost of site B is not a roost of site A.
    const bRoost = await roost(b.siteId);
    expectProblem(await post(`/api/chunks/${d}/mount`, { siteId: h.siteId, from, to: bRoost }), 404, 'not_found');
    expect(await mountRows(d)).toHaveLength(0);
  });

  it('needs site write exactly', async () => {
    const reader = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read', 'admin'] }]);
    const body = expectProblem(
      await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId, from: to, to: from }, reader),
      403,
      'scope_insufficient',
    );
    expect(body.required).toEqual({ resource: 'site', id: h.siteId, permission: 'write' });
    const roostWriter = await scopedKey([{ resource: 'roost', id: '*', permissions: ['write'] }]);
    expectProblem(
      await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId, from: to, to: from }, roostWriter),
      403,
      'scope_insufficient',
    );
    expect(await mountRows(digest)).toHaveLength(1);
  });

  it('replays with an Idempotency-Key and refuses the same key with another body', async () => {
    const d = fakeHash();
    await hold(h.siteId, d);
    const key = idemKey();
    const body = { siteId: h.siteId, from, to };
    const first = await h.request({ method: 'POST', url: `/api/chunks/${d}/mount`, body, idempotencyKey: key });
    expect(first.statusCode).toBe(201);
    const replay = await h.request({ method: 'POST', url: `/api/chunks/${d}/mount`, body, idempotencyKey: key });
    expect(replay.statusCode).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(first.json());
    const other = await h.request({
      method: 'POST',
      url: `/api/chunks/${d}/mount`,
      body: { ...body, from: to, to: from },
      idempotencyKey: key,
    });
    expectProblem(other, 422, 'idempotency_key_mismatch');
    expect(await mountRows(d)).toHaveLength(1);
  });
});

// ------------------------------------------------------------------------------------------- referrers

describe('GET /api/chunks/{digest}/referrers', () => {
  const ENTRY_KEYS = [
    'entryId',
    'source',
    'roostId',
    'fromRoostId',
    'toRoostId',
    'versionId',
    'versionNumber',
    'fileCount',
    'pathCount',
    'totalBytes',
    'referencedAt',
    'createdAt',
    'createdBy',
    'mountedAt',
    'mountedBy',
  ].sort();
  let digest: string;
  let r1: string;
  let r2: string;
  let v1: string;
  let v2: string;
  let v3: string;

  beforeAll(async () => {
    digest = fakeHash();
    await hold(h.siteId, digest);
    r1 = await roost(h.siteId, `a-${randomBytes(4).toString('hex')}`);
    r2 = await roost(h.siteId, `b-${randomBytes(4).toString('hex')}`);
    v1 = await version(h.siteId, r1, 1, [digest, fakeHash()], 2);
    v2 = await version(h.siteId, r1, 2, [digest]);
    v3 = await version(h.siteId, r2, 1, [fakeHash()]); // does not reference the chunk
    expect((await post(`/api/chunks/${digest}/mount`, { siteId: h.siteId, from: r1, to: r2 })).statusCode).toBe(201);
  });

  const url = (q = '') => `/api/chunks/${digest}/referrers?siteId=${h.siteId}${q}`;

  it('lists version and mount entries with the spec field list, null where not applicable', async () => {
    const res = await h.request({ method: 'GET', url: url() });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toMatchObject({ digest, siteId: h.siteId, next_page_token: '', nextPageToken: '' });
    expect(body.items).toEqual(body.referrers);
    expect(body.referrers).toHaveLength(3);
    for (const e of body.referrers) expect(Object.keys(e).sort()).toEqual(ENTRY_KEYS);
    const [e1, e2, m] = body.referrers;
    expect(e1).toMatchObject({
      entryId: versionEntryId(digest, h.siteId, r1, v1),
      source: 'version',
      roostId: r1,
      fromRoostId: null,
      toRoostId: null,
      versionId: v1,
      versionNumber: 1,
      fileCount: 2,
      pathCount: 2,
      totalBytes: 1000,
      createdBy: h.userId,
      mountedAt: null,
      mountedBy: null,
    });
    expect(e1.referencedAt).toBe(e1.createdAt);
    expect(e2).toMatchObject({
      source: 'version',
      roostId: r1,
      versionId: v2,
      versionNumber: 2,
      fileCount: null,
      pathCount: null,
      totalBytes: 2000,
    });
    expect(m).toMatchObject({
      entryId: mountEntryId(digest, h.siteId, r1, r2),
      source: 'mount',
      roostId: r2,
      fromRoostId: r1,
      toRoostId: r2,
      versionId: null,
      versionNumber: null,
      fileCount: null,
      pathCount: null,
      totalBytes: null,
      createdBy: h.userId,
      mountedBy: h.userId,
    });
    expect(m.mountedAt).toBe(m.createdAt);
    expect(Number.isNaN(Date.parse(m.createdAt))).toBe(false);
    expect(body.referrers.map((e: { versionId: string | null }) => e.versionId)).not.toContain(v3);
  });

  it('pages with page_size/page_token and with the limit/cursor aliases', async () => {
    const all = (await h.request({ method: 'GET', url: url() })).json().referrers.map((e: { entryId: string }) => e.entryId);
    for (const [sizeName, tokenName] of [
      ['page_size', 'page_token'],
      ['limit', 'cursor'],
    ]) {
      const seen: string[] = [];
      let token = '';
      let pages = 0;
      do {
        const res = await h.request({
          method: 'GET',
          url: url(`&${sizeName}=2${token ? `&${tokenName}=${encodeURIComponent(token)}` : ''}`),
        });
        expect(res.statusCode).toBe(200);
        const body = res.json();
        expect(body.referrers.length).toBeLessThanOrEqual(2);
        expect(body.nextPageToken).toBe(body.next_page_token);
        seen.push(...body.referrers.map((e: { entryId: string }) => e.entryId));
        token = body.next_page_token;
        pages++;
      } while (token);
      expect(pages).toBe(2);
      expect(seen).toEqual(all);
    }
    // The canonical name wins over the alias.
    expect((await h.request({ method: 'GET', url: url('&page_size=1&limit=3') })).json().referrers).toHaveLength(1);
    expect((await h.request({ method: 'GET', url: url('&page_size=200') })).statusCode).toBe(200);
  });

  it('rejects bad pagination', async () => {
    for (const q of ['&page_size=0', '&page_size=201', '&page_size=abc', '&limit=-1', '&page_token=garbage', '&cursor=%%%']) {
      expectProblem(await h.request({ method: 'GET', url: url(q) }), 400, 'validation_failed');
    }
    const wellEncodedButForeign = Buffer.from(JSON.stringify({ p: { offset: 3 } })).toString('base64url');
    expect(
      expectProblem(await h.request({ method: 'GET', url: url(`&page_token=${wellEncodedButForeign}`) }), 400, 'validation_failed').param,
    ).toBe('page_token');
  });

  it('404s a digest the site does not hold and a foreign or unknown site; 400s a malformed digest or siteId', async () => {
    expect(
      expectProblem(await h.request({ method: 'GET', url: `/api/chunks/${fakeHash()}/referrers?siteId=${h.siteId}` }), 404, 'not_found')
        .param,
    ).toBe('digest');
    expectProblem(await h.request({ method: 'GET', url: url(), key: b.apiKey }), 404, 'not_found');
    await hold(b.siteId, digest);
    const bView = await h.request({ method: 'GET', url: `/api/chunks/${digest}/referrers?siteId=${b.siteId}`, key: b.apiKey });
    expect(bView.statusCode).toBe(200);
    expect(bView.json().referrers).toEqual([]);
    expectProblem(await h.request({ method: 'GET', url: `/api/chunks/${digest}/referrers?siteId=site_unknown` }), 404, 'not_found');
    expectProblem(
      await h.request({ method: 'GET', url: `/api/chunks/${digest.slice(2)}/referrers?siteId=${h.siteId}` }),
      400,
      'validation_failed',
    );
    expectProblem(await h.request({ method: 'GET', url: `/api/chunks/${digest}/referrers` }), 400, 'validation_failed');
    expectProblem(await h.request({ method: 'GET', url: `/api/chunks/${digest}/referrers?siteId=a%20b` }), 400, 'validation_failed');
  });

  it('needs site read exactly', async () => {
    const writer = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    expect(expectProblem(await h.request({ method: 'GET', url: url(), key: writer }), 403, 'scope_insufficient').required).toEqual({
      resource: 'site',
      id: h.siteId,
      permission: 'read',
    });
    const elsewhere = await scopedKey([{ resource: 'site', id: b.siteId, permissions: ['read'] }]);
    expectProblem(await h.request({ method: 'GET', url: url(), key: elsewhere }), 403, 'scope_insufficient');
  });
});
