/**
 * Chunk hashing on every core (docs/benchmarks.md "Hashing"): a pool of worker threads, each reading
 * files with synchronous reads of READ_BLOCK bytes into one reused buffer and feeding every block to the
 * running SHA-256 of its 4 MiB chunk, so hashing is bounded by the CPU's SHA-256 speed times the cores
 * rather than by one thread's event loop. A block small enough to stay in the core's L2 cache is hashed
 * while still there (a whole 4 MiB chunk read first is written to memory and read back). The main thread
 * only hands out batches of files and collects chunk lists; progress comes back at most once per 4 MiB.
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

/** What a worker found for one file: its chunks and the bytes it read, or the read error. */
export type HashOutcome = { chunks: ChunkRef[]; total: number } | { error: string; code?: string };

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
parentPort.on('message', (batch) => {
  const results = batch.files.map((f) => {
    try {
      return hashFile(f.absPath);
    } catch (err) {
      return { error: String((err && err.message) || err), code: err && err.code };
    }
  });
  if (pending > 0) parentPort.postMessage({ progress: pending });
  pending = 0;
  parentPort.postMessage({ id: batch.id, results });
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
 * soon as its batch is back (batches finish out of job order). Read errors come back per file (never
 * thrown); the pool itself throws only when a worker dies or a callback throws.
 */
export async function hashFiles(
  jobs: readonly HashJob[],
  opts: {
    threads: number;
    onBytes?: (n: number) => void;
    onFile?: () => void;
    onOutcome?: (index: number, outcome: HashOutcome) => void;
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
              worker.postMessage({ id, files: batches[id].map((i) => ({ absPath: jobs[i].absPath })) });
            };
            worker.on('message', (m: { progress?: number; id?: number; results?: HashOutcome[] }) => {
              try {
                if (m.progress !== undefined) return opts.onBytes?.(m.progress);
                const batch = batches[m.id as number];
                send();
                (m.results ?? []).forEach((r, k) => {
                  outcomes[batch[k]] = r;
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
