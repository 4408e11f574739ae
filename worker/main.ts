/**
 * Worker entry point (`tsx worker/main.ts`): reads configuration, opens the pool and blob store, ensures
 * the background workflows (event relay, sweep schedules; ROOST_BACKGROUND_WORKFLOWS), runs the
 * Temporal worker until SIGINT/SIGTERM, then shuts down gracefully (running activities get the grace time,
 * then are cancelled and retried elsewhere), closes the pool and exits 0. Exit code 1 on a start-up or
 * worker failure.
 */
// Tracing (when an OTLP endpoint is set) must start before http and pg load: first import.
import '../telemetry/instrument';
import { loadConfig } from '../config/env';
import { createPool } from '../db/pool';
import { BlobStore } from '../storage/blob';
import { Client, Connection } from '@temporalio/client';
import { closeWorkerConnections, installRuntime, runWorker } from './worker';
import { ensureBackgroundWorkflows } from './background';
import { collectProcessMetrics, observePool, startMetricsListener } from '../telemetry/metrics';
import { activeTracing } from '../telemetry/tracing';
import { createLogger } from '../telemetry/logging';

/** The process's JSON logger (telemetry/logging.ts); the SDK's Runtime writes through it too. */
const log = createLogger({ service: 'roost-worker', level: process.env.ROOST_LOG_LEVEL ?? 'info' });

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
    await blob.ensureContainers();
    const stop = new AbortController();
    const onSignal = (signal: NodeJS.Signals) => {
      log.info({ signal }, 'signal received, shutting down');
      stop.abort();
    };
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    if (cfg.ROOST_BACKGROUND_WORKFLOWS) {
      const connection = await Connection.connect({ address: cfg.temporalAddress });
      try {
        await ensureBackgroundWorkflows(new Client({ connection, namespace: cfg.TEMPORAL_NAMESPACE }), cfg);
      } finally {
        await connection.close();
      }
      log.info('event relay and sweep schedules ensured');
    }
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
