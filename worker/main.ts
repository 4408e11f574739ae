/**
 * Worker entry point (`tsx worker/main.ts`): reads configuration, opens the pool and blob store, ensures
 * the background workflows (event relay, sweep schedules; ROOST_BACKGROUND_WORKFLOWS), runs the
 * Temporal worker until SIGINT/SIGTERM, then shuts down gracefully (running activities get the grace time,
 * then are cancelled and retried elsewhere), closes the pool and exits 0. Exit code 1 on a start-up or
 * worker failure.
 */
import { loadConfig } from '../config/env';
import { createPool } from '../db/pool';
import { BlobStore } from '../storage/blob';
import { Client, Connection } from '@temporalio/client';
import { closeWorkerConnections, installRuntime, runWorker } from './worker';
import { ensureBackgroundWorkflows } from './background';

async function main(): Promise<void> {
  // Signals are handled below (one graceful path), not by the SDK's default handlers.
  installRuntime();
  const cfg = loadConfig();
  const db = createPool(cfg.databaseUrl, 20);
  try {
    const blob = BlobStore.fromConfig(cfg);
    await blob.ensureContainers();
    const stop = new AbortController();
    const onSignal = (signal: NodeJS.Signals) => {
      console.error(`roost worker: ${signal} received, shutting down`);
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
      console.error('roost worker: event relay and sweep schedules ensured');
    }
    console.error(
      `roost worker: serving task queue ${cfg.ROOST_TASK_QUEUE} on ${cfg.temporalAddress} (namespace ${cfg.TEMPORAL_NAMESPACE})`,
    );
    await runWorker(cfg, { cfg, db, blob }, { signal: stop.signal });
    console.error('roost worker: stopped');
  } finally {
    await closeWorkerConnections();
    await db.end().catch(() => undefined);
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error('roost worker: failed:', err);
    process.exit(1);
  },
);
