/**
 * Benchmark 6, `classic`: one classic installer deployment (`POST /api/sites/{siteId}/deployments`,
 * `parallel_install: true`) of an installer that succeeds at once (a POSIX shell script served over HTTPS
 * by test/support/installers.ts, really downloaded, sha256-checked and run by every agent: agent/installer.ts)
 * to `machines` simulated machines (agent/fleet.ts in a child process: bench/fleet-child.ts), with the real
 * API, `classicDeploymentWorkflow` and Temporal worker of the bench stack.
 *
 * Figures:
 * - `deployment.lastCompletedSeconds`: from just before the create request to the moment the last machine
 *   finished its `classic_install` as completed (agent side, after its final report was answered);
 * - `deployment.perMachineSeconds`: percentiles over the machines of that same time (when each machine was
 *   done, counted from the create request), and `runSeconds` of each target's own install
 *   (`finished_at - dispatched_at` of classic_deployment_targets, database clock: command pick-up, download,
 *   sha256, run, the reports) and `queuedSeconds` (`dispatched_at` minus the deployment's `created_at`: the
 *   wait for a parallelism slot);
 * - `deployment.workflowCompletedSeconds`: to the workflow's result (its final settle included);
 * - `history`: every run of the workflow (continue-as-new chain, newest last) with its event count and
 *   history size in bytes, once for a 10-machine deployment and once for the full one, next to Temporal's
 *   limits: the history must not grow with the number of targets;
 * - the floor: the rollout benchmark's (bench/rollout.ts `commandFloor`): one trivial command queued for every
 *   machine with one INSERT, timed to the last machine's report (the agent protocol alone), measured
 *   before and after the deployment; the floor is their mean.
 * Afterwards the installer's own log proves every machine ran it exactly once.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { CLASSIC_INSTALL, classicDeploymentWorkflowId } from '../domain/classic';
import { installerScript, startInstallerServer } from '../test/support/installers';
import { commandFloor, FleetProcess, fleetChildOptions } from './rollout';
import type { FleetTuning } from './options';
import type { BenchStack, BenchSite } from './stack';
import { latencySummary, log, round } from './util';

/** Temporal's default per-workflow-run history limits (the server terminates a run past them). */
export const TEMPORAL_HISTORY_LIMITS = { events: 51_200, bytes: 50 * 1024 * 1024 };

/** One run of the deployment workflow. */
interface RunHistory {
  runId: string;
  events: number;
  bytes: number;
}

/** What one deployment measured. */
interface DeploymentFigures {
  deploymentId: string;
  targets: number;
  status: string;
  createRequestMs: number;
  lastCompletedSeconds: number;
  workflowCompletedSeconds: number;
  /** Per machine: seconds from the create request to its install's final report. */
  perMachineSeconds: ReturnType<typeof latencySummary>;
  /** Per target: seconds from dispatch to the final report (database clock). */
  runSeconds: ReturnType<typeof latencySummary>;
  /** Per target: seconds from the deployment's creation to its dispatch (database clock). */
  queuedSeconds: ReturnType<typeof latencySummary>;
  /** The workflow's runs, oldest first (more than one when it continued as new). */
  runs: RunHistory[];
  historyEventsTotal: number;
}

export interface ClassicFigures {
  machines: number;
  parallelism: number;
  pollMs: number;
  fleetStartSeconds: number;
  installer: { bytes: number };
  deployment: DeploymentFigures;
  /** The same deployment to 10 machines first: its history next to the full one's. */
  small: Pick<DeploymentFigures, 'targets' | 'lastCompletedSeconds' | 'runs' | 'historyEventsTotal'>;
  historyLimits: typeof TEMPORAL_HISTORY_LIMITS;
  floor: { command: 'reboot_machine'; seconds: number; samplesSeconds: number[] };
  /** lastCompletedSeconds ÷ floor seconds. */
  timesFloor: number;
  /** Machines whose installer ran exactly once in the full deployment (must equal machines). */
  ranOnce: number;
  fleetStats: Record<string, number>;
}

/** The workflow's runs, newest last: follows continuedExecutionRunId back from the latest run. */
async function workflowRuns(bench: BenchStack, workflowId: string): Promise<RunHistory[]> {
  const client = bench.stack.api.deps.temporal.workflow;
  const runs: RunHistory[] = [];
  let runId: string | undefined;
  for (let i = 0; i < 1000; i++) {
    const handle = client.getHandle(workflowId, runId);
    const [history, described] = await Promise.all([handle.fetchHistory(), handle.describe()]);
    const events = history.events ?? [];
    const bytes = Number(described.raw.workflowExecutionInfo?.historySizeBytes ?? 0);
    runs.unshift({ runId: described.runId, events: events.length, bytes });
    const previous = events[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId;
    if (!previous) break;
    runId = previous;
  }
  return runs;
}

/** Creates a parallel deployment of `installer` to `machines`, waits for every install and the workflow. */
async function deployAndWait(
  bench: BenchStack,
  site: BenchSite,
  fleet: FleetProcess,
  installer: { url: string; sha256: string },
  machines: string[],
  timeoutMs: number,
): Promise<DeploymentFigures> {
  const from = fleet.outcomes.length;
  const t0 = Date.now();
  const created = await site.client.request<{ deploymentId: string }>('POST', `/api/sites/${encodeURIComponent(site.siteId)}/deployments`, {
    body: {
      name: `bench ${machines.length}`,
      installer_url: installer.url,
      installer_name: 'setup.sh',
      silent_flags: '/S',
      sha256: installer.sha256,
      machines,
      parallel_install: true,
      timeout_seconds: 300,
    },
    idempotencyKey: true,
  });
  const createRequestMs = Date.now() - t0;
  const { deploymentId } = created.body;
  log(`classic: ${deploymentId} created for ${machines.length} machines in ${createRequestMs} ms; waiting for every install`);
  const wanted = new Set(machines);
  const doneAt = new Map<string, number>();
  let cursor = from;
  let lastLog = Date.now();
  await fleet.until(() => {
    for (; cursor < fleet.outcomes.length; cursor++) {
      const o = fleet.outcomes[cursor];
      if (o.type !== CLASSIC_INSTALL || !wanted.has(o.machineId) || doneAt.has(o.machineId)) continue;
      if (o.status !== 'completed') throw new Error(`${o.machineId} reported ${o.status} for its install: ${o.error ?? ''}`);
      doneAt.set(o.machineId, o.at);
    }
    if (Date.now() - lastLog > 5000) {
      lastLog = Date.now();
      log(`classic: ${doneAt.size}/${machines.length} installed`);
    }
    return doneAt.size === machines.length;
  }, timeoutMs);
  const lastCompleted = Math.max(...doneAt.values());

  const workflowId = classicDeploymentWorkflowId(site.siteId, deploymentId);
  const handle = bench.stack.api.deps.temporal.workflow.getHandle(workflowId);
  const outcome = (await Promise.race([
    handle.result(),
    new Promise((_, reject) => setTimeout(() => reject(new Error('the deployment workflow did not close')), timeoutMs).unref()),
  ])) as { status: string };
  const workflowDone = Date.now();
  const runs = await workflowRuns(bench, workflowId);

  const targets = await bench.pool.query<{ run: number | null; queued: number | null }>(
    `SELECT EXTRACT(EPOCH FROM (t.finished_at - t.dispatched_at))::FLOAT8 AS run,
            EXTRACT(EPOCH FROM (t.dispatched_at - d.created_at))::FLOAT8 AS queued
       FROM classic_deployment_targets t
       JOIN classic_deployments d ON d.site_id = t.site_id AND d.deployment_id = t.deployment_id
      WHERE t.site_id = $1 AND t.deployment_id = $2`,
    [site.siteId, deploymentId],
  );
  const secs = (xs: (number | null)[]) => latencySummary(xs.filter((x): x is number => x !== null));
  return {
    deploymentId,
    targets: machines.length,
    status: outcome.status,
    createRequestMs,
    lastCompletedSeconds: round((lastCompleted - t0) / 1000),
    workflowCompletedSeconds: round((workflowDone - t0) / 1000),
    perMachineSeconds: latencySummary([...doneAt.values()].map((at) => (at - t0) / 1000)),
    runSeconds: secs(targets.rows.map((r) => r.run)),
    queuedSeconds: secs(targets.rows.map((r) => r.queued)),
    runs,
    historyEventsTotal: runs.reduce((a, r) => a + r.events, 0),
  };
}

/** Runs benchmark 6 on a fresh site of `bench`; `rootDir` holds the machines' folders (deleted afterwards). */
export async function benchClassic(
  bench: BenchStack,
  opts: { machines: number; fleet: FleetTuning; rootDir: string },
): Promise<ClassicFigures> {
  // Generous: on a loaded 2-core machine a 1,000-target run needed more than 10 minutes (docs/benchmarks.md).
  const timeoutMs = Math.max(10 * 60_000, opts.machines * 2000);
  const site = await bench.newSite('classic');
  // The site's deployQuota (default 100) bounds a deployment's targets.
  await bench.pool.query('UPDATE sites SET deploy_quota = $2 WHERE site_id = $1', [site.siteId, Math.max(100, opts.machines)]);
  await fs.rm(opts.rootDir, { recursive: true, force: true });
  await fs.mkdir(opts.rootDir, { recursive: true });
  const marker = path.join(opts.rootDir, 'installer-runs.log');
  const server = await startInstallerServer();
  const script = installerScript({ marker, installs: path.join(opts.rootDir, 'installs') });
  const installer = server.add('setup.sh', script);
  const secret = await site.client.post<{ enrolmentSecret: string }>(
    `/api/sites/${encodeURIComponent(site.siteId)}/enrolment-secret`,
    {},
    { idempotencyKey: true },
  );
  log(`classic: starting ${opts.machines} simulated machines (${opts.fleet.processes} child process(es))`);
  let fleet: FleetProcess | undefined;
  try {
    const started = await FleetProcess.start({
      baseUrl: bench.apiUrl,
      siteId: site.siteId,
      enrolmentSecret: secret.enrolmentSecret,
      count: opts.machines,
      rootDir: path.join(opts.rootDir, 'machines'),
      installerCa: server.ca,
      ...fleetChildOptions(opts.fleet),
    });
    fleet = started.fleet;
    const { machineIds } = started;
    log(`classic: fleet up in ${round(started.startMs / 1000)} s`);

    await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs); // warm-up, untimed
    const floorSamples = [await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs)];
    log(`classic: floor (one trivial command to each machine) ${round(floorSamples[0])} s`);

    const small = await deployAndWait(bench, site, fleet, installer, machineIds.slice(0, Math.min(10, machineIds.length)), timeoutMs);
    log(`classic: 10-machine deployment done in ${small.lastCompletedSeconds} s, ${small.historyEventsTotal} history events`);
    const before = (await fs.readFile(marker, 'utf8')).split('\n').filter(Boolean).length;
    const full = await deployAndWait(bench, site, fleet, installer, machineIds, timeoutMs);
    log(
      `classic: last install ${full.lastCompletedSeconds} s, workflow ${full.status} at ${full.workflowCompletedSeconds} s, ` +
        `${full.runs.length} run(s), ${full.historyEventsTotal} history events`,
    );
    floorSamples.push(await commandFloor(bench, fleet, site.siteId, machineIds, timeoutMs));
    log(`classic: floor again ${round(floorSamples[1])} s`);

    // The installer logs "<machine> <args>" per run: every machine exactly once in the full deployment.
    const runsPerMachine = new Map<string, number>();
    for (const line of (await fs.readFile(marker, 'utf8')).split('\n').filter(Boolean).slice(before)) {
      const m = line.split(' ')[0];
      runsPerMachine.set(m, (runsPerMachine.get(m) ?? 0) + 1);
    }
    const ranOnce = machineIds.filter((m) => runsPerMachine.get(m) === 1).length;
    if (ranOnce !== machineIds.length || runsPerMachine.size !== machineIds.length)
      throw new Error(`the installer ran once on ${ranOnce} of ${machineIds.length} machines (${runsPerMachine.size} distinct)`);

    const stopped = await fleet.stop();
    const floor = floorSamples.reduce((a, b) => a + b, 0) / floorSamples.length;
    return {
      machines: machineIds.length,
      parallelism: bench.cfg.ROOST_CLASSIC_PARALLELISM,
      pollMs: bench.cfg.ROOST_CLASSIC_POLL_MS,
      fleetStartSeconds: round(started.startMs / 1000),
      installer: { bytes: Buffer.byteLength(script) },
      deployment: full,
      small: {
        targets: small.targets,
        lastCompletedSeconds: small.lastCompletedSeconds,
        runs: small.runs,
        historyEventsTotal: small.historyEventsTotal,
      },
      historyLimits: TEMPORAL_HISTORY_LIMITS,
      floor: { command: 'reboot_machine', seconds: round(floor), samplesSeconds: floorSamples.map((s) => round(s)) },
      timesFloor: round(full.lastCompletedSeconds / floor, 2),
      ranOnce,
      fleetStats: stopped.stats,
    };
  } finally {
    await fleet?.stop().catch(() => undefined);
    await server.close();
    await fs.rm(opts.rootDir, { recursive: true, force: true });
    log('classic: machine folders deleted');
  }
}
