/**
 * How many chunk PUTs a push keeps in flight (docs/decisions/cli-push-pipeline.md): chosen from the chunks'
 * sizes rather than a fixed count. A chunk may start while fewer than `maxChunks` are in flight and the
 * bytes in flight stay within `maxBytes`; one chunk alone always may start, whatever its size. So small
 * chunks (most of a typical tree, a few KiB each, where each PUT is mostly a round trip) go up to
 * `maxChunks` at once, while 4 MiB chunks are bounded by bytes (UPLOAD_BYTES_IN_FLIGHT ÷ 4 MiB = 16),
 * which also bounds the memory a push holds (each PUT holds its chunk's bytes).
 * An explicit `--concurrency N` is a plain count: N chunks, whatever their size.
 */

/** Most chunk PUTs in flight when chunks are small (the count cap of the automatic rule). */
export const UPLOAD_CHUNKS_IN_FLIGHT = 32;
/** Most chunk bytes in flight under the automatic rule (64 MiB: sixteen 4 MiB chunks). */
export const UPLOAD_BYTES_IN_FLIGHT = 64 * 1024 * 1024;

/** The limits of an upload window: chunks and bytes (Infinity = no byte bound). */
export interface UploadLimits {
  maxChunks: number;
  maxBytes: number;
}

/**
 * The limits for a push: `concurrency` given (`roost push --concurrency N`) means N chunks, no byte
 * bound; otherwise the automatic rule (UPLOAD_CHUNKS_IN_FLIGHT chunks, UPLOAD_BYTES_IN_FLIGHT bytes).
 * @throws RangeError when `concurrency` is not a positive integer.
 */
export function uploadLimits(concurrency?: number): UploadLimits {
  if (concurrency === undefined) return { maxChunks: UPLOAD_CHUNKS_IN_FLIGHT, maxBytes: UPLOAD_BYTES_IN_FLIGHT };
  if (!Number.isInteger(concurrency) || concurrency < 1) throw new RangeError(`concurrency must be a positive integer, got ${concurrency}`);
  return { maxChunks: concurrency, maxBytes: Infinity };
}

/** Whether a chunk of `size` bytes may start with `chunks` PUTs holding `bytes` bytes in flight. */
export function admits(limits: UploadLimits, inFlight: { chunks: number; bytes: number }, size: number): boolean {
  if (inFlight.chunks === 0) return true;
  return inFlight.chunks < limits.maxChunks && inFlight.bytes + size <= limits.maxBytes;
}

/**
 * How many chunks of these sizes (bytes, in order) the rule lets start at once from an empty window:
 * the effective concurrency the automatic rule chooses for them (reported by the push and the bench).
 */
export function concurrencyFor(limits: UploadLimits, sizes: readonly number[]): number {
  const inFlight = { chunks: 0, bytes: 0 };
  for (const size of sizes) {
    if (!admits(limits, inFlight, size)) break;
    inFlight.chunks += 1;
    inFlight.bytes += size;
  }
  return inFlight.chunks;
}

/**
 * A window over chunk PUTs: `run(size, fn, key)` waits until `admits` lets a chunk of `size` bytes start,
 * runs `fn`, and frees its place when `fn` settles. Queued chunks start in the order they were queued, or,
 * with `order: 'key'`, in ascending `key` order (ties in queueing order): `push()` keys chunks by hash so
 * they finish roughly in hash order and a finished hash range can be confirmed while the rest uploads
 * (docs/decisions/cli-push-pipeline.md). The head of the queue is never overtaken by a later chunk that
 * would fit, so a large chunk waits only for bytes in flight to drain (and, in key order, for chunks
 * queued later with smaller keys, finitely many per push). `clear()` rejects every queued chunk with
 * `reason` (in-flight ones run on).
 */
export class UploadWindow {
  private chunks = 0;
  private bytes = 0;
  private readonly queue: { size: number; key: string; start: () => void; fail: (err: unknown) => void }[] = [];
  /** Most chunks seen in flight at once, and most bytes (for reports and tests). */
  peakChunks = 0;
  peakBytes = 0;

  constructor(
    readonly limits: UploadLimits,
    readonly order: 'fifo' | 'key' = 'fifo',
  ) {}

  /** Chunks queued and not yet started. */
  get queued(): number {
    return this.queue.length;
  }

  /** Chunks and bytes in flight now. */
  get inFlight(): { chunks: number; bytes: number } {
    return { chunks: this.chunks, bytes: this.bytes };
  }

  /** `key`: where the chunk queues under `order: 'key'` (ignored in FIFO order). */
  async run<T>(size: number, fn: () => Promise<T>, key = ''): Promise<T> {
    if (this.queue.length > 0 || !admits(this.limits, this.inFlight, size)) {
      await new Promise<void>((start, fail) => this.enqueue({ size, key, start, fail }));
    } else this.take(size);
    try {
      return await fn();
    } finally {
      this.chunks -= 1;
      this.bytes -= size;
      this.drain();
    }
  }

  clear(reason: unknown): void {
    for (const q of this.queue.splice(0)) q.fail(reason);
  }

  private enqueue(item: (typeof this.queue)[number]): void {
    if (this.order === 'fifo') {
      this.queue.push(item);
      return;
    }
    // Binary search for the first queued key greater than this one (equal keys keep queueing order).
    let lo = 0;
    let hi = this.queue.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.queue[mid].key <= item.key) lo = mid + 1;
      else hi = mid;
    }
    this.queue.splice(lo, 0, item);
  }

  private take(size: number): void {
    this.chunks += 1;
    this.bytes += size;
    this.peakChunks = Math.max(this.peakChunks, this.chunks);
    this.peakBytes = Math.max(this.peakBytes, this.bytes);
  }

  private drain(): void {
    while (this.queue.length > 0 && admits(this.limits, this.inFlight, this.queue[0].size)) {
      const q = this.queue.shift()!;
      this.take(q.size);
      q.start();
    }
  }
}
