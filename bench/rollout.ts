/**
 * Benchmark 5, `rollout`: one roost deploy of a small version (four files, ~36 KiB, so the figure
 * measures orchestration, not bandwidth) to `machines` simulated machines (agent/fleet.ts, all agents
 * in one child process: bench/fleet-child.ts), with the real API, rollout workflow (canary, then fleet)
 * and Temporal worker of the bench stack.
 *
 * Figures:
 * - `rollout.lastCommitSeconds`: from just before `POST /api/roosts/{roostId}/deploy` to the moment the
 *   last machine finished its sync_pull as committed (agent side, after its final report was answered);
 * - the waves: `canaryDispatchedSeconds` / `fleetDispatchedSeconds` (first sync_pull of the wave queued,
 *   `rollout_machines.dispatched_at`, database clock), `canaryLastCommitSeconds`, `fleetFirstCommitSeconds`
 *   (fleet dispatch minus canary end is the workflow's wave hand-over);
 * - `rollout.workflowCompletedSeconds`: to the rollout's `completed_at` (stage completed, written by the
 *   workflow once its wave watcher saw the last machine: includes the watcher's poll interval);
 * - `rollout.historyEvents`: the rollout workflow's history length (`handle.fetchHistory()`), once closed;
 * - the floor: one trivial command (`reboot_machine`: the simulated agent reports it and restarts its
 *   loops at once, with no downtime: bench/fleet-child.ts) queued for every machine with one INSERT, timed
 *   to the last machine's report, i.e. the agent protocol alone (long-poll wake-up, delivery, report).
 *   After one untimed warm-up round, measured before and after the rollout; the floor is their mean.
 *   With `--skip-floor`, the rollout starts one heartbeat interval after the fleet is up instead.
 * A few machines' trees are compared byte for byte with the source afterwards. The agents' trees are
 * deleted at the end.
 */
import { createHash, randomBytes } from 'node:crypto';
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { resolveExtractDir } from '../agent/agent';
import { fleetMachineIds, verifyTree } from '../agent/fleet';
import { push } from '../cli/push';
import { createRoost } from './push';
import type { FleetChildStart, FleetCounters, FleetOutcome, FromChild, ToChild } from './fleet-child';
import type { BenchStack } from './stack';
import type { FleetTuning } from './options';
import { postgresCpuSeconds, postmasterPid, processCpuSeconds } from './cpu';
import { cpuProfArgs, log, round, sleep } from './util';

export interface RolloutFigures {
  machines: number;
  version: { files: number; bytes: number; versionId: string };
  fleetStartSeconds: number;
  rollout: {
    rolloutId: string;
    canary: number;
    fleet: number;
    deployRequestMs: number;
    lastCommitSeconds: number;
    canaryDispatchedSeconds: number;
    canaryLastCommitSeconds: number;
    fleetDispatchedSeconds: number;
    fleetFirstCommitSeconds: number;
    workflowCompletedSeconds: number;
    stage: string;
    historyEvents: number;
    syncAttempts: number;
  };
  floor: { command: 'reboot_machine'; seconds: number; samplesSeconds: number[] };
  /** lastCommitSeconds ÷ floor seconds. */
  timesFloor: number;
  /** lastCommitSeconds per 1,000 machines (the figure that must stay flat as the fleet grows). */
  secondsPer1000Machines: number;
  /** How the simulated fleet ran. */
  fleet: FleetTuning;
  /**
   * HTTP requests the agents made from the deploy request to the last commit, per committed machine:
   * `api` to the Roost API (long-polls, reports, heartbeats and every sync call), `blob` signed-URL GETs
   * (version body, chunks), `total` both. Of `total`: `sync` the requests of the sync itself (the long-poll
   * that delivered the sync_pull, every request made for the command, the blob GETs), `liveness` the rest
   * (heartbeats, long-polls that came back empty, config reads), which grows with the rollout's duration,
   * not with the sync.
   */
  requestsPerMachine: { api: number; blob: number; total: number; sync: number; liveness: number };
  /**
   * CPU seconds per 1,000 committed syncs over the same window: `api` the bench process (API and the
   * Temporal worker with the rollout workflow: they share it), `postgres` the whole cluster, `fleet` the
   * simulator processes; -1 where /proc cannot be read.
   */
  cpuSecondsPer1000Syncs: { api: number; postgres: number; fleet: number };
  verifiedMachines: number;
  fleetStats: Record<string, number>;
}

/** The small version: four files (one empty), deterministic bytes (also served by bench/api.ts). */
const VERSION_FILES: { path: string; size: number }[] = [
  { path: 'bin/app.exe', size: 32 * 1024 },
  { path: 'config/app.json', size: 1200 },
  { path: 'README.txt', size: 3000 },
  { path: 'data/empty.dat', size: 0 },
];

export async function writeSmallVersion(dir: string): Promise<number> {
  await fs.rm(dir, { recursive: true, force: true });
  let bytes = 0;
  for (const f of VERSION_FILES) {
    const abs = path.join(dir, ...f.path.split('/'));
    await fs.mkdir(path.dirname(abs), { recursive: true });
    const out = Buffer.alloc(f.size);
    for (let off = 0, i = 0; off < f.size; off += 32, i++) createHash('sha256').update(`${f.path}:${i}`).digest().copy(out, off);
    await fs.writeFile(abs, out);
    bytes += f.size;
  }
  return bytes;
}

/** What `FleetProcess.start` takes: the fleet child's options for the whole fleet, and how many processes share it. */
export type FleetStart = Omit<FleetChildStart, 'machineIds'> & {
  /** Child processes the agents are spread over (default 1; ids are split into contiguous slices). */
  processes?: number;
  /**
   * Scheduling niceness of the children (default 0). Simulated machines stand in for remote computers:
   * niced, they take the CPU the API, the worker and PostgreSQL leave instead of competing with them.
   */
  nice?: number;
};

/**
 * The fleet child processes (bench/fleet-child.ts) and the outcomes they reported, merged (also used by
 * bench/classic.ts). Machine ids are `sim-0000`… over the whole fleet, whatever the number of processes.
 */
export class FleetProcess {
  readonly outcomes: FleetOutcome[] = [];
  private readonly listeners = new Set<() => void>();
  private exited = false;

  private constructor(private readonly children: ChildProcess[]) {
    for (const child of children) {
      child.on('message', (m: FromChild) => {
        if (m.type === 'outcomes') {
          this.outcomes.push(...m.items);
          for (const l of this.listeners) l();
        }
      });
      child.once('exit', () => {
        this.exited = true;
        for (const l of this.listeners) l();
      });
    }
  }

  /** Number of child processes. */
  get processes(): number {
    return this.children.length;
  }

  /** Spawns the children (`node --import tsx bench/fleet-child.ts`) and starts `count` agents over them. */
  static async start(opts: FleetStart): Promise<{ fleet: FleetProcess; machineIds: string[]; startMs: number }> {
    const { processes = 1, nice = 0, ...childOpts } = opts;
    const n = Math.max(1, Math.min(processes, opts.count));
    const ids = fleetMachineIds(opts.count);
    const children = Array.from({ length: n }, () =>
      // ROOST_BENCH_CPU_PROF_DIR: each fleet process writes a V8 CPU profile there when it exits (where the time goes).
      spawn(process.execPath, [...cpuProfArgs(), '--import', 'tsx', path.join(__dirname, 'fleet-child.ts')], {
        cwd: path.join(__dirname, '..'),
        stdio: ['ignore', 2, 'inherit', 'ipc'],
      }),
    );
    if (nice > 0) for (const child of children) if (child.pid) os.setPriority(child.pid, nice);
    const fleet = new FleetProcess(children);
    const t0 = Date.now();
    try {
      const ready = await Promise.all(
        children.map((child, i) => {
          const slice = ids.slice(Math.floor((i * ids.length) / n), Math.floor(((i + 1) * ids.length) / n));
          return new Promise<string[]>((resolve, reject) => {
            const onMsg = (m: FromChild) => {
              if (m.type === 'ready') resolve(m.machineIds);
              else if (m.type === 'failed') reject(new Error(`fleet failed to start: ${m.message}`));
            };
            child.on('message', onMsg);
            child.once('exit', (code) => reject(new Error(`fleet process exited with ${code} before it was ready`)));
            child.send({ type: 'start', opts: { ...childOpts, count: slice.length, machineIds: slice } } satisfies ToChild);
          });
        }),
      );
      return { fleet, machineIds: ready.flat(), startMs: Date.now() - t0 };
    } catch (err) {
      await fleet.stop().catch(() => undefined);
      throw err;
    }
  }

  /** Resolves once `done()` holds (checked on every batch of outcomes and every `pollMs`), rejects at `timeoutMs`. */
  async until(done: () => boolean | Promise<boolean>, timeoutMs: number, pollMs = 1000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!(await done())) {
      if (this.exited) throw new Error('a fleet process exited');
      if (Date.now() > deadline) throw new Error(`timed out after ${Math.round(timeoutMs / 1000)} s`);
      await this.nextBatch(pollMs);
    }
  }

  /** Resolves at the next batch of outcomes (or a child's exit), or after `ms`. */
  private nextBatch(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const finish = () => {
        clearTimeout(timer);
        this.listeners.delete(finish);
        resolve();
      };
      const timer = setTimeout(finish, ms);
      this.listeners.add(finish);
    });
  }

  /** Requests the agents made so far (API, blob) and the CPU seconds of the fleet processes, summed. */
  async counters(): Promise<FleetCounters> {
    const all = await Promise.all(
      this.children.map(
        (child) =>
          new Promise<FleetCounters>((resolve, reject) => {
            const t = setTimeout(() => reject(new Error('a fleet process did not answer for its counters')), 30_000);
            const onMsg = (m: FromChild) => {
              if (m.type !== 'counters') return;
              clearTimeout(t);
              child.off('message', onMsg);
              resolve(m.counters);
            };
            child.on('message', onMsg);
            child.send({ type: 'counters' } satisfies ToChild);
          }),
      ),
    );
    return all.reduce(
      (a, c) => ({
        api: a.api + c.api,
        blob: a.blob + c.blob,
        command: a.command + c.command,
        delivering: a.delivering + c.delivering,
        cpuSeconds: a.cpuSeconds + c.cpuSeconds,
      }),
      { api: 0, blob: 0, command: 0, delivering: 0, cpuSeconds: 0 },
    );
  }

  /** Stops every agent; resolves with the fleet's stats (summed over the processes). */
  async stop(): Promise<{ stats: Record<string, number>; warnings: string[] }> {
    const results = await Promise.all(this.children.map((c) => FleetProcess.stopChild(c)));
    const stats: Record<string, number> = {};
    for (const r of results) for (const [k, v] of Object.entries(r.stats)) stats[k] = (stats[k] ?? 0) + v;
    return { stats, warnings: results.flatMap((r) => r.warnings).slice(-20) };
  }

  private static async stopChild(child: ChildProcess): Promise<{ stats: Record<string, number>; warnings: string[] }> {
    if (child.exitCode !== null || child.signalCode !== null || !child.connected) return { stats: {}, warnings: [] };
    const result = await new Promise<{ stats: Record<string, number>; warnings: string[] }>((resolve) => {
      const t = setTimeout(() => resolve({ stats: {}, warnings: ['fleet stop timed out'] }), 60_000);
      child.on('message', (m: FromChild) => {
        if (m.type === 'stopped') {
          clearTimeout(t);
          resolve({ stats: m.stats, warnings: m.warnings });
        }
      });
      child.send({ type: 'stop' } satisfies ToChild);
    });
    await new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve();
      const t = setTimeout(() => {
        child.kill('SIGKILL');
        resolve();
      }, 10_000);
      child.once('exit', () => {
        clearTimeout(t);
        resolve();
      });
    });
    return result;
  }
}

/** The fleet child options of a bench fleet tuning. */
export function fleetChildOptions(
  t: FleetTuning,
): Pick<FleetStart, 'processes' | 'heartbeatMs' | 'pollWaitSeconds' | 'apiConnections' | 'inlineSync' | 'nice'> {
  return {
    processes: t.processes,
    heartbeatMs: t.heartbeatMs,
    pollWaitSeconds: t.pollWaitSeconds,
    apiConnections: t.apiConnections,
    inlineSync: t.inlineSync,
    nice: t.nice,
  };
}

/**
 * The floor: one reboot_machine command per machine, inserted with one statement; seconds until every
 * machine reported it. @throws when a machine reports anything but completed.
 */
export async function commandFloor(
  bench: BenchStack,
  fleet: FleetProcess,
  siteId: string,
  machineIds: string[],
  timeoutMs: number,
): Promise<number> {
  const tag = randomBytes(4).toString('hex');
  const commandIds = machineIds.map((m) => `cmd_bench_${tag}_${m}`);
  const wanted = new Set(commandIds);
  const from = fleet.outcomes.length;
  const t0 = Date.now();
  await bench.pool.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, created_by, expires_at)
     SELECT $1, u.machine_id, u.command_id, 'reboot_machine', 'pending', '{"delaySeconds":0}'::jsonb, 'bench', now() + INTERVAL '30 minutes'
       FROM UNNEST($2::text[], $3::text[]) AS u (machine_id, command_id)`,
    [siteId, machineIds, commandIds],
  );
  let last = t0;
  const seen = new Set<string>();
  await fleet.until(
    () => {
      for (let i = from; i < fleet.outcomes.length; i++) {
        const o = fleet.outcomes[i];
        if (!wanted.has(o.commandId) || seen.has(o.commandId)) continue;
        if (o.status !== 'completed') throw new Error(`${o.machineId} reported ${o.status} for the floor command: ${o.error ?? ''}`);
        seen.add(o.commandId);
        last = Math.max(last, o.at);
      }
      return seen.size === wanted.size;
    },
    timeoutMs,
    500,
  );
  return (last - t0) / 1000;
}

/** Runs benchmark 5 on a fresh site of `bench`; `rootDir` holds the machines' trees (deleted afterwards). */
export async function benchRollout(
  bench: BenchStack,
  opts: { machines: number; fleet: FleetTuning; rootDir: string; floor?: boolean },
): Promise<RolloutFigures> {
  const timeoutMs = Math.max(10 * 60_000, opts.machines * 600);
  const site = await bench.newSite('rollout');
  const srcDir = path.join(opts.rootDir, '..', 'rollout-version');
  const bytes = await writeSmallVersion(srcDir);
  const extractPath = 'C:\\Roost\\bench-app';
  const roostId = await createRoost(site, 'bench rollout', { extractPath });
  const pushed = await push({ client: site.client, siteId: site.siteId, roostId, dir: srcDir });
  const secret = await site.client.post<{ enrolmentSecret: string }>(
    `/api/sites/${encodeURIComponent(site.siteId)}/enrolment-secret`,
    {},
    { idempotencyKey: true },
  );

  await fs.rm(opts.rootDir, { recursive: true, force: true });
  await fs.mkdir(opts.rootDir, { recursive: true });
  log(`rollout: starting ${opts.machines} simulated machines (${opts.fleet.processes} child process(es))`);
  const started = await FleetProcess.start({
    baseUrl: bench.apiUrl,
    siteId: site.siteId,
    enrolmentSecret: secret.enrolmentSecret,
    count: opts.machines,
    rootDir: opts.rootDir,
    ...fleetChildOptions(opts.fleet),
  });
  const { fleet, machineIds } = started;
  log(`rollout: fleet up in ${round(started.startMs / 1000)} s`);
  try {
    const floorSamples: number[] = [];
    if (opts.floor !== false) {
      // One untimed round first: every agent's long-poll and connections are then in their steady state.
      await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs);
      floorSamples.push(await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs));
      log(`rollout: floor (one trivial command to each machine) ${round(floorSamples[0])} s`);
    } else {
      // Without the floor's rounds, one heartbeat interval instead: the fleet's first heartbeats and
      // config reads are then behind it, as in a fleet that has been running (a rollout does not start
      // into an enrolment storm).
      log(`rollout: floor skipped; letting the fleet settle for one heartbeat interval (${round(opts.fleet.heartbeatMs / 1000)} s)`);
      await sleep(opts.fleet.heartbeatMs);
    }

    // The rollout.
    const pm = bench.cfg.embedded.postgres ? postmasterPid(path.join(bench.cfg.ROOST_DATA_DIR, 'pg')) : null;
    const cpu0 = { api: processCpuSeconds(process.pid), postgres: pm ? postgresCpuSeconds(pm) : -1 };
    const req0 = await fleet.counters();
    const from = fleet.outcomes.length;
    const t0 = Date.now();
    const deploy = await site.client.request<{ rolloutId: string; canary: string[]; fleet: string[] }>(
      'POST',
      `/api/roosts/${encodeURIComponent(roostId)}/deploy`,
      {
        body: { siteId: site.siteId, versionId: pushed.versionId, machines: machineIds },
        idempotencyKey: true,
      },
    );
    const deployRequestMs = Date.now() - t0;
    const { rolloutId } = deploy.body;
    const canary = new Set(deploy.body.canary);
    log(
      `rollout: ${rolloutId} deployed (canary ${deploy.body.canary.length}, fleet ${deploy.body.fleet.length}); waiting for every commit`,
    );
    const committedAt = new Map<string, number>();
    let attempts = 0;
    let stage = 'canary';
    let lastStageCheck = 0;
    let cursor = from;
    await fleet.until(async () => {
      for (; cursor < fleet.outcomes.length; cursor++) {
        const o = fleet.outcomes[cursor];
        if (o.type !== 'sync_pull') continue;
        attempts++;
        if (o.status === 'completed' && !committedAt.has(o.machineId)) committedAt.set(o.machineId, o.at);
      }
      if (committedAt.size === machineIds.length) return true;
      if (Date.now() - lastStageCheck > 2000) {
        lastStageCheck = Date.now();
        const r = await bench.pool.query<{ stage: string }>('SELECT stage FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
          site.siteId,
          rolloutId,
        ]);
        stage = r.rows[0]?.stage ?? stage;
        if (stage === 'failed') throw new Error(`the rollout failed after ${committedAt.size} commits`);
        log(`rollout: ${committedAt.size}/${machineIds.length} committed, stage ${stage}`);
      }
      return false;
    }, timeoutMs);
    const req1 = await fleet.counters();
    const cpu1 = { api: processCpuSeconds(process.pid), postgres: pm ? postgresCpuSeconds(pm) : -1 };
    const n = committedAt.size;
    const perThousand = (a: number, b: number) => (a < 0 || b < 0 ? -1 : round(((b - a) * 1000) / n, 2));
    const requestsPerMachine = {
      api: round((req1.api - req0.api) / n, 2),
      blob: round((req1.blob - req0.blob) / n, 2),
      total: round((req1.api - req0.api + req1.blob - req0.blob) / n, 2),
      sync: round((req1.command - req0.command + req1.delivering - req0.delivering + req1.blob - req0.blob) / n, 2),
      liveness: round((req1.api - req0.api - (req1.command - req0.command) - (req1.delivering - req0.delivering)) / n, 2),
    };
    const cpuSecondsPer1000Syncs = {
      api: perThousand(cpu0.api, cpu1.api),
      postgres: perThousand(cpu0.postgres, cpu1.postgres),
      fleet: perThousand(req0.cpuSeconds, req1.cpuSeconds),
    };
    log(
      `rollout: requests per machine ${JSON.stringify(requestsPerMachine)}, CPU s per 1,000 syncs ${JSON.stringify(cpuSecondsPer1000Syncs)}`,
    );
    const lastCommit = Math.max(...committedAt.values());
    const canaryLast = Math.max(...[...committedAt].filter(([m]) => canary.has(m)).map(([, at]) => at));
    const fleetTimes = [...committedAt].filter(([m]) => !canary.has(m)).map(([, at]) => at);
    const fleetFirst = fleetTimes.length ? Math.min(...fleetTimes) : lastCommit;

    // The workflow's end and its history.
    const row = await bench.pool.query<{ workflow_id: string }>('SELECT workflow_id FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
      site.siteId,
      rolloutId,
    ]);
    const handle = bench.stack.api.deps.temporal.workflow.getHandle(row.rows[0].workflow_id);
    await Promise.race([handle.result(), sleep(timeoutMs).then(() => Promise.reject(new Error('the rollout workflow did not close')))]);
    const dispatched = await bench.pool.query<{ wave: string; first: Date }>(
      'SELECT wave, min(dispatched_at) AS first FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 GROUP BY wave',
      [site.siteId, rolloutId],
    );
    const dispatchedAt = (wave: string) => {
      const row = dispatched.rows.find((r) => r.wave === wave);
      return row?.first ? round((row.first.getTime() - t0) / 1000) : -1;
    };
    const final = await bench.pool.query<{ stage: string; completed_at: Date | null }>(
      'SELECT stage, completed_at FROM rollouts WHERE site_id = $1 AND rollout_id = $2',
      [site.siteId, rolloutId],
    );
    const history = await handle.fetchHistory();
    const historyEvents = history.events?.length ?? 0;
    log(`rollout: last commit ${round((lastCommit - t0) / 1000)} s, workflow ${final.rows[0].stage}, ${historyEvents} history events`);

    if (opts.floor !== false) {
      floorSamples.push(await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs));
      log(`rollout: floor again ${round(floorSamples[1])} s`);
    }

    // A few machines' trees, byte for byte.
    const sample = [machineIds[0], machineIds[Math.floor(machineIds.length / 2)], machineIds[machineIds.length - 1]];
    const uniqueSample = [...new Set(sample)];
    for (const m of uniqueSample) {
      const diffs = await verifyTree(srcDir, resolveExtractDir(path.join(opts.rootDir, m), extractPath));
      if (diffs.length) throw new Error(`machine ${m}'s tree differs from the version: ${JSON.stringify(diffs.slice(0, 5))}`);
    }

    const stopped = await fleet.stop();
    // -1 when the floor was skipped (--skip-floor).
    const floor = floorSamples.length ? floorSamples.reduce((a, b) => a + b, 0) / floorSamples.length : -1;
    const lastCommitSeconds = (lastCommit - t0) / 1000;
    return {
      machines: machineIds.length,
      version: { files: VERSION_FILES.length, bytes, versionId: pushed.versionId },
      fleetStartSeconds: round(started.startMs / 1000),
      rollout: {
        rolloutId,
        canary: deploy.body.canary.length,
        fleet: deploy.body.fleet.length,
        deployRequestMs,
        lastCommitSeconds: round(lastCommitSeconds),
        canaryDispatchedSeconds: dispatchedAt('canary'),
        canaryLastCommitSeconds: round((canaryLast - t0) / 1000),
        fleetDispatchedSeconds: dispatchedAt('fleet'),
        fleetFirstCommitSeconds: round((fleetFirst - t0) / 1000),
        workflowCompletedSeconds: final.rows[0].completed_at ? round((final.rows[0].completed_at.getTime() - t0) / 1000) : -1,
        stage: final.rows[0].stage,
        historyEvents,
        syncAttempts: attempts,
      },
      floor: { command: 'reboot_machine', seconds: round(floor), samplesSeconds: floorSamples.map((s) => round(s)) },
      timesFloor: floor > 0 ? round(lastCommitSeconds / floor, 2) : -1,
      secondsPer1000Machines: round((lastCommitSeconds * 1000) / machineIds.length, 2),
      fleet: { ...opts.fleet, processes: fleet.processes },
      requestsPerMachine,
      cpuSecondsPer1000Syncs,
      verifiedMachines: uniqueSample.length,
      fleetStats: stopped.stats,
    };
  } finally {
    await fleet.stop().catch(() => undefined);
    await fs.rm(opts.rootDir, { recursive: true, force: true });
    await fs.rm(srcDir, { recursive: true, force: true });
    log('rollout: machine trees deleted');
  }
}
