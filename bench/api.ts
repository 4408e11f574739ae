/**
 * Benchmark `api`: the API's own overhead on an authenticated read. autocannon drives
 * `GET /api/roosts/{roostId}/versions/current?siteId=` (API key as `Authorization: Bearer`) at a fixed
 * number of connections for a fixed time against the real app in a process of its own
 * (bench/api-child.ts `api`), and the same URL against the floor: a bare Fastify route in the same kind of
 * process running the same read (db/roosts.ts `resolveVersion`) through a pool of the same size
 * (bench/api-child.ts `floor`). Figures: requests/s, latency p50/p99 (ms), SQL statements per request,
 * and `ofFloor` = API requests/s ÷ floor requests/s (goal ≥ 0.6).
 *
 * Order: floor, API, the ablations (when asked, or when the API is under 0.6× the floor), floor again; the
 * floor figure is the mean of its two runs, so drift on a shared machine hits both sides. Each ablation is
 * the real app without one plugin (api/app.ts `BuildOptions.without`) or with logging silenced; its figure
 * minus the full app's is that plugin's cost on this read. Every run must answer 200 to every request
 * (autocannon's non-2xx and error counts are checked) and one answer of each server is checked for the
 * version id, so a broken server cannot pass for a fast one.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import autocannon from 'autocannon';
import type { Config } from '../config/env';
import { EnvSchema } from '../config/env';
import { push } from '../cli/push';
import { OPTIONAL_PLUGINS, type OptionalPlugin } from '../api/app';
import type { ApiChildStart, FromApiChild, ToApiChild } from './api-child';
import { createRoost } from './push';
import { writeSmallVersion } from './rollout';
import type { BenchStack } from './stack';
import { log, round } from './util';

/** Ratio of the floor's requests/s the API should reach. */
export const API_GOAL = 0.6;

export interface LoadFigures {
  requestsPerSecond: number;
  requests: number;
  latencyMs: { p50: number; p90: number; p99: number; mean: number; max: number };
  /** SQL statements sent through the server's pool per request. */
  sqlPerRequest: number;
  /** 1-minute load average when the run started. */
  load1: number;
}

export interface ApiFigures {
  route: string;
  connections: number;
  durationSeconds: number;
  api: LoadFigures;
  floor: LoadFigures & { samplesRequestsPerSecond: number[]; query: string };
  /** API requests/s ÷ floor requests/s (goal ≥ 0.6). */
  ofFloor: number;
  /** API p99 ÷ floor p99. */
  timesFloorP99: number;
  /** Per left-out plugin (or `logging` silenced): requests/s without it and the gain over the full app (%). */
  ablations: Record<string, LoadFigures & { gainPercent: number }>;
}

/** Environment of a child process for `cfg` (every setting spelled out, services reached as external). */
export function childEnv(cfg: Config, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(EnvSchema.properties)) {
    const v = (cfg as unknown as Record<string, unknown>)[key];
    if (v !== undefined && v !== null) env[key] = String(v);
  }
  env.DATABASE_URL = cfg.databaseUrl;
  env.TEMPORAL_ADDRESS = cfg.temporalAddress;
  return { ...env, ...extra };
}

/** One server child (bench/api-child.ts). */
class ServerChild {
  private constructor(
    private readonly child: ChildProcess,
    readonly url: string,
  ) {}

  static async start(cfg: Config, opts: ApiChildStart): Promise<ServerChild> {
    // ROOST_BENCH_CPU_PROF_DIR: each server child writes a V8 CPU profile there when it exits (where the time goes).
    const prof = process.env.ROOST_BENCH_CPU_PROF_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.ROOST_BENCH_CPU_PROF_DIR}`] : [];
    const child = spawn(process.execPath, [...prof, '--import', 'tsx', path.join(__dirname, 'api-child.ts')], {
      cwd: path.join(__dirname, '..'),
      env: childEnv(cfg),
      // The app's log lines go nowhere, as they would go to a collector in production (written, not read).
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
    });
    const url = await new Promise<string>((resolve, reject) => {
      child.on('message', (m: FromApiChild) => {
        if (m.type === 'ready') resolve(m.url);
        else if (m.type === 'failed') reject(new Error(`server child failed to start: ${m.message}`));
      });
      child.once('exit', (code) => reject(new Error(`server child exited with ${code} before it was ready`)));
      child.send({ type: 'start', opts } satisfies ToApiChild);
    });
    return new ServerChild(child, url);
  }

  /** SQL statements sent through the child's pool so far. */
  queries(): Promise<number> {
    return new Promise((resolve) => {
      const onMsg = (m: FromApiChild) => {
        if (m.type === 'stats') {
          this.child.off('message', onMsg);
          resolve(m.queries);
        }
      };
      this.child.on('message', onMsg);
      this.child.send({ type: 'stats' } satisfies ToApiChild);
    });
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const gone = new Promise((r) => this.child.once('exit', r));
    this.child.disconnect();
    const t = setTimeout(() => this.child.kill('SIGKILL'), 15_000);
    await gone;
    clearTimeout(t);
  }
}

interface Target {
  path: string;
  headers: Record<string, string>;
  versionId: string;
}

/** One autocannon run against `server`; throws unless every request answered 200. */
async function drive(server: ServerChild, target: Target, connections: number, seconds: number): Promise<LoadFigures> {
  const load1 = round(os.loadavg()[0], 2);
  const q0 = await server.queries();
  const result = await autocannon({ url: server.url + target.path, connections, duration: seconds, headers: target.headers });
  const q1 = await server.queries();
  if (result.errors || result.non2xx || result.timeouts)
    throw new Error(`${server.url}: ${result.errors} errors, ${result.timeouts} timeouts, ${result.non2xx} non-2xx answers`);
  const requests = result.requests.total;
  return {
    requestsPerSecond: round(requests / seconds, 1),
    requests,
    latencyMs: {
      p50: round(result.latency.p50),
      p90: round(result.latency.p90),
      p99: round(result.latency.p99),
      mean: round(result.latency.average),
      max: round(result.latency.max),
    },
    sqlPerRequest: requests ? round((q1 - q0) / requests, 2) : 0,
    load1,
  };
}

/** Checks one answer of `server` names the version. */
async function checkAnswer(server: ServerChild, target: Target): Promise<void> {
  const res = await fetch(server.url + target.path, { headers: target.headers });
  const body = (await res.json()) as { versionId?: string; version_id?: string };
  if (res.status !== 200 || (body.versionId ?? body.version_id) !== target.versionId)
    throw new Error(`${server.url} answered ${res.status} without version ${target.versionId}: ${JSON.stringify(body).slice(0, 300)}`);
}

/**
 * Runs the benchmark on a fresh site of `bench`. `ablations`: true runs every one, false none, undefined
 * runs them only when the API is under API_GOAL of the floor.
 */
export async function benchApi(
  bench: BenchStack,
  opts: { connections: number; seconds: number; ablations?: boolean; rootDir: string },
): Promise<ApiFigures> {
  const site = await bench.newSite('api');
  const roostId = await createRoost(site, 'bench api');
  const srcDir = path.join(opts.rootDir, 'api-version');
  await writeSmallVersion(srcDir);
  const pushed = await push({ client: site.client, siteId: site.siteId, roostId, dir: srcDir });
  const target: Target = {
    path: `/api/roosts/${encodeURIComponent(roostId)}/versions/current?siteId=${encodeURIComponent(site.siteId)}`,
    headers: { authorization: `Bearer ${site.apiKey}` },
    versionId: pushed.versionId,
  };
  // The body the floor serves: the one the API answers with.
  const current = await site.client.request<{ version: unknown }>('GET', target.path);
  const warm = Math.min(3, opts.seconds);
  await fs.rm(srcDir, { recursive: true, force: true });

  const measure = async (label: string, start: ApiChildStart): Promise<LoadFigures> => {
    const server = await ServerChild.start(bench.cfg, start);
    try {
      await checkAnswer(server, target);
      await drive(server, target, opts.connections, warm);
      const f = await drive(server, target, opts.connections, opts.seconds);
      log(`api: ${label} ${f.requestsPerSecond} req/s, p99 ${f.latencyMs.p99} ms, ${f.sqlPerRequest} SQL/request (load ${f.load1})`);
      return f;
    } finally {
      await server.stop();
    }
  };
  const logLevel = bench.cfg.ROOST_LOG_LEVEL === 'error' ? 'warn' : bench.cfg.ROOST_LOG_LEVEL;
  const floorStart: ApiChildStart = { mode: 'floor', versionBody: current.body.version };
  const floor1 = await measure('floor', floorStart);
  const api = await measure('api', { mode: 'api', logLevel, without: [] });
  const ablations: ApiFigures['ablations'] = {};
  const runAblations = opts.ablations ?? api.requestsPerSecond < API_GOAL * floor1.requestsPerSecond;
  if (runAblations) {
    const variants: { name: string; start: ApiChildStart }[] = [
      { name: 'logging', start: { mode: 'api', logLevel: 'silent', without: [] } },
      ...OPTIONAL_PLUGINS.map((p: OptionalPlugin) => ({ name: p, start: { mode: 'api' as const, logLevel, without: [p] } })),
      { name: 'all', start: { mode: 'api', logLevel: 'silent', without: [...OPTIONAL_PLUGINS] } },
    ];
    for (const v of variants) {
      const f = await measure(`without ${v.name}`, v.start);
      ablations[v.name] = { ...f, gainPercent: round((f.requestsPerSecond / api.requestsPerSecond - 1) * 100, 1) };
    }
  }
  const floor2 = await measure('floor again', floorStart);
  const samples = [floor1.requestsPerSecond, floor2.requestsPerSecond];
  const floorRps = round((samples[0] + samples[1]) / 2, 1);
  const floorP99 = round((floor1.latencyMs.p99 + floor2.latencyMs.p99) / 2);
  return {
    route: 'GET /api/roosts/{roostId}/versions/{versionRef} (versionRef current)',
    connections: opts.connections,
    durationSeconds: opts.seconds,
    api,
    floor: {
      ...floor1,
      requestsPerSecond: floorRps,
      latencyMs: { ...floor1.latencyMs, p99: floorP99 },
      samplesRequestsPerSecond: samples,
      query: 'db/roosts.ts resolveVersion',
    },
    ofFloor: floorRps > 0 ? round(api.requestsPerSecond / floorRps, 2) : 0,
    timesFloorP99: floorP99 > 0 ? round(api.latencyMs.p99 / floorP99, 2) : 0,
    ablations,
  };
}
