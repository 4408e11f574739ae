/**
 * Chunk use cases: the `/api/chunks/...` routes (check, upload-urls, download-urls, mount, referrers;
 * docs/decisions/chunk-*.md) and chunk presence at publish (docs/decisions/publish-chunk-lookup.md).
 * Bytes never pass through the API: clients PUT to and GET from per-blob SAS URLs signed here.
 */
import pLimit from 'p-limit';
import type { ReferrerEntry, ReferrerPosition } from '../domain/chunks';
import type { ChunkRef } from '../domain/version';
import type { Pool } from 'pg';
import {
  chunkHeld,
  type ChunkRow,
  checkRows,
  chunkRows,
  clearVerifyFailed,
  countChunks,
  heldHashes,
  insertChunks,
  listReferrers,
  mountChunk,
} from '../db/chunks';
import type { Queryable } from '../db/pool';
import { recordVerifyResult } from '../db/sweeps';
import { quotaTiers, recordChunks, reserveUploads } from '../db/quota';
import { ApiError } from '../domain/errors';
import { CHUNK_SIZE } from '../domain/version';
import {
  type BlobStore,
  chunkListingPrefixes,
  DOWNLOAD_URL_TTL_MS,
  listingShare,
  type SignedUrl,
  type StoredBlob,
  UPLOAD_URL_TTL_MS,
} from '../storage/blob';
import type { ServiceDeps } from './deps';

// ---------------------------------------------------------------------------------------------------
// Re-hashing recorded chunks

/**
 * Re-hashes the stored bytes of recorded chunks (`rows`: those marked bad by verification, whose client
 * was told to upload them again, or otherwise suspect): sound bytes clear any mark (and set verified_at);
 * bad bytes are recorded (`chunk.verify_failed` when not reported before, db/sweeps.ts
 * recordVerifyResult) and quarantined so a fresh create-only upload can replace them. Returns the hashes
 * unsound (bad bytes, or no blob).
 */
export async function rehashChunks(db: Pool, blob: BlobStore, siteId: string, suspect: ChunkRow[]): Promise<Set<string>> {
  const unsound = new Set<string>();
  if (suspect.length === 0) return unsound;
  const limit = pLimit(BLOB_CHECK_CONCURRENCY);
  await Promise.all(
    suspect.map((r) =>
      limit(async () => {
        const stored = await blob.chunkDigest(siteId, r.hash);
        if (stored?.digest === r.hash) {
          await clearVerifyFailed(db, siteId, [r.hash]);
          return;
        }
        unsound.add(r.hash);
        if (!stored) return; // quarantined already: waits for a fresh upload
        await recordVerifyResult(db, siteId, r.hash, stored.digest);
        if (stored.digest !== r.hash) await blob.quarantineChunk(siteId, r.hash, stored.etag, stored.digest);
      }),
    ),
  );
  return unsound;
}

// ---------------------------------------------------------------------------------------------------
// Chunk presence at publish

/** Concurrent blob property reads while checking chunks that have no `chunks` row yet. */
export const BLOB_CHECK_CONCURRENCY = 32;
/**
 * Fewest unrecorded chunks for which listing the site's chunk prefix is considered instead of HEADs. A
 * listing reads only the hash prefixes that cover the chunks (storage/blob.ts chunkListingPrefixes), so
 * from a few dozen chunks on it is the cheaper call: on Azurite a HEAD costs ~3.4 ms of its CPU (a scan of
 * its blob table) and listing one first hex digit of 4,400 blobs ~57 ms; the cold bench push's last
 * digit (~270 chunks, left to publish) went to 270 HEADs whenever it fell under the old bound of 256.
 */
export const LIST_MIN_UNKNOWN = 64;
/** What one list page (5,000 blobs) costs, in blob property reads (measured on Azurite: roughly 20–40). */
export const HEADS_PER_LIST_PAGE = 50;

/**
 * True when listing the site's chunk blobs under the prefixes that cover `unknown` (storage/blob.ts
 * chunkListingPrefixes: about one page per 5,000 of the chunks it holds there, plus the new ones) costs
 * less than one HEAD per unrecorded chunk. A 1 GiB cold push has ~17,500 new chunks: 4 list pages instead
 * of 17,500 HEADs. `unknown`: the hashes, or just their number (then the whole site is assumed listed).
 */
export async function listingIsCheaper(db: Queryable, siteId: string, unknown: readonly string[] | number): Promise<boolean> {
  const unknownCount = typeof unknown === 'number' ? unknown : unknown.length;
  if (unknownCount < LIST_MIN_UNKNOWN) return false;
  const prefixes = typeof unknown === 'number' ? [''] : chunkListingPrefixes(unknown);
  const pages = Math.max(prefixes.length, Math.ceil(((await countChunks(db, siteId)) * listingShare(prefixes) + unknownCount) / 5000));
  return pages * HEADS_PER_LIST_PAGE < unknownCount;
}

/**
 * Which of `refs` (distinct hashes with the size in bytes the version references) the site lacks. A chunk
 * is present when a `chunks` row exists for (site, hash); for a hash with no row the stored blob is
 * checked and accepted only when its size equals the referenced size, and then a row is recorded so
 * the next check is SQL only. Returns the missing hashes in `refs` order, and the present chunks whose
 * recorded size differs from the referenced size (`conflicts`: hash → recorded size in bytes).
 * `record` writes the rows of the chunks found in storage (default: a plain insert; publish passes the
 * quota-checked `recordChunks` of db/quota.ts, which may throw 402 quota_exceeded).
 * A recorded chunk whose bytes verification found wrong, or a never-verified one whose recorded size
 * conflicts with the reference, is re-hashed from storage (`rehashChunks`): sound bytes (re-uploaded
 * since) clear its mark, bad ones are quarantined and count as missing. An unrecorded blob of another
 * size than the reference is settled the same way (`settleStoredBlob`): sound bytes are a conflict,
 * bad ones are quarantined and missing.
 * `opts.strategy`: how unrecorded chunks are looked up in storage: `head` (one property read each, 32 in
 * flight), `list` (list the site's chunk prefix), or `auto` (default: list when that is cheaper,
 * `listingIsCheaper`). Both give the same answer.
 * @throws whatever `record` throws; blob storage errors other than 404.
 */
export async function findMissingChunks(
  db: Pool,
  blob: BlobStore,
  siteId: string,
  refs: ChunkRef[],
  record?: (found: ChunkRef[]) => Promise<unknown>,
  opts: { strategy?: 'auto' | 'list' | 'head' } = {},
): Promise<{ missing: string[]; conflicts: Map<string, number> }> {
  const conflicts = new Map<string, number>();
  if (refs.length === 0) return { missing: [], conflicts };
  const hashes = refs.map((r) => r.hash);
  const rows = await chunkRows(db, siteId, hashes);
  const known = new Map(rows.map((r) => [r.hash, r.size]));
  const unknown: ChunkRef[] = [];
  for (const r of refs) {
    const size = known.get(r.hash);
    if (size === undefined) unknown.push(r);
    else if (size !== r.size) conflicts.set(r.hash, size);
  }
  // A conflict on bytes never verified may be bad bytes rather than a wrong reference: re-hash those too.
  const suspect = rows.filter((r) => r.verify_failed_digest !== null || (conflicts.has(r.hash) && r.verified_at === null));
  const unsound = await rehashChunks(db, blob, siteId, suspect);
  for (const h of unsound) conflicts.delete(h);
  const strategy = opts.strategy ?? 'auto';
  const useList =
    strategy === 'list' ||
    (strategy === 'auto' &&
      (await listingIsCheaper(
        db,
        siteId,
        unknown.map((r) => r.hash),
      )));
  const stored = await lookUpBlobs(blob, siteId, unknown, useList);
  const found: ChunkRef[] = [];
  const missing = new Set<string>();
  const limit = pLimit(BLOB_CHECK_CONCURRENCY);
  await Promise.all(
    unknown.map((r, i) =>
      limit(async () => {
        const b = stored[i];
        if (b === null) missing.add(r.hash);
        else if (b.size === r.size) found.push(r);
        else {
          // Stored with another size: the reference is wrong (bytes sound: a conflict), or the bytes are.
          const sound = await settleStoredBlob(blob, siteId, r.hash, b);
          if (sound) conflicts.set(r.hash, b.size);
          else missing.add(r.hash);
        }
      }),
    ),
  );
  if (found.length && record) await record(found);
  else if (found.length) await insertChunks(db, siteId, found);
  return { missing: hashes.filter((h) => missing.has(h) || unsound.has(h)), conflicts };
}

/** Looks up the blobs of `refs` by listing the site's chunk prefix or one property read each (32 in flight). */
async function lookUpBlobs(blob: BlobStore, siteId: string, refs: { hash: string }[], useList: boolean): Promise<(StoredBlob | null)[]> {
  if (useList) {
    const blobs = await blob.chunkBlobsByListing(siteId, new Set(refs.map((r) => r.hash)));
    return refs.map((r) => blobs.get(r.hash) ?? null);
  }
  const limit = pLimit(BLOB_CHECK_CONCURRENCY);
  return Promise.all(refs.map((r) => limit(() => blob.chunkBlob(siteId, r.hash))));
}

/**
 * Decides about an unrecorded chunk blob whose size is not the expected one: a size no chunk can have
 * (0, or over CHUNK_SIZE) is quarantined unread; otherwise the bytes are hashed (at most 4 MiB) and
 * quarantined unless they hash to `hash`. Returns true when the stored bytes are sound.
 */
export async function settleStoredBlob(blob: BlobStore, siteId: string, hash: string, stored: StoredBlob): Promise<boolean> {
  if (stored.size === 0 || stored.size > CHUNK_SIZE) {
    await blob.quarantineChunk(siteId, hash, stored.etag, `size-${stored.size}`);
    return false;
  }
  const digest = await blob.chunkDigest(siteId, hash);
  if (!digest) return false;
  if (digest.digest === hash) return true;
  await blob.quarantineChunk(siteId, hash, digest.etag, digest.digest);
  return false;
}

// ---------------------------------------------------------------------------------------------------
// The chunk routes

/** Distinct values in first-seen order. */
function distinct(hashes: string[]): string[] {
  return [...new Set(hashes)];
}

/** Signed URLs of a set of chunks: digest → URL, and the earliest expiry as RFC 3339 UTC. */
export interface SignedUrls {
  urls: Record<string, string>;
  expiresAt: string;
}

/** Signs one URL per hash; returns the map and the earliest expiry as RFC 3339 UTC. */
async function signAll(hashes: string[], ttlMs: number, sign: (hash: string) => Promise<SignedUrl>): Promise<SignedUrls> {
  const signed = await Promise.all(hashes.map(sign));
  const urls: Record<string, string> = {};
  let expiresAt = Date.now() + ttlMs;
  hashes.forEach((h, i) => {
    urls[h] = signed[i].url;
    expiresAt = Math.min(expiresAt, signed[i].expiresAt);
  });
  return { urls, expiresAt: new Date(expiresAt).toISOString() };
}

/**
 * `POST /api/chunks/check`: the digests among `hashes` the site does not hold with sound bytes, in
 * request order, each once. A chunk is held when its `chunks` row exists and is not marked bad, or, with
 * no row yet, when upload URLs were issued for it (an upload reservation) and its blob is in storage
 * with a size a chunk can have: such chunks are recorded now (quota-checked, db/quota.ts recordChunks),
 * so a push interrupted between upload and publish resumes without uploading them again and the next
 * check is SQL only. Chunks marked bad are re-hashed (`rehashChunks`: sound bytes heal). Hashes never
 * reserved cost no storage call, so a check of chunks nobody uploaded is two indexed queries.
 * `access` (the caller's authorisation, run alongside the queries) is awaited before any storage call
 * or write: a refused caller changes nothing.
 * @throws whatever `access` rejects with; blob storage errors other than 404.
 */
export async function checkChunks(
  deps: Pick<ServiceDeps, 'db' | 'blob' | 'cfg'>,
  input: { siteId: string; hashes: string[]; access?: Promise<unknown> },
): Promise<{ missing: string[] }> {
  const { siteId } = input;
  const wanted = distinct(input.hashes);
  const [{ rows, reserved }] = await Promise.all([checkRows(deps.db, siteId, wanted), input.access]);
  const recorded = new Set(rows.map((r) => r.hash));
  const unsound = await rehashChunks(
    deps.db,
    deps.blob,
    siteId,
    rows.filter((r) => r.verify_failed_digest !== null),
  );
  const uploaded = await uploadedUnrecorded(
    deps,
    siteId,
    reserved.filter((h) => !recorded.has(h)),
  );
  if (recorded.size - unsound.size + uploaded.size === wanted.length) return { missing: [] };
  return { missing: wanted.filter((h) => (recorded.has(h) ? unsound.has(h) : !uploaded.has(h))) };
}

/**
 * Which of `hashes` (no `chunks` row, upload URLs issued) are in blob storage with a size a chunk can
 * have (1..CHUNK_SIZE bytes); records them. Blobs of impossible sizes are quarantined. Returns the
 * hashes found.
 */
async function uploadedUnrecorded(deps: Pick<ServiceDeps, 'db' | 'blob' | 'cfg'>, siteId: string, hashes: string[]): Promise<Set<string>> {
  const found = new Set<string>();
  if (hashes.length === 0) return found;
  const stored = await lookUpBlobs(
    deps.blob,
    siteId,
    hashes.map((hash) => ({ hash })),
    await listingIsCheaper(deps.db, siteId, hashes),
  );
  const refs: ChunkRef[] = [];
  await Promise.all(
    hashes.map(async (hash, i) => {
      const b = stored[i];
      if (!b) return;
      if (b.size > 0 && b.size <= CHUNK_SIZE) {
        refs.push({ hash, size: b.size });
        found.add(hash);
      } else await deps.blob.quarantineChunk(siteId, hash, b.etag, `size-${b.size}`);
    }),
  );
  try {
    await recordChunks(deps.db, siteId, refs, quotaTiers(deps.cfg));
  } catch (err) {
    // Over quota: the bytes are stored all the same; publish records them (and answers 402) later.
    if (!(err instanceof ApiError && err.code === 'quota_exceeded')) throw err;
  }
  return found;
}

/**
 * `POST /api/chunks/upload-urls`: one create+write SAS URL per distinct hash (60 minutes), and the
 * quota reservation of the bytes they may add (pending until publish records the chunk or the URLs
 * expire; db/quota.ts reserveUploads). Does not check access.
 * @throws ApiError quota_exceeded (402, no URL is issued), not_found when the site does not exist.
 */
export async function uploadUrls(
  deps: Pick<ServiceDeps, 'db' | 'blob' | 'cfg'>,
  input: { siteId: string; hashes: string[] },
): Promise<SignedUrls> {
  const { siteId } = input;
  const signed = await signAll(distinct(input.hashes), UPLOAD_URL_TTL_MS, (h) => deps.blob.chunkUploadUrl(siteId, h));
  await reserveUploads(deps.db, siteId, Object.keys(signed.urls), new Date(Date.now() + UPLOAD_URL_TTL_MS), quotaTiers(deps.cfg));
  return signed;
}

/**
 * `/api/chunks/download-urls`: a read-only SAS URL (15 minutes) per distinct hash the site holds with
 * sound bytes; the others are listed in `missing` (request order). Does not check access.
 */
export async function downloadUrls(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: { siteId: string; hashes: string[] },
): Promise<SignedUrls & { missing: string[] }> {
  const { siteId } = input;
  const wanted = distinct(input.hashes);
  const held = await heldHashes(deps.db, siteId, wanted);
  const present = wanted.filter((h) => held.has(h));
  const { urls, expiresAt } = await signAll(present, DOWNLOAD_URL_TTL_MS, (h) => deps.blob.chunkDownloadUrl(siteId, h));
  return { urls, expiresAt, missing: wanted.filter((h) => !held.has(h)) };
}

/**
 * `POST /api/chunks/{digest}/mount`: records the mount of a held chunk from roost `from` into roost
 * `to` (no bytes move; a repeat is a no-op). Does not check access.
 * @throws ApiError not_found (param `from`, `to` or `digest`) when a roost or the chunk is missing.
 */
export async function mount(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; digest: string; from: string; to: string; createdBy: string },
): Promise<{ entryId: string; created: boolean }> {
  return mountChunk(deps.db, input);
}

/**
 * `GET /api/chunks/{digest}/referrers`: one page (`pageSize` entries after position `after`) of the
 * mount and version entries that reference a held chunk, and the next position (undefined on the last
 * page). Does not check access.
 * @throws ApiError not_found (param `digest`) when the site does not hold the chunk.
 */
export async function referrers(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; digest: string; pageSize: number; after?: ReferrerPosition },
): Promise<{ entries: ReferrerEntry[]; next: ReferrerPosition | undefined }> {
  const { siteId, digest } = input;
  if (!(await chunkHeld(deps.db, siteId, digest)))
    throw new ApiError('not_found', 'chunk not stored for this site', { extras: { param: 'digest' } });
  return listReferrers(deps.db, siteId, digest, { pageSize: input.pageSize, after: input.after });
}
