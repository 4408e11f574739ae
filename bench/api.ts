/**
 * Benchmark `api`: the API's own overhead on an authenticated read. autocannon drives
 * `GET /api/roosts/{roostId}/versions/current?siteId=` (API key as `Authorization: Bearer`) at a fixed
 * number of connections for a fixed time against the real app in a process of its own
 * (bench/api-child.ts `api`), and the same URL against the floor: a bare Fastify route in the same kind of
 * process running the same read (db/roosts.ts `resolveVersion`) through a pool of the same size
 * (bench/api-child.ts `floor`). Figures: requests/s, latency p50/p99 (ms), SQL statements per request,
 * and `ofFloor` = API requests/s ÷ floor requests/s (goal ≥ 0.6).
 *
 * Order: both servers start and get a warm-up of WARM_REQUESTS requests each (a process that has served
 * only a few hundred requests still runs unoptimised code and spends up to twice the CPU per request), then `rounds` alternating rounds (floor, then API, each
 * `seconds` long) against the two running processes; each round's `ofFloor` is API ÷ floor requests/s of
 * that round, and the figure is the median of the rounds, so the load other processes put on a shared
 * machine (which moves a single run by 2–4× within minutes) hits both sides of a ratio alike. Beside the
 * requests/s, CPU per request is read for each side: the server process's own (process.cpuUsage) and the
 * PostgreSQL cluster's (bench/cpu.ts, embedded cluster only), summed over the rounds; `cpuOfFloor` = floor
 * CPU ÷ API CPU per request, the same ratio as requests/s would be on an otherwise idle machine where CPU is
 * the limit. Ablations (when asked, or when the API is under 0.6× the floor) are the real app without one
 * plugin (api/app.ts `BuildOptions.without`) or with logging silenced, each run right after a run of the full
 * app; its gain is over that run. Every run must answer 200 to every request
 * (autocannon's non-2xx and error counts are checked) and one answer of each server is checked for the
 * version id, so a broken server cannot pass for a fast one.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import autocannon from 'autocannon';
import { push } from '../cli/push';
import { OPTIONAL_PLUGINS, type OptionalPlugin } from '../api/app';
import type { ApiChildStart } from './api-child';
import { createRoost } from './push';
import { writeSmallVersion } from './rollout';
import { ServerChild } from './server-child';
import type { BenchStack } from './stack';
import { postgresCpuSeconds, postmasterPid } from './cpu';
import { log, round } from './util';

/** Median of `xs` (mean of the middle two for an even count). */
function median(xs: number[]): number {
  const v = [...xs].sort((a, b) => a - b);
  const m = Math.floor(v.length / 2);
  return v.length === 0 ? 0 : v.length % 2 ? v[m] : round((v[m - 1] + v[m]) / 2, 2);
}

/** Requests each server answers before it is measured (until V8 has optimised the hot paths). */
const WARM_REQUESTS = 4000;

/** Ratio of the floor's requests/s the API should reach. */
export const API_GOAL = 0.6;

export interface LoadFigures {
  requestsPerSecond: number;
  requests: number;
  latencyMs: { p50: number; p90: number; p99: number; mean: number; max: number };
  /** SQL statements sent through the server's pool per request. */
  sqlPerRequest: number;
  /** CPU time per request (µs): the server process's own, and the PostgreSQL cluster's (-1 when not readable). */
  cpuMicrosPerRequest: { server: number; postgres: number };
  /** 1-minute load average when the run started. */
  load1: number;
}

/** One alternating round: the floor's run, then the API's. */
export interface ApiRound {
  floor: LoadFigures;
  api: LoadFigures;
  /** API requests/s ÷ floor requests/s in this round. */
  ofFloor: number;
}

export interface ApiFigures {
  route: string;
  connections: number;
  durationSeconds: number;
  /** The run of the median round (by its ofFloor) for each side. */
  api: LoadFigures;
  floor: LoadFigures & { samplesRequestsPerSecond: number[]; query: string };
  rounds: ApiRound[];
  /** Median over the rounds of API requests/s ÷ floor requests/s (goal ≥ 0.6). */
  ofFloor: number;
  /** API p99 ÷ floor p99 in the median round. */
  timesFloorP99: number;
  /**
   * CPU per request over all rounds (µs): server process, PostgreSQL, and their sum; `cpuOfFloor` = floor
   * total ÷ API total (the requests/s ratio CPU alone allows, whatever else runs on the machine).
   */
  cpu: {
    api: { server: number; postgres: number; total: number };
    floor: { server: number; postgres: number; total: number };
    cpuOfFloor: number;
  };
  /** Per left-out plugin (or `logging` silenced): requests/s without it and the gain over the full app (%). */
  ablations: Record<string, LoadFigures & { gainPercent: number }>;
}

interface Target {
  path: string;
  headers: Record<string, string>;
  versionId: string;
}

/** CPU seconds of the PostgreSQL cluster so far (-1 when it cannot be read: external database). */
type PgCpu = () => number;

/** One autocannon run against `server`; throws unless every request answered 200. */
async function drive(server: ServerChild, target: Target, connections: number, seconds: number, pgCpu: PgCpu): Promise<LoadFigures> {
  const load1 = round(os.loadavg()[0], 2);
  const s0 = await server.stats();
  const pg0 = pgCpu();
  const result = await autocannon({ url: server.url + target.path, connections, duration: seconds, headers: target.headers });
  const pg1 = pgCpu();
  const s1 = await server.stats();
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
    sqlPerRequest: requests ? round((s1.queries - s0.queries) / requests, 2) : 0,
    cpuMicrosPerRequest: {
      server: requests ? round((s1.cpuMicros - s0.cpuMicros) / requests, 1) : 0,
      postgres: requests && pg0 >= 0 && pg1 >= 0 ? round(((pg1 - pg0) * 1e6) / requests, 1) : -1,
    },
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
  opts: { connections: number; seconds: number; rounds: number; ablations?: boolean; rootDir: string },
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
  await fs.rm(srcDir, { recursive: true, force: true });

  const pm = bench.cfg.embedded.postgres ? postmasterPid(path.join(bench.cfg.ROOST_DATA_DIR, 'pg')) : null;
  const pgCpu: PgCpu = () => (pm ? postgresCpuSeconds(pm) : -1);
  const run = async (label: string, server: ServerChild): Promise<LoadFigures> => {
    const f = await drive(server, target, opts.connections, opts.seconds, pgCpu);
    log(
      `api: ${label} ${f.requestsPerSecond} req/s, p99 ${f.latencyMs.p99} ms, ${f.sqlPerRequest} SQL/request, ` +
        `CPU/request server ${f.cpuMicrosPerRequest.server} µs, PostgreSQL ${f.cpuMicrosPerRequest.postgres} µs (load ${f.load1})`,
    );
    return f;
  };
  const startServer = async (start: ApiChildStart): Promise<ServerChild> => {
    const server = await ServerChild.start(bench.cfg, start);
    try {
      await checkAnswer(server, target);
      await autocannon({ url: server.url + target.path, connections: opts.connections, amount: WARM_REQUESTS, headers: target.headers });
      return server;
    } catch (err) {
      await server.stop();
      throw err;
    }
  };
  const logLevel = bench.cfg.ROOST_LOG_LEVEL === 'error' ? 'warn' : bench.cfg.ROOST_LOG_LEVEL;
  const floorServer = await startServer({ mode: 'floor', versionBody: current.body.version });
  let apiServer: ServerChild | undefined;
  const rounds: ApiRound[] = [];
  const ablations: ApiFigures['ablations'] = {};
  try {
    apiServer = await startServer({ mode: 'api', logLevel, without: [] });
    for (let r = 1; r <= opts.rounds; r++) {
      const floor = await run(`round ${r}/${opts.rounds} floor`, floorServer);
      const api = await run(`round ${r}/${opts.rounds} api`, apiServer);
      rounds.push({ floor, api, ofFloor: floor.requestsPerSecond > 0 ? round(api.requestsPerSecond / floor.requestsPerSecond, 2) : 0 });
      log(`api: round ${r} ofFloor ${rounds[rounds.length - 1].ofFloor}`);
    }
    const medianOf = median(rounds.map((x) => x.ofFloor));
    const runAblations = opts.ablations ?? medianOf < API_GOAL;
    if (runAblations) {
      const variants: { name: string; start: ApiChildStart }[] = [
        { name: 'logging', start: { mode: 'api', logLevel: 'silent', without: [] } },
        ...OPTIONAL_PLUGINS.map((p: OptionalPlugin) => ({ name: p, start: { mode: 'api' as const, logLevel, without: [p] } })),
        { name: 'all', start: { mode: 'api', logLevel: 'silent', without: [...OPTIONAL_PLUGINS] } },
      ];
      for (const v of variants) {
        const variant = await startServer(v.start);
        try {
          const full = await run(`api (before without ${v.name})`, apiServer);
          const f = await run(`without ${v.name}`, variant);
          ablations[v.name] = { ...f, gainPercent: round((f.requestsPerSecond / full.requestsPerSecond - 1) * 100, 1) };
        } finally {
          await variant.stop();
        }
      }
    }
  } finally {
    await apiServer?.stop();
    await floorServer.stop();
  }
  const byRatio = [...rounds].sort((x, y) => x.ofFloor - y.ofFloor);
  const mid = byRatio[Math.floor((byRatio.length - 1) / 2)];
  const cpuSum = (side: 'api' | 'floor') => {
    const n = rounds.reduce((t, x) => t + x[side].requests, 0);
    const per = (k: 'server' | 'postgres') =>
      rounds.some((x) => x[side].cpuMicrosPerRequest[k] < 0)
        ? -1
        : round(rounds.reduce((t, x) => t + x[side].cpuMicrosPerRequest[k] * x[side].requests, 0) / Math.max(1, n), 1);
    const server = per('server');
    const postgres = per('postgres');
    return { server, postgres, total: round(server + Math.max(0, postgres), 1) };
  };
  const cpuApi = cpuSum('api');
  const cpuFloor = cpuSum('floor');
  return {
    route: 'GET /api/roosts/{roostId}/versions/{versionRef} (versionRef current)',
    connections: opts.connections,
    durationSeconds: opts.seconds,
    api: mid.api,
    floor: { ...mid.floor, samplesRequestsPerSecond: rounds.map((x) => x.floor.requestsPerSecond), query: 'db/roosts.ts resolveVersion' },
    rounds,
    ofFloor: median(rounds.map((x) => x.ofFloor)),
    timesFloorP99: mid.floor.latencyMs.p99 > 0 ? round(mid.api.latencyMs.p99 / mid.floor.latencyMs.p99, 2) : 0,
    cpu: { api: cpuApi, floor: cpuFloor, cpuOfFloor: cpuApi.total > 0 ? round(cpuFloor.total / cpuApi.total, 2) : 0 },
    ablations,
  };
}
