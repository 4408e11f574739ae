/**
 * How publish finds the chunks a site has not recorded yet (services/chunks.ts findMissingChunks): one blob
 * property read per chunk, or one listing of the site's chunk prefix when that is cheaper (a cold push
 * of thousands of new chunks). Both lookups must give the same answer on real Azurite: present with the
 * referenced size, missing, or present with the wrong size (missing too, since uploaded bytes are
 * untrusted until checked). Then a publish of 300 new chunks takes the listing path end to end, and a
 * chunk with bytes the verification sweep found wrong heals through check, re-upload and publish.
 */
import { randomBytes } from 'node:crypto';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { findMissingChunks, listingIsCheaper, LIST_MIN_UNKNOWN } from '../../services/chunks';
import { sha256Hex } from '../../domain/hex';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName, quarantineBlobName } from '../../storage/blob';

let h: Harness;

beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => {
  await h?.close();
});

/** Stores `bytes` as a chunk blob of the site (no `chunks` row); returns its reference. */
async function storeChunk(bytes: Buffer, siteId = h.siteId): Promise<{ hash: string; size: number }> {
  const hash = sha256Hex(bytes);
  await h.deps.blob.put('chunks', chunkBlobName(siteId, hash), bytes, 'application/octet-stream');
  return { hash, size: bytes.length };
}

async function newRoost(): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: h.siteId, name: `lookup ${randomBytes(3).toString('hex')}` },
  });
  expect(res.statusCode).toBe(201);
  return res.json().roostId;
}

it('finds the same present, missing and wrong-size chunks by listing as by property reads', async () => {
  const present = await Promise.all([0, 1, 2].map(() => storeChunk(randomBytes(100 + Math.floor(Math.random() * 100)))));
  const wrongSize = await storeChunk(randomBytes(64));
  const absent = { hash: sha256Hex(randomBytes(16)), size: 10 };
  // Another site's blob with the same hash is not this site's chunk.
  const foreign = await storeChunk(randomBytes(32), `site_${randomBytes(12).toString('hex')}`);
  const refs = [present[0], absent, present[1], { ...wrongSize, size: wrongSize.size + 1 }, present[2], foreign];
  const recordNothing = async () => undefined; // leave no rows, so both lookups start from the same state
  const byHead = await findMissingChunks(h.deps.db, h.deps.blob, h.siteId, refs, recordNothing, { strategy: 'head' });
  const byList = await findMissingChunks(h.deps.db, h.deps.blob, h.siteId, refs, recordNothing, { strategy: 'list' });
  expect(byHead.missing).toEqual([absent.hash, foreign.hash]);
  // Stored bytes that hash to their name, referenced with another size: the reference is wrong.
  expect(byHead.conflicts).toEqual(new Map([[wrongSize.hash, wrongSize.size]]));
  expect(byList).toEqual(byHead);
});

it('quarantines an unrecorded blob whose bytes are wrong and whose size is not the referenced one (it is missing)', async () => {
  const good = randomBytes(40);
  const hash = sha256Hex(good);
  const bad = randomBytes(41);
  await h.deps.blob.put('chunks', chunkBlobName(h.siteId, hash), bad, 'application/octet-stream');
  const { missing, conflicts } = await findMissingChunks(h.deps.db, h.deps.blob, h.siteId, [{ hash, size: 40 }], async () => undefined);
  expect([missing, conflicts.size]).toEqual([[hash], 0]);
  expect(await h.deps.blob.get('chunks', chunkBlobName(h.siteId, hash))).toBeNull();
  expect(await h.deps.blob.get('chunks', quarantineBlobName(h.siteId, hash, sha256Hex(bad)))).toEqual(bad);
});

it(`publishes a version of ${LIST_MIN_UNKNOWN + 44} new chunks through the listing path, and refuses one whose chunk is absent`, async () => {
  const count = LIST_MIN_UNKNOWN + 44;
  // The rule publish applies: list when a few pages cost less than one HEAD per new chunk.
  expect(await listingIsCheaper(h.deps.db, h.siteId, count)).toBe(true);
  expect(await listingIsCheaper(h.deps.db, h.siteId, LIST_MIN_UNKNOWN - 1)).toBe(false);
  const chunks = await Promise.all(
    Array.from({ length: count }, (_, i) => storeChunk(Buffer.from(`chunk ${i} ${randomBytes(8).toString('hex')}`))),
  );
  const files = chunks.map((c, i) => ({ path: `data/file-${String(i).padStart(4, '0')}.txt`, size: c.size, chunks: [c] }));
  const version = (extra: typeof files = []) => ({
    schemaVersion: 2,
    mediaType: VERSION_MEDIA_TYPE,
    config: { producer: 'lookup-test' },
    files: [...files, ...extra],
  });

  const absent = { hash: sha256Hex(randomBytes(16)), size: 7 };
  const refused = await h.request({
    method: 'POST',
    url: `/api/roosts/${await newRoost()}/versions`,
    body: { siteId: h.siteId, version: version([{ path: 'data/zz-absent.txt', size: 7, chunks: [absent] }]) },
    idempotencyKey: idemKey(),
  });
  expect(refused.statusCode).toBe(412);
  expect(refused.json()).toMatchObject({ code: 'precondition_failed', missingChunks: [absent.hash] });

  const roostId = await newRoost();
  const ok = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    body: { siteId: h.siteId, version: version() },
    idempotencyKey: idemKey(),
  });
  expect(ok.statusCode).toBe(201);
  const { rows } = await h.deps.db.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM chunks WHERE site_id = $1 AND hash = ANY($2::text[])',
    [h.siteId, chunks.map((c) => c.hash)],
  );
  expect(rows[0].n).toBe(count);
});

it('heals a chunk whose stored bytes the verification sweep found wrong: check and download-urls call it missing until a publish re-hashes re-uploaded bytes', async () => {
  const good = randomBytes(50);
  const bad = randomBytes(50);
  const hash = sha256Hex(good);
  await h.deps.blob.put('chunks', chunkBlobName(h.siteId, hash), bad, 'application/octet-stream');
  await h.deps.db.query(`INSERT INTO chunks (site_id, hash, size, verify_failed_digest, verify_failed_at) VALUES ($1, $2, 50, $3, now())`, [
    h.siteId,
    hash,
    sha256Hex(bad),
  ]);
  const check = async () =>
    (await h.request({ method: 'POST', url: '/api/chunks/check', body: { siteId: h.siteId, hashes: [hash] } })).json().missing;
  const publish = async () =>
    h.request({
      method: 'POST',
      url: `/api/roosts/${await newRoost()}/versions`,
      body: {
        siteId: h.siteId,
        version: {
          schemaVersion: 2,
          mediaType: VERSION_MEDIA_TYPE,
          config: {},
          files: [{ path: 'healed.bin', size: 50, chunks: [{ hash, size: 50 }] }],
        },
      },
      idempotencyKey: idemKey(),
    });

  expect(await check()).toEqual([hash]);
  const urls = await h.request({ method: 'POST', url: '/api/chunks/download-urls', body: { siteId: h.siteId, hashes: [hash] } });
  expect(urls.json()).toMatchObject({ urls: {}, missing: [hash] });
  const refused = await publish();
  expect([refused.statusCode, refused.json().code, refused.json().missingChunks]).toEqual([412, 'precondition_failed', [hash]]);

  // The client re-uploads (what `roost push` does after check said missing); the next publish re-hashes it.
  await h.deps.blob.put('chunks', chunkBlobName(h.siteId, hash), good, 'application/octet-stream');
  expect((await publish()).statusCode).toBe(201);
  const { rows } = await h.deps.db.query('SELECT verify_failed_digest, verified_at FROM chunks WHERE site_id = $1 AND hash = $2', [
    h.siteId,
    hash,
  ]);
  expect(rows[0].verify_failed_digest).toBeNull();
  expect(rows[0].verified_at).not.toBeNull();
  expect(await check()).toEqual([]);
});
