/**
 * Benchmark 1, `chunker`: the chunk-and-hash stage of a cold push (cli/chunker.ts `scanTree`, exactly
 * what `push()` runs as its `hash` stage: walk, 4 MiB chunks, SHA-256 per chunk on one thread per core,
 * version body) over the generated tree, in MB/s, against two floors over the same file list:
 * `openssl dgst -sha256` on every core at once (the physical limit: one full read and one SHA-256 of
 * every byte with OpenSSL's SHA-NI code; `opensslFloor`, `ofOpensslFloor` = chunker MB/s ÷ its MB/s) and
 * `sha256sum` on one core (`floor`, `timesFloor`, kept from earlier runs for comparison).
 *
 * Both run `rounds` times alternately after one untimed warm-up read (so the page cache is equally warm
 * for both); the figures are the medians (and each side's best round), every sample is listed too. `timesFloor` = chunker time ÷
 * sha256sum time (1.0 means as fast as sha256sum).
 */
import { scanTree, walkTree } from '../cli/chunker';
import os from 'node:os';
import { opensslFiles, sha256sumFiles } from './sha256sum';
import type { TreeInfo } from './tree';
import { log, mbps, median, now, round } from './util';

export interface ChunkerFigures {
  tree: { files: number; bytes: number };
  rounds: number;
  chunker: { MBps: number; ms: number; bestMBps: number; samplesMs: number[]; chunks: number };
  floor: { tool: 'sha256sum'; MBps: number; ms: number; bestMBps: number; samplesMs: number[] };
  /** chunker time ÷ sha256sum time (= sha256sum MB/s ÷ chunker MB/s; 1.0 means as fast as sha256sum). */
  timesFloor: number;
  /** The same ratio over each side's best round (less sensitive to other load on the machine). */
  timesFloorBest: number;
  /** `openssl dgst -sha256 -r` with one process per core (`parallel`), same rounds. */
  opensslFloor: { tool: 'openssl dgst -sha256'; parallel: number; MBps: number; ms: number; bestMBps: number; samplesMs: number[] };
  /** chunker MB/s ÷ openssl MB/s (medians; 1.0 means the physical limit); `ofOpensslFloorBest` over best rounds. */
  ofOpensslFloor: number;
  ofOpensslFloorBest: number;
}

/** Runs benchmark 1 over `tree`. */
export async function benchChunker(tree: TreeInfo, opts: { rounds: number }): Promise<ChunkerFigures> {
  const { files } = await walkTree(tree.root);
  const paths = files.map((f) => f.absPath);
  const bytes = files.reduce((s, f) => s + f.size, 0);
  log(`chunker: warm-up read of ${files.length} files`);
  await sha256sumFiles(paths);
  const parallel = Math.max(1, os.availableParallelism());
  const sized = files.map((f) => ({ path: f.absPath, size: f.size }));
  const floorMs: number[] = [];
  const opensslMs: number[] = [];
  const chunkerMs: number[] = [];
  let chunks = 0;
  for (let r = 0; r < opts.rounds; r++) {
    floorMs.push(await sha256sumFiles(paths));
    opensslMs.push(await opensslFiles(sized, parallel));
    const t0 = now();
    const scan = await scanTree(tree.root);
    chunkerMs.push(now() - t0);
    chunks = scan.body.files.reduce((s, f) => s + f.chunks.length, 0);
    log(
      `chunker: round ${r + 1}/${opts.rounds}: sha256sum ${mbps(bytes, floorMs[r])} MB/s, openssl ×${parallel} ${mbps(bytes, opensslMs[r])} MB/s, scanTree ${mbps(bytes, chunkerMs[r])} MB/s`,
    );
  }
  const c = median(chunkerMs);
  const f = median(floorMs);
  const o = median(opensslMs);
  return {
    tree: { files: files.length, bytes },
    rounds: opts.rounds,
    chunker: {
      MBps: mbps(bytes, c),
      ms: round(c),
      bestMBps: mbps(bytes, Math.min(...chunkerMs)),
      samplesMs: chunkerMs.map((x) => round(x)),
      chunks,
    },
    floor: {
      tool: 'sha256sum',
      MBps: mbps(bytes, f),
      ms: round(f),
      bestMBps: mbps(bytes, Math.min(...floorMs)),
      samplesMs: floorMs.map((x) => round(x)),
    },
    timesFloor: round(c / f, 2),
    timesFloorBest: round(Math.min(...chunkerMs) / Math.min(...floorMs), 2),
    opensslFloor: {
      tool: 'openssl dgst -sha256',
      parallel,
      MBps: mbps(bytes, o),
      ms: round(o),
      bestMBps: mbps(bytes, Math.min(...opensslMs)),
      samplesMs: opensslMs.map((x) => round(x)),
    },
    ofOpensslFloor: round(o / c, 2),
    ofOpensslFloorBest: round(Math.min(...opensslMs) / Math.min(...chunkerMs), 2),
  };
}
