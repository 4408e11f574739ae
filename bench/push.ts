/**
 * Benchmarks 2 and 3 over the generated tree, with the real push pipeline (cli/push.ts `push()`, the CLI's
 * client, the bench API, Azurite).
 *
 * 2. `push`: a cold push end to end (a new site, so no chunk is deduplicated: hash, check, upload-urls,
 *    PUT every chunk, publish, overlapped as `push()` runs them), timed from the call to `push()` to its
 *    return, against the upload floor: the fastest of plain parallel PUTs of the same distinct chunks
 *    at each concurrency of FLOOR_CONCURRENCIES to the same Azurite, each under a new site (the store's
 *    own limit). For the floor the chunks are cut into memory once and each run's upload URLs are
 *    requested before its clock starts; only the PUTs are timed. Every floor run and every push start
 *    from an empty Azurite (the bench Azurite is restarted empty in between, since its per-PUT cost
 *    grows with the number of blobs it holds), and all move exactly the same bytes. After the sweep come
 *    `rounds` alternating rounds: a cold push into a new site, then the floor at the sweep's fastest
 *    concurrency (the machine's load drifts, so both sides sample it alike). `timesFloor` is the fastest
 *    push over the fastest floor run (sweep or rounds); `timesFloorMedian` the medians of the rounds. CPU seconds of this process, Azurite and the API process, and this
 *    process's main-thread utilisation, are reported per run (where the time went).
 * 3. `republish`: pushing the unchanged tree again (same body, so the same version id: the server finds
 *    every chunk and the version already current and changes nothing), in seconds, against `sha256sum`
 *    of the same file list. `rounds` alternating rounds, medians reported.
 */
import pLimit from 'p-limit';
import { request } from 'undici';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { producerConfig, readChunk, scanTree, walkTree } from '../cli/chunker';
import { push, type PushResult } from '../cli/push';
import { concurrencyFor, uploadLimits } from '../cli/upload-window';
import { RoostClient, blockBlobHeaders } from '../cli/client';
import { CHUNK_SIZE } from '../domain/version';
import { postgresCpuSeconds, postmasterPid } from './cpu';
import { type ApiWhere, type ServerChild, withApiChild } from './server-child';
import { sha256sumFiles } from './sha256sum';
import { type BenchSite, type BenchStack, CLIENT_TIMEOUT_MS } from './stack';
import type { TreeInfo } from './tree';
import { loadAverage, log, mbps, median, mib, now, processCpuSeconds, round } from './util';

/** A tree published by the cold push, reused by the republish benchmark. */
export interface PublishedTree {
  site: BenchSite;
  roostId: string;
  versionId: string;
  /** The version body's `config` block, reused so a republish produces the identical body. */
  config: Record<string, unknown>;
}

/** Concurrencies the upload floor tries; its figure is the fastest. */
export const FLOOR_CONCURRENCIES = [4, 8, 16, 32, 64] as const;

/**
 * Where the CPU went during one timed run: seconds (user + system, all threads) of the bench process (the
 * CLI side: push or plain PUTs; with `--push-api in-process` also the API), the bench Azurite, the
 * API process and the embedded PostgreSQL cluster, and the bench process's main-thread event-loop utilisation (0..1: busy share of the wall time).
 */
export interface RunCpu {
  benchSeconds: number;
  azuriteSeconds?: number;
  apiSeconds?: number;
  /** Every process of the embedded PostgreSQL cluster (absent on an external database). */
  postgresSeconds?: number;
  mainThreadBusy: number;
}

/** Starts measuring a run's CPU; the returned function ends it. `postmaster`: the embedded cluster's, if any. */
function cpuMeter(pids: { azurite?: number; api?: number; postmaster?: number | null }): () => RunCpu {
  const c0 = process.cpuUsage();
  const elu0 = performance.eventLoopUtilization();
  const a0 = pids.azurite ? processCpuSeconds(pids.azurite) : undefined;
  const p0 = pids.api ? processCpuSeconds(pids.api) : undefined;
  const g0 = pids.postmaster ? postgresCpuSeconds(pids.postmaster) : undefined;
  return () => {
    const c = process.cpuUsage(c0);
    const a1 = pids.azurite ? processCpuSeconds(pids.azurite) : undefined;
    const p1 = pids.api ? processCpuSeconds(pids.api) : undefined;
    const g1 = pids.postmaster ? postgresCpuSeconds(pids.postmaster) : undefined;
    return {
      benchSeconds: round((c.user + c.system) / 1e6),
      ...(a0 !== undefined && a1 !== undefined ? { azuriteSeconds: round(a1 - a0) } : {}),
      ...(p0 !== undefined && p1 !== undefined ? { apiSeconds: round(p1 - p0) } : {}),
      ...(g0 !== undefined && g1 !== undefined ? { postgresSeconds: round(g1 - g0) } : {}),
      mainThreadBusy: round(performance.eventLoopUtilization(elu0).utilization, 3),
    };
  };
}

export interface ColdPushFigures {
  tree: { files: number; bytes: number };
  /** Where the API ran (`--push-api`). */
  api: ApiWhere;
  /** `--concurrency` when given, else `"auto"` (the CLI's rule, cli/upload-window.ts). */
  concurrency: number | 'auto';
  /** Distinct chunks and their bytes (what both sides upload). */
  chunks: number;
  uploadBytes: number;
  /** Alternating rounds of a cold push and the floor at the sweep's fastest concurrency (`--rounds`). */
  rounds: number;
  /** The fastest round's push (every field but the samples and `cpuByRound` is that round's). */
  push: {
    seconds: number;
    /** Median over the rounds. */
    medianSeconds: number;
    /** Every round's push, in seconds. */
    samplesSeconds: number[];
    /** Uploaded bytes ÷ wall time. */
    MBps: number;
    /** Tree bytes ÷ wall time (what a user sees). */
    treeMBps: number;
    stagesMs: PushResult['timings'];
    chunksUploaded: number;
    /** Uploaded chunks confirmed (recorded) by hash range while later ones uploaded, before publish. */
    chunksConfirmedEarly: number;
    /** Chunks PUT from the bytes hashing handed over (cli/push.ts CARRY_MAX_BYTES), not read back. */
    chunksCarried: number;
    versionId: string;
    /** The upload window the push ran with, and the most PUTs it had in flight. */
    upload: PushResult['upload'] & { smallChunkConcurrency: number; fullChunkConcurrency: number };
    /** When each stage started and ended (ms since the push started). */
    stageSpansMs: PushResult['stageSpansMs'];
    cpu: RunCpu;
    cpuByRound: RunCpu[];
  };
  /** The fastest plain-PUT run of the sweep and the rounds (the store's limit): its concurrency, seconds, MB/s. */
  floor: { what: string; seconds: number; MBps: number; setupSeconds: number; concurrency: number };
  /** Every floor run: concurrency → seconds. */
  bestOf: Record<string, number>;
  /** CPU of every floor run, by concurrency. */
  floorCpu: Record<string, RunCpu>;
  /** The floor run again after each push round, at the sweep's fastest concurrency: fastest, median, every run. */
  floorAfter: { concurrency: number; seconds: number; medianSeconds: number; samplesSeconds: number[]; cpu: RunCpu[] };
  /** 1-minute load average when the push started and when it ended (/proc/loadavg). */
  loadAverage: { start: number; end: number };
  /** The fastest push ÷ the fastest plain-PUT run (sweep or rounds). */
  timesFloor: number;
  /** Median push ÷ median of the floor runs that alternated with the pushes (same concurrency, same number of runs). */
  timesFloorMedian: number;
  /** push seconds ÷ the plain-PUT run at concurrency 4 (the floor before the sweep, for earlier runs). */
  timesFloorAt4: number;
}

export interface RepublishFigures {
  tree: { files: number; bytes: number };
  rounds: number;
  republish: {
    seconds: number;
    bestSeconds: number;
    samplesSeconds: number[];
    stagesMs: PushResult['timings'];
    chunksUploaded: number;
    sameVersion: boolean;
  };
  floor: { tool: 'sha256sum'; seconds: number; bestSeconds: number; samplesSeconds: number[] };
  /** republish seconds ÷ sha256sum seconds (medians). */
  timesFloor: number;
  /** The same over each side's best round. */
  timesFloorBest: number;
}

/** Creates a roost in the site through the API; returns its id. */
export async function createRoost(site: BenchSite, name: string, extra: Record<string, unknown> = {}): Promise<string> {
  const r = await site.client.request<{ roostId: string }>('POST', '/api/roosts', { body: { siteId: site.siteId, name, ...extra } });
  return r.body.roostId;
}

/**
 * One plain PUT of bytes to a signed URL, as a block blob: the request the CLI sends (cli/client.ts
 * `blockBlobHeaders`), through the same HTTP client (undici's `request`), with nothing else around it.
 */
async function plainPut(url: string, bytes: Buffer): Promise<void> {
  const res = await request(url, { method: 'PUT', headers: blockBlobHeaders(bytes.length), body: bytes });
  await res.body.dump();
  if (res.statusCode < 200 || res.statusCode >= 300) throw new Error(`upload floor: PUT answered ${res.statusCode}`);
}

/**
 * The upload floor: cuts the chunks into memory once, then for each concurrency of FLOOR_CONCURRENCIES
 * empties the bench Azurite, issues URLs under a new site (untimed) and times the PUTs alone.
 * Returns seconds per concurrency, the untimed set-up seconds, and bytes moved.
 */
async function uploadFloor(
  bench: BenchStack,
  tree: TreeInfo,
  api: { url?: string; pid?: number },
  concurrencies: readonly number[] = FLOOR_CONCURRENCIES,
): Promise<{ byConcurrency: Record<string, number>; cpu: Record<string, RunCpu>; setupSeconds: number; bytes: number; chunks: number }> {
  const s0 = now();
  const scan = await scanTree(tree.root);
  const hashes = [...scan.locations.keys()];
  const buffers = new Map<string, Buffer>();
  let bytes = 0;
  for (const h of hashes) {
    const b = await readChunk(scan.locations.get(h)!, h);
    buffers.set(h, b);
    bytes += b.length;
  }
  let setupSeconds = (now() - s0) / 1000;
  const byConcurrency: Record<string, number> = {};
  const cpu: Record<string, RunCpu> = {};
  for (const concurrency of concurrencies) {
    const s1 = now();
    await bench.resetStorage();
    const site = siteOn(await bench.newSite(`upload-floor-${concurrency}`), api.url);
    const urls: Record<string, string> = {};
    for (let i = 0; i < hashes.length; i += 1000) {
      const r = await site.client.post<{ urls: Record<string, string> }>(
        '/api/chunks/upload-urls',
        { siteId: site.siteId, hashes: hashes.slice(i, i + 1000) },
        { retrySafe: true },
      );
      Object.assign(urls, r.urls);
    }
    setupSeconds += (now() - s1) / 1000;
    const limit = pLimit(concurrency);
    const meter = cpuMeter({ azurite: bench.azuritePid(), api: api.pid, postmaster: postmasterOf(bench) });
    const t0 = now();
    await Promise.all(hashes.map((h) => limit(() => plainPut(urls[h], buffers.get(h)!))));
    byConcurrency[concurrency] = round((now() - t0) / 1000);
    cpu[concurrency] = meter();
    log(
      `push: upload floor at concurrency ${concurrency}: ${byConcurrency[concurrency]} s (${mbps(bytes, byConcurrency[concurrency] * 1000)} MB/s, load ${loadAverage()}, cpu ${JSON.stringify(cpu[concurrency])})`,
    );
  }
  buffers.clear();
  return { byConcurrency, cpu, setupSeconds, bytes, chunks: hashes.length };
}

/** The embedded PostgreSQL cluster's postmaster pid, or null on an external database. */
function postmasterOf(bench: BenchStack): number | null {
  return bench.cfg.embedded.postgres ? postmasterPid(path.join(bench.cfg.ROOST_DATA_DIR, 'pg')) : null;
}

/** The same site reached through the API at `url` (the API process), or as it is (`url` undefined: the in-process API). */
export function siteOn(site: BenchSite, url: string | undefined): BenchSite {
  if (!url) return site;
  return { ...site, client: new RoostClient({ baseUrl: url, apiKey: site.apiKey, timeoutMs: CLIENT_TIMEOUT_MS }) };
}

/**
 * Runs benchmark 2; also returns the published tree for benchmark 3 (reached through the in-process API).
 * `api: 'process'` (default) serves the floor's upload URLs and the whole push from the real app in a
 * process of its own session (bench/server-child.ts), stopped at the end.
 */
export async function benchColdPush(
  bench: BenchStack,
  tree: TreeInfo,
  opts: { concurrency?: number; api?: ApiWhere; rounds?: number },
): Promise<{ figures: ColdPushFigures; published: PublishedTree }> {
  const where = opts.api ?? 'process';
  const rounds = opts.rounds ?? 3;
  return withApiChild(bench.cfg, where, (server) => coldPush(bench, tree, { concurrency: opts.concurrency, api: where, server, rounds }));
}

/** One timed cold push of the rounds. */
interface PushRun {
  seconds: number;
  result: PushResult;
  cpu: RunCpu;
}

async function coldPush(
  bench: BenchStack,
  tree: TreeInfo,
  opts: { concurrency?: number; api: ApiWhere; server?: ServerChild; rounds: number },
): Promise<{ figures: ColdPushFigures; published: PublishedTree }> {
  const api = { url: opts.server?.url, pid: opts.server?.pid };
  if (opts.server) log(`push: the API runs in process ${opts.server.pid} (${opts.server.url})`);
  const floor = await uploadFloor(bench, tree, api);
  const [bestC, sweepSeconds] = Object.entries(floor.byConcurrency).sort((a, b) => a[1] - b[1])[0];
  log(`push: upload floor ${sweepSeconds} s at concurrency ${bestC} (${mbps(floor.bytes, sweepSeconds * 1000)} MB/s)`);
  const config = { ...producerConfig(), producer: 'roost-cli' as const };
  const loadStart = loadAverage();
  const runs: PushRun[] = [];
  const after: { seconds: number; cpu: RunCpu }[] = [];
  let published: PublishedTree | undefined;
  // Alternating rounds: a push, then the floor again at the sweep's fastest concurrency, so both sides
  // sample the machine's drifting load alike (docs/benchmarks.md "What each figure means").
  for (let r = 0; r < opts.rounds; r++) {
    // Azurite gets slower the more blobs it holds: every push starts from the same (empty) storage.
    await bench.resetStorage();
    const benchSite = await bench.newSite(`push-${r + 1}`);
    const site = siteOn(benchSite, api.url);
    const roostId = await createRoost(site, 'bench tree');
    log(
      `push: round ${r + 1}/${opts.rounds}: cold push of ${mib(tree.bytes)} to ${site.siteId}/${roostId} at concurrency ${opts.concurrency ?? 'auto'} (load ${loadAverage()})`,
    );
    const meter = cpuMeter({ azurite: bench.azuritePid(), api: api.pid, postmaster: postmasterOf(bench) });
    const t0 = now();
    const result = await push({ client: site.client, siteId: site.siteId, roostId, dir: tree.root, concurrency: opts.concurrency, config });
    const ms = now() - t0;
    const cpu = meter();
    if (result.chunksUploaded !== floor.chunks || result.bytesUploaded !== floor.bytes) {
      throw new Error(
        `cold push uploaded ${result.chunksUploaded} chunks / ${result.bytesUploaded} bytes, the floor ${floor.chunks} / ${floor.bytes}`,
      );
    }
    runs.push({ seconds: round(ms / 1000), result, cpu });
    published = { site: benchSite, roostId, versionId: result.versionId, config };
    log(
      `push: round ${r + 1}: cold push ${round(ms / 1000)} s (${mbps(result.bytesUploaded, ms)} MB/s uploaded, stages ${JSON.stringify(result.timings)}, spans ${JSON.stringify(result.stageSpansMs)}, cpu ${JSON.stringify(cpu)})`,
    );
    await bench.resetStorage();
    const again = await uploadFloor(bench, tree, api, [Number(bestC)]);
    after.push({ seconds: again.byConcurrency[bestC], cpu: again.cpu[bestC] });
  }
  const loadEnd = loadAverage();
  const best = runs.reduce((a, b) => (b.seconds < a.seconds ? b : a));
  const floorSeconds = Math.min(sweepSeconds, ...after.map((a) => a.seconds));
  const afterMedian = median(after.map((a) => a.seconds));
  const pushMedian = median(runs.map((x) => x.seconds));
  const limits = uploadLimits(opts.concurrency);
  const result = best.result;
  return {
    figures: {
      tree: { files: result.filesTotal, bytes: result.bytesTotal },
      api: opts.api,
      concurrency: opts.concurrency ?? 'auto',
      chunks: floor.chunks,
      uploadBytes: floor.bytes,
      rounds: opts.rounds,
      push: {
        seconds: best.seconds,
        medianSeconds: round(pushMedian),
        samplesSeconds: runs.map((x) => x.seconds),
        MBps: mbps(result.bytesUploaded, best.seconds * 1000),
        treeMBps: mbps(result.bytesTotal, best.seconds * 1000),
        stagesMs: result.timings,
        chunksUploaded: result.chunksUploaded,
        chunksConfirmedEarly: result.chunksConfirmedEarly,
        chunksCarried: result.chunksCarried,
        versionId: result.versionId,
        upload: {
          ...result.upload,
          smallChunkConcurrency: concurrencyFor(limits, new Array<number>(256).fill(4096)),
          fullChunkConcurrency: concurrencyFor(limits, new Array<number>(256).fill(CHUNK_SIZE)),
        },
        stageSpansMs: result.stageSpansMs,
        cpu: best.cpu,
        cpuByRound: runs.map((x) => x.cpu),
      },
      floor: {
        what: `the fastest of parallel PUTs of the pre-cut chunks at concurrency ${FLOOR_CONCURRENCIES.join(', ')}, and again at the fastest one after each push round`,
        seconds: floorSeconds,
        MBps: mbps(floor.bytes, floorSeconds * 1000),
        setupSeconds: round(floor.setupSeconds),
        concurrency: Number(bestC),
      },
      bestOf: floor.byConcurrency,
      floorAfter: {
        concurrency: Number(bestC),
        seconds: round(Math.min(...after.map((a) => a.seconds))),
        medianSeconds: round(afterMedian),
        samplesSeconds: after.map((a) => a.seconds),
        cpu: after.map((a) => a.cpu),
      },
      floorCpu: floor.cpu,
      loadAverage: { start: loadStart, end: loadEnd },
      timesFloor: round(best.seconds / floorSeconds, 2),
      timesFloorMedian: round(pushMedian / afterMedian, 2),
      timesFloorAt4: round(best.seconds / floor.byConcurrency['4'], 2),
    },
    published: published!,
  };
}

/** Publishes the tree untimed (when `republish` runs without `push`). */
export async function publishTree(bench: BenchStack, tree: TreeInfo, concurrency: number | undefined): Promise<PublishedTree> {
  const site = await bench.newSite('republish');
  const roostId = await createRoost(site, 'bench tree');
  const config = { ...producerConfig(), producer: 'roost-cli' as const };
  log(`republish: publishing the tree once (untimed set-up)`);
  const r = await push({ client: site.client, siteId: site.siteId, roostId, dir: tree.root, concurrency, config });
  return { site, roostId, versionId: r.versionId, config };
}

/** Runs benchmark 3 against an already published tree. */
export async function benchRepublish(
  tree: TreeInfo,
  published: PublishedTree,
  opts: { concurrency?: number; rounds: number },
): Promise<RepublishFigures> {
  const { files } = await walkTree(tree.root);
  const paths = files.map((f) => f.absPath);
  const pushSec: number[] = [];
  const floorSec: number[] = [];
  let last: PushResult | undefined;
  let sameVersion = true;
  for (let r = 0; r < opts.rounds; r++) {
    floorSec.push((await sha256sumFiles(paths)) / 1000);
    const t0 = now();
    last = await push({
      client: published.site.client,
      siteId: published.site.siteId,
      roostId: published.roostId,
      dir: tree.root,
      concurrency: opts.concurrency,
      config: published.config,
    });
    pushSec.push((now() - t0) / 1000);
    if (last.versionId !== published.versionId) sameVersion = false;
    if (last.chunksUploaded !== 0) throw new Error(`a no-op republish uploaded ${last.chunksUploaded} chunks`);
    log(
      `republish: round ${r + 1}/${opts.rounds}: sha256sum ${round(floorSec[r])} s, republish ${round(pushSec[r])} s (${JSON.stringify(last.timings)})`,
    );
  }
  const p = median(pushSec);
  const f = median(floorSec);
  return {
    tree: { files: files.length, bytes: files.reduce((s, x) => s + x.size, 0) },
    rounds: opts.rounds,
    republish: {
      seconds: round(p),
      bestSeconds: round(Math.min(...pushSec)),
      samplesSeconds: pushSec.map((x) => round(x)),
      stagesMs: last!.timings,
      chunksUploaded: last!.chunksUploaded,
      sameVersion,
    },
    floor: {
      tool: 'sha256sum',
      seconds: round(f),
      bestSeconds: round(Math.min(...floorSec)),
      samplesSeconds: floorSec.map((x) => round(x)),
    },
    timesFloor: round(p / f, 2),
    timesFloorBest: round(Math.min(...pushSec) / Math.min(...floorSec), 2),
  };
}
