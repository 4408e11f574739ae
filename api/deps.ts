/** Creates the API's dependencies from configuration (pool, blob store, Temporal client). */
import { Client, Connection } from '@temporalio/client';
import type { Config } from '../config/env';
import { createPool } from '../db/pool';
import { BlobStore } from '../storage/blob';
import type { AppDeps } from './context';

/** Connects to PostgreSQL, Azure Blob and Temporal. Call `closeDeps` on shutdown. */
export async function createDeps(cfg: Config): Promise<AppDeps> {
  const db = createPool(cfg.databaseUrl, 20);
  const blob = BlobStore.fromConfig(cfg);
  await blob.ensureContainers();
  const connection = await Connection.connect({ address: cfg.temporalAddress });
  const temporal = new Client({ connection, namespace: cfg.TEMPORAL_NAMESPACE });
  return { cfg, db, blob, temporal };
}

export async function closeDeps(deps: AppDeps): Promise<void> {
  await deps.temporal.connection.close().catch(() => undefined);
  await deps.db.end().catch(() => undefined);
}
