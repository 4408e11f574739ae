/**
 * Chunk integrity (docs/decisions/chunk-integrity.md) against real Azurite SAS, PostgreSQL and the API:
 * stored chunk bytes cannot be overwritten through any URL the API hands out (create-only upload URLs,
 * refused by the store), and a chunk whose stored bytes are wrong heals: verification quarantines the bad
 * bytes, check asks for the chunk again, and a fresh upload through a new create-only URL stores it.
 * A push resumes: check reports chunks present once their bytes are in storage, before any publish.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { sha256Hex } from '../../domain/hex';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName, quarantineBlobName } from '../../storage/blob';
import { verifyChunk } from '../../activities/verify';
import { RoostClient } from '../../cli/client';
import { push } from '../../cli/push';

let h: Harness;

beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => {
  await h?.close();
});

function chunk(size: number): { bytes: Buffer; hash: string } {
  const bytes = randomBytes(size);
  return { bytes, hash: sha256Hex(bytes) };
}

async function uploadUrls(hashes: string[]): Promise<Record<string, string>> {
  const res = await h.request({ method: 'POST', url: '/api/chunks/upload-urls', body: { siteId: h.siteId, hashes } });
  expect(res.statusCode).toBe(200);
  return res.json().urls;
}

async function check(hashes: string[]): Promise<string[]> {
  const res = await h.request({ method: 'POST', url: '/api/chunks/check', body: { siteId: h.siteId, hashes } });
  expect(res.statusCode).toBe(200);
  return res.json().missing;
}

/** A PUT straight to a signed URL, as any client could send it. */
function put(url: string, bytes: Buffer, extra = ''): Promise<Response> {
  return fetch(`${url}${extra}`, {
    method: 'PUT',
    body: bytes,
    headers: { 'x-ms-blob-type': 'BlockBlob', 'content-type': 'application/octet-stream' },
  });
}

async function stored(hash: string): Promise<Buffer | null> {
  return h.deps.blob.get('chunks', chunkBlobName(h.siteId, hash));
}

/** Publishes one file made of `chunks` into a new roost; returns the response. */
async function publish(chunks: { hash: string; size: number }[]) {
  const roost = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: h.siteId, name: `integrity ${randomBytes(4).toString('hex')}` },
  });
  expect(roost.statusCode).toBe(201);
  const size = chunks.reduce((n, c) => n + c.size, 0);
  return h.request({
    method: 'POST',
    url: `/api/roosts/${roost.json().roostId}/versions`,
    body: {
      siteId: h.siteId,
      version: { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: {}, files: [{ path: 'f.bin', size, chunks }] },
    },
    idempotencyKey: idemKey(),
  });
}

describe('stored chunk bytes are immutable', () => {
  it('refuses, in the store, a PUT of other bytes under a digest already stored (before and after publish)', async () => {
    const a = chunk(3000);
    const evil = randomBytes(3000);
    const first = await uploadUrls([a.hash]);
    expect((await put(first[a.hash], a.bytes)).status).toBe(201);

    // Uploaded, not yet published: neither a fresh URL nor the first one (still valid) can replace it.
    const again = await uploadUrls([a.hash]);
    const refused = await put(again[a.hash], evil);
    expect(refused.status).toBe(403);
    expect(refused.headers.get('x-ms-error-code')).toBe('AuthorizationPermissionMismatch');
    expect((await put(first[a.hash], evil)).status).toBe(403);
    // Nor staged blocks committed over it (Put Block, then Put Block List).
    const blockId = Buffer.from('block-0001').toString('base64');
    expect((await put(again[a.hash], evil, `&comp=block&blockid=${encodeURIComponent(blockId)}`)).status).toBe(403);
    const list = await fetch(`${again[a.hash]}&comp=blocklist`, {
      method: 'PUT',
      body: `<?xml version="1.0" encoding="utf-8"?><BlockList><Latest>${blockId}</Latest></BlockList>`,
    });
    expect(list.status).toBe(403);
    expect(await stored(a.hash)).toEqual(a.bytes);

    // Published (versions use it): a URL issued for a held chunk cannot overwrite it either.
    expect((await publish([{ hash: a.hash, size: 3000 }])).statusCode).toBe(201);
    const held = await uploadUrls([a.hash]);
    expect((await put(held[a.hash], evil)).status).toBe(403);
    expect(await stored(a.hash)).toEqual(a.bytes);
  });

  it("the CLI's upload answers a refused create as 'exists' (say a retried PUT whose first answer was lost)", async () => {
    const b = chunk(700);
    const client = new RoostClient({ baseUrl: 'http://127.0.0.1:1', apiKey: h.apiKey });
    const url = (await uploadUrls([b.hash]))[b.hash];
    expect(await client.putBlob(url, b.bytes)).toBe('created');
    expect(await client.putBlob(url, b.bytes)).toBe('exists');
    expect(await client.putBlob((await uploadUrls([b.hash]))[b.hash], randomBytes(700))).toBe('exists');
    expect(await stored(b.hash)).toEqual(b.bytes);
  });
});

describe('healing a chunk whose stored bytes are wrong', () => {
  it('verification quarantines the bad bytes, check asks for the chunk, and a fresh create-only upload stores the right ones', async () => {
    const good = chunk(5000);
    const bad = randomBytes(5000);
    // The first upload under a digest may carry any bytes (they are untrusted until hashed).
    expect((await put((await uploadUrls([good.hash]))[good.hash], bad)).status).toBe(201);
    expect((await publish([{ hash: good.hash, size: 5000 }])).statusCode).toBe(201);
    expect(await check([good.hash])).toEqual([]);

    // What the verification sweep runs per chunk.
    expect(await verifyChunk(h.deps, h.siteId, good.hash)).toEqual({ sound: false, emitted: true });
    const events = await h.deps.db.query(`SELECT data FROM events WHERE site_id = $1 AND type = 'chunk.verify_failed'`, [h.siteId]);
    expect(events.rows.map((r) => r.data)).toContainEqual({
      siteId: h.siteId,
      hash: good.hash,
      expectedDigest: good.hash,
      actualDigest: sha256Hex(bad),
    });
    // Quarantined: moved out of the chunk's name, kept for inspection.
    expect(await stored(good.hash)).toBeNull();
    expect(await h.deps.blob.get('chunks', quarantineBlobName(h.siteId, good.hash, sha256Hex(bad)))).toEqual(bad);
    // A second verification does not report the quarantined chunk again.
    expect(await verifyChunk(h.deps, h.siteId, good.hash)).toEqual({ sound: false, emitted: false });

    expect(await check([good.hash])).toEqual([good.hash]);
    const down = await h.request({ method: 'POST', url: '/api/chunks/download-urls', body: { siteId: h.siteId, hashes: [good.hash] } });
    expect(down.json()).toMatchObject({ urls: {}, missing: [good.hash] });

    // The fresh upload (what `roost push` does once check says missing) creates the blob again.
    expect((await put((await uploadUrls([good.hash]))[good.hash], good.bytes)).status).toBe(201);
    expect((await publish([{ hash: good.hash, size: 5000 }])).statusCode).toBe(201);
    expect(await check([good.hash])).toEqual([]);
    const healed = await h.request({ method: 'POST', url: '/api/chunks/download-urls', body: { siteId: h.siteId, hashes: [good.hash] } });
    expect(Buffer.from(await (await fetch(healed.json().urls[good.hash])).arrayBuffer())).toEqual(good.bytes);
    expect(await verifyChunk(h.deps, h.siteId, good.hash)).toEqual({ sound: true, emitted: false });
  });
});

describe('resumable push', () => {
  it('check reports chunks present once their bytes are stored, before any publish (check, upload-urls, PUT, check)', async () => {
    const parts = [chunk(1000), chunk(2000), chunk(3000)];
    const never = chunk(10);
    const hashes = [...parts.map((p) => p.hash), never.hash];
    expect(await check(hashes)).toEqual(hashes);
    const urls = await uploadUrls(parts.map((p) => p.hash));
    for (const p of parts) expect((await put(urls[p.hash], p.bytes)).status).toBe(201);

    // A key without access to the site learns nothing and records nothing.
    const other = await h.other();
    const refused = await h.request({ method: 'POST', url: '/api/chunks/check', body: { siteId: h.siteId, hashes }, key: other.apiKey });
    expect(refused.statusCode).toBe(404);
    const rows = () =>
      h.deps.db.query('SELECT hash, size FROM chunks WHERE site_id = $1 AND hash = ANY($2) ORDER BY size', [h.siteId, hashes]);
    expect((await rows()).rows).toEqual([]);

    expect(await check(hashes)).toEqual([never.hash]);
    // Recorded with their stored sizes (the next check is SQL only), reservations finalised.
    expect((await rows()).rows).toEqual(parts.map((p) => ({ hash: p.hash, size: p.bytes.length })));
    expect(await check(hashes)).toEqual([never.hash]);
    const reserved = await h.deps.db.query('SELECT hash FROM upload_reservations WHERE site_id = $1 AND hash = ANY($2)', [
      h.siteId,
      hashes,
    ]);
    expect(reserved.rows).toEqual([]);
  });

  it('does not count a stored blob that no chunk can be (empty): it is quarantined and asked for again', async () => {
    const c = chunk(100);
    expect((await put((await uploadUrls([c.hash]))[c.hash], Buffer.alloc(0))).status).toBe(201);
    expect(await check([c.hash])).toEqual([c.hash]);
    expect(await stored(c.hash)).toBeNull();
    expect((await put((await uploadUrls([c.hash]))[c.hash], c.bytes)).status).toBe(201);
    expect(await check([c.hash])).toEqual([]);
  });

  it('an interrupted `roost push` resumed uploads only what the first run did not store', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'roost-resume-'));
    try {
      for (let i = 0; i < 24; i++) fs.writeFileSync(path.join(dir, `f${String(i).padStart(2, '0')}.bin`), randomBytes(900 + i));
      const roost = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'resume' } });
      const roostId = roost.json().roostId as string;
      const client = new RoostClient({ baseUrl: await h.listen(), apiKey: h.apiKey });
      const puts: string[] = [];
      const putBlob = client.putBlob.bind(client);
      client.putBlob = async (url, bytes, opts) => {
        puts.push(url.split('?')[0].split('/').pop() as string);
        return putBlob(url, bytes, opts);
      };

      // Interrupted after 10 chunks were stored (as if the process died between upload and publish).
      const first = push({
        client,
        siteId: h.siteId,
        roostId,
        dir,
        concurrency: 1,
        onProgress: (p) => {
          if (p.stage === 'upload' && p.detail?.chunksDone === 10) throw new Error('interrupted');
        },
      });
      await expect(first).rejects.toThrow('interrupted');
      const storedFirst = new Set(puts);
      expect(storedFirst.size).toBe(10);

      puts.length = 0;
      const resumed = await push({ client, siteId: h.siteId, roostId, dir, concurrency: 2 });
      expect(resumed.chunksTotal).toBe(24);
      expect(resumed.chunksUploaded).toBe(14);
      expect(puts).toHaveLength(14);
      expect(puts.filter((hash) => storedFirst.has(hash))).toEqual([]);
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
