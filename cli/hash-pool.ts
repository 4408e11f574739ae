/**
 * Chunk hashing on every core (docs/benchmarks.md "Hashing"): a pool of worker threads, each reading
 * files with synchronous reads of READ_BLOCK bytes into one reused buffer and feeding every block to the
 * running SHA-256 of its 4 MiB chunk, so hashing is bounded by the CPU's SHA-256 speed times the cores
 * rather than by one thread's event loop. A block small enough to stay in the core's L2 cache is hashed
 * while still there (a whole 4 MiB chunk read first is written to memory and read back). The main thread
 * only hands out batches of files and collects chunk lists; progress comes back at most once per 4 MiB.
 * A caller that will upload the chunks can ask for small files' bytes too (`carry`): such a file is read
 * into a buffer of its own, hashed from it and handed over with its chunk list (the buffer transferred,
 * not copied), so the upload need not open and read the file a second time (cli/push.ts).
 *
 * The worker is plain JavaScript over Node built-ins, started from source (`eval`), so it runs the same
 * under tsx, Jest and the packaged single-file executable, where no separate worker file exists.
 */
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import { CHUNK_SIZE, type ChunkRef } from '../domain/version';

/** Bytes per read (256 KiB): one reused buffer per thread, hashed while it is still in the L2 cache. */
export const READ_BLOCK = 256 * 1024;

/** One file to hash: absolute path and the size the walk saw (bytes). */
export interface HashJob {
  absPath: string;
  size: number;
}

/**
 * What a worker found for one file: its chunks and the bytes it read (`total`), or the read error.
 * `bytes`: the file's content, when its batch carried bytes (`CarryBudget`) and the file was small enough.
 */
export type HashOutcome = { chunks: ChunkRef[]; total: number; bytes?: Uint8Array } | { error: string; code?: string };

/**
 * Which files' bytes come back with their chunk lists: files of 1..`maxFileBytes` bytes (at most one
 * chunk), in batches for which `take(bytes)` agreed to hold their sizes' sum. The caller keeps the count
 * and lowers it as it lets the buffers go; a batch it refuses is hashed without carrying.
 */
export interface CarryBudget {
  maxFileBytes: number;
  take(bytes: number): boolean;
}

const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const fs = require('node:fs');
const CHUNK = ${CHUNK_SIZE};
const BLOCK = ${READ_BLOCK};
const PROGRESS_EVERY = ${CHUNK_SIZE};
const buf = Buffer.allocUnsafe(BLOCK);
let pending = 0;
function hashFile(absPath) {
  const fd = fs.openSync(absPath, 'r');
  try {
    const chunks = [];
    let total = 0;
    for (;;) {
      const hash = createHash('sha256');
      let got = 0;
      while (got < CHUNK) {
        const n = fs.readSync(fd, buf, 0, Math.min(BLOCK, CHUNK - got), null);
        if (n === 0) break;
        hash.update(n === BLOCK ? buf : buf.subarray(0, n));
        got += n;
      }
      if (got === 0) break;
      chunks.push({ hash: hash.digest('hex'), size: got });
      total += got;
      pending += got;
      if (pending >= PROGRESS_EVERY) {
        parentPort.postMessage({ progress: pending });
        pending = 0;
      }
      if (got < CHUNK) break;
    }
    return { chunks, total };
  } finally {
    fs.closeSync(fd);
  }
}
// A small file carried whole: read into a buffer of its own (transferred to the main thread afterwards),
// then one probe read into the shared buffer so a file that grew since the walk shows in total.
function carryFile(absPath, size) {
  const fd = fs.openSync(absPath, 'r');
  try {
    const bytes = new Uint8Array(size);
    let got = 0;
    while (got < size) {
      const n = fs.readSync(fd, bytes, got, size - got, null);
      if (n === 0) break;
      got += n;
    }
    const extra = got === size ? fs.readSync(fd, buf, 0, 1, null) : 0;
    pending += got;
    const chunks = got > 0 ? [{ hash: createHash('sha256').update(bytes.subarray(0, got)).digest('hex'), size: got }] : [];
    return { chunks, total: got + extra, bytes: got === size && extra === 0 ? bytes : undefined };
  } finally {
    fs.closeSync(fd);
  }
}
parentPort.on('message', (batch) => {
  const transfer = [];
  const results = batch.files.map((f) => {
    try {
      if (!f.carry) return hashFile(f.absPath);
      const r = carryFile(f.absPath, f.size);
      if (r.bytes) transfer.push(r.bytes.buffer);
      return r;
    } catch (err) {
      return { error: String((err && err.message) || err), code: err && err.code };
    }
  });
  if (pending > 0) parentPort.postMessage({ progress: pending });
  pending = 0;
  parentPort.postMessage({ id: batch.id, results }, transfer);
});
`;

/**
 * Files per batch at most, and bytes per batch at which a batch is closed: many small files share one
 * message, yet batches stay small enough that the last ones balance across threads and a pipelined
 * push (cli/push.ts) gets its first chunk lists early.
 */
const BATCH_FILES = 64;
const BATCH_BYTES = 8 * 1024 * 1024;

/** Threads a pool uses by default: one per core the process may use. */
export function defaultHashThreads(): number {
  return Math.max(1, os.availableParallelism());
}

/**
 * Hashes `jobs` on `threads` worker threads and returns one outcome per job, in job order.
 * `onBytes` is called with byte counts as they are hashed (at most once per 4 MiB per thread, and at the
 * end of each batch), `onFile` once per finished file, `onOutcome` with each job's index and outcome as
 * soon as its batch is back (batches finish out of job order), with the file's bytes when `carry`
 * holds them (see CarryBudget). Read errors come back per file (never thrown); the pool itself throws
 * only when a worker dies or a callback throws.
 */
export async function hashFiles(
  jobs: readonly HashJob[],
  opts: {
    threads: number;
    onBytes?: (n: number) => void;
    onFile?: () => void;
    onOutcome?: (index: number, outcome: HashOutcome) => void;
    carry?: CarryBudget;
  },
): Promise<HashOutcome[]> {
  const batches: number[][] = [];
  let current: number[] = [];
  let bytes = 0;
  jobs.forEach((job, i) => {
    current.push(i);
    bytes += job.size;
    if (current.length >= BATCH_FILES || bytes >= BATCH_BYTES) {
      batches.push(current);
      current = [];
      bytes = 0;
    }
  });
  if (current.length) batches.push(current);

  const outcomes: HashOutcome[] = new Array<HashOutcome>(jobs.length);
  const threads = Math.max(1, Math.min(opts.threads, batches.length));
  const workers = Array.from({ length: threads }, () => new Worker(WORKER_SOURCE, { eval: true }));
  let next = 0;
  try {
    await Promise.all(
      workers.map(
        (worker) =>
          new Promise<void>((resolve, reject) => {
            const send = () => {
              if (next >= batches.length) return resolve();
              const id = next++;
              const carries = (i: number) =>
                opts.carry !== undefined && jobs[i].size > 0 && jobs[i].size <= Math.min(opts.carry.maxFileBytes, CHUNK_SIZE);
              const carried = batches[id].reduce((n, i) => n + (carries(i) ? jobs[i].size : 0), 0);
              const carry = carried > 0 && opts.carry!.take(carried);
              worker.postMessage({
                id,
                files: batches[id].map((i) => ({ absPath: jobs[i].absPath, size: jobs[i].size, carry: carry && carries(i) })),
              });
            };
            worker.on('message', (m: { progress?: number; id?: number; results?: HashOutcome[] }) => {
              try {
                if (m.progress !== undefined) return opts.onBytes?.(m.progress);
                const batch = batches[m.id as number];
                send();
                (m.results ?? []).forEach((r, k) => {
                  // The bytes go to onOutcome only: the caller decides how long they are held.
                  outcomes[batch[k]] = 'bytes' in r && r.bytes ? { chunks: r.chunks, total: r.total } : r;
                  opts.onFile?.();
                  opts.onOutcome?.(batch[k], r);
                });
              } catch (err) {
                next = batches.length;
                reject(err);
              }
            });
            worker.once('error', reject);
            worker.once('exit', (code) => {
              if (next < batches.length || code !== 0) reject(new Error(`a hashing thread exited with code ${code}`));
            });
            send();
          }),
      ),
    );
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
  return outcomes;
}
