/**
 * Chunk download of the reference agent (docs/agent-protocol.md "Roost sync"; docs/decisions/agent-sync.md):
 * the local chunk store `<rootDir>/chunks/<hash>`, which needed chunks it already holds intact
 * (`chunks_dedup`), and the download of the rest through signed URLs requested in batches of ≤1000
 * (`POST /api/chunks/download-urls`), with bounded concurrency (optionally one limiter for a whole fleet),
 * re-verifying every chunk's size and SHA-256 and refetching on mismatch (CHUNK_TRIES tries). No per-chunk
 * call reaches the API, only blob storage.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import pLimit from 'p-limit';
import type { SyncCounters } from '../domain/target-state';
import { SyncCancelled, SyncFailure, errMessage } from './errors';
import type { FaultInjector } from './faults';
import { HttpError, fetchBytes, isTransient, sleep } from './http';
import { type DownloadUrls, RETRY_BACKOFF_CAP_MS, SYNC_RETRY_WINDOW_MS } from './transport';

/** Hashes per download-urls call (the route's limit). */
export const DOWNLOAD_URL_BATCH = 1000;
/** Tries per chunk (first download plus refetches) before the sync fails. */
export const CHUNK_TRIES = 3;
/** Download URLs this close to expiry (ms) are requested again before use. */
const URL_REFRESH_MARGIN_MS = 30_000;

/** A concurrency limiter (p-limit); share one across agents to bound a fleet's downloads. */
export type Limiter = pLimit.Limit;

/** A limiter allowing `concurrency` tasks at once. */
export function createLimiter(concurrency: number): Limiter {
  return pLimit(concurrency);
}

/** The local chunk store `<rootDir>/chunks/<hash>`: chunks verified once, reused by later syncs. */
export class ChunkStore {
  constructor(readonly dir: string) {}

  /** Path of a stored chunk. */
  path(hash: string): string {
    return path.join(this.dir, hash);
  }

  /** True when the store holds `hash` at `size` bytes and it still hashes to its digest. */
  async holdsIntact(hash: string, size: number): Promise<boolean> {
    const st = await fs.stat(this.path(hash)).catch(() => null);
    if (!st || st.size !== size) return false;
    try {
      return (
        createHash('sha256')
          .update(await fs.readFile(this.path(hash)))
          .digest('hex') === hash
      );
    } catch {
      return false;
    }
  }

  /** Stores a verified chunk (temp file, rename). */
  async put(hash: string, data: Buffer): Promise<void> {
    const file = this.path(hash);
    const tmp = `${file}.tmp-${randomBytes(4).toString('hex')}`;
    await fs.writeFile(tmp, data);
    await fs.rename(tmp, file);
  }

  /** The bytes of a stored chunk. */
  read(hash: string): Promise<Buffer> {
    return fs.readFile(this.path(hash));
  }

  /**
   * Of `needed` (hash → size), the chunks the store lacks or holds damaged (a stored chunk is reused only
   * when it still hashes to its digest); counts the reused ones in `counters.chunks_dedup`.
   */
  async missing(needed: Map<string, number>, counters: SyncCounters): Promise<[string, number][]> {
    const out: [string, number][] = [];
    for (const [hash, size] of needed) {
      if (await this.holdsIntact(hash, size)) counters.chunks_dedup++;
      else out.push([hash, size]);
    }
    return out;
  }
}

/** Lazily fetched, shared, refreshable URL map of one download batch. */
class UrlBatch {
  private current: Promise<{ urls: Record<string, string>; expiresAt: number }> | undefined;

  constructor(
    private readonly fetchUrls: (hashes: string[]) => Promise<DownloadUrls>,
    private readonly hashes: string[],
  ) {}

  /** The signed URL of `hash`. @throws SyncFailure when the site lacks a chunk of the batch. */
  async get(hash: string): Promise<string> {
    let batch = await this.load();
    if (batch.expiresAt - Date.now() < URL_REFRESH_MARGIN_MS) {
      this.refresh();
      batch = await this.load();
    }
    const url = batch.urls[hash];
    if (!url) throw new SyncFailure(`the site does not hold chunk ${hash}`);
    return url;
  }

  /** Forgets the URLs (the SAS expired): the next `get` requests them again. */
  refresh(): void {
    this.current = undefined;
  }

  private load(): Promise<{ urls: Record<string, string>; expiresAt: number }> {
    if (!this.current) {
      const p = this.fetchUrls(this.hashes).then((r) => {
        if (r.missing && r.missing.length > 0)
          throw new SyncFailure(`the site lacks ${r.missing.length} chunk(s) of this version, e.g. ${r.missing[0]}`);
        return { urls: r.urls, expiresAt: Date.parse(r.expiresAt) };
      });
      p.catch(() => {
        if (this.current === p) this.current = undefined;
      });
      this.current = p;
    }
    return this.current;
  }
}

/** What a download run needs. */
export interface DownloadContext {
  store: ChunkStore;
  /** Signed URLs of a batch of hashes (agent/transport.ts downloadUrls). */
  downloadUrls: (hashes: string[]) => Promise<DownloadUrls>;
  limit: Limiter;
  faults: FaultInjector;
  /** The agent's stop signal. */
  signal: AbortSignal;
}

/**
 * Downloads one chunk into the store, verifying size and SHA-256; refetches on mismatch.
 * @returns the number of refetches needed. @throws SyncFailure after CHUNK_TRIES bad downloads.
 */
async function downloadChunk(ctx: DownloadContext, hash: string, size: number, urls: UrlBatch, counters: SyncCounters): Promise<number> {
  const { signal } = ctx;
  const corruptFirst = ctx.faults.corruptsFirstDownload();
  let lastError = '';
  let unreachable = 0;
  let unreachableSince = 0;
  for (let attempt = 1; attempt <= CHUNK_TRIES; attempt++) {
    const url = await urls.get(hash); // SyncFailure when the site lacks the chunk; API errors were retried already
    let data: Buffer;
    try {
      data = await fetchBytes(url, signal);
    } catch (err) {
      if (signal.aborted) throw err;
      lastError = errMessage(err);
      if (err instanceof HttpError && err.status === 403)
        urls.refresh(); // SAS expired
      else if (isTransient(err)) {
        // Blob storage unreachable or failing (network, 5xx): not a try of the chunk's bytes. Wait with
        // backoff for as long as a sync retries its API calls, then give up.
        unreachableSince ||= Date.now();
        if (Date.now() - unreachableSince < SYNC_RETRY_WINDOW_MS) {
          attempt--;
          unreachable++;
          await sleep(Math.min(RETRY_BACKOFF_CAP_MS, 100 * 2 ** Math.min(unreachable, 16)), signal);
          continue;
        }
      }
      await sleep(100 * attempt, signal);
      continue;
    }
    unreachableSince = 0;
    counters.bytes_fetched += data.length;
    if (attempt === 1 && corruptFirst) ctx.faults.corrupt(data);
    const actual = createHash('sha256').update(data).digest('hex');
    if (data.length === size && actual === hash) {
      await ctx.store.put(hash, data);
      counters.chunks_fetched++;
      return attempt - 1;
    }
    lastError = `chunk ${hash} failed verification (got ${data.length} bytes, sha256 ${actual.slice(0, 12)}…)`;
  }
  throw new SyncFailure(`chunk ${hash} could not be fetched intact after ${CHUNK_TRIES} tries: ${lastError}`);
}

/**
 * Downloads `missing` ([hash, size bytes]) into the store, DOWNLOAD_URL_BATCH hashes per URL request,
 * through the limiter. `onChunk(refetches)` runs after each stored chunk (progress, refetch count);
 * `counters.chunks_fetched` and `bytes_fetched` grow as chunks arrive.
 * @throws SyncFailure (a chunk the site lacks, or one never intact), SyncCancelled when the agent stops.
 */
export async function downloadChunks(
  ctx: DownloadContext,
  missing: [string, number][],
  counters: SyncCounters,
  onChunk: (refetches: number) => void,
): Promise<void> {
  for (let i = 0; i < missing.length; i += DOWNLOAD_URL_BATCH) {
    const batch = missing.slice(i, i + DOWNLOAD_URL_BATCH);
    const urls = new UrlBatch(
      ctx.downloadUrls,
      batch.map(([h]) => h),
    );
    await Promise.all(
      batch.map(([hash, size]) =>
        ctx.limit(async () => {
          if (ctx.signal.aborted) throw new SyncCancelled('agent stopping');
          onChunk(await downloadChunk(ctx, hash, size, urls, counters));
        }),
      ),
    );
  }
}
