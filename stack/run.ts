/**
 * The whole stack in one process (`roost stack`, `npm run demo`, benchmarks): the embedded services
 * (PostgreSQL, Azurite, Temporal dev server with its Web UI) as child processes, migrations, the API and
 * a Temporal worker in-process; resolves once `GET /readyz` answers 200. `stop()` shuts everything down in
 * reverse order: API, worker, services.
 */
import type { Worker } from '@temporalio/worker';
import type { Config } from '../config/env';
import { createPool } from '../db/pool';
import { migrate } from '../db/migrate';
import { startApi, type RunningApi } from '../api/server';
import { closeServiceDeps } from '../services/deps';
import { ensureServices, ensureServicesAwayFromOthers, isListening, type ServiceHandle, stopServices } from './services';
import { closeWorkerConnections, createWorker } from '../worker/worker';
import { ensureBackgroundWorkflows } from '../worker/background';

function apiPortInUse(port: number, cause?: unknown): Error {
  return new Error(`port ${port} (ROOST_API_PORT) is in use by another program: set ROOST_API_PORT to a free port (0 picks one)`, {
    cause,
  });
}

export interface RunningStack {
  cfg: Config;
  api: RunningApi;
  worker: Worker | undefined;
  services: ServiceHandle[];
  /** `metrics`: the ROOST_METRICS_PORT listener; `temporalMetrics`: the Temporal SDK exporter (when configured). */
  urls: { api: string; reference: string; openapi: string; temporalUi: string; metrics?: string; temporalMetrics?: string };
  /** Stops the worker (if running) without stopping the rest, e.g. to simulate a worker restart. */
  stopWorker(): Promise<void>;
  /** Starts a (new) worker. */
  startWorker(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts everything. `worker: false` runs the API only (a separate `worker/main.ts` process then serves
 * the task queue). `log` receives one line per step. `movePortsInUse` (self-contained runs such as the
 * demo) moves service ports still at their defaults off ports another clone's services hold
 * (portsAwayFromOthers); the stack's `cfg` then carries the ports used.
 * @throws PortInUseError when a service port is held by something else (and not moved), Error naming
 *   ROOST_API_PORT when the API's port is taken.
 */
export async function startStack(
  cfg: Config,
  opts: { worker?: boolean; log?: (line: string) => void; movePortsInUse?: boolean } = {},
): Promise<RunningStack> {
  const log = opts.log ?? (() => undefined);
  // Checked before anything starts: a taken API port would otherwise fail only after the services are up.
  const apiHost = ['0.0.0.0', '::'].includes(cfg.ROOST_API_HOST) ? '127.0.0.1' : cfg.ROOST_API_HOST;
  if (cfg.ROOST_API_PORT !== 0 && (await isListening(cfg.ROOST_API_PORT, apiHost))) throw apiPortInUse(cfg.ROOST_API_PORT);
  log('starting services (PostgreSQL, Azurite, Temporal dev server)');
  let services: ServiceHandle[];
  if (opts.movePortsInUse) {
    const away = await ensureServicesAwayFromOthers(cfg);
    cfg = away.cfg;
    services = away.handles;
    for (const m of away.moved) log(`port ${m.from} is held by ${m.holder ?? 'another program'}: this run uses ${m.to} (${m.setting})`);
  } else {
    services = await ensureServices(cfg);
  }
  const pool = createPool(cfg.databaseUrl, 2);
  try {
    const applied = await migrate(pool);
    if (applied.length) log(`applied migrations: ${applied.join(', ')}`);
  } finally {
    await pool.end();
  }
  let api: RunningApi;
  try {
    api = await startApi(cfg);
  } catch (err) {
    await stopServices(services);
    if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE') throw apiPortInUse(cfg.ROOST_API_PORT, err);
    throw err;
  }
  let worker: Worker | undefined;
  let workerRun: Promise<void> | undefined;
  const startWorker = async () => {
    worker = await createWorker(cfg, { cfg, db: api.deps.db, blob: api.deps.blob });
    workerRun = worker.run();
    if (cfg.ROOST_BACKGROUND_WORKFLOWS) await ensureBackgroundWorkflows(api.deps.temporal, cfg);
  };
  const stopWorker = async () => {
    if (worker && worker.getState() === 'RUNNING') worker.shutdown();
    await workerRun?.catch(() => undefined);
    worker = undefined;
    workerRun = undefined;
  };
  if (opts.worker !== false) {
    log('starting worker');
    await startWorker();
  }
  // Ready means what `GET /readyz` says (every dependency answers, every migration applied), asked the way
  // a load balancer would.
  const deadline = Date.now() + 60_000;
  for (let ready = await api.app.inject({ url: '/readyz' }); ready.statusCode !== 200; ready = await api.app.inject({ url: '/readyz' })) {
    if (Date.now() > deadline) {
      await stopWorker();
      await api.close().catch(() => undefined);
      await stopServices(services);
      throw new Error(`the stack did not become ready within 60 s: GET /readyz answered ${ready.statusCode} ${ready.body}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  const stack: RunningStack = {
    cfg,
    api,
    get worker() {
      return worker;
    },
    services,
    urls: {
      api: api.url,
      reference: `${api.url}/docs`,
      openapi: `${api.url}/api/openapi.json`,
      temporalUi: cfg.temporalUiUrl,
      ...(api.metricsUrl ? { metrics: api.metricsUrl } : {}),
      ...(cfg.ROOST_TEMPORAL_METRICS_ADDRESS && opts.worker !== false
        ? { temporalMetrics: `http://${cfg.ROOST_TEMPORAL_METRICS_ADDRESS}/metrics` }
        : {}),
    },
    stopWorker,
    startWorker,
    async stop() {
      // The API first (no new requests; those in flight finish), then the worker drains (its running activities
      // finish and report to Temporal), then the connections both used, and the services last.
      log('stopping the API');
      // The metrics listener too: an open server would keep the process alive after the stack stopped.
      await api.closeMetrics().catch(() => undefined);
      await api.app.close().catch(() => undefined);
      log('stopping the worker (draining running activities)');
      await stopWorker();
      await closeWorkerConnections();
      await closeServiceDeps(api.deps);
      const ours = services.filter((s) => s.started);
      if (ours.length > 0)
        log(`stopping services: ${ours.map((s) => `${s.name} (${s.running?.() === false ? 'already exited' : 'running'})`).join(', ')}`);
      await stopServices(services);
    },
  };
  return stack;
}
