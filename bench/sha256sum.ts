/**
 * Hashing floors, run as child processes over a file list and timed from the first spawn to the last
 * exit; their output is read and counted so a silent failure cannot pass for a fast run:
 * - `sha256sumFiles`: coreutils `sha256sum`, one invocation after another (as many paths as fit
 *   comfortably on a command line);
 * - `opensslFiles`: `openssl dgst -sha256 -r` (OpenSSL's SHA-256, SHA-NI where the CPU has it) on every
 *   core at once: `parallel` invocations pulling small batches from one queue.
 */
import { spawn } from 'node:child_process';
import { now } from './util';

/** Bytes of arguments per sha256sum invocation (well below Linux's ARG_MAX). */
const ARG_BYTES = 96 * 1024;

/** Splits paths into argument lists of at most ARG_BYTES. */
function argBatches(paths: readonly string[]): string[][] {
  const out: string[][] = [];
  let cur: string[] = [];
  let len = 0;
  for (const p of paths) {
    if (cur.length && len + p.length + 1 > ARG_BYTES) {
      out.push(cur);
      cur = [];
      len = 0;
    }
    cur.push(p);
    len += p.length + 1;
  }
  if (cur.length) out.push(cur);
  return out;
}

/** Runs one `cmd args… paths…`; resolves with the number of digest lines printed. */
function runOnce(paths: string[], cmd = 'sha256sum', args: string[] = ['--']): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, [...args, ...paths], { stdio: ['ignore', 'pipe', 'pipe'] });
    let lines = 0;
    let err = '';
    child.stdout.on('data', (b: Buffer) => {
      for (const c of b) if (c === 10) lines++;
    });
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve(lines) : reject(new Error(`${cmd} exited with ${code}: ${err.slice(0, 500)}`))));
  });
}

/**
 * Hashes every path with sha256sum. Resolves with the wall time in ms.
 * @throws when sha256sum fails or prints fewer digests than there are files.
 */
export async function sha256sumFiles(paths: readonly string[]): Promise<number> {
  const t0 = now();
  let digests = 0;
  for (const batch of argBatches(paths)) digests += await runOnce(batch);
  const ms = now() - t0;
  if (digests !== paths.length) throw new Error(`sha256sum printed ${digests} digests for ${paths.length} files`);
  return ms;
}

/** Bytes of file data per openssl batch: small enough that `parallel` queues stay balanced. */
const OPENSSL_BATCH_BYTES = 32 * 1024 * 1024;

/**
 * Hashes every file with `openssl dgst -sha256 -r`, `parallel` processes at once. `files`: path and size
 * in bytes. Resolves with the wall time in ms.
 * @throws when openssl fails or prints fewer digests than there are files.
 */
export async function opensslFiles(files: readonly { path: string; size: number }[], parallel: number): Promise<number> {
  const batches: string[][] = [];
  let cur: string[] = [];
  let bytes = 0;
  let args = 0;
  for (const f of files) {
    if (cur.length && (bytes + f.size > OPENSSL_BATCH_BYTES || args + f.path.length + 1 > ARG_BYTES)) {
      batches.push(cur);
      cur = [];
      bytes = 0;
      args = 0;
    }
    cur.push(f.path);
    bytes += f.size;
    args += f.path.length + 1;
  }
  if (cur.length) batches.push(cur);
  const t0 = now();
  let digests = 0;
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.max(1, parallel) }, async () => {
      while (next < batches.length) {
        const printed = await runOnce(batches[next++], 'openssl', ['dgst', '-sha256', '-r']);
        digests += printed; // after the await: `digests += await …` would read it before other runs add theirs
      }
    }),
  );
  const ms = now() - t0;
  if (digests !== files.length) throw new Error(`openssl printed ${digests} digests for ${files.length} files`);
  return ms;
}
