/**
 * Command-line options of `npm run bench` (node:util parseArgs; unknown options are an error).
 *
 *   --only <names>        comma list of benchmarks: chunker, push, republish, check, rollout, classic, api, scaleout (default all)
 *   --size-mib <n>        size of the generated tree for chunker, push, republish (default 1024)
 *   --machines <n>        simulated machines for rollout, classic and scaleout (default 1000)
 *   --fleet-processes <n> child processes the simulated machines are spread over (default one per 2,500 machines)
 *   --heartbeat-ms <n>    heartbeat interval of every simulated machine (default 30000, 6 ms per machine
 *                         above 5,000 machines, at most 60000: the API's 90 s staleness bound stays met)
 *   --poll-wait <s>       long-poll wait of every simulated machine in seconds, 1..30 (default 25)
 *   --api-connections <n> keep-alive connections per fleet process for API calls other than long-polls (default 64)
 *   --fleet-nice <n>      scheduling niceness of the fleet processes, 0..19 (default 10: the simulated machines
 *                         stand in for remote computers, so they take the CPU the API, worker and database leave)
 *   --requests <n>        chunks/check requests (default 300)
 *   --stored-chunks <n>   chunks stored for the check benchmark (default 100000)
 *   --concurrency <n>     chunk PUTs in flight for the push (default: the CLI's automatic rule, cli/upload-window.ts)
 *   --push-api <where>    where the cold push's API runs: `process` (default: a process of its own, as a remote
 *                         API would) or `in-process` (the bench process, beside the CLI, as before)
 *   --rounds <n>          alternating rounds of the chunker, push, republish and api benchmarks (default 3)
 *   --connections <n>     autocannon connections of the api benchmark (default 10)
 *   --seconds <n>         seconds of each autocannon run of the api benchmark (default 10)
 *   --api-ablations       run the api benchmark's plugin ablations even when the API reaches its goal
 *   --database <name>     bench database on the embedded cluster (default roost_bench)
 *   --keep-database       leave the bench database in place afterwards (for inspection)
 *   --out <file>          also write the JSON document to this file
 */
import { parseArgs } from 'node:util';
import type { ApiWhere } from './server-child';

export const BENCHMARKS = ['chunker', 'push', 'republish', 'check', 'rollout', 'classic', 'api', 'scaleout'] as const;
export type BenchName = (typeof BENCHMARKS)[number];

export interface BenchOptions {
  only: BenchName[];
  sizeMiB: number;
  machines: number;
  fleet: FleetTuning;
  requests: number;
  storedChunks: number;
  /** Chunk PUTs in flight for the push; undefined = the CLI's automatic rule. */
  concurrency?: number;
  /** Where the cold push's API runs (bench/server-child.ts ApiWhere). */
  pushApi: ApiWhere;
  /** Where the `check` benchmark's API runs. */
  checkApi: ApiWhere;
  /** The rollout and scale-out benchmarks skip their floor (one reboot_machine per machine, twice): minutes at 10,000 machines. */
  skipFloor: boolean;
  rounds: number;
  connections: number;
  seconds: number;
  /** true: always run the api benchmark's ablations; undefined: only when the API misses its goal. */
  apiAblations?: boolean;
  database: string;
  keepDatabase: boolean;
  out?: string;
}

/** How the simulated fleet of rollout and classic runs (bench/fleet-child.ts). */
export interface FleetTuning {
  processes: number;
  heartbeatMs: number;
  pollWaitSeconds: number;
  apiConnections: number;
  /** The agents' compact sync protocol (docs/agent-protocol.md "Inline sync"); false with `--separate-sync`. */
  inlineSync: boolean;
  /** Niceness of the fleet processes (0..19; `--fleet-nice`). */
  nice: number;
}

/** Machines per fleet process by default. */
export const MACHINES_PER_FLEET_PROCESS = 2500;

/** The default heartbeat interval for `machines` simulated machines (ms; see the header). */
export function defaultHeartbeatMs(machines: number): number {
  return Math.min(60_000, Math.max(30_000, machines * 6));
}

/** `--<name>`: `process` (the default) or `in-process`; throws on anything else. */
function apiWhere(name: string, raw: string | undefined): ApiWhere {
  const v = raw ?? 'process';
  if (v !== 'process' && v !== 'in-process') throw new Error(`--${name} must be process or in-process (got ${v})`);
  return v;
}

function positive(name: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be a positive integer (got ${raw})`);
  return n;
}

/** Parses argv (without node and the script). @throws Error naming the bad option. */
export function parseOptions(argv: string[]): BenchOptions {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    allowPositionals: false,
    options: {
      only: { type: 'string' },
      'size-mib': { type: 'string' },
      machines: { type: 'string' },
      'fleet-processes': { type: 'string' },
      'heartbeat-ms': { type: 'string' },
      'poll-wait': { type: 'string' },
      'api-connections': { type: 'string' },
      'fleet-nice': { type: 'string' },
      'separate-sync': { type: 'boolean' },
      'skip-floor': { type: 'boolean' },
      requests: { type: 'string' },
      'stored-chunks': { type: 'string' },
      concurrency: { type: 'string' },
      'push-api': { type: 'string' },
      'check-api': { type: 'string' },
      rounds: { type: 'string' },
      connections: { type: 'string' },
      seconds: { type: 'string' },
      'api-ablations': { type: 'boolean' },
      database: { type: 'string' },
      'keep-database': { type: 'boolean' },
      out: { type: 'string' },
    },
  });
  let only: BenchName[] = [...BENCHMARKS];
  if (values.only !== undefined) {
    const names = values.only
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
    const bad = names.filter((n) => !(BENCHMARKS as readonly string[]).includes(n));
    if (bad.length || names.length === 0) throw new Error(`--only takes a comma list of ${BENCHMARKS.join(', ')} (got ${values.only})`);
    only = BENCHMARKS.filter((b) => names.includes(b));
  }
  const database = values.database ?? 'roost_bench';
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(database)) throw new Error(`--database must be a plain lowercase identifier (got ${database})`);
  const machines = positive('machines', values.machines, 1000);
  const pollWaitSeconds = positive('poll-wait', values['poll-wait'], 25);
  if (pollWaitSeconds > 30) throw new Error(`--poll-wait must be 1..30 seconds (got ${pollWaitSeconds})`);
  const nice = values['fleet-nice'] === undefined ? 10 : Number(values['fleet-nice']);
  if (!Number.isInteger(nice) || nice < 0 || nice > 19) throw new Error(`--fleet-nice must be 0..19 (got ${values['fleet-nice']})`);
  return {
    only,
    sizeMiB: positive('size-mib', values['size-mib'], 1024),
    machines,
    fleet: {
      processes: positive('fleet-processes', values['fleet-processes'], Math.ceil(machines / MACHINES_PER_FLEET_PROCESS)),
      heartbeatMs: positive('heartbeat-ms', values['heartbeat-ms'], defaultHeartbeatMs(machines)),
      pollWaitSeconds,
      apiConnections: positive('api-connections', values['api-connections'], 64),
      inlineSync: values['separate-sync'] !== true,
      nice,
    },
    requests: positive('requests', values.requests, 300),
    storedChunks: positive('stored-chunks', values['stored-chunks'], 100_000),
    concurrency: values.concurrency === undefined ? undefined : positive('concurrency', values.concurrency, 4),
    pushApi: apiWhere('push-api', values['push-api']),
    checkApi: apiWhere('check-api', values['check-api']),
    skipFloor: values['skip-floor'] === true,
    rounds: positive('rounds', values.rounds, 3),
    connections: positive('connections', values.connections, 10),
    seconds: positive('seconds', values.seconds, 10),
    ...(values['api-ablations'] ? { apiAblations: true } : {}),
    database,
    keepDatabase: values['keep-database'] === true,
    out: values.out,
  };
}
