/**
 * Benchmark `scaleout`: the production shape on one machine (docs/deployment.md). Two API processes
 * (`node api/server.ts`) and two worker processes (`node worker/main.ts`) on the bench's task queue, the
 * simulated fleet (bench/fleet-child.ts) reaching the APIs through a round-robin TCP balancer (this
 * module's `RoundRobin`, the stand-in for a load balancer), one rollout of the small version to every
 * machine; once `killAtFraction` of the machines committed, one worker and one API process are killed
 * with SIGKILL (no graceful shutdown: a crash). The rollout must still complete with every machine
 * committed **exactly once**: one completed `sync_pull` reported by each agent, and each
 * `rollout_machines` row `succeeded` after one attempt.
 *
 * Figures: seconds to the last commit (and per 1,000 machines), the floor (one trivial command to each
 * machine through the same balancer, as bench/rollout.ts), when the kills happened, the longest pause
 * between two commits before and after them (what the kills cost), commits per second before and after,
 * the balancer's connections per API process, sync attempts, the workflow's history length.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Config } from '../config/env';
import { RoostClient } from '../cli/client';
import { push } from '../cli/push';
import { BalancerProcesses, MACHINES_PER_BALANCER_PROCESS } from './balancer';
import { childEnv } from './server-child';
import { createRoost } from './push';
import { commandFloor, FleetProcess, fleetChildOptions, writeSmallVersion } from './rollout';
import type { FleetTuning } from './options';
import { CLIENT_TIMEOUT_MS, type BenchStack } from './stack';
import { log, round, sleep } from './util';

const ROOT = path.join(__dirname, '..');

/** A child process of the bench (API or worker) and what it printed last (for failures). */
interface Child {
  name: string;
  proc: ChildProcess;
  tail: () => string;
}

function spawnChild(name: string, script: string, env: NodeJS.ProcessEnv, ready: RegExp): Promise<Child & { match: RegExpExecArray }> {
  const proc = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, script)], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const keep = (d: Buffer) => {
    out = (out + d.toString()).slice(-20_000);
  };
  proc.stderr!.on('data', keep);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start within 120 s: ${out.slice(-2000)}`)), 120_000);
    proc.stdout!.on('data', (d: Buffer) => {
      keep(d);
      const m = ready.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ name, proc, tail: () => out.slice(-2000), match: m });
      }
    });
    proc.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? signal}) before it was ready: ${out.slice(-2000)}`));
    });
  });
}

/** One API process (`node api/server.ts`) on a free loopback port; resolves with its port. */
async function startApiProcess(cfg: Config, name: string): Promise<Child & { port: number }> {
  const env = childEnv(cfg, { ROOST_API_PORT: '0', ROOST_API_HOST: '127.0.0.1', ROOST_LOG_LEVEL: 'error' });
  delete env.ROOST_METRICS_PORT;
  const c = await spawnChild(name, 'api/server.ts', env, /listening on http:\/\/127\.0\.0\.1:(\d+)/);
  return { ...c, port: Number(c.match[1]) };
}

/** One worker process (`node worker/main.ts`) on the bench's task queue; resolves once it serves it. */
async function startWorkerProcess(cfg: Config, name: string): Promise<Child> {
  const env = childEnv(cfg, { ROOST_LOG_LEVEL: 'info', ROOST_BACKGROUND_WORKFLOWS: 'false' });
  delete env.ROOST_METRICS_PORT;
  delete env.ROOST_TEMPORAL_METRICS_ADDRESS;
  return spawnChild(name, 'worker/main.ts', env, /serving task queue/);
}

/** SIGKILLs a child and resolves once it is gone. */
async function killHard(c: Child): Promise<void> {
  if (c.proc.exitCode !== null || c.proc.signalCode !== null) return;
  const gone = new Promise((r) => c.proc.once('exit', r));
  c.proc.kill('SIGKILL');
  await gone;
}

/** SIGTERM (graceful), then SIGKILL after 20 s. */
async function stopChild(c: Child): Promise<void> {
  if (c.proc.exitCode !== null || c.proc.signalCode !== null) return;
  const gone = new Promise((r) => c.proc.once('exit', r));
  c.proc.kill('SIGTERM');
  const t = setTimeout(() => c.proc.kill('SIGKILL'), 20_000);
  await gone;
  clearTimeout(t);
}

export interface ScaleoutFigures {
  machines: number;
  apiProcesses: number;
  workerProcesses: number;
  fleetStartSeconds: number;
  floor: { command: 'reboot_machine'; seconds: number };
  rollout: {
    rolloutId: string;
    lastCommitSeconds: number;
    secondsPer1000Machines: number;
    workflowCompletedSeconds: number;
    historyEvents: number;
    stage: string;
    syncAttempts: number;
  };
  /** lastCommitSeconds ÷ floor seconds. */
  timesFloor: number;
  kills: {
    atSeconds: number;
    committedBefore: number;
    killed: string[];
    /** Longest pause between two consecutive commits before the kills and after them (s). */
    longestGapBeforeSeconds: number;
    longestGapAfterSeconds: number;
    /** Commits per second over the 20 s before the kills and from the kills to the end. */
    commitsPerSecondBefore: number;
    commitsPerSecondAfter: number;
  };
  exactlyOnce: {
    completedSyncsPerMachine: { min: number; max: number };
    rolloutMachinesSucceeded: number;
    attemptsPerMachine: { min: number; max: number };
    syncCommandsPerMachine: { min: number; max: number };
  };
  balancerConnections: number[];
  /** Processes the balancer ran in (bench/balancer-child.ts). */
  balancerProcesses: number;
  fleetStats: Record<string, number>;
}

/**
 * Runs the scale-out benchmark with `machines` simulated machines on a fresh site of `bench` (whose stack
 * runs no in-process worker); `rootDir` holds the machines' trees (deleted afterwards).
 */
export async function benchScaleout(
  bench: BenchStack,
  opts: { machines: number; rootDir: string; killAtFraction?: number; fleet?: FleetTuning; floor?: boolean },
): Promise<ScaleoutFigures> {
  const killAt = Math.max(1, Math.floor(opts.machines * (opts.killAtFraction ?? 0.4)));
  // Generous: on a loaded 2-core machine one API process serves the whole fleet after the kill.
  const timeoutMs = Math.max(20 * 60_000, opts.machines * 2000);
  const children: Child[] = [];
  let balancer: BalancerProcesses | undefined;
  let fleet: FleetProcess | undefined;
  const srcDir = path.join(opts.rootDir, '..', 'scaleout-version');
  try {
    log('scaleout: starting 2 API processes and 2 worker processes');
    const [apiA, apiB, workerA, workerB] = await Promise.all([
      startApiProcess(bench.cfg, 'api-a'),
      startApiProcess(bench.cfg, 'api-b'),
      startWorkerProcess(bench.cfg, 'worker-a'),
      startWorkerProcess(bench.cfg, 'worker-b'),
    ]);
    children.push(apiA, apiB, workerA, workerB);
    const balancerProcesses = Math.max(2, Math.ceil(opts.machines / MACHINES_PER_BALANCER_PROCESS));
    balancer = await BalancerProcesses.start([apiA.port, apiB.port], balancerProcesses, opts.fleet?.nice ?? 0);
    const url = balancer.url;
    log(
      `scaleout: balancer ${url} (${balancerProcesses} processes) → :${apiA.port}, :${apiB.port}; task queue ${bench.cfg.ROOST_TASK_QUEUE}`,
    );

    const site = await bench.newSite('scaleout');
    const client = new RoostClient({ baseUrl: url, apiKey: site.apiKey, timeoutMs: CLIENT_TIMEOUT_MS });
    const viaBalancer = { ...site, client };
    await writeSmallVersion(srcDir);
    const extractPath = 'C:\\Roost\\bench-scaleout';
    const roostId = await createRoost(viaBalancer, 'bench scaleout', { extractPath });
    const pushed = await push({ client, siteId: site.siteId, roostId, dir: srcDir });
    const secret = await client.post<{ enrolmentSecret: string }>(
      `/api/sites/${encodeURIComponent(site.siteId)}/enrolment-secret`,
      {},
      { idempotencyKey: true },
    );
    await fs.rm(opts.rootDir, { recursive: true, force: true });
    await fs.mkdir(opts.rootDir, { recursive: true });
    log(`scaleout: starting ${opts.machines} simulated machines behind the balancer`);
    const started = await FleetProcess.start({
      baseUrl: url,
      siteId: site.siteId,
      enrolmentSecret: secret.enrolmentSecret,
      count: opts.machines,
      rootDir: opts.rootDir,
      ...(opts.fleet ? fleetChildOptions(opts.fleet) : {}),
    });
    fleet = started.fleet;
    const { machineIds } = started;
    log(`scaleout: fleet up in ${round(started.startMs / 1000)} s`);
    let floor = -1;
    if (opts.floor !== false) {
      await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs);
      floor = await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs);
      log(`scaleout: floor (one trivial command to each machine) ${round(floor)} s`);
    } else {
      // As the rollout benchmark without its floor: one heartbeat interval for the fleet to settle.
      const settleMs = opts.fleet?.heartbeatMs ?? 30_000;
      log(`scaleout: floor skipped; letting the fleet settle for ${round(settleMs / 1000)} s`);
      await sleep(settleMs);
    }

    const from = fleet.outcomes.length;
    const t0 = Date.now();
    const deploy = await client.request<{ rolloutId: string }>('POST', `/api/roosts/${encodeURIComponent(roostId)}/deploy`, {
      body: { siteId: site.siteId, versionId: pushed.versionId, machines: machineIds },
      idempotencyKey: true,
    });
    const { rolloutId } = deploy.body;
    log(`scaleout: ${rolloutId} deployed; SIGKILL of worker-a and api-a after ${killAt} commits`);
    const completed = new Map<string, number>();
    const commitTimes: number[] = [];
    let attempts = 0;
    let cursor = from;
    let killedAt = 0;
    let committedBefore = 0;
    let lastLog = 0;
    await fleet.until(async () => {
      for (; cursor < fleet!.outcomes.length; cursor++) {
        const o = fleet!.outcomes[cursor];
        if (o.type !== 'sync_pull') continue;
        attempts++;
        if (o.status === 'completed') {
          completed.set(o.machineId, (completed.get(o.machineId) ?? 0) + 1);
          commitTimes.push(o.at);
        }
      }
      if (!killedAt && completed.size >= killAt) {
        killedAt = Date.now();
        committedBefore = completed.size;
        await Promise.all([killHard(workerA), killHard(apiA)]);
        log(`scaleout: killed worker-a and api-a (SIGKILL) at ${round((killedAt - t0) / 1000)} s, ${committedBefore} committed`);
      }
      if (Date.now() - lastLog > 5000) {
        lastLog = Date.now();
        log(`scaleout: ${completed.size}/${machineIds.length} committed`);
      }
      return completed.size === machineIds.length;
    }, timeoutMs);
    const lastCommit = Math.max(...commitTimes);
    const row = await bench.pool.query<{ workflow_id: string }>('SELECT workflow_id FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
      site.siteId,
      rolloutId,
    ]);
    const handle = bench.stack.api.deps.temporal.workflow.getHandle(row.rows[0].workflow_id);
    await Promise.race([handle.result(), sleep(timeoutMs).then(() => Promise.reject(new Error('the rollout workflow did not close')))]);
    const history = await handle.fetchHistory();
    const final = await bench.pool.query<{ stage: string; completed_at: Date | null }>(
      'SELECT stage, completed_at FROM rollouts WHERE site_id = $1 AND rollout_id = $2',
      [site.siteId, rolloutId],
    );
    // Exactly once, from the database: every machine's row succeeded after one attempt, one sync_pull each.
    const rm = await bench.pool.query<{ succeeded: string; min_attempts: number; max_attempts: number }>(
      `SELECT count(*) FILTER (WHERE status = 'succeeded') AS succeeded, min(attempts) AS min_attempts, max(attempts) AS max_attempts
         FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2`,
      [site.siteId, rolloutId],
    );
    const cmds = await bench.pool.query<{ n: number }>(
      `SELECT count(c.command_id)::int AS n FROM UNNEST($2::text[]) AS m(machine_id)
         LEFT JOIN commands c ON c.site_id = $1 AND c.machine_id = m.machine_id AND c.type = 'sync_pull'
        GROUP BY m.machine_id`,
      [site.siteId, machineIds],
    );
    // A few more seconds for a late duplicate to show up before the per-machine counts are read.
    await sleep(3000);
    for (; cursor < fleet.outcomes.length; cursor++) {
      const o = fleet.outcomes[cursor];
      if (o.type === 'sync_pull' && o.status === 'completed') completed.set(o.machineId, (completed.get(o.machineId) ?? 0) + 1);
    }
    const perMachine = machineIds.map((m) => completed.get(m) ?? 0);
    const cmdCounts = cmds.rows.map((r) => r.n);
    const succeeded = Number(rm.rows[0].succeeded);
    if (Math.min(...perMachine) !== 1 || Math.max(...perMachine) !== 1)
      throw new Error(`not exactly once: completed syncs per machine range ${Math.min(...perMachine)}..${Math.max(...perMachine)}`);
    if (succeeded !== machineIds.length) throw new Error(`${succeeded} of ${machineIds.length} rollout machines succeeded`);

    const sorted = [...commitTimes].sort((a, b) => a - b);
    const gap = (times: number[]) => times.slice(1).reduce((g, t, i) => Math.max(g, t - times[i]), 0) / 1000;
    const before = sorted.filter((t) => t <= killedAt);
    const after = [killedAt, ...sorted.filter((t) => t > killedAt)];
    const recent = before.filter((t) => t > killedAt - 20_000);
    const balancerConnections = await balancer.connections();
    const stopped = await fleet.stop();
    const lastCommitSeconds = (lastCommit - t0) / 1000;
    return {
      machines: machineIds.length,
      apiProcesses: 2,
      workerProcesses: 2,
      fleetStartSeconds: round(started.startMs / 1000),
      floor: { command: 'reboot_machine', seconds: floor > 0 ? round(floor) : -1 },
      rollout: {
        rolloutId,
        lastCommitSeconds: round(lastCommitSeconds),
        secondsPer1000Machines: round((lastCommitSeconds / machineIds.length) * 1000),
        workflowCompletedSeconds: final.rows[0].completed_at ? round((final.rows[0].completed_at.getTime() - t0) / 1000) : -1,
        historyEvents: history.events?.length ?? 0,
        stage: final.rows[0].stage,
        syncAttempts: attempts,
      },
      timesFloor: floor > 0 ? round(lastCommitSeconds / floor, 2) : -1,
      kills: {
        atSeconds: round((killedAt - t0) / 1000),
        committedBefore,
        killed: ['worker-a (SIGKILL)', 'api-a (SIGKILL)'],
        longestGapBeforeSeconds: round(gap(before)),
        longestGapAfterSeconds: round(gap(after)),
        commitsPerSecondBefore: round(recent.length / Math.min(20, (killedAt - t0) / 1000), 1),
        commitsPerSecondAfter: round((after.length - 1) / Math.max(0.001, (lastCommit - killedAt) / 1000), 1),
      },
      exactlyOnce: {
        completedSyncsPerMachine: { min: Math.min(...perMachine), max: Math.max(...perMachine) },
        rolloutMachinesSucceeded: succeeded,
        attemptsPerMachine: { min: rm.rows[0].min_attempts, max: rm.rows[0].max_attempts },
        syncCommandsPerMachine: { min: Math.min(...cmdCounts), max: Math.max(...cmdCounts) },
      },
      balancerConnections,
      balancerProcesses,
      fleetStats: stopped.stats,
    };
  } finally {
    await fleet?.stop().catch(() => undefined);
    await balancer?.close();
    await Promise.all(children.map((c) => stopChild(c)));
    await fs.rm(opts.rootDir, { recursive: true, force: true });
    await fs.rm(srcDir, { recursive: true, force: true });
    log('scaleout: processes stopped, machine trees deleted');
  }
}
