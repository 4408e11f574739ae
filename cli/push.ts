/**
 * The push pipeline (docs/contract.md Chunks "Upload flow": check, then upload-urls for the missing hashes, then
 * PUT each, then publish; "Roost versions" POST /api/roosts/{roostId}/versions).
 *
 * `push()` runs the stages overlapped, not one after the other (docs/decisions/cli-push-pipeline.md):
 * 1. hash: walk and chunk the tree (cli/chunker.ts, worker threads), each file's chunks handed on as soon
 *    as its hashing batch is back;
 * 2. check: new distinct hashes go to `POST /api/chunks/check` in batches of at most 1000, a batch sent
 *    as soon as 1000 are waiting or nothing else is in flight or queued;
 * 3. upload: each check answer's missing hashes get their signed URLs at once (`POST
 *    /api/chunks/upload-urls`), and their PUTs join one upload window (cli/upload-window.ts: up to 32
 *    small chunks or 64 MiB in flight, or exactly `concurrency` chunks when given), each chunk re-read
 *    from its file at its offset and re-verified, except small files whose bytes the hashing thread
 *    handed over (CARRY_MAX_BYTES); an expired or refused URL (403) is re-issued once;
 * 4. publish: once every PUT is done, one Idempotency-Key for the whole push, reused on every retry. A
 *    412 precondition_failed naming missingChunks (say a chunk vanished between check and publish)
 *    uploads those and publishes again (at most 3 publish attempts).
 * The first failure that survives its retries ends the push: PUTs in flight are aborted, queued ones
 * never start, hashing stops. Each stage is also exported (findMissing, uploadChunks, publishScan) for
 * callers that drive them one after another.
 * Errors: ClientError from the API (problem code/status/detail), ChunkerError from the tree.
 */
import type { Tick } from './progress';
import { performance } from 'node:perf_hooks';
import { setMaxListeners } from 'node:events';
import { type ChunkLocation, type ScanResult, type SkippedEntry, SYNC_READ_MAX, readChunk, scanTree } from './chunker';
import type { CarryBudget } from './hash-pool';
import { UploadWindow, uploadLimits } from './upload-window';
import { ClientError, type RoostClient, newIdempotencyKey, seg } from './client';
import { computeVersionId, type VersionBody } from '../domain/version';

/** Most hashes per chunk check or upload-urls call (docs/contract.md Limits). */
export const HASH_BATCH = 1000;

/** Files read and hashed at once during the hash stage. */
export const HASH_FILES_IN_FLIGHT = 8;

/**
 * Fewest chunks a push uploads before it confirms finished hash ranges ahead of publish (see
 * `confirmBatchSize`): below this, publish's own storage lookup is cheap (a few hundred HEADs at most).
 */
export const CONFIRM_MIN_UPLOADS = 512;

/**
 * How many uploaded chunks one early confirmation (`POST /api/chunks/check` of chunks already PUT, which
 * records them, docs/contract.md Chunks) carries, for a push uploading `uploads` chunks: about an eighth of
 * them, at least 256 (well above the count from which the server lists storage rather than reading each
 * blob, services/chunks.ts LIST_MIN_UNKNOWN), at most 1000 (the batch limit); 0 (no early confirmation)
 * below CONFIRM_MIN_UPLOADS.
 */
export function confirmBatchSize(uploads: number): number {
  if (uploads < CONFIRM_MIN_UPLOADS) return 0;
  return Math.min(HASH_BATCH, Math.max(256, Math.ceil(uploads / 8)));
}

/**
 * Most bytes of small files (each at most SYNC_READ_MAX) a push holds from hashing to their PUT: their
 * hashing thread hands their content over (cli/hash-pool.ts CarryBudget), so the upload neither opens
 * nor reads nor re-hashes them again. Beyond this, chunks are read back from their files as before.
 */
export const CARRY_MAX_BYTES = 64 * 1024 * 1024;

/** Per-attempt limit of the publish call: a cold publish of a large tree checks every new chunk's stored size (minutes for 10^4 chunks). */
export const PUBLISH_TIMEOUT_MS = 15 * 60_000;
/** Publish attempts after 412 precondition_failed with missingChunks. */
const MISSING_CHUNK_ROUNDS = 3;

export type PushStage = 'hash' | 'check' | 'upload' | 'publish';

/**
 * One progress tick. `done`/`total` count bytes for hash and upload, hashes for check, 0..1 for publish.
 * Stages overlap in `push()`, so ticks of different stages interleave; a stage's `total` may still grow
 * until a tick says `final` (hash: from the start; check: once hashing ended; upload: once every check
 * batch is answered).
 */
export interface PushProgress {
  stage: PushStage;
  done: number;
  total: number;
  /** `total` will not grow any more (absent: true). */
  final?: boolean;
  /** Stage-specific figures (files hashed, chunks uploaded, …). */
  detail?: Record<string, number>;
}

/** A push tick as the progress display (cli/progress.ts) takes it: hash and upload count bytes, the others items. */
export function pushTick(p: PushProgress): Tick {
  return { stage: p.stage, done: p.done, total: p.total, final: p.final ?? true, bytes: p.stage === 'hash' || p.stage === 'upload' };
}

export interface PushOptions {
  client: RoostClient;
  siteId: string;
  roostId: string;
  /** Root folder of the tree to publish. */
  dir: string;
  /**
   * Chunk uploads in flight at once. Default: chosen from the chunks' sizes (cli/upload-window.ts: up
   * to 32 small chunks, 64 MiB of 4 MiB ones).
   */
  concurrency?: number;
  onProgress?: (p: PushProgress) => void;
  /** Version description (max 500 chars, docs/contract.md Limits). */
  description?: string;
  /** Publish only if the roost's current version is still this id (412 version_stale otherwise). */
  expectedCurrentVersionId?: string;
  /** Replaces the default producer config of the body (tests pin createdAt with it). */
  config?: Record<string, unknown>;
  /** Idempotency-Key of the publish (default: a fresh one per push). */
  idempotencyKey?: string;
  /** Most bytes of small files held from hashing to their PUT (default CARRY_MAX_BYTES; 0: none, every chunk is read back). */
  carryMaxBytes?: number;
}

/** Publish response fields (docs/contract.md: 201 versionId, versionNumber, currentVersionId, previousVersionId). */
export interface PublishResponse {
  versionId: string;
  versionNumber: number;
  currentVersionId: string;
  previousVersionId: string | null;
}

export interface PushResult {
  roostId: string;
  siteId: string;
  versionId: string;
  versionNumber: number;
  previousVersionId: string | null;
  filesTotal: number;
  bytesTotal: number;
  /** Distinct chunks the version references. */
  chunksTotal: number;
  /** Chunks PUT to storage by this push. */
  chunksUploaded: number;
  /** Chunks the site already held (not uploaded). */
  chunksSkipped: number;
  bytesUploaded: number;
  /** Entries left out of the version (symlinks, sockets, …). */
  skipped: SkippedEntry[];
  /** True when the server answered the publish from its idempotency cache. */
  replayed: boolean;
  /**
   * Wall time per stage in ms: how long the stage had work in flight. Stages overlap, so these add up
   * to more than `wallMs`.
   */
  timings: Record<PushStage, number>;
  /** When each stage first had work in flight and when its last work ended, ms since the push started. */
  stageSpansMs: StageTimer['spans'];
  /** Wall time of the whole push in ms. */
  wallMs: number;
  /** Uploaded chunks confirmed (recorded by the server) while later ones still uploaded, before publish. */
  chunksConfirmedEarly: number;
  /** Chunks PUT from the bytes their hashing thread handed over, not read back from their files (CARRY_MAX_BYTES). */
  chunksCarried: number;
  /** Most chunk PUTs in flight at once, and the limits the upload window ran with. */
  upload: { peakInFlight: number; maxChunks: number; maxBytes: number | null };
  /** The version body that was published (its JCS SHA-256 is versionId). */
  body: VersionBody;
}

function batches<T>(items: T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

interface UploadUrlsResponse {
  urls: Record<string, string>;
  expiresAt?: string;
}

/**
 * Accumulates per-stage wall time (ms) as the union of the stage's busy intervals: overlapping runs of
 * one stage (parallel PUTs) count once.
 */
export class StageTimer {
  readonly timings: Record<PushStage, number> = { hash: 0, check: 0, upload: 0, publish: 0 };
  /** Per stage that ran: when its first run started and its last run ended, in ms since `origin`. */
  readonly spans: Partial<Record<PushStage, { startMs: number; endMs: number }>> = {};
  private readonly active: Record<PushStage, number> = { hash: 0, check: 0, upload: 0, publish: 0 };
  private readonly since: Record<PushStage, number> = { hash: 0, check: 0, upload: 0, publish: 0 };
  /** `origin`: performance.now() at the start of the push. */
  constructor(private readonly origin = performance.now()) {}
  async run<T>(stage: PushStage, fn: () => Promise<T>): Promise<T> {
    if (this.active[stage]++ === 0) this.since[stage] = performance.now();
    this.spans[stage] ??= { startMs: Math.round(this.since[stage] - this.origin), endMs: 0 };
    try {
      return await fn();
    } finally {
      const t = performance.now();
      if (--this.active[stage] === 0) this.timings[stage] += Math.round(t - this.since[stage]);
      this.spans[stage]!.endMs = Math.round(t - this.origin);
    }
  }
}

/** What the upload and publish stages share. */
export interface StageContext {
  client: RoostClient;
  siteId: string;
  scan: ScanResult;
  /** Chunk uploads in flight at once (default: chosen from chunk sizes, cli/upload-window.ts). */
  concurrency?: number;
  onProgress?: (p: PushProgress) => void;
}

/**
 * Check stage: which of the scan's distinct chunks the site lacks (`POST /api/chunks/check`, batches of
 * at most 1000). Returns them in path order. @throws ClientError
 */
export async function findMissing(ctx: StageContext): Promise<string[]> {
  const all = [...ctx.scan.locations.keys()];
  const progress = ctx.onProgress ?? (() => undefined);
  const found = new Set<string>();
  let done = 0;
  progress({ stage: 'check', done, total: all.length });
  for (const batch of batches(all, HASH_BATCH)) {
    const res = await ctx.client.post<{ missing: string[] }>(
      '/api/chunks/check',
      { siteId: ctx.siteId, hashes: batch },
      { retrySafe: true },
    );
    for (const h of res.missing ?? []) if (ctx.scan.locations.has(h)) found.add(h);
    done += batch.length;
    progress({ stage: 'check', done, total: all.length });
  }
  return all.filter((h) => found.has(h));
}

/** Upload stage result: the chunks PUT and their bytes. */
export interface UploadTally {
  uploaded: Set<string>;
  bytes: number;
}

/**
 * PUTs one chunk to its signed URL, its bytes re-read from the file (and re-verified). A 403 from
 * storage re-signs that URL once. Resolves 'exists' when storage already holds the chunk (the
 * create-only URL is refused). @throws ClientError, ChunkerError (a file changed since hashing)
 */
async function putChunk(
  client: RoostClient,
  siteId: string,
  loc: ChunkLocation,
  hash: string,
  url: string | undefined,
  signal: AbortSignal,
): Promise<'created' | 'exists'> {
  signal.throwIfAborted();
  if (!url) throw new Error(`the server issued no upload URL for chunk ${hash}`);
  const bytes = await readChunk(loc, hash);
  signal.throwIfAborted();
  try {
    return await client.putBlob(url, bytes, { signal });
  } catch (err) {
    if (!(err instanceof ClientError) || err.code !== 'upload_forbidden') throw err;
    const fresh = await client.post<UploadUrlsResponse>('/api/chunks/upload-urls', { siteId, hashes: [hash] }, { retrySafe: true });
    const again = fresh.urls?.[hash];
    if (!again) throw err;
    return client.putBlob(again, bytes, { signal });
  }
}

/**
 * Upload stage on its own: signed URLs per batch of at most 1000, then one PUT per chunk through an
 * upload window (cli/upload-window.ts), its bytes re-read from the file (and re-verified). A 403 from
 * storage re-signs that URL once; a chunk storage already holds (the create-only URL is refused)
 * counts as stored, not uploaded. The first failure that survives its retries ends the stage: PUTs in
 * flight are aborted and queued ones never start. Adds to `tally`.
 * @throws ClientError, ChunkerError (a file changed since hashing)
 */
export async function uploadChunks(
  ctx: StageContext,
  hashes: string[],
  tally: UploadTally = { uploaded: new Set(), bytes: 0 },
): Promise<UploadTally> {
  const { client, siteId, scan } = ctx;
  const progress = ctx.onProgress ?? (() => undefined);
  const total = hashes.reduce((n, h) => n + (scan.locations.get(h)?.size ?? 0), 0);
  let done = 0;
  let chunksDone = 0;
  progress({ stage: 'upload', done, total, detail: { chunksDone, chunksTotal: hashes.length } });
  const window = new UploadWindow(uploadLimits(ctx.concurrency));
  const stop = new AbortController();
  setMaxListeners(0, stop.signal); // every PUT in flight listens for it (cli/client.ts putBlob)
  const upload = async (hash: string, urls: Record<string, string> | undefined): Promise<void> => {
    const loc = scan.locations.get(hash) as ChunkLocation;
    const put = await putChunk(client, siteId, loc, hash, urls?.[hash], stop.signal);
    // 'exists': storage holds the chunk already (create-only URL); publish checks it like any other.
    if (put === 'created') {
      tally.uploaded.add(hash);
      tally.bytes += loc.size;
    }
    done += loc.size;
    chunksDone += 1;
    progress({ stage: 'upload', done, total, detail: { chunksDone, chunksTotal: hashes.length } });
  };
  try {
    for (const batch of batches(hashes, HASH_BATCH)) {
      const { urls } = await client.post<UploadUrlsResponse>('/api/chunks/upload-urls', { siteId, hashes: batch }, { retrySafe: true });
      await Promise.all(
        batch.map((hash) =>
          window
            .run(scan.locations.get(hash)?.size ?? 0, () => upload(hash, urls))
            .catch((err: unknown) => {
              if (!stop.signal.aborted) stop.abort(err);
              window.clear(stop.signal.reason);
              throw err;
            }),
        ),
      );
    }
  } catch (err) {
    // The first failure, not an abort echoed by the uploads it cancelled.
    throw stop.signal.aborted ? stop.signal.reason : err;
  }
  return tally;
}

export interface PublishOptions extends StageContext {
  roostId: string;
  description?: string;
  expectedCurrentVersionId?: string;
  /** Default: a fresh key; the same key is used for every attempt and recovery round. */
  idempotencyKey?: string;
  /** Receives the uploads of recovery rounds (default: a fresh tally). */
  tally?: UploadTally;
}

/**
 * Publish stage: `POST /api/roosts/{roostId}/versions` with one Idempotency-Key. On 412
 * precondition_failed whose missingChunks are all chunks of this scan, uploads them and publishes again
 * (at most 3 publish attempts). Checks that the returned versionId is the body's JCS SHA-256.
 * @throws ClientError (any other refusal, or missing chunks this scan cannot supply), Error on an id mismatch
 */
export async function publishScan(
  opts: PublishOptions,
  timer: StageTimer = new StageTimer(),
): Promise<{ response: PublishResponse; replayed: boolean; tally: UploadTally }> {
  const { client, siteId, roostId, scan } = opts;
  const progress = opts.onProgress ?? (() => undefined);
  const tally = opts.tally ?? { uploaded: new Set<string>(), bytes: 0 };
  const idempotencyKey = opts.idempotencyKey ?? newIdempotencyKey();
  const body: Record<string, unknown> = { siteId, version: scan.body };
  if (opts.description !== undefined) body.description = opts.description;
  if (opts.expectedCurrentVersionId !== undefined) body.expectedCurrentVersionId = opts.expectedCurrentVersionId;
  progress({ stage: 'publish', done: 0, total: 1 });
  let published: { body: PublishResponse; replayed: boolean } | undefined;
  for (let round = 0; !published; round++) {
    try {
      published = await timer.run('publish', () =>
        client.request<PublishResponse>('POST', `/api/roosts/${seg(roostId)}/versions`, {
          body,
          idempotencyKey,
          timeoutMs: PUBLISH_TIMEOUT_MS,
        }),
      );
    } catch (err) {
      const lacking = err instanceof ClientError && err.code === 'precondition_failed' ? (err.body.missingChunks as unknown) : undefined;
      if (round + 1 >= MISSING_CHUNK_ROUNDS || !Array.isArray(lacking) || lacking.length === 0) throw err;
      const ours = lacking.filter((h): h is string => typeof h === 'string' && scan.locations.has(h));
      if (ours.length !== lacking.length) throw err;
      await timer.run('upload', () => uploadChunks(opts, ours, tally));
      progress({ stage: 'publish', done: 0, total: 1 });
    }
  }
  progress({ stage: 'publish', done: 1, total: 1 });
  const expected = computeVersionId(scan.body);
  if (published.body.versionId !== expected) {
    throw new Error(`the server published version ${published.body.versionId}, but the body sent hashes to ${expected}`);
  }
  return { response: published.body, replayed: published.replayed, tally };
}

/**
 * Runs the whole pipeline (hash, check, upload overlapped; then publish) and returns what it did.
 * The version body, the chunks uploaded and the published version are the same as running the stages
 * one after another. @throws ClientError (API refusals: scope, 404, 412 version_stale, quota…),
 * ChunkerError (unusable tree), Error when the server's version id is not the SHA-256 of the canonical
 * body sent.
 */
export async function push(opts: PushOptions): Promise<PushResult> {
  const { client, siteId, roostId } = opts;
  const progress = opts.onProgress ?? (() => undefined);
  const t0 = performance.now();
  const timer = new StageTimer(t0);
  const window = new UploadWindow(uploadLimits(opts.concurrency), 'key');
  const tally: UploadTally = { uploaded: new Set(), bytes: 0 };
  // The first failure ends everything: hashing (onEntry throws), queued PUTs, PUTs in flight.
  const stop = new AbortController();
  // Every PUT in flight listens for it (cli/client.ts putBlob), up to the window's count.
  setMaxListeners(0, stop.signal);
  const fail = (err: unknown): void => {
    if (!stop.signal.aborted) stop.abort(err);
    window.clear(stop.signal.reason);
  };

  /** Distinct chunks in hashing-completion order, where their bytes are, and what is waiting for a check. */
  const seen = new Map<string, ChunkLocation>();
  /** Small files' bytes held from hashing until their chunk is stored or known to the site (CARRY_MAX_BYTES). */
  let carried = 0;
  let chunksCarried = 0;
  const carryMax = opts.carryMaxBytes ?? CARRY_MAX_BYTES;
  const carry: CarryBudget = {
    maxFileBytes: SYNC_READ_MAX,
    take: (n) => {
      if (carried + n > carryMax) return false;
      carried += n;
      return true;
    },
  };
  const letGo = (loc: ChunkLocation): void => {
    if (!loc.bytes) return;
    carried -= loc.bytes.length;
    loc.bytes = undefined;
  };
  let waiting: string[] = [];
  let hashingDone = false;
  let requestsInFlight = 0;
  const tasks: Promise<void>[] = [];
  const c = { checked: 0, checkBatchesOpen: 0, upTotal: 0, upChunksTotal: 0, upDone: 0, upChunksDone: 0 };
  const checkTick = () => progress({ stage: 'check', done: c.checked, total: seen.size, final: hashingDone });
  const uploadTick = () =>
    progress({
      stage: 'upload',
      done: c.upDone,
      total: c.upTotal,
      final: hashingDone && c.checkBatchesOpen === 0 && waiting.length === 0,
      detail: { chunksDone: c.upChunksDone, chunksTotal: c.upChunksTotal },
    });

  /**
   * Early confirmation (docs/decisions/cli-push-pipeline.md): chunks upload in hash order (the window is
   * keyed by hash), so hash ranges finish one after another while later ones upload. Once every chunk to
   * upload is known, each finished range's chunks go to `POST /api/chunks/check` (the server finds them
   * in storage by listing only that range, and records them), so publish no longer has to look the whole
   * push up in storage after the last PUT; the last range is left to publish itself. Ranges are the 256
   * two-hex-digit hash prefixes; a call carries at least `confirmBatchSize` chunks and at most HASH_BATCH,
   * and ends where a first hex digit does whenever the batch limit allows. A failed confirmation costs
   * nothing but that saving (publish checks every chunk anyway), so its error is dropped.
   */
  const range = (hash: string): number => parseInt(hash.slice(0, 2), 16);
  const rangePending = new Int32Array(256);
  const rangeUploaded: string[][] = Array.from({ length: 256 }, () => []);
  let nextRange = 0;
  let confirmBuffer: string[] = [];
  let confirmedEarly = 0;
  const confirmations: Promise<void>[] = [];
  const uploadsKnown = () => hashingDone && c.checkBatchesOpen === 0 && waiting.length === 0;
  const sendConfirmation = (hashes: string[]): void => {
    confirmations.push(
      timer
        .run('publish', () => client.post<{ missing: string[] }>('/api/chunks/check', { siteId, hashes }, { retrySafe: true }))
        .then(
          (res) => {
            confirmedEarly += hashes.length - (res.missing?.length ?? 0);
          },
          () => undefined,
        ),
    );
  };
  const confirmFinishedRanges = (): void => {
    if (!uploadsKnown() || stop.signal.aborted) return;
    const size = confirmBatchSize(c.upChunksTotal);
    if (size === 0) return;
    while (nextRange < 256 && rangePending[nextRange] === 0) {
      const hashes = rangeUploaded[nextRange++].sort();
      if (confirmBuffer.length > 0 && confirmBuffer.length + hashes.length > HASH_BATCH) {
        sendConfirmation(confirmBuffer);
        confirmBuffer = [];
      }
      confirmBuffer.push(...hashes);
      if (nextRange === 256) break; // the last range: publish looks it up itself, right after its PUTs
      // A call leaves at the end of a group of 16 ranges (one first hex digit): the server lists a wider set
      // of hashes a whole first digit at a time (storage/blob.ts chunkListingPrefixes), so a call that
      // ended inside a group would have that group listed again by the next call.
      if (nextRange % 16 === 0 && confirmBuffer.length >= size) {
        sendConfirmation(confirmBuffer);
        confirmBuffer = [];
      }
      while (confirmBuffer.length > HASH_BATCH) {
        sendConfirmation(confirmBuffer.slice(0, HASH_BATCH));
        confirmBuffer = confirmBuffer.slice(HASH_BATCH);
      }
    }
  };

  /** One check batch, then its missing chunks' URLs, then their PUTs through the window (in hash order). */
  const checkAndUpload = async (batch: string[]): Promise<void> => {
    let missing: string[];
    let urls: Record<string, string>;
    requestsInFlight += 1;
    try {
      const res = await timer.run('check', () =>
        client.post<{ missing: string[] }>('/api/chunks/check', { siteId, hashes: batch }, { retrySafe: true }),
      );
      const lacking = new Set(res.missing ?? []);
      missing = batch.filter((h) => lacking.has(h)).sort();
      for (const h of batch) if (!lacking.has(h)) letGo(seen.get(h)!);
      c.checked += batch.length;
      checkTick();
      urls = missing.length
        ? (
            await timer.run('upload', () =>
              client.post<UploadUrlsResponse>('/api/chunks/upload-urls', { siteId, hashes: missing }, { retrySafe: true }),
            )
          ).urls
        : {};
      for (const h of missing) {
        c.upTotal += seen.get(h)!.size;
        rangePending[range(h)] += 1;
      }
      c.upChunksTotal += missing.length;
    } finally {
      requestsInFlight -= 1;
      c.checkBatchesOpen -= 1;
    }
    uploadTick();
    sendChecks();
    confirmFinishedRanges();
    // Settled, not all: the push returns (or throws) only once none of its PUTs is still running.
    const puts = await Promise.allSettled(
      missing.map((hash) => {
        const loc = seen.get(hash)!;
        return window
          .run(
            loc.size,
            async () => {
              const fromCarry = loc.bytes !== undefined;
              const put = await timer.run('upload', () => putChunk(client, siteId, loc, hash, urls[hash], stop.signal));
              if (fromCarry) chunksCarried += 1;
              letGo(loc);
              if (put === 'created') {
                tally.uploaded.add(hash);
                tally.bytes += loc.size;
              }
              c.upDone += loc.size;
              c.upChunksDone += 1;
              rangeUploaded[range(hash)].push(hash);
              rangePending[range(hash)] -= 1;
              uploadTick();
              confirmFinishedRanges();
            },
            hash,
          )
          .catch((err: unknown) => {
            fail(err); // at once: PUTs in flight are aborted, queued ones never start
            throw err;
          });
      }),
    );
    const failed = puts.find((p) => p.status === 'rejected');
    if (failed) throw failed.reason;
  };

  /** Sends full batches, and a partial one when the pipeline would otherwise idle (or hashing ended). */
  const sendChecks = (): void => {
    let sent = false;
    while (waiting.length >= HASH_BATCH || (waiting.length > 0 && (hashingDone || (requestsInFlight === 0 && window.queued === 0)))) {
      if (stop.signal.aborted) return;
      const batch = waiting.slice(0, HASH_BATCH);
      waiting = waiting.slice(HASH_BATCH);
      c.checkBatchesOpen += 1;
      tasks.push(checkAndUpload(batch).catch((err: unknown) => fail(err)));
      sent = true;
    }
    // The check stage is under way from its first batch on, not only from the first answer.
    if (sent) checkTick();
  };

  let scan: ScanResult | undefined;
  try {
    scan = await timer.run('hash', () =>
      scanTree(opts.dir, {
        config: opts.config,
        // 8 files hashed at once on the main thread (small trees): measured 235–254 MB/s against 132–155 MB/s with 2 (docs/benchmarks.md).
        concurrency: HASH_FILES_IN_FLIGHT,
        onProgress: (p) =>
          progress({
            stage: 'hash',
            done: p.bytesDone,
            total: p.bytesTotal,
            final: true,
            detail: { filesDone: p.filesDone, filesTotal: p.filesTotal },
          }),
        carry,
        onEntry: (file, entry, bytes) => {
          stop.signal.throwIfAborted();
          let offset = 0;
          for (const ch of entry.chunks) {
            if (!seen.has(ch.hash)) {
              seen.set(ch.hash, { absPath: file.absPath, offset, size: ch.size, bytes });
              waiting.push(ch.hash);
            } else if (bytes) {
              carried -= bytes.length; // a duplicate of a chunk already seen: its bytes are not needed
            }
            offset += ch.size;
          }
          sendChecks();
        },
      }),
    );
  } catch (err) {
    fail(err);
  }
  hashingDone = true;
  if (!stop.signal.aborted) {
    checkTick();
    sendChecks();
    confirmFinishedRanges();
  }
  // Tasks catch their own errors into fail(); a batch can still add PUTs to its own task, never new tasks.
  await Promise.all(tasks);
  // Confirmations never reject; publish waits for them so the server records each chunk once.
  await Promise.all(confirmations);
  if (stop.signal.aborted) throw stop.signal.reason;
  uploadTick();
  const ctx: StageContext = { client, siteId, scan: scan!, concurrency: opts.concurrency, onProgress: opts.onProgress };
  const published = await publishScan(
    {
      ...ctx,
      roostId,
      description: opts.description,
      expectedCurrentVersionId: opts.expectedCurrentVersionId,
      idempotencyKey: opts.idempotencyKey,
      tally,
    },
    timer,
  );
  const chunksTotal = scan!.locations.size;
  const res = published.response;
  return {
    roostId,
    siteId,
    versionId: res.versionId,
    versionNumber: res.versionNumber,
    previousVersionId: res.previousVersionId ?? null,
    filesTotal: scan!.body.files.length,
    bytesTotal: scan!.bytesTotal,
    chunksTotal,
    chunksUploaded: tally.uploaded.size,
    chunksSkipped: chunksTotal - tally.uploaded.size,
    bytesUploaded: tally.bytes,
    skipped: scan!.skipped,
    replayed: published.replayed,
    timings: timer.timings,
    stageSpansMs: timer.spans,
    wallMs: Math.round(performance.now() - t0),
    chunksConfirmedEarly: confirmedEarly,
    chunksCarried,
    upload: {
      peakInFlight: window.peakChunks,
      maxChunks: window.limits.maxChunks,
      maxBytes: Number.isFinite(window.limits.maxBytes) ? window.limits.maxBytes : null,
    },
    body: scan!.body,
  };
}
