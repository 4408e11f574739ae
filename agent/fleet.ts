/**
 * Fleet simulator: many reference agents (agent/agent.ts) in one process, for tests and benchmarks.
 *
 * `startFleet` enrols and starts `count` agents (bounded start-up concurrency), each with its own machine
 * root `<rootDir>/<machineId>` (own chunk store and state, as real machines have) and one long-poll in
 * flight, and one download limiter shared by the whole fleet so a thousand agents never hold more than
 * `downloadConcurrency` chunks in memory at once. Per-agent cost at rest: one pending long-poll request,
 * one heartbeat timer and a few small maps.
 *
 * Connections: every long-poll has a keep-alive connection of its own (one per agent: it is held for the
 * whole wait), every other API call of the fleet shares one keep-alive pool of at most `apiConnections`
 * connections (requests beyond it queue in the pool). Without the bound, a heartbeat or report sent while
 * the agent's poll waited opened a second connection and kept it: 10,000 agents held over 20,000 sockets
 * (the process's open-file limit; `connect EMFILE`), and the API as many.
 *
 * Faults (AgentFaults) apply to every agent: `failMachines` fail every sync of the listed machines,
 * `failStageMachines` fail only their staged syncs (activation 'staged'; their live trees stay as they were).
 *
 * `verifyTree(a, b)` compares two directory trees byte for byte and lists the differences.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import pLimit from 'p-limit';
import { Agent as HttpAgent } from 'undici';
import { Agent, type AgentFaults, type AgentOptions, type AgentStats, type CommandOutcome, createLimiter } from './agent';
import { emptyStats } from './commands';

export interface FleetOptions extends AgentFaults {
  baseUrl: string;
  siteId: string;
  enrolmentSecret: string;
  /** Number of agents. */
  count: number;
  /** Parent folder of every machine root. */
  rootDir: string;
  /** Machine ids are `<prefix><index>` with a zero-padded index (default `sim-`). */
  machinePrefix?: string;
  /** Explicit machine ids (`count` of them; e.g. one slice of a fleet spread over processes); overrides the prefix. */
  machineIds?: string[];
  /** Keep-alive connections the fleet's API calls other than long-polls share (default 64). */
  apiConnections?: number;
  /** Heartbeat interval per agent (ms, default 30000). */
  heartbeatMs?: number;
  /** Long-poll wait (seconds, default 25). */
  pollWaitSeconds?: number;
  /** Chunk downloads in flight across the whole fleet (default 32). */
  downloadConcurrency?: number;
  /** Agents enrolling at once during start-up (default 50). */
  startConcurrency?: number;
  progressIntervalMs?: number;
  /** The compact sync protocol (AgentOptions.inlineSync, default true). */
  inlineSync?: boolean;
  uploadScreenshots?: boolean;
  random?: () => number;
  /** fsync every assembled file (default false here: simulated machines share one disk; see AgentOptions). */
  fsyncFiles?: boolean;
  /**
   * Gives up the start when aborted (e.g. `AbortSignal.timeout(ms)`): the agents started so far are stopped
   * and startFleet rejects with the signal's reason, so no agent outlives a start that failed.
   */
  signal?: AbortSignal;
  /** Extra per-agent options (e.g. hostname), by index. */
  perAgent?: (index: number, machineId: string) => Partial<AgentOptions>;
}

export interface Fleet {
  machineIds: string[];
  agents: Agent[];
  /** The agent of a machine id. */
  agent(machineId: string): Agent | undefined;
  /** Resolves when every listed machine has handled its command of `commandIds` (map machineId → commandId). */
  waitForCommands(commandIds: Map<string, string>, timeoutMs?: number): Promise<CommandOutcome[]>;
  /** Totals over all agents. */
  stats(): AgentStats;
  /** Recent warnings (bounded), newest last. */
  warnings: string[];
  /** Stops every agent and waits for them. */
  stop(): Promise<void>;
}

/** Zero-padded machine ids `<prefix>0000`… for `count` agents. */
export function fleetMachineIds(count: number, prefix = 'sim-'): string[] {
  const width = Math.max(4, String(count - 1).length);
  return Array.from({ length: count }, (_, i) => `${prefix}${String(i).padStart(width, '0')}`);
}

/**
 * Enrols and starts the fleet. If any agent fails to start, the started ones are stopped and the error
 * is rethrown.
 */
export async function startFleet(opts: FleetOptions): Promise<Fleet> {
  const machineIds = opts.machineIds ?? fleetMachineIds(opts.count, opts.machinePrefix);
  if (machineIds.length !== opts.count) throw new Error(`machineIds has ${machineIds.length} ids for a fleet of ${opts.count}`);
  const api = new HttpAgent({ connections: opts.apiConnections ?? 64, keepAliveTimeout: 60_000 });
  const poll = new HttpAgent({ keepAliveTimeout: 60_000 });
  const downloadLimit = createLimiter(opts.downloadConcurrency ?? 32);
  const warnings: string[] = [];
  const agents = machineIds.map(
    (machineId, i) =>
      new Agent({
        baseUrl: opts.baseUrl,
        siteId: opts.siteId,
        enrolmentSecret: opts.enrolmentSecret,
        machineId,
        rootDir: path.join(opts.rootDir, machineId),
        heartbeatMs: opts.heartbeatMs,
        pollWaitSeconds: opts.pollWaitSeconds,
        downloadLimit,
        progressIntervalMs: opts.progressIntervalMs,
        inlineSync: opts.inlineSync,
        uploadScreenshots: opts.uploadScreenshots,
        random: opts.random,
        corruptFirstDownloadRate: opts.corruptFirstDownloadRate,
        failSyncRate: opts.failSyncRate,
        failMachines: opts.failMachines,
        failStageMachines: opts.failStageMachines,
        syncDelayMs: opts.syncDelayMs,
        fsyncFiles: opts.fsyncFiles ?? false,
        dispatchers: { api, poll },
        ...(opts.perAgent?.(i, machineId) ?? {}),
      }),
  );
  for (const a of agents) {
    a.on('warn', (msg: string) => {
      warnings.push(`${a.machineId}: ${msg}`);
      if (warnings.length > 200) warnings.shift();
    });
  }
  const byId = new Map(agents.map((a) => [a.machineId, a]));
  const stop = async () => {
    await Promise.all(agents.map((a) => a.stop()));
    await Promise.all([api.close(), poll.close()]).catch(() => undefined);
  };
  const limit = pLimit(opts.startConcurrency ?? 50);
  const signal = opts.signal;
  const starting = Promise.allSettled(
    agents.map((a) => limit(() => (signal?.aborted ? Promise.reject(signal.reason as Error) : a.start()))),
  );
  let started: PromiseSettledResult<void>[];
  try {
    started = signal ? await Promise.race([starting, abortedPromise(signal)]) : await starting;
  } catch (err) {
    limit.clearQueue();
    await stop();
    throw err;
  }
  const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    await stop();
    throw failed.reason;
  }
  return {
    machineIds,
    agents,
    agent: (id) => byId.get(id),
    warnings,
    waitForCommands: (commandIds, timeoutMs = 120_000) =>
      Promise.all(
        [...commandIds].map(([machineId, commandId]) => {
          const a = byId.get(machineId);
          if (!a) return Promise.reject(new Error(`no agent for ${machineId}`));
          return a.waitForCommand(commandId, timeoutMs);
        }),
      ),
    stats: () => {
      const total = emptyStats();
      for (const a of agents) for (const k of Object.keys(total) as (keyof typeof total)[]) total[k] += a.stats[k];
      return total;
    },
    stop,
  };
}

/** Rejects with the signal's reason once it aborts (at once when it already has). */
function abortedPromise(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    if (signal.aborted) reject(signal.reason as Error);
    else signal.addEventListener('abort', () => reject(signal.reason as Error), { once: true });
  });
}

/** One difference between two trees; `path` is relative with forward slashes. */
export interface TreeDifference {
  path: string;
  /** missing: only in a; extra: only in b; type: file vs folder; size / content: both files, bytes differ. */
  kind: 'missing' | 'extra' | 'type' | 'size' | 'content';
}

async function listTree(root: string): Promise<Map<string, 'file' | 'dir' | 'other'>> {
  const out = new Map<string, 'file' | 'dir' | 'other'>();
  const walk = async (dir: string, rel: string) => {
    let entries;
    try {
      entries = await fs.readdir(dir, { withFileTypes: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' && rel === '') return;
      throw err;
    }
    for (const e of entries) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) {
        out.set(r, 'dir');
        await walk(path.join(dir, e.name), r);
      } else out.set(r, e.isFile() ? 'file' : 'other');
    }
  };
  await walk(root, '');
  return out;
}

function fileDigest(file: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const h = createHash('sha256');
    createReadStream(file)
      .on('data', (d) => h.update(d))
      .on('error', reject)
      .on('end', () => resolve(h.digest('hex')));
  });
}

/**
 * Compares `dirA` (e.g. the source) with `dirB` (e.g. an agent's extract root) byte for byte, folders
 * included. Returns the differences sorted by path; an empty array means identical trees. A missing
 * root counts as an empty tree.
 */
export async function verifyTree(dirA: string, dirB: string): Promise<TreeDifference[]> {
  const [a, b] = await Promise.all([listTree(dirA), listTree(dirB)]);
  const diffs: TreeDifference[] = [];
  for (const [rel, kind] of a) {
    const other = b.get(rel);
    if (other === undefined) diffs.push({ path: rel, kind: 'missing' });
    else if (other !== kind) diffs.push({ path: rel, kind: 'type' });
    else if (kind === 'file') {
      const fa = path.join(dirA, ...rel.split('/'));
      const fb = path.join(dirB, ...rel.split('/'));
      const [sa, sb] = await Promise.all([fs.stat(fa), fs.stat(fb)]);
      if (sa.size !== sb.size) diffs.push({ path: rel, kind: 'size' });
      else if ((await fileDigest(fa)) !== (await fileDigest(fb))) diffs.push({ path: rel, kind: 'content' });
    }
  }
  for (const rel of b.keys()) if (!a.has(rel)) diffs.push({ path: rel, kind: 'extra' });
  return diffs.sort((x, y) => (x.path < y.path ? -1 : x.path > y.path ? 1 : 0));
}
