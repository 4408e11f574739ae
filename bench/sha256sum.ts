/**
 * The hashing floor: coreutils `sha256sum` over a file list, run as child processes (one after another,
 * each given as many paths as fit comfortably on a command line), timed from the first spawn to the last
 * exit. Its output is read and counted so a silent failure cannot pass for a fast run.
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

/** Runs one `sha256sum -- paths…`; resolves with the number of digest lines printed. */
function runOnce(paths: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = spawn('sha256sum', ['--', ...paths], { stdio: ['ignore', 'pipe', 'pipe'] });
    let lines = 0;
    let err = '';
    child.stdout.on('data', (b: Buffer) => {
      for (const c of b) if (c === 10) lines++;
    });
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve(lines) : reject(new Error(`sha256sum exited with ${code}: ${err.slice(0, 500)}`))));
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
