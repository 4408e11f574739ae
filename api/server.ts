/**
 * Runs the API: creates dependencies from configuration, builds the app and listens on
 * ROOST_API_HOST:ROOST_API_PORT. `startApi` is used by `roost stack`, the demo and the benchmarks;
 * `node api/server.ts` (through tsx) runs one stateless API process.
 */
// Tracing (when an OTLP endpoint is set) must start before http and pg load: first import.
import '../telemetry/instrument';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config/env';
import { loadConfig } from '../config/env';
import { buildApp } from './app';
import { startLostStartPass } from './lost-starts';
import type { AppDeps } from './context';
import { closeServiceDeps as closeDeps, createServiceDeps as createDeps } from '../services/deps';
import { startMetricsListener, type MetricsListener } from '../telemetry/metrics';
import { activeTracing } from '../telemetry/tracing';
import { createLogger } from '../telemetry/logging';

export interface RunningApi {
  app: FastifyInstance;
  deps: AppDeps;
  /** Base URL the API answers on, e.g. http://127.0.0.1:8080 */
  url: string;
  /** URL of the separate metrics listener (ROOST_METRICS_PORT), when one runs. */
  metricsUrl?: string;
  /** Closes the metrics listener, if one runs (`close` does too; stack/run.ts closes the parts in its own order). */
  closeMetrics(): Promise<void>;
  /** Closes the metrics listener, the app and the dependencies. */
  close(): Promise<void>;
}

/** Starts one API process. Port 0 picks a free port (the returned url names it). `loggerInstance` replaces the process logger (tests). */
export async function startApi(cfg: Config, opts: { logger?: boolean; loggerInstance?: Logger } = {}): Promise<RunningApi> {
  // The app's logger, made here so start-up work that waits on a dependency in the background logs with it.
  const logger =
    opts.logger === false ? undefined : (opts.loggerInstance ?? createLogger({ service: 'roost-api', level: cfg.ROOST_LOG_LEVEL }));
  // Waits on no dependency: the API listens (liveness, readiness naming what is down, 503s) whatever is down.
  const deps = await createDeps(cfg, undefined, { log: logger });
  const app = await buildApp(deps, logger ? { loggerInstance: logger } : { logger: false });
  await app.listen({ host: cfg.ROOST_API_HOST, port: cfg.ROOST_API_PORT });
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : cfg.ROOST_API_PORT;
  const url = `http://${cfg.ROOST_API_HOST}:${port}`;
  deps.cfg = { ...cfg, publicUrl: cfg.ROOST_PUBLIC_URL ?? url };
  let metrics: MetricsListener | undefined;
  if (cfg.ROOST_METRICS_PORT !== undefined) {
    try {
      metrics = await startMetricsListener(cfg.ROOST_METRICS_HOST, cfg.ROOST_METRICS_PORT);
    } catch (err) {
      await app.close();
      await closeDeps(deps);
      throw new Error(
        `metrics listener on ${cfg.ROOST_METRICS_HOST}:${cfg.ROOST_METRICS_PORT} (ROOST_METRICS_PORT): ${(err as Error).message}`,
      );
    }
  }
  const lostStarts = startLostStartPass(deps, app.log);
  const closeMetrics = async () => {
    const m = metrics;
    metrics = undefined;
    await m?.close();
  };
  return {
    app,
    deps,
    url,
    metricsUrl: metrics?.url,
    closeMetrics,
    async close() {
      lostStarts.stop();
      await closeMetrics();
      await app.close();
      await closeDeps(deps);
    },
  };
}

if (require.main === module) {
  const cfg = loadConfig();
  startApi(cfg)
    .then((api) => {
      process.stdout.write(`roost api listening on ${api.url}\n`);
      if (api.metricsUrl) process.stdout.write(`roost api metrics on ${api.metricsUrl}\n`);
      const stop = () =>
        void api
          .close()
          .then(() => activeTracing()?.shutdown())
          .then(() => process.exit(0));
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    })
    .catch((err) => {
      process.stderr.write(`roost api failed to start: ${(err as Error).message}\n`);
      process.exit(1);
    });
}
