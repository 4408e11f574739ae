/**
 * The API-overhead benchmark's servers (bench/api.ts), each in a process of its own so that autocannon in
 * the parent never shares their event loop. Both kinds are the same process kind (`node --import tsx`,
 * configuration from the environment through config/env.ts `loadConfig`, a `pg` pool of 20 from
 * db/pool.ts `createPool`, as services/deps.ts gives the API), listening on a free loopback port:
 *
 * - `api`: the real app (api/app.ts `buildApp` over services/deps.ts `createServiceDeps`), at the log level
 *   it is given, optionally `without` some plugins (the benchmark's plugin ablations);
 * - `floor`: a bare Fastify (no logger, no plugins, no schema) with one route,
 *   `GET /api/roosts/:roostId/versions/current?siteId=`, that runs the read the real route's service runs
 *   (db/roosts.ts `resolveVersion`: the roost row, then its current version row) through the pool and
 *   answers those rows with the version body it was given (the real route serves the body from the
 *   process's cache, services/version-bodies.ts), i.e. HTTP + the route's SQL + JSON.
 *
 * Driven over Node IPC. Parent → child: `start`, `stats`. Child → parent: `ready` (base URL), `stats`
 * (SQL statements sent through the pool since start, and the process's user+system CPU time so far, µs), `failed`. Never run by hand; exits when the parent goes.
 */
import Fastify from 'fastify';
import type { Pool } from 'pg';
import { loadConfig } from '../config/env';
import { createPool } from '../db/pool';
import { resolveVersion } from '../db/roosts';
import { buildApp, type OptionalPlugin } from '../api/app';
import { closeServiceDeps, createServiceDeps } from '../services/deps';

/** What the parent asks for with `start`. */
export type ApiChildStart = { mode: 'api'; logLevel: string; without: OptionalPlugin[] } | { mode: 'floor'; versionBody: unknown };

export type ToApiChild = { type: 'start'; opts: ApiChildStart } | { type: 'stats' };
export type FromApiChild =
  { type: 'ready'; url: string } | { type: 'stats'; queries: number; cpuMicros: number } | { type: 'failed'; message: string };

/** The pool size services/deps.ts `createServiceDeps` gives the API. */
export const POOL_SIZE = 20;

function send(msg: FromApiChild): void {
  process.send?.(msg);
}

let queries = 0;
let close: (() => Promise<void>) | undefined;

/** Counts the statements sent through `pool` (pool.query; the routes read through it). */
function countQueries(pool: Pool): void {
  const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    queries++;
    return query(...args);
  };
}

async function start(opts: ApiChildStart): Promise<string> {
  const cfg = loadConfig();
  if (opts.mode === 'api') {
    const deps = await createServiceDeps(cfg, POOL_SIZE);
    countQueries(deps.db);
    const app = await buildApp(deps, { logger: { level: opts.logLevel }, without: opts.without });
    await app.listen({ host: '127.0.0.1', port: 0 });
    close = async () => {
      await app.close();
      await closeServiceDeps(deps);
    };
    const addr = app.server.address();
    return `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
  }
  const pool = createPool(cfg.databaseUrl, POOL_SIZE);
  countQueries(pool);
  const app = Fastify({ logger: false });
  const body = opts.versionBody;
  app.get('/api/roosts/:roostId/versions/current', async (request) => {
    const { roostId } = request.params as { roostId: string };
    const { siteId } = request.query as { siteId: string };
    const row = await resolveVersion(pool, siteId, roostId, 'current');
    return { ...row, version: body };
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  close = async () => {
    await app.close();
    await pool.end();
  };
  const addr = app.server.address();
  return `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
}

process.on('message', (msg: ToApiChild) => {
  if (msg.type === 'start') {
    start(msg.opts).then(
      (url) => send({ type: 'ready', url }),
      (err) => send({ type: 'failed', message: (err as Error).stack ?? String(err) }),
    );
  } else if (msg.type === 'stats') {
    const cpu = process.cpuUsage();
    send({ type: 'stats', queries, cpuMicros: cpu.user + cpu.system });
  }
});

// The parent went away (or told us to stop by disconnecting): close and exit.
process.on('disconnect', () => {
  void (close?.() ?? Promise.resolve()).catch(() => undefined).finally(() => process.exit(0));
});
