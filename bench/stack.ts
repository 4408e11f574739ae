/**
 * The benchmarks' own in-process stack (stack/run.ts `startStack`) with a bench-specific configuration,
 * so a run never disturbs a `roost stack` or a test run on the same services: its own database
 * (`roost_bench` by default, dropped and recreated at start, dropped again at the end unless kept), the
 * API on a free port, a unique Temporal task queue and (embedded default) an Azurite of its own. Also: a
 * fresh site per benchmark (db/bootstrap.ts, so nothing is ever deduplicated across benchmarks) and the
 * clean-up of everything those sites wrote.
 */
import { azuriteConnectionString } from '../config/env';
import { randomBytes } from 'node:crypto';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { type Pool } from 'pg';
import { type Config, loadConfig } from '../config/env';
import { bootstrap } from '../db/bootstrap';
import { createPool } from '../db/pool';
import { RoostClient } from '../cli/client';
import { startStack, type RunningStack } from '../stack/run';
import {
  createDatabase,
  dropDatabase,
  ensureAzurite,
  ensurePostgres,
  ensureTemporal,
  freePort,
  type ServiceHandle,
  stopServices,
} from '../stack/services';
import { log } from './util';

export interface BenchStack {
  cfg: Config;
  stack: RunningStack;
  /** A pool on the bench database for set-up and the SQL floors (10 connections). */
  pool: Pool;
  /** Base URL of the bench API (a free port). */
  apiUrl: string;
  /** A new site (tier enterprise) with a superadmin owner and a full-access key, plus a client carrying that key. */
  newSite(label: string): Promise<BenchSite>;
  /**
   * Embedded default: restarts the bench Azurite empty (same port, fresh folder) and recreates the
   * containers, so the next measurement starts from the same storage state as the previous one (Azurite
   * slows down as it holds more blobs). Returns false, doing nothing, with external storage.
   */
  resetStorage(): Promise<boolean>;
  /** Process id of the bench's own Azurite (embedded default; undefined with external storage). */
  azuritePid(): number | undefined;
  /** Stops everything, removes what the bench sites wrote (blobs, the database unless kept). */
  close(opts?: { keepDatabase?: boolean }): Promise<void>;
}

/**
 * Per-attempt timeout of the bench's API clients. The CLI's 60 s default is shorter than a cold publish of
 * a ~17,500-chunk version takes on a loaded 2-core machine (publish checks each new chunk's stored size);
 * the CLI then retries with the same Idempotency-Key, gets 409 idempotency_key_in_use and gives up. The
 * bench measures how long the pipeline takes, so it waits.
 */
export const CLIENT_TIMEOUT_MS = 15 * 60_000;

export interface BenchSite {
  siteId: string;
  userId: string;
  apiKey: string;
  client: RoostClient;
}

/**
 * The bench configuration: the environment, with the bench database, API port 0, a unique task queue and
 * rate limits scaled out of the way (×1000 unless ROOST_RATE_LIMIT_SCALE is set: the spec's 300 requests
 * per hour per key would otherwise throttle the check benchmark into measuring Retry-After).
 */
export function benchConfig(database: string): Config {
  return loadConfig({
    ROOST_RATE_LIMIT_SCALE: '1000',
    ...process.env,
    ROOST_PG_DATABASE: database,
    ROOST_API_PORT: '0',
    ROOST_TASK_QUEUE: `roost-bench-${randomBytes(4).toString('hex')}`,
    // A throwaway task queue: no relay or sweep schedules to leave behind on the dev server.
    ROOST_BACKGROUND_WORKFLOWS: 'false',
    ROOST_LOG_LEVEL: process.env.ROOST_LOG_LEVEL ?? 'error',
  });
}

/** Stops what the bench stack started so far (set during start-up, cleared by close); for signal handlers. */
let pendingStop: (() => Promise<void>) | undefined;

/** Stops the bench stack's services if one is starting or running (SIGINT/SIGTERM path). */
export async function emergencyStopBench(): Promise<void> {
  await pendingStop?.();
}

/**
 * Starts (or reuses) PostgreSQL and the Temporal dev server, recreates the bench database, starts an
 * Azurite of the bench's own (embedded default: a free port, files under DATA/bench/azurite, removed at
 * the end: deleting tens of thousands of chunk blobs one by one takes Azurite minutes, and the bench's
 * traffic stays off the Azurite of a running stack), then the API and a worker (`worker: false` skips
 * the Temporal worker, for benchmarks that start no workflow).
 */
export async function startBenchStack(opts: { database: string; worker: boolean }): Promise<BenchStack> {
  const base = benchConfig(opts.database);
  if (opts.worker) {
    // The in-process worker logs through the SDK Runtime; keep the bench's stderr to warnings and worse.
    const { DefaultLogger, Runtime } = await import('@temporalio/worker');
    Runtime.install({ logger: new DefaultLogger('WARN'), shutdownSignals: [] });
  }
  const services: ServiceHandle[] = [];
  let cfg = base;
  let azuriteDir: string | undefined;
  let azurite: ServiceHandle | undefined;
  const stopAll = async () => {
    pendingStop = undefined;
    if (azurite) await azurite.stop().catch(() => undefined);
    azurite = undefined;
    await stopServices(services);
  };
  pendingStop = stopAll;
  try {
    if (base.embedded.postgres) services.push(await ensurePostgres(base));
    if (base.embedded.temporal) services.push(await ensureTemporal(base));
    if (base.embedded.azurite) {
      azuriteDir = path.join(base.ROOST_DATA_DIR, 'bench', 'azurite');
      await fsp.rm(azuriteDir, { recursive: true, force: true });
      cfg = { ...base, ROOST_AZURITE_PORT: await freePort() };
      azurite = await ensureAzurite({ ...cfg, ROOST_DATA_DIR: azuriteDir });
      // The stack reaches this Azurite as external storage: its data folder is the bench's, not the clone's,
      // so the stack must not start (or claim) an embedded one on that port.
      cfg = {
        ...cfg,
        AZURE_STORAGE_CONNECTION_STRING: azuriteConnectionString(cfg.ROOST_AZURITE_PORT),
        embedded: { ...cfg.embedded, azurite: false },
      };
    }
    if (cfg.embedded.postgres) createDatabase(cfg, opts.database, true);
  } catch (err) {
    await stopAll();
    throw err;
  }
  const stack = await startStack(cfg, { worker: opts.worker, log: (l) => log(`stack: ${l}`) }).catch(async (err) => {
    await stopAll();
    throw err;
  });
  const pool = createPool(cfg.databaseUrl, 10);
  pendingStop = async () => {
    await stack.stop().catch(() => undefined);
    await stopAll();
  };
  const secret = randomBytes(24).toString('hex');
  const sites: string[] = [];
  log(`stack: api ${stack.urls.api}, database ${opts.database}, azurite :${cfg.ROOST_AZURITE_PORT}, task queue ${cfg.ROOST_TASK_QUEUE}`);

  return {
    cfg,
    stack,
    pool,
    apiUrl: stack.urls.api,
    async newSite(label: string): Promise<BenchSite> {
      const tag = randomBytes(4).toString('hex');
      const r = await bootstrap(pool, { siteName: `bench-${label}-${tag}`, email: `bench-${label}-${tag}@bench.test`, secret });
      // The largest storage tier, so a big --size-mib never meets 402 quota_exceeded (upload-urls reserves
      // 4 MiB per hash until publish, and the check site "holds" 100,000 × 4 MiB).
      await pool.query(`UPDATE sites SET tier = 'enterprise' WHERE site_id = $1`, [r.siteId]);
      sites.push(r.siteId);
      return {
        siteId: r.siteId,
        userId: r.userId,
        apiKey: r.apiKey,
        client: new RoostClient({ baseUrl: stack.urls.api, apiKey: r.apiKey, timeoutMs: CLIENT_TIMEOUT_MS }),
      };
    },
    azuritePid(): number | undefined {
      return azurite?.pid;
    },
    async resetStorage(): Promise<boolean> {
      if (!azuriteDir || !azurite) return false;
      await azurite.stop();
      await fsp.rm(azuriteDir, { recursive: true, force: true });
      azurite = await ensureAzurite({ ...cfg, ROOST_DATA_DIR: azuriteDir });
      await stack.api.deps.blob.ensureContainers();
      log('stack: bench Azurite restarted empty');
      return true;
    },
    async close(closeOpts = {}): Promise<void> {
      if (!azuriteDir) {
        // External storage: delete what the bench sites wrote, blob by blob.
        const blob = stack.api.deps.blob;
        let deleted = 0;
        for (const siteId of sites) {
          for (const container of ['chunks', 'versions', 'screenshots'] as const) {
            const names: string[] = [];
            for await (const b of blob.container(container).listBlobsFlat({ prefix: `sites/${siteId}/` })) names.push(b.name);
            for (let i = 0; i < names.length; i += 64) await Promise.all(names.slice(i, i + 64).map((n) => blob.delete(container, n)));
            deleted += names.length;
          }
        }
        if (deleted) log(`stack: deleted ${deleted} blobs written by the bench sites`);
      }
      pendingStop = undefined;
      await pool.end().catch(() => undefined);
      await stack.stop();
      if (cfg.embedded.postgres && !closeOpts.keepDatabase) dropDatabase(cfg, opts.database);
      await stopAll();
      if (azuriteDir) {
        await fsp.rm(azuriteDir, { recursive: true, force: true });
        log('stack: bench Azurite stopped and its files removed');
      }
    },
  };
}
