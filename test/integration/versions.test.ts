/**
 * Version routes over the real services (docs/contract.md "Roost versions, rollback, deploy" without deploy,
 * "Roost current pointer", "Version id and version refs"): publish, list, fetch, files, diff,
 * patch, rollback.
 */
import { randomBytes } from 'node:crypto';
import { sha256Hex } from '../../domain/hex';
import type { Scope } from '../../domain/scopes';
import { computeVersionId, VERSION_MEDIA_TYPE } from '../../domain/version';
import { versionBlobName } from '../../storage/blob';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { scopedKey as scopedKeyOf } from '../support/identity';

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => h.close());

// ---------------------------------------------------------------------------------------------------
// Fixtures

interface FileSpec {
  path: string;
  content: Buffer;
}

/** A file entry whose content fits one chunk (or none when empty). */
function entry(f: FileSpec) {
  return { path: f.path, size: f.content.length, chunks: f.content.length ? [{ hash: sha256Hex(f.content), size: f.content.length }] : [] };
}

function body(files: FileSpec[], extra: Record<string, unknown> = {}) {
  return { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'test' }, files: files.map(entry), ...extra };
}

function file(path: string, text: string): FileSpec {
  return { path, content: Buffer.from(text) };
}

/** Records the files' chunks as present for a site (the SQL path of the presence check). */
async function present(files: FileSpec[], siteId = h.siteId): Promise<void> {
  for (const f of files) {
    if (!f.content.length) continue;
    await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING', [
      siteId,
      sha256Hex(f.content),
      f.content.length,
    ]);
  }
}

/** PUTs bytes to the chunk's signed upload URL in Azurite (no `chunks` row). */
async function upload(bytes: Buffer, hash = sha256Hex(bytes), siteId = h.siteId): Promise<string> {
  const { url } = await h.deps.blob.chunkUploadUrl(siteId, hash);
  const res = await fetch(url, {
    method: 'PUT',
    headers: { 'x-ms-blob-type': 'BlockBlob', 'content-type': 'application/octet-stream' },
    body: bytes,
  });
  expect(res.status).toBe(201);
  return hash;
}

async function newRoost(extra: Record<string, unknown> = {}): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: h.siteId, name: 'app', targets: ['m-1'], extractPath: 'C:\\app', ...extra },
  });
  expect(res.statusCode).toBe(201);
  return res.json().roostId;
}

function publishReq(roostId: string, payload: Record<string, unknown>, opts: { key?: string; idem?: string | true } = {}) {
  return h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    body: { siteId: h.siteId, ...payload },
    key: opts.key,
    idempotencyKey: opts.idem ?? true,
  });
}

/** Publishes `files` (chunks recorded present first) and returns the 201 body. */
async function publish(roostId: string, files: FileSpec[], extra: Record<string, unknown> = {}) {
  await present(files);
  const res = await publishReq(roostId, { version: body(files), ...extra });
  expect(res.statusCode).toBe(201);
  return res.json() as { versionId: string; versionNumber: number; currentVersionId: string; previousVersionId: string | null };
}

async function roost(roostId: string) {
  return (await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` })).json();
}

async function eventsOf(type: string, roostId: string) {
  const { rows } = await h.deps.db.query<{ data: Record<string, unknown> }>(
    `SELECT data FROM events WHERE site_id = $1 AND type = $2 AND data->>'roostId' = $3 ORDER BY occurred_at`,
    [h.siteId, type, roostId],
  );
  return rows.map((r) => r.data);
}

const scopedKey = (scopes: Scope[]) => scopedKeyOf(h, scopes);

const get = (url: string, key?: string) => h.request({ method: 'GET', url, key });

// ---------------------------------------------------------------------------------------------------
// Publish

describe('POST /api/roosts/{roostId}/versions', () => {
  it('publishes version 1 then 2, moving current and previous, with version.published events', async () => {
    const roostId = await newRoost();
    const files1 = [file('bin/app.exe', 'v1 binary'), file('readme.txt', 'hello'), file('empty.log', '')];
    const v1 = await publish(roostId, files1, { description: 'first' });
    expect(v1).toEqual({
      versionId: computeVersionId(body(files1)),
      versionNumber: 1,
      currentVersionId: v1.versionId,
      previousVersionId: null,
    });

    const files2 = [file('bin/app.exe', 'v2 binary!'), file('readme.txt', 'hello')];
    const v2 = await publish(roostId, files2);
    expect(v2).toEqual({
      versionId: computeVersionId(body(files2)),
      versionNumber: 2,
      currentVersionId: v2.versionId,
      previousVersionId: v1.versionId,
    });

    const r = await roost(roostId);
    expect(r).toMatchObject({
      versionCounter: 2,
      currentVersionId: v2.versionId,
      previousVersionId: v1.versionId,
      totalFiles: 2,
      totalSize: 15,
    });

    const events = await eventsOf('version.published', roostId);
    expect(events).toEqual([
      {
        roostId,
        siteId: h.siteId,
        versionId: v1.versionId,
        versionNumber: 1,
        description: 'first',
        totalFiles: 3,
        totalSize: 14,
        createdBy: h.userId,
      },
      {
        roostId,
        siteId: h.siteId,
        versionId: v2.versionId,
        versionNumber: 2,
        description: null,
        totalFiles: 2,
        totalSize: 15,
        createdBy: h.userId,
      },
    ]);

    // The version's distinct chunks are recorded (with how many files use each), and the stored body is the canonical JSON.
    const { rows } = await h.deps.db.query(
      'SELECT hash, size, file_count FROM version_chunks WHERE site_id = $1 AND roost_id = $2 AND version_id = $3 ORDER BY hash',
      [h.siteId, roostId, v1.versionId],
    );
    expect(rows).toHaveLength(2);
    expect(rows.every((c) => c.file_count === 1)).toBe(true);
    const stored = await h.deps.blob.get('versions', versionBlobName(h.siteId, roostId, v1.versionId));
    expect(sha256Hex(stored!)).toBe(v1.versionId);
  });

  it('stores an empty description as null and keeps extra top-level keys in the id', async () => {
    const roostId = await newRoost();
    const files = [file('a.txt', 'extra keys')];
    await present(files);
    const version = body(files, { annotations: { team: 'ops' } });
    const res = await publishReq(roostId, { version, description: '' });
    expect(res.statusCode).toBe(201);
    expect(res.json().versionId).toBe(computeVersionId(version));
    expect(res.json().versionId).not.toBe(computeVersionId(body(files)));
    expect((await roost(roostId)).currentVersionDescription).toBeNull();
    const fetched = (await get(`/api/roosts/${roostId}/versions/current?siteId=${h.siteId}`)).json();
    expect(fetched.version.annotations).toEqual({ team: 'ops' });
  });

  it('applies name, targets and extractPath sent with the publish', async () => {
    const roostId = await newRoost();
    await publish(roostId, [file('x', 'meta')], { name: 'Renamed', targets: ['m-9'], extractPath: 'E:\\x' });
    expect(await roost(roostId)).toMatchObject({ name: 'Renamed', targets: ['m-9'], extractPath: 'E:\\x', versionCounter: 1 });
  });

  it('returns the response only (no description, publishedAt or body)', async () => {
    const roostId = await newRoost();
    const res = await publish(roostId, [file('only', 'shape')], { description: 'not echoed' });
    expect(Object.keys(res).sort()).toEqual(['currentVersionId', 'previousVersionId', 'versionId', 'versionNumber']);
  });

  describe('expectedCurrentVersionId', () => {
    it('guards against a stale head (412 version_stale, nothing changes)', async () => {
      const roostId = await newRoost();
      const v1 = await publish(roostId, [file('g', 'one')]);
      const files = [file('g', 'two')];
      await present(files);
      const stale = await publishReq(roostId, { version: body(files), expectedCurrentVersionId: 'f'.repeat(64) });
      expect(stale.statusCode).toBe(412);
      expect(stale.json()).toMatchObject({ code: 'version_stale', currentVersionId: v1.versionId });
      const none = await publishReq(roostId, { version: body(files), expectedCurrentVersionId: null });
      expect(none.json().code).toBe('version_stale');
      expect(await roost(roostId)).toMatchObject({ versionCounter: 1, currentVersionId: v1.versionId });

      const ok = await publishReq(roostId, { version: body(files), expectedCurrentVersionId: v1.versionId });
      expect(ok.statusCode).toBe(201);
      const three = [file('g', 'three')];
      await present(three);
      const legacy = await publishReq(roostId, { version: body(three), expectedCurrentVersionId: `vrs_${ok.json().versionId}` });
      expect(legacy.statusCode).toBe(201);
      expect(legacy.json().previousVersionId).toBe(ok.json().versionId);
    });

    it('accepts null on an empty roost and rejects malformed guards', async () => {
      const roostId = await newRoost();
      const files = [file('n', 'first of all')];
      await present(files);
      const bad = await publishReq(roostId, { version: body(files), expectedCurrentVersionId: 'abc' });
      expect(bad.json()).toMatchObject({ code: 'validation_failed' });
      expect(Object.keys(bad.json().errors)).toContain('expectedCurrentVersionId');
      const ok = await publishReq(roostId, { version: body(files), expectedCurrentVersionId: null });
      expect(ok.statusCode).toBe(201);
    });
  });

  describe('chunk presence', () => {
    it('412 precondition_failed names at most 20 missingChunks and changes nothing', async () => {
      const roostId = await newRoost();
      const files = Array.from({ length: 25 }, (_, i) =>
        file(`f${String(i).padStart(2, '0')}`, `missing ${i} ${randomBytes(4).toString('hex')}`),
      );
      await present(files.slice(0, 2));
      const res = await publishReq(roostId, { version: body(files) });
      expect(res.statusCode).toBe(412);
      const p = res.json();
      expect(p.code).toBe('precondition_failed');
      expect(p.missingChunks).toEqual(files.slice(2, 22).map((f) => sha256Hex(f.content)));
      expect(p.missingCount).toBe(23);
      expect(await roost(roostId)).toMatchObject({ versionCounter: 0, currentVersionId: null });
    });

    it('accepts a chunk found in blob storage with the referenced size and records it', async () => {
      const roostId = await newRoost();
      const bytes = randomBytes(1000);
      const hash = await upload(bytes);
      const version = { ...body([]), files: [{ path: 'blob.bin', size: 1000, chunks: [{ hash, size: 1000 }] }] };
      const res = await publishReq(roostId, { version });
      expect(res.statusCode).toBe(201);
      const { rows } = await h.deps.db.query('SELECT size FROM chunks WHERE site_id = $1 AND hash = $2', [h.siteId, hash]);
      expect(rows).toEqual([{ size: 1000 }]);
    });

    it('never accepts a stored blob whose size differs from the reference', async () => {
      const roostId = await newRoost();
      const hash = sha256Hex(randomBytes(16));
      await upload(randomBytes(10), hash); // wrong bytes under that name
      const version = { ...body([]), files: [{ path: 'short.bin', size: 16, chunks: [{ hash, size: 16 }] }] };
      const res = await publishReq(roostId, { version });
      expect(res.statusCode).toBe(412);
      expect(res.json().missingChunks).toEqual([hash]);
      const { rows } = await h.deps.db.query('SELECT 1 FROM chunks WHERE site_id = $1 AND hash = $2', [h.siteId, hash]);
      expect(rows).toHaveLength(0);
    });

    it("does not see another site's chunks", async () => {
      const other = await h.other();
      const roostId = await newRoost();
      const files = [file('theirs', `other site ${randomBytes(4).toString('hex')}`)];
      await present(files, other.siteId);
      await upload(files[0].content, undefined, other.siteId);
      const res = await publishReq(roostId, { version: body(files) });
      expect(res.statusCode).toBe(412);
    });

    it('rejects a reference whose size contradicts the recorded chunk size', async () => {
      const roostId = await newRoost();
      const f = file('sized', `size ${randomBytes(4).toString('hex')}`);
      await upload(f.content); // stored bytes that hash to their name: the reference is what is wrong
      await present([f]);
      const version = { ...body([]), files: [{ path: 'sized', size: 3, chunks: [{ hash: sha256Hex(f.content), size: 3 }] }] };
      const res = await publishReq(roostId, { version });
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('validation_failed');
      expect(Object.keys(res.json().errors)).toEqual(['version.files.0.chunks.0.size']);
    });
  });

  describe('body validation', () => {
    const cases: [string, (v: Record<string, any>) => void, string][] = [
      ['schemaVersion', (v) => (v.schemaVersion = 1), 'version.schemaVersion'],
      ['mediaType', (v) => (v.mediaType = 'application/json'), 'version.mediaType'],
      ['config', (v) => (v.config = []), 'version.config'],
      ['empty files', (v) => (v.files = []), 'version.files'],
      ['absolute path', (v) => (v.files[0].path = '/etc/passwd'), 'version.files.0.path'],
      ['dot-dot path', (v) => (v.files[0].path = 'a/../b'), 'version.files.0.path'],
      ['negative size', (v) => (v.files[0].size = -1), 'version.files.0.size'],
      ['prefixed hash', (v) => (v.files[0].chunks[0].hash = 'sha256:' + v.files[0].chunks[0].hash), 'version.files.0.chunks.0.hash'],
      ['upper-case hash', (v) => (v.files[0].chunks[0].hash = v.files[0].chunks[0].hash.toUpperCase()), 'version.files.0.chunks.0.hash'],
      ['zero chunk size', (v) => (v.files[0].chunks[0].size = 0), 'version.files.0.chunks.0.size'],
      ['short inner chunk', (v) => v.files[0].chunks.unshift({ hash: 'a'.repeat(64), size: 5 }), 'version.files.0.chunks.0.size'],
      [
        'two sizes for one hash',
        (v) => v.files.push({ path: 'dup', size: 2, chunks: [{ hash: v.files[0].chunks[0].hash, size: 2 }] }),
        'version.files.1.chunks.0.size',
      ],
    ];
    it.each(cases)('rejects %s with validation_failed under version.*', async (_name, mutate, key) => {
      const roostId = await newRoost();
      const v = body([file('ok.txt', 'valid')]) as Record<string, any>;
      mutate(v);
      const res = await publishReq(roostId, { version: v });
      expect(res.statusCode).toBe(400);
      const p = res.json();
      expect(p.code).toBe('validation_failed');
      expect(Object.keys(p.errors)).toContain(key);
    });

    it('rejects a missing version, a long description, unknown fields and a bad siteId', async () => {
      const roostId = await newRoost();
      const v = body([file('ok.txt', 'valid')]);
      const cases: [Record<string, unknown>, string][] = [
        [{ version: undefined }, 'version'],
        [{ version: v, description: 'x'.repeat(501) }, 'description'],
        [{ version: v, description: 'bell\u0007' }, 'description'],
        [{ version: v, publishedAt: 'now' }, 'publishedAt'],
        [{ version: v, siteId: 'bad site' }, 'siteId'],
        [{ version: v, targets: 'm-1,m-2' as unknown as string[], extra: 1 }, 'extra'],
      ];
      for (const [payload, key] of cases) {
        const res = await publishReq(roostId, payload);
        expect(res.statusCode).toBe(400);
        expect(res.json().code).toBe('validation_failed');
        expect(Object.keys(res.json().errors)).toContain(key);
      }
      expect((await roost(roostId)).versionCounter).toBe(0);
      const exactly500 = await present([file('ok.txt', 'valid')]).then(() =>
        publishReq(roostId, { version: v, description: 'é'.repeat(500) }),
      );
      expect(exactly500.statusCode).toBe(201);
    });
  });

  it('accepts bodies over 1 MiB (route body limit 64 MiB) and refuses larger ones with 413', async () => {
    const roostId = await newRoost();
    const f = file('shared', 'one chunk, many files');
    await present([f]);
    const files = Array.from({ length: 20000 }, (_, i) => ({
      path: `dir${i % 50}/file-${i}.dat`,
      size: f.content.length,
      chunks: entry(f).chunks,
    }));
    const version = { ...body([]), files };
    expect(JSON.stringify(version).length).toBeGreaterThan(2 * 1024 * 1024);
    const res = await publishReq(roostId, { version });
    expect(res.statusCode).toBe(201);
    const { rows } = await h.deps.db.query('SELECT file_count FROM version_chunks WHERE site_id = $1 AND roost_id = $2', [
      h.siteId,
      roostId,
    ]);
    expect(rows).toEqual([{ file_count: 20000 }]);
    const files2 = (await get(`/api/roosts/${roostId}/versions/1/files?siteId=${h.siteId}&prefix=dir7/&page_size=500`)).json();
    expect(files2.total).toBe(400);

    const huge = `{"siteId":"${h.siteId}","version":"${'a'.repeat(64 * 1024 * 1024 + 10)}"}`;
    const tooBig = await h.app.inject({
      method: 'POST',
      url: `/api/roosts/${roostId}/versions`,
      headers: { authorization: `Bearer ${h.apiKey}`, 'content-type': 'application/json', 'idempotency-key': idemKey() },
      payload: huge,
    });
    expect(tooBig.statusCode).toBe(413);
    expect(tooBig.json().code).toBe('payload_too_large');
  });

  it('re-publishing the current body is a no-op (200); an older body moves the pointer back (200, version.rolled_back)', async () => {
    const roostId = await newRoost();
    const a = [file('same', 'body A')];
    const b = [file('same', 'body B')];
    const v1 = await publish(roostId, a);
    const v2 = await publish(roostId, b);
    const again = await publishReq(roostId, { version: body(b), expectedCurrentVersionId: v2.versionId });
    expect(again.statusCode).toBe(200);
    expect(again.json()).toEqual({
      versionId: v2.versionId,
      versionNumber: 2,
      currentVersionId: v2.versionId,
      previousVersionId: v1.versionId,
    });

    const back = await publishReq(roostId, { version: body(a), description: 'ignored' });
    expect(back.statusCode).toBe(200);
    expect(back.json()).toEqual({
      versionId: v1.versionId,
      versionNumber: 1,
      currentVersionId: v1.versionId,
      previousVersionId: v2.versionId,
    });
    expect(await roost(roostId)).toMatchObject({
      versionCounter: 2,
      currentVersionId: v1.versionId,
      previousVersionId: v2.versionId,
      currentVersionDescription: null,
    });
    expect(await eventsOf('version.published', roostId)).toHaveLength(2);
    expect(await eventsOf('version.rolled_back', roostId)).toEqual([
      { roostId, siteId: h.siteId, fromVersion: v2.versionId, toVersion: v1.versionId, triggeredBy: h.userId },
    ]);
  });

  it('serialises concurrent publishes on one roost: distinct numbers, a consistent chain', async () => {
    const roostId = await newRoost();
    const tag = randomBytes(4).toString('hex');
    const sets = Array.from({ length: 4 }, (_, i) => [file('c', `concurrent ${tag} ${i}`)]);
    for (const s of sets) await present(s);
    const results = await Promise.all(sets.map((s) => publishReq(roostId, { version: body(s) })));
    expect(results.map((r) => r.statusCode)).toEqual([201, 201, 201, 201]);
    expect(results.map((r) => r.json().versionNumber).sort()).toEqual([1, 2, 3, 4]);
    const list = (await get(`/api/roosts/${roostId}/versions?siteId=${h.siteId}`)).json().versions;
    // Each version's parent is the one numbered just below it; the newest is current.
    for (let i = 0; i < list.length - 1; i++) expect(list[i].parentVersionId).toBe(list[i + 1].versionId);
    expect((await roost(roostId)).currentVersionId).toBe(list[0].versionId);
  });

  describe('Idempotency-Key', () => {
    it('is required', async () => {
      const roostId = await newRoost();
      const res = await h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/versions`,
        body: { siteId: h.siteId, version: body([file('a', 'b')]) },
      });
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('idempotency_key_required');
      const long = await publishReq(roostId, { version: body([file('a', 'b')]) }, { idem: 'k'.repeat(256) });
      expect(long.json().code).toBe('idempotency_key_invalid');
    });

    it('replays the first response with Idempotent-Replayed and 422s on a different body', async () => {
      const roostId = await newRoost();
      const files = [file('idem', `idem ${randomBytes(4).toString('hex')}`)];
      await present(files);
      const key = idemKey();
      const first = await publishReq(roostId, { version: body(files) }, { idem: key });
      expect(first.statusCode).toBe(201);
      const replay = await publishReq(roostId, { version: body(files) }, { idem: key });
      expect(replay.statusCode).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.json()).toEqual(first.json());
      expect((await roost(roostId)).versionCounter).toBe(1);
      expect(await eventsOf('version.published', roostId)).toHaveLength(1);

      const mismatch = await publishReq(roostId, { version: body(files), description: 'different' }, { idem: key });
      expect(mismatch.statusCode).toBe(422);
      expect(mismatch.json().code).toBe('idempotency_key_mismatch');
    });
  });

  it('answers 404 for a missing or deleted roost and for another site, 403 without write scope', async () => {
    const files = [file('z', 'zzz')];
    await present(files);
    expect((await publishReq('rst_000000000000000000000000', { version: body(files) })).json().code).toBe('not_found');
    const gone = await newRoost();
    await h.request({ method: 'DELETE', url: `/api/roosts/${gone}?siteId=${h.siteId}` });
    expect((await publishReq(gone, { version: body(files) })).statusCode).toBe(404);

    const roostId = await newRoost();
    const other = await h.other();
    const cross = await publishReq(roostId, { version: body(files) }, { key: other.apiKey });
    expect(cross.statusCode).toBe(404);
    const reader = await scopedKey([{ resource: 'roost', id: roostId, permissions: ['read', 'rollback'] }]);
    const denied = await publishReq(roostId, { version: body(files) }, { key: reader });
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'roost', id: roostId, permission: 'write' } });
    const writer = await scopedKey([{ resource: 'roost', id: roostId, permissions: ['write'] }]);
    expect((await publishReq(roostId, { version: body(files) }, { key: writer })).statusCode).toBe(201);
  });
});

// ---------------------------------------------------------------------------------------------------
// Reads

describe('version refs and reads', () => {
  let roostId: string;
  let v: { versionId: string }[];
  const filesOf = [
    [file('app/main.exe', 'main v1'), file('app/lib.dll', 'lib'), file('docs/readme.md', 'read me'), file('old.txt', 'old')],
    [file('app/main.exe', 'main v2 longer'), file('app/lib.dll', 'lib'), file('docs/readme.md', 'read me!'), file('new.txt', 'new file')],
    [file('app/main.exe', 'main v3'), file('app/lib.dll', 'lib')],
  ];
  beforeAll(async () => {
    roostId = await newRoost();
    v = [];
    for (const [i, files] of filesOf.entries()) v.push(await publish(roostId, files, { description: `release ${i + 1}` }));
  });

  const vurl = (ref: string, rest = '', q = '') => `/api/roosts/${roostId}/versions/${ref}${rest}?siteId=${h.siteId}${q}`;

  it('resolves every ref form', async () => {
    const id2 = v[1].versionId;
    const expectations: [string, number][] = [
      [id2, 2],
      [`vrs_${id2}`, 2],
      [`vrs_${id2.slice(0, 12)}`, 2],
      ['2', 2],
      ['%232', 2],
      ['v2', 2],
      ['V2', 2],
      ['current', 3],
      ['previous', 2],
      ['first', 1],
    ];
    for (const [ref, n] of expectations) {
      const res = await get(vurl(ref));
      expect({ ref, status: res.statusCode, n: res.json().versionNumber }).toEqual({ ref, status: 200, n });
    }
  });

  it('400 version_ref_malformed for non-refs, 404 version_not_found for refs that match nothing', async () => {
    for (const ref of ['latest', '0', 'v0', '-1', '%23', 'vrs_xyz', 'A'.repeat(64), 'head~1']) {
      const res = await get(vurl(ref));
      expect({ ref, code: res.json().code, status: res.statusCode }).toEqual({ ref, code: 'version_ref_malformed', status: 400 });
    }
    for (const ref of ['99', '%2399', 'e'.repeat(64), 'vrs_eeeeeeee']) {
      const res = await get(vurl(ref));
      expect({ ref, code: res.json().code, status: res.statusCode }).toEqual({ ref, code: 'version_not_found', status: 404 });
    }
    const empty = await newRoost();
    for (const alias of ['current', 'previous', 'first']) {
      expect((await get(`/api/roosts/${empty}/versions/${alias}?siteId=${h.siteId}`)).json().code).toBe('version_not_found');
    }
    expect((await get(`/api/roosts/rst_nope/versions/1?siteId=${h.siteId}`)).json().code).toBe('not_found');
  });

  it('GET …/versions/{ref} returns the stored body and the metadata (also beside it)', async () => {
    const res = await get(vurl('1'));
    expect(res.statusCode).toBe(200);
    const r = res.json();
    expect(r).toMatchObject({
      versionId: v[0].versionId,
      versionNumber: 1,
      description: 'release 1',
      roostId,
      siteId: h.siteId,
      version: body(filesOf[0]),
    });
    // signature/signingKeyId: the service's Ed25519 signature of the version (docs/decisions/signed-manifests.md).
    expect(r.signature).toMatch(/^[A-Za-z0-9_-]{86}$/);
    expect(r.signingKeyId).toMatch(/^sk_[0-9a-f]{24}$/);
    const metadata = {
      versionUrl: r.versionUrl,
      createdAt: r.createdAt,
      createdBy: h.userId,
      totalSize: 20,
      totalFiles: 4,
      parentVersionId: null,
      signature: r.signature,
      signingKeyId: r.signingKeyId,
    };
    expect(r.metadata).toEqual(metadata);
    expect(r).toMatchObject(metadata);
    expect(r.versionUrl).toMatch(
      new RegExp(`/${h.deps.blob.containerName('versions')}/sites/${h.siteId}/roosts/${roostId}/versions/${v[0].versionId}\\.json$`),
    );
    expect((await get(vurl('2'))).json().parentVersionId).toBe(v[0].versionId);
  });

  it('410 not_found when the stored body is gone', async () => {
    const r = await newRoost();
    const pub = await publish(r, [file('vanish', `gone ${randomBytes(4).toString('hex')}`)]);
    await h.deps.blob.delete('versions', versionBlobName(h.siteId, r, pub.versionId));
    const res = await get(`/api/roosts/${r}/versions/current?siteId=${h.siteId}`);
    expect(res.statusCode).toBe(410);
    expect(res.json()).toMatchObject({ code: 'not_found', status: 410 });
    expect((await get(`/api/roosts/${r}/versions/current/files?siteId=${h.siteId}`)).statusCode).toBe(410);
  });

  it('GET …/versions lists version records newest first with nextCursor null', async () => {
    const res = await get(`/api/roosts/${roostId}/versions?siteId=${h.siteId}`);
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.versions.map((x: { versionNumber: number }) => x.versionNumber)).toEqual([3, 2, 1]);
    expect(body.nextCursor).toBeNull();
    expect(body.next_page_token).toBe('');
    expect(body.nextPageToken).toBe('');
    expect(Object.keys(body.versions[0]).sort()).toEqual(
      [
        'createdAt',
        'createdBy',
        'description',
        'parentVersionId',
        'signature',
        'signingKeyId',
        'totalFiles',
        'totalSize',
        'versionId',
        'versionNumber',
        'versionUrl',
      ].sort(),
    );
    expect(body.versions[0]).toMatchObject({
      versionId: v[2].versionId,
      description: 'release 3',
      parentVersionId: v[1].versionId,
      totalFiles: 2,
    });
  });

  it('pages the version list with both name families; canonical wins; bad sizes fail', async () => {
    const base = `/api/roosts/${roostId}/versions?siteId=${h.siteId}`;
    const p1 = (await get(`${base}&page_size=2`)).json();
    expect(p1.versions.map((x: { versionNumber: number }) => x.versionNumber)).toEqual([3, 2]);
    expect(p1.next_page_token).not.toBe('');
    expect(p1.nextPageToken).toBe(p1.next_page_token);
    const p2 = (await get(`${base}&page_size=2&page_token=${p1.next_page_token}`)).json();
    expect(p2.versions.map((x: { versionNumber: number }) => x.versionNumber)).toEqual([1]);
    expect(p2.next_page_token).toBe('');
    const legacy = (await get(`${base}&limit=1&cursor=${p1.next_page_token}`)).json();
    expect(legacy.versions.map((x: { versionNumber: number }) => x.versionNumber)).toEqual([1]);
    expect((await get(`${base}&page_size=1&limit=100`)).json().versions).toHaveLength(1);
    for (const q of ['&page_size=0', '&page_size=101', '&limit=x', '&page_token=%%%']) {
      const res = await get(`${base}${q}`);
      expect({ q, code: res.json().code }).toEqual({ q, code: 'validation_failed' });
    }
    expect((await get(`/api/roosts/${roostId}/versions`)).json().code).toBe('validation_failed');
  });

  it('GET …/files pages files with prefix, total and opaque offset tokens', async () => {
    const all = (await get(vurl('1', '/files'))).json();
    expect(all).toMatchObject({ versionId: v[0].versionId, roostId, siteId: h.siteId, total: 4, next_page_token: '', nextPageToken: '' });
    expect(all.files).toEqual(body(filesOf[0]).files);
    expect(all.items).toEqual(all.files);

    const p1 = (await get(vurl('1', '/files', '&prefix=app/&page_size=1'))).json();
    expect(p1.total).toBe(2);
    expect(p1.files.map((f: { path: string }) => f.path)).toEqual(['app/main.exe']);
    const p2 = (await get(vurl('1', '/files', `&prefix=app/&page_size=1&page_token=${p1.next_page_token}`))).json();
    expect(p2.files.map((f: { path: string }) => f.path)).toEqual(['app/lib.dll']);
    expect(p2.next_page_token).toBe('');
    expect((await get(vurl('1', '/files', '&prefix=nothing/'))).json()).toMatchObject({ total: 0, files: [] });
    for (const q of ['&page_size=501', '&page_size=0', '&page_token=nope'])
      expect((await get(vurl('1', '/files', q))).json().code).toBe('validation_failed');
    expect((await get(vurl('v9', '/files'))).json().code).toBe('version_not_found');
  });

  it('GET …/diff compares ordered chunk sequences of target against base', async () => {
    const res = await get(vurl('2', '/diff', '&against=1'));
    expect(res.statusCode).toBe(200);
    const d = res.json();
    expect(d).toMatchObject({
      versionId: v[1].versionId,
      toVersion: v[1].versionId,
      fromVersion: v[0].versionId,
      against: '1',
      roostId,
      siteId: h.siteId,
    });
    expect(d.summary).toEqual({ added: 1, removed: 1, changed: 2, unchanged: 1, hasChanges: true, netBytesDelta: 33 - 20 });
    expect(d.added).toEqual([{ path: 'new.txt', size: 8, reason: 'added', chunks: 1 }]);
    expect(d.removed).toEqual([{ path: 'old.txt', size: 3, reason: 'removed', chunks: 1 }]);
    expect(d.modified).toEqual([
      { path: 'app/main.exe', fromSize: 7, toSize: 14, reason: 'size_changed', fromChunks: 1, toChunks: 1 },
      { path: 'docs/readme.md', fromSize: 7, toSize: 8, reason: 'size_changed', fromChunks: 1, toChunks: 1 },
    ]);

    const same = (await get(vurl('current', '/diff', '&against=current'))).json();
    expect(same.summary).toEqual({ added: 0, removed: 0, changed: 0, unchanged: 2, hasChanges: false, netBytesDelta: 0 });
    const back = (await get(vurl('current', '/diff', `&against=${v[1].versionId}`))).json();
    expect(back.summary).toMatchObject({ added: 0, removed: 2, changed: 1, unchanged: 1 });
    expect(back.modified[0]).toMatchObject({ path: 'app/main.exe', reason: 'size_changed', fromSize: 14, toSize: 7 });
  });

  it('diff errors: against required, malformed and unknown refs', async () => {
    expect((await get(vurl('2', '/diff'))).json().code).toBe('validation_failed');
    const bad = (await get(vurl('2', '/diff', '&against=yesterday'))).json();
    expect(bad).toMatchObject({ code: 'version_ref_malformed', param: 'against' });
    expect((await get(vurl('2', '/diff', '&against=%2342'))).json()).toMatchObject({ code: 'version_not_found', param: 'against' });
    expect((await get(vurl('nope', '/diff', '&against=1'))).json().code).toBe('version_ref_malformed');
  });

  it('reads are site-scoped and need read scope', async () => {
    const other = await h.other();
    for (const url of [
      vurl('1'),
      vurl('1', '/files'),
      vurl('1', '/diff', '&against=2'),
      `/api/roosts/${roostId}/versions?siteId=${h.siteId}`,
    ]) {
      expect((await get(url, other.apiKey)).statusCode).toBe(404);
    }
    const writer = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    const denied = await get(vurl('1'), writer);
    expect(denied.statusCode).toBe(403);
    expect(denied.json().required).toEqual({ resource: 'roost', id: roostId, permission: 'read' });
    const reader = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    expect((await get(vurl('1', '/files'), reader)).statusCode).toBe(200);
  });
});

// ---------------------------------------------------------------------------------------------------
// PATCH

describe('PATCH /api/roosts/{roostId}/versions/{versionRef}', () => {
  let roostId: string;
  let v1: { versionId: string };
  beforeAll(async () => {
    roostId = await newRoost();
    v1 = await publish(roostId, [file('p', `patch ${randomBytes(4).toString('hex')}`)], { description: 'before' });
  });
  const patch = (ref: string, payload: Record<string, unknown>, key?: string) =>
    h.request({ method: 'PATCH', url: `/api/roosts/${roostId}/versions/${ref}`, body: { siteId: h.siteId, ...payload }, key });

  it('edits the description and returns the record with roostId, siteId, updatedAt', async () => {
    const res = await patch('%231', { description: 'after' });
    expect(res.statusCode).toBe(200);
    const r = res.json();
    expect(r).toMatchObject({
      versionId: v1.versionId,
      versionNumber: 1,
      description: 'after',
      roostId,
      siteId: h.siteId,
      createdBy: h.userId,
      parentVersionId: null,
    });
    expect(Date.parse(r.updatedAt)).toBeGreaterThanOrEqual(Date.parse(r.createdAt));
    expect((await get(`/api/roosts/${roostId}/versions/1?siteId=${h.siteId}`)).json().description).toBe('after');
    expect((await patch('current', { description: '' })).json().description).toBeNull();
    expect((await patch('current', { description: null })).json().description).toBeNull();
  });

  it('refuses content fields with version_content_immutable and changes nothing', async () => {
    for (const extra of [{ version: {} }, { versionNumber: 5 }, { files: [] }, { createdBy: 'me' }]) {
      const res = await patch('1', { description: 'sneaky', ...extra });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ code: 'version_content_immutable', fields: Object.keys(extra) });
    }
    expect((await get(`/api/roosts/${roostId}/versions/1?siteId=${h.siteId}`)).json().description).not.toBe('sneaky');
  });

  it('validates description, refs, site and scope', async () => {
    expect((await patch('1', { description: 'x'.repeat(501) })).json().code).toBe('validation_failed');
    expect((await patch('1', {})).json().code).toBe('validation_failed');
    expect((await patch('latest', { description: 'x' })).json().code).toBe('version_ref_malformed');
    expect((await patch('7', { description: 'x' })).json().code).toBe('version_not_found');
    const other = await h.other();
    expect((await patch('1', { description: 'x' }, other.apiKey)).statusCode).toBe(404);
    const reader = await scopedKey([{ resource: 'roost', id: roostId, permissions: ['read'] }]);
    const denied = await patch('1', { description: 'x' }, reader);
    expect(denied.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'roost', id: roostId, permission: 'write' } });
  });
});

// ---------------------------------------------------------------------------------------------------
// Rollback

describe('POST /api/roosts/{roostId}/rollback', () => {
  const rollback = (roostId: string, payload: Record<string, unknown> = {}, opts: { key?: string; idem?: string | true } = {}) =>
    h.request({
      method: 'POST',
      url: `/api/roosts/${roostId}/rollback`,
      body: { siteId: h.siteId, ...payload },
      key: opts.key,
      idempotencyKey: opts.idem ?? true,
    });

  async function threeVersions() {
    const roostId = await newRoost();
    const tag = randomBytes(4).toString('hex');
    const vs = [];
    for (let i = 1; i <= 3; i++) vs.push(await publish(roostId, [file('r', `rollback ${tag} ${i}`)]));
    return { roostId, vs };
  }

  it('defaults to previous, moves the pointer only and records version.rolled_back', async () => {
    const { roostId, vs } = await threeVersions();
    const res = await rollback(roostId);
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({
      ok: true,
      roostId,
      siteId: h.siteId,
      currentVersionId: vs[1].versionId,
      currentVersionNumber: 2,
      previousVersionId: vs[2].versionId,
    });
    expect(await roost(roostId)).toMatchObject({
      versionCounter: 3,
      currentVersionId: vs[1].versionId,
      previousVersionId: vs[2].versionId,
    });
    expect((await get(`/api/roosts/${roostId}/versions?siteId=${h.siteId}`)).json().versions).toHaveLength(3);
    expect(await eventsOf('version.rolled_back', roostId)).toEqual([
      { roostId, siteId: h.siteId, fromVersion: vs[2].versionId, toVersion: vs[1].versionId, triggeredBy: h.userId },
    ]);

    // "previous" is now version 3 again: rolling back twice returns to where we started.
    expect((await rollback(roostId)).json().currentVersionId).toBe(vs[2].versionId);
    const first = await rollback(roostId, { targetVersion: 'first' });
    expect(first.json()).toMatchObject({ currentVersionNumber: 1, previousVersionId: vs[2].versionId });
    expect((await rollback(roostId, { targetVersion: '#3' })).json().currentVersionNumber).toBe(3);
    expect((await rollback(roostId, { targetVersion: `vrs_${vs[1].versionId.slice(0, 10)}` })).json().currentVersionNumber).toBe(2);
  });

  it('400 rollback_no_op when the target is current; version_ref_malformed; version_not_found', async () => {
    const { roostId, vs } = await threeVersions();
    for (const targetVersion of ['current', '3', vs[2].versionId]) {
      const res = await rollback(roostId, { targetVersion });
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('rollback_no_op');
    }
    expect((await rollback(roostId, { targetVersion: 'v0' })).json()).toMatchObject({
      code: 'version_ref_malformed',
      param: 'targetVersion',
    });
    expect((await rollback(roostId, { targetVersion: '12' })).json()).toMatchObject({ code: 'version_not_found', status: 404 });
    expect((await rollback(roostId, { extra: true })).json().code).toBe('validation_failed');
    expect((await rollback(roostId, { siteId: undefined })).json().code).toBe('validation_failed');
    expect((await roost(roostId)).currentVersionId).toBe(vs[2].versionId);

    const single = await newRoost();
    await publish(single, [file('s', `single ${randomBytes(4).toString('hex')}`)]);
    expect((await rollback(single)).json().code).toBe('version_not_found');
    expect((await rollback('rst_missing')).json().code).toBe('not_found');
  });

  it('requires an Idempotency-Key, replays, and 422s on a different body', async () => {
    const { roostId, vs } = await threeVersions();
    const none = await h.request({ method: 'POST', url: `/api/roosts/${roostId}/rollback`, body: { siteId: h.siteId } });
    expect(none.json().code).toBe('idempotency_key_required');
    const key = idemKey();
    const first = await rollback(roostId, { targetVersion: '1' }, { idem: key });
    expect(first.statusCode).toBe(200);
    const replay = await rollback(roostId, { targetVersion: '1' }, { idem: key });
    expect(replay.statusCode).toBe(200);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(first.json());
    expect(await eventsOf('version.rolled_back', roostId)).toHaveLength(1);
    const mismatch = await rollback(roostId, { targetVersion: '2' }, { idem: key });
    expect(mismatch.statusCode).toBe(422);
    expect(mismatch.json().code).toBe('idempotency_key_mismatch');
    expect((await roost(roostId)).currentVersionId).toBe(vs[0].versionId);
  });

  it('needs roost rollback (write is not enough) and hides other sites', async () => {
    const { roostId } = await threeVersions();
    const writer = await scopedKey([{ resource: 'roost', id: '*', permissions: ['read', 'write', 'deploy', 'admin'] }]);
    const denied = await rollback(roostId, {}, { key: writer });
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({
      code: 'scope_insufficient',
      required: { resource: 'roost', id: roostId, permission: 'rollback' },
    });
    const roller = await scopedKey([{ resource: 'roost', id: roostId, permissions: ['rollback'] }]);
    expect((await rollback(roostId, {}, { key: roller })).statusCode).toBe(200);
    const siteRoller = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['rollback'] }]);
    expect((await rollback(roostId, {}, { key: siteRoller })).statusCode).toBe(200);
    const other = await h.other();
    expect((await rollback(roostId, {}, { key: other.apiKey })).statusCode).toBe(404);
  });
});
