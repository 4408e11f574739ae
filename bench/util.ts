/**
 * Small helpers shared by the benchmarks: progress lines on stderr, a monotonic timer, summary
 * statistics, throughput in MB/s (10^6 bytes per second) and a seeded PRNG (so the generated tree and
 * the request sets are the same on every run).
 */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import { performance } from 'node:perf_hooks';

const origin = performance.now();

/** One progress line on stderr, prefixed with seconds since start (stdout carries only the final JSON document). */
export function log(line: string): void {
  process.stderr.write(`[bench +${((performance.now() - origin) / 1000).toFixed(1)}s] ${line}\n`);
}

/** Milliseconds since an arbitrary origin (monotonic, sub-millisecond). */
export function now(): number {
  return performance.now();
}

/** Runs `fn` and returns its result with the wall time in milliseconds. */
export async function timed<T>(fn: () => Promise<T>): Promise<{ result: T; ms: number }> {
  const t0 = now();
  const result = await fn();
  return { result, ms: now() - t0 };
}

/** Rounds to `digits` decimals (JSON figures stay readable). */
export function round(x: number, digits = 2): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** Throughput in MB/s (10^6 bytes per second) of `bytes` moved in `ms` milliseconds. */
export function mbps(bytes: number, ms: number): number {
  return ms > 0 ? round(bytes / 1e6 / (ms / 1000)) : 0;
}

/** Nearest-rank percentile (p in 0..100) of an unsorted sample; 0 for an empty one. */
export function percentile(samples: readonly number[], p: number): number {
  if (samples.length === 0) return 0;
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil((p / 100) * sorted.length)));
  return sorted[rank - 1];
}

/** Median (the 50th nearest-rank percentile). */
export function median(samples: readonly number[]): number {
  return percentile(samples, 50);
}

/** Latency summary in ms: count, p50, p90, p99, mean, min, max (rounded to 0.01 ms). */
export function latencySummary(samples: readonly number[]): {
  count: number;
  p50: number;
  p90: number;
  p99: number;
  mean: number;
  min: number;
  max: number;
} {
  const mean = samples.length ? samples.reduce((a, b) => a + b, 0) / samples.length : 0;
  return {
    count: samples.length,
    p50: round(percentile(samples, 50)),
    p90: round(percentile(samples, 90)),
    p99: round(percentile(samples, 99)),
    mean: round(mean),
    min: round(samples.length ? Math.min(...samples) : 0),
    max: round(samples.length ? Math.max(...samples) : 0),
  };
}

/** mulberry32: a tiny deterministic PRNG returning floats in [0, 1). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Fisher–Yates shuffle in place with the given random source. */
export function shuffle<T>(items: T[], random: () => number): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}

/** Human size for progress lines (MiB with one decimal). */
export function mib(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

/** Sleeps `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The 1-minute load average, two decimals. */
export function loadAverage(): number {
  return round(os.loadavg()[0], 2);
}

/** Linux's USER_HZ: /proc reports CPU times in these ticks (100 on every mainstream architecture). */
const USER_HZ = 100;

/**
 * CPU seconds (user + system, all threads) a process has used so far, from /proc/PID/stat; undefined when
 * the process is gone or /proc is not there (not Linux).
 */
export function processCpuSeconds(pid: number): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command (which may hold spaces) start after the last ')': state is field 3, utime 14, stime 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / USER_HZ;
  } catch {
    return undefined;
  }
}

/**
 * Node flags that make a bench child process write a V8 CPU profile when it exits, into
 * `ROOST_BENCH_CPU_PROF_DIR` (none when unset): where a server's or a fleet process's time goes.
 */
export function cpuProfArgs(): string[] {
  const dir = process.env.ROOST_BENCH_CPU_PROF_DIR;
  return dir ? ['--cpu-prof', `--cpu-prof-dir=${dir}`] : [];
}

/**
 * Stops an IPC child the bench started: disconnects its channel (the child exits on `disconnect`), sends
 * SIGKILL after `graceMs` if it is still running, and resolves once it is gone (at once if it already is).
 */
export async function disconnectChild(child: ChildProcess, graceMs: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.disconnect();
  const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await gone;
  clearTimeout(t);
}
