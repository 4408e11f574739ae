/**
 * The whole stack in one process (`roost stack`, `npm run demo`, benchmarks): the embedded services
 * (PostgreSQL, Azurite, Temporal dev server with its Web UI) as child processes, migrations, the API and
 * a Temporal worker in-process. `stop()` shuts everything down in reverse order.
 */
import type { Worker } from '@temporalio/worker';
import type { Config } from '../config/env';
import { createPool } from '../db/pool';
import { migrate } from '../db/migrate';
import { startApi, type RunningApi } from '../api/server';
import { ensureServices, type ServiceHandle, stopServices } from './services';
import { closeWorkerConnections, createWorker } from '../worker/worker';
import { ensureBackgroundWorkflows } from '../worker/background';

export interface RunningStack {
  cfg: Config;
  api: RunningApi;
  worker: Worker | undefined;
  services: ServiceHandle[];
  urls: { api: string; reference: string; openapi: string; temporalUi: string };
  /** Stops the worker (if running) without stopping the rest, e.g. to simulate a worker restart. */
  stopWorker(): Promise<void>;
  /** Starts a (new) worker. */
  startWorker(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts everything. `worker: false` runs the API only (a separate `worker/main.ts` process then serves
 * the task queue). `log` receives one line per step.
 */
export async function startStack(cfg: Config, opts: { worker?: boolean; log?: (line: string) => void } = {}): Promise<RunningStack> {
  const log = opts.log ?? (() => undefined);
  log('starting services (PostgreSQL, Azurite, Temporal dev server)');
  const services = await ensureServices(cfg);
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
  const stack: RunningStack = {
    cfg,
    api,
    get worker() {
      return worker;
    },
    services,
    urls: { api: api.url, reference: `${api.url}/docs`, openapi: `${api.url}/api/openapi.json`, temporalUi: cfg.temporalUiUrl },
    stopWorker,
    startWorker,
    async stop() {
      await stopWorker();
      await closeWorkerConnections();
      await api.close().catch(() => undefined);
      await stopServices(services);
    },
  };
  return stack;
}
