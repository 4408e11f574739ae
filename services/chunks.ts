/**
 * Chunk use cases: the `/api/chunks/...` routes (check, upload-urls, download-urls, mount, referrers;
 * docs/decisions/chunk-*.md) and chunk presence at publish (docs/decisions/publish-chunk-lookup.md).
 * Bytes never pass through the API: clients PUT to and GET from per-blob SAS URLs signed here.
 */
import pLimit from 'p-limit';
import type { ReferrerEntry, ReferrerPosition } from '../domain/chunks';
import type { ChunkRef } from '../domain/version';
import { chunkHeld, chunkRows, clearVerifyFailed, countChunks, heldHashes, insertChunks, listReferrers, mountChunk } from '../db/chunks';
import type { Queryable } from '../db/pool';
import { quotaTiers, reserveUploads } from '../db/quota';
import { ApiError } from '../domain/errors';
import { type BlobStore, DOWNLOAD_URL_TTL_MS, type SignedUrl, UPLOAD_URL_TTL_MS } from '../storage/blob';
import type { ServiceDeps } from './deps';

// ---------------------------------------------------------------------------------------------------
// Chunk presence at publish

/** Concurrent blob property reads while checking chunks that have no `chunks` row yet. */
export const BLOB_CHECK_CONCURRENCY = 32;
/** Fewest unrecorded chunks for which listing the site's chunk prefix is considered instead of HEADs. */
export const LIST_MIN_UNKNOWN = 256;
/** What one list page (5,000 blobs) costs, in blob property reads (measured on Azurite: roughly 20–40). */
export const HEADS_PER_LIST_PAGE = 50;

/**
 * True when listing the site's chunk blobs (about one page per 5,000 of the chunks it holds, plus the new
 * ones) costs less than one HEAD per unrecorded chunk. A 1 GiB cold push has ~17,500 new chunks: 4 list
 * pages instead of 17,500 HEADs.
 */
export async function listingIsCheaper(db: Queryable, siteId: string, unknownCount: number): Promise<boolean> {
  if (unknownCount < LIST_MIN_UNKNOWN) return false;
  const pages = Math.ceil(((await countChunks(db, siteId)) + unknownCount) / 5000);
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
 * A recorded chunk whose bytes the verification sweep found wrong is re-hashed from storage: sound bytes
 * (re-uploaded since) clear its mark, anything else counts as missing.
 * `opts.strategy`: how unrecorded chunks are looked up in storage: `head` (one property read each, 32 in
 * flight), `list` (list the site's chunk prefix), or `auto` (default: list when that is cheaper,
 * `listingIsCheaper`). Both give the same answer.
 * @throws whatever `record` throws; blob storage errors other than 404.
 */
export async function findMissingChunks(
  db: Queryable,
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
  // Chunks whose stored bytes the verification sweep found wrong: re-hash what is stored now (the client
  // was told to upload them again); sound bytes clear the mark, anything else is missing.
  const unsound = new Set<string>();
  const suspect = rows.filter((r) => r.verify_failed_digest !== null && !conflicts.has(r.hash));
  if (suspect.length) {
    const limit = pLimit(BLOB_CHECK_CONCURRENCY);
    const digests = await Promise.all(suspect.map((r) => limit(() => blob.chunkDigest(siteId, r.hash))));
    const healed = suspect.filter((r, i) => digests[i]?.digest === r.hash && digests[i]?.size === r.size).map((r) => r.hash);
    for (const r of suspect) if (!healed.includes(r.hash)) unsound.add(r.hash);
    if (healed.length) await clearVerifyFailed(db, siteId, healed);
  }
  let stored: (number | null)[];
  const strategy = opts.strategy ?? 'auto';
  if (strategy === 'list' || (strategy === 'auto' && (await listingIsCheaper(db, siteId, unknown.length)))) {
    const sizes = await blob.chunkSizesByListing(siteId, new Set(unknown.map((r) => r.hash)));
    stored = unknown.map((r) => sizes.get(r.hash) ?? null);
  } else {
    const limit = pLimit(BLOB_CHECK_CONCURRENCY);
    stored = await Promise.all(unknown.map((r) => limit(() => blob.chunkSize(siteId, r.hash))));
  }
  const found: ChunkRef[] = [];
  const missing = new Set<string>();
  unknown.forEach((r, i) => (stored[i] === r.size ? found.push(r) : missing.add(r.hash)));
  if (found.length && record) await record(found);
  else if (found.length) await insertChunks(db, siteId, found);
  return { missing: hashes.filter((h) => missing.has(h) || unsound.has(h)), conflicts };
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
 * request order, each once. Does not check access.
 */
export async function checkChunks(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; hashes: string[] },
): Promise<{ missing: string[] }> {
  const wanted = distinct(input.hashes);
  const held = await heldHashes(deps.db, input.siteId, wanted);
  return { missing: held.size === wanted.length ? [] : wanted.filter((h) => !held.has(h)) };
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
