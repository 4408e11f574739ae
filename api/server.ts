/**
 * Runs the API: creates dependencies from configuration, builds the app and listens on
 * ROOST_API_HOST:ROOST_API_PORT. `startApi` is used by `roost stack`, the demo and the benchmarks;
 * `node api/server.ts` (through tsx) runs one stateless API process.
 */
import type { FastifyInstance } from 'fastify';
import type { Config } from '../config/env';
import { loadConfig } from '../config/env';
import { buildApp } from './app';
import type { AppDeps } from './context';
import { closeServiceDeps as closeDeps, createServiceDeps as createDeps } from '../services/deps';

export interface RunningApi {
  app: FastifyInstance;
  deps: AppDeps;
  /** Base URL the API answers on, e.g. http://127.0.0.1:8080 */
  url: string;
  close(): Promise<void>;
}

/** Starts one API process. Port 0 picks a free port (the returned url names it). */
export async function startApi(cfg: Config, opts: { logger?: boolean } = {}): Promise<RunningApi> {
  const deps = await createDeps(cfg);
  const app = await buildApp(deps, opts.logger === false ? { logger: false } : {});
  await app.listen({ host: cfg.ROOST_API_HOST, port: cfg.ROOST_API_PORT });
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : cfg.ROOST_API_PORT;
  const url = `http://${cfg.ROOST_API_HOST}:${port}`;
  deps.cfg = { ...cfg, publicUrl: cfg.ROOST_PUBLIC_URL ?? url };
  return {
    app,
    deps,
    url,
    async close() {
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
      const stop = () => void api.close().then(() => process.exit(0));
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    })
    .catch((err) => {
      process.stderr.write(`roost api failed to start: ${(err as Error).message}\n`);
      process.exit(1);
    });
}
