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

/** What start-up work still running in the background reports (the API logs it). */
export interface StartupLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

/** First and longest wait (ms) between attempts at start-up work a dependency that is down holds back. */
const STARTUP_RETRY_MS = { first: 500, max: 15_000 } as const;

/**
 * gRPC reconnect waits of the Temporal connections (ms). After failed connection attempts a channel waits
 * before the next one, the wait growing to `grpc.max_reconnect_backoff_ms` (120 s by default), and calls in
 * between fail without trying: after a 5-minute outage the API answered 503 for 92 s while Temporal was
 * serving again. Capped at 5 s, the API sees Temporal within seconds (docs/decisions/outages.md "Back from
 * an outage"; test/integration/temporal-reconnect.test.ts); an attempt is one TCP connect, cheap to repeat.
 */
const RECONNECT_CHANNEL_ARGS = { 'grpc.initial_reconnect_backoff_ms': 500, 'grpc.max_reconnect_backoff_ms': 5_000 } as const;

/** Start-up work still running, by the deps it belongs to; `closeServiceDeps` stops it. */
const background = new WeakMap<ServiceDeps, AbortController>();

/**
 * Runs the start-up step `step` (`what` names it in the log) until it succeeds, waiting between attempts
 * with doubling waits (STARTUP_RETRY_MS) and a warning line per failure, while `retryIf` says the failure
 * is worth waiting out (default: every failure); the API ensures its blob containers with it in the
 * background, worker/main.ts each start-up step while a dependency is unreachable.
 * @returns true once it succeeded, false when `signal` aborted first
 * @throws the step's failure when `retryIf` refuses it
 */
export async function retryStartupStep(
  what: string,
  step: () => Promise<unknown>,
  signal: AbortSignal,
  opts: { log?: StartupLog; retryIf?: (err: unknown) => boolean } = {},
): Promise<boolean> {
  for (let attempt = 1, wait: number = STARTUP_RETRY_MS.first; ; attempt++, wait = Math.min(wait * 2, STARTUP_RETRY_MS.max)) {
    if (signal.aborted) return false;
    try {
      await step();
      if (attempt > 1) opts.log?.info({ attempt }, `${what}: done`);
      return true;
    } catch (err) {
      if (signal.aborted) return false;
      if (opts.retryIf && !opts.retryIf(err)) throw err;
      opts.log?.warn({ err, attempt, retryInMs: wait }, `${what}: a dependency is unreachable, retrying`);
    }
    await new Promise<void>((resolve) => {
      const t = setTimeout(done, wait);
      function done() {
        clearTimeout(t);
        signal.removeEventListener('abort', done);
        resolve();
      }
      signal.addEventListener('abort', done, { once: true });
    });
  }
}

/**
 * Creates the PostgreSQL pool (`poolSize`, default 20), the blob store and the Temporal client without
 * waiting for any of them to answer, so the API starts and listens while a dependency is down
 * (docs/decisions/outages.md "Starting during an outage"): the Temporal connection is lazy (it connects on
 * the first call; a call while Temporal is down fails as UNAVAILABLE, answered 503), and the blob containers
 * are ensured in the background, retried until blob storage answers (`log` hears of each failed attempt).
 * Call `closeServiceDeps` on shutdown.
 */
export async function createServiceDeps(cfg: Config, poolSize = 20, opts: { log?: StartupLog } = {}): Promise<ServiceDeps> {
  const db = createPool(cfg.databaseUrl, poolSize, {
    queryTimeoutMs: cfg.ROOST_DB_QUERY_TIMEOUT_MS,
    connectTimeoutMs: cfg.ROOST_DB_CONNECT_TIMEOUT_MS,
  });
  const blob = BlobStore.fromConfig(cfg);
  const stop = new AbortController();
  void retryStartupStep('ensure the blob containers', () => blob.ensureContainers({ abortSignal: stop.signal }), stop.signal, {
    log: opts.log,
  });
  // Lazy: `Connection.connect` waited for the server and threw when it was down, so an API restarted during a
  // Temporal outage never listened (not even /healthz) and exited. The SDK's retry interceptor still rides
  // out a short blip per call.
  const connection = Connection.lazy({ address: cfg.temporalAddress, channelArgs: RECONNECT_CHANNEL_ARGS });
  // Workflow starts carry the request id for the activities' logs and the caller's trace context (a no-op
  // while tracing is off; docs/observability.md).
  const temporal = new Client({
    connection,
    namespace: cfg.TEMPORAL_NAMESPACE,
    interceptors: { workflow: [new RequestIdClientInterceptor(), new OpenTelemetryWorkflowClientInterceptor()] },
  });
  const temporalProbe = Connection.lazy({ address: cfg.temporalAddress, interceptors: [], channelArgs: RECONNECT_CHANNEL_ARGS });
  const deps: ServiceDeps = { cfg, db, blob, temporal, temporalProbe };
  background.set(deps, stop);
  return deps;
}

/** Stops start-up work still running, closes the Temporal connections and the pool; never throws. */
export async function closeServiceDeps(deps: ServiceDeps): Promise<void> {
  background.get(deps)?.abort();
  await deps.temporalProbe.close().catch(() => undefined);
  await deps.temporal.connection.close().catch(() => undefined);
  await deps.db.end().catch(() => undefined);
}
