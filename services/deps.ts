/**
 * What every service function is given: configuration, the PostgreSQL pool, the blob store and the Temporal
 * client (docs/architecture.md). Services take these explicitly, never from a framework, so they can be
 * called from the API, the CLI's launchers and tests alike.
 */
import { Client, Connection } from '@temporalio/client';
import { OpenTelemetryWorkflowClientInterceptor } from '@temporalio/interceptors-opentelemetry';
import { RequestIdClientInterceptor } from '../telemetry/logging';
import type { Pool } from 'pg';
import type { LanguageModelV3 } from '@ai-sdk/provider';
import type { Config } from '../config/env';
import { createPool } from '../db/pool';
import { BlobStore } from '../storage/blob';

export interface ServiceDeps {
  cfg: Config;
  db: Pool;
  blob: BlobStore;
  temporal: Client;
  /**
   * A second connection to the same frontend without the SDK's gRPC retry interceptor, for the readiness
   * probe only (`GET /readyz`): one attempt within the probe's deadline, and no retry timer left behind that
   * would fire on a closed channel after shutdown.
   */
  temporalProbe: Connection;
  /** The model answering conversation sends instead of the configured one (services/cortex-model.ts; tests, embedders). */
  cortexModel?: LanguageModelV3;
}

/**
 * Connects to PostgreSQL (a pool of `poolSize`, default 20), Azure Blob (ensuring the containers) and
 * Temporal. Call `closeServiceDeps` on shutdown.
 * @throws when blob containers cannot be ensured or Temporal cannot be reached.
 */
export async function createServiceDeps(cfg: Config, poolSize = 20): Promise<ServiceDeps> {
  const db = createPool(cfg.databaseUrl, poolSize, {
    queryTimeoutMs: cfg.ROOST_DB_QUERY_TIMEOUT_MS,
    connectTimeoutMs: cfg.ROOST_DB_CONNECT_TIMEOUT_MS,
  });
  const blob = BlobStore.fromConfig(cfg);
  await blob.ensureContainers();
  // 30 s rather than the SDK's 10 s: a Temporal server that is busy (a loaded machine, a restart in
  // progress) answers late; one that is down still fails start-up with a clear error.
  const connection = await Connection.connect({ address: cfg.temporalAddress, connectTimeout: '30 seconds' });
  // Workflow starts carry the request id for the activities' logs and the caller's trace context (a no-op
  // while tracing is off; docs/observability.md).
  const temporal = new Client({
    connection,
    namespace: cfg.TEMPORAL_NAMESPACE,
    interceptors: { workflow: [new RequestIdClientInterceptor(), new OpenTelemetryWorkflowClientInterceptor()] },
  });
  const temporalProbe = Connection.lazy({ address: cfg.temporalAddress, interceptors: [] });
  return { cfg, db, blob, temporal, temporalProbe };
}

/** Closes the Temporal connections and the pool; never throws. */
export async function closeServiceDeps(deps: ServiceDeps): Promise<void> {
  await deps.temporalProbe.close().catch(() => undefined);
  await deps.temporal.connection.close().catch(() => undefined);
  await deps.db.end().catch(() => undefined);
}
