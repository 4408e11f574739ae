/**
 * Worker entry point (`tsx worker/main.ts`): reads configuration, opens the pool and blob store, ensures
 * the background workflows (event relay, sweep schedules; ROOST_BACKGROUND_WORKFLOWS), runs the
 * Temporal worker until SIGINT/SIGTERM, then shuts down gracefully (running activities get the grace time,
 * then are cancelled and retried elsewhere), closes the pool and exits 0. Blob storage or Temporal down at
 * start is waited for (retried with a warning line), not a failure. Exit code 1 on any other start-up or
 * worker failure.
 */
// Tracing (when an OTLP endpoint is set) must start before http and pg load: first import.
import '../telemetry/instrument';
import { loadConfig } from '../config/env';
import { createPool } from '../db/pool';
import { BlobStore } from '../storage/blob';
import { Client, Connection } from '@temporalio/client';
import { TransportError } from '@temporalio/worker';
import { closeWorkerConnections, installRuntime, runWorker, workerConnection } from './worker';
import { unavailableDependency } from '../domain/outage';
import { ensureBackgroundWorkflows } from './background';
import { collectProcessMetrics, observePool, startMetricsListener } from '../telemetry/metrics';
import { activeTracing } from '../telemetry/tracing';
import { createLogger } from '../telemetry/logging';
import { retryStartupStep } from '../services/deps';

/** The process's JSON logger (telemetry/logging.ts); the SDK's Runtime writes through it too. */
const log = createLogger({ service: 'roost-worker', level: process.env.ROOST_LOG_LEVEL ?? 'info' });

/**
 * Whether `err` says a dependency could not be reached (domain/outage.ts; a worker connection's
 * TransportError) rather than a mistake a retry cannot mend.
 */
function unreachable(err: unknown): boolean {
  return unavailableDependency(err) !== null || err instanceof TransportError;
}

/**
 * Runs a start-up step until it succeeds while it fails because a dependency is down (services/deps.ts
 * retryStartupStep); any other failure is thrown.
 * @returns true once it succeeded, false when `signal` aborted first
 */
function untilReachable(what: string, step: () => Promise<unknown>, signal: AbortSignal): Promise<boolean> {
  return retryStartupStep(what, step, signal, { log, retryIf: unreachable });
}

async function main(): Promise<void> {
  // Signals are handled below (one graceful path), not by the SDK's default handlers.
  const cfg = loadConfig();
  installRuntime(cfg, { logger: log });
  const db = createPool(cfg.databaseUrl, 20);
  // The worker's pool and activities in the process registry, served on ROOST_METRICS_PORT (docs/observability.md).
  const unobservePool = observePool(db, 'worker');
  collectProcessMetrics();
  const metrics =
    cfg.ROOST_METRICS_PORT === undefined ? undefined : await startMetricsListener(cfg.ROOST_METRICS_HOST, cfg.ROOST_METRICS_PORT);
  if (metrics) log.info({ url: metrics.url }, 'metrics listener started');
  if (cfg.ROOST_TEMPORAL_METRICS_ADDRESS)
    log.info({ url: `http://${cfg.ROOST_TEMPORAL_METRICS_ADDRESS}/metrics` }, 'Temporal SDK metrics exporter started');
  try {
    const blob = BlobStore.fromConfig(cfg);
    const stop = new AbortController();
    const onSignal = (signal: NodeJS.Signals) => {
      log.info({ signal }, 'signal received, shutting down');
      stop.abort();
    };
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    // A worker started while blob storage or Temporal is down waits for them instead of exiting.
    if (!(await untilReachable('ensure the blob containers', () => blob.ensureContainers({ abortSignal: stop.signal }), stop.signal)))
      return;
    if (cfg.ROOST_BACKGROUND_WORKFLOWS) {
      const ensured = await untilReachable(
        'ensure the event relay and sweep schedules',
        async () => {
          // Lazy: a call while Temporal is down fails as UNAVAILABLE (an outage), where `Connection.connect`
          // failed with a bare deadline error. The signal cancels a call the SDK is still retrying.
          const connection = Connection.lazy({ address: cfg.temporalAddress });
          try {
            await connection.withAbortSignal(stop.signal, () =>
              ensureBackgroundWorkflows(new Client({ connection, namespace: cfg.TEMPORAL_NAMESPACE }), cfg),
            );
          } finally {
            await connection.close();
          }
        },
        stop.signal,
      );
      if (!ensured) return;
      log.info('event relay and sweep schedules ensured');
    }
    // The connection runWorker's worker takes (worker/worker.ts workerConnection keeps it once made).
    if (!(await untilReachable('connect to Temporal', () => workerConnection(cfg), stop.signal))) return;
    log.info({ taskQueue: cfg.ROOST_TASK_QUEUE, temporal: cfg.temporalAddress, namespace: cfg.TEMPORAL_NAMESPACE }, 'serving task queue');
    await runWorker(cfg, { cfg, db, blob }, { signal: stop.signal });
    log.info('stopped');
  } finally {
    await closeWorkerConnections();
    unobservePool();
    await metrics?.close();
    await activeTracing()
      ?.shutdown()
      .catch(() => undefined);
    await db.end().catch(() => undefined);
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    log.error({ err }, 'failed');
    process.exit(1);
  },
);
