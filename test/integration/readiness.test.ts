/**
 * `GET /healthz` (liveness) and `GET /readyz` (readiness: database, blob storage, Temporal, migrations;
 * docs/observability.md "Health and readiness") while real dependencies stop and come back. This file starts
 * its own PostgreSQL cluster and its own Azurite (the suite's keep serving the other files) and stops them for
 * real; Temporal is the suite's, reached through a TCP proxy this file closes.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import { buildApp } from '../../api/app';
import type { AppDeps } from '../../api/context';
import { createPool } from '../../db/pool';
import { migrate, migrationFiles } from '../../db/migrate';
import { closeServiceDeps, createServiceDeps } from '../../services/deps';
import { checkReadiness, HEALTH_TIMEOUT_MS } from '../../services/identity';
import type { ApiError } from '../../domain/errors';
import { clusterDir, ensurePostgres, externalClustersRoot } from '../../stack/postgres';
import { ensureAzurite, type ServiceHandle } from '../../stack/services';
import { freePorts } from '../../stack/ports';
import { BlobStore } from '../../storage/blob';
import type { Config } from '../../config/env';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy';
import { testConfig } from '../support/env';
import { testLogger } from '../support/test-log';

let dataDir: string;
let cfg: Config;
let pg: ServiceHandle | undefined;
let azurite: ServiceHandle | undefined;
let temporal: TcpProxy;
let deps: AppDeps;
let app: FastifyInstance;

const readyz = async () => {
  const res = await app.inject({ url: '/readyz' });
  return { status: res.statusCode, body: res.json() };
};
const healthz = async () => {
  const res = await app.inject({ url: '/healthz' });
  return [res.statusCode, res.json()];
};
/** Asks /readyz until it answers `status` (a dependency that comes back takes a moment to accept connections). */
async function readyzUntil(status: number): Promise<{ status: number; body: any }> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await readyz();
    if (r.status === status || Date.now() > deadline) return r;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}
const READY = {
  ok: true,
  dependencies: { database: 'up', blobStorage: 'up', temporal: 'up' },
  migrations: 'applied',
};

beforeAll(async () => {
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-readyz-'));
  const [pgPort, azuritePort] = await freePorts(2);
  const suite = testConfig();
  temporal = await startTcpProxy(Number(suite.temporalAddress.split(':').pop()));
  cfg = testConfig({
    ROOST_DATA_DIR: dataDir,
    ROOST_PG_PORT: String(pgPort),
    ROOST_PG_DATABASE: 'roost_readyz',
    ROOST_AZURITE_PORT: String(azuritePort),
    TEMPORAL_ADDRESS: `127.0.0.1:${temporal.port}`,
  });
  pg = await ensurePostgres(cfg);
  azurite = await ensureAzurite(cfg);
  await BlobStore.fromConfig(cfg).ensureContainers();
  const pool = createPool(cfg.databaseUrl, 1);
  await migrate(pool).finally(() => pool.end());
  deps = await createServiceDeps(cfg);
  app = await buildApp(deps, { loggerInstance: testLogger('roost-api') });
  await app.ready();
}, 180_000);

afterAll(async () => {
  await app?.close();
  if (deps) await closeServiceDeps(deps);
  await temporal?.close();
  await azurite?.stop();
  await pg?.stop();
  // The cluster of a data folder lives outside it when run as root (stack/postgres.ts externalClusterFolder).
  const cluster = dataDir ? clusterDir({ ROOST_DATA_DIR: dataDir }) : undefined;
  if (cluster?.startsWith(externalClustersRoot())) fs.rmSync(path.dirname(cluster), { recursive: true, force: true });
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
});

test('ready when every dependency answers and every migration is applied', async () => {
  expect(await readyz()).toEqual({ status: 200, body: READY });
  expect(await healthz()).toEqual([200, { ok: true }]);
});

test('PostgreSQL stopped: not ready (database down, migrations unknown) while still alive; ready again once it is back', async () => {
  await pg!.stop();
  const down = await readyz();
  expect([down.status, down.body.code, down.body.dependencies, down.body.migrations]).toEqual([
    503,
    'service_unavailable',
    { database: 'down', blobStorage: 'up', temporal: 'up' },
    'unknown',
  ]);
  expect(down.body.detail).toBe('not ready: the database; retry shortly');
  expect(await healthz()).toEqual([200, { ok: true }]);
  pg = await ensurePostgres(cfg);
  expect(await readyzUntil(200)).toEqual({ status: 200, body: READY });
});

test('Azurite stopped: not ready (blob storage down); ready again once it is back', async () => {
  await azurite!.stop();
  const down = await readyz();
  expect([down.status, down.body.dependencies, down.body.migrations]).toEqual([
    503,
    { database: 'up', blobStorage: 'down', temporal: 'up' },
    'applied',
  ]);
  expect(Number((await app.inject({ url: '/readyz' })).headers['retry-after'])).toBeGreaterThan(0);
  expect(await healthz()).toEqual([200, { ok: true }]);
  azurite = await ensureAzurite(cfg);
  expect(await readyzUntil(200)).toEqual({ status: 200, body: READY });
});

test('Temporal unreachable: not ready (temporal down); ready again once it is reachable', async () => {
  await temporal.down();
  const down = await readyz();
  expect([down.status, down.body.dependencies]).toEqual([503, { database: 'up', blobStorage: 'up', temporal: 'down' }]);
  await temporal.up();
  expect(await readyzUntil(200)).toEqual({ status: 200, body: READY });
});

test('a probe that found Temporal unreachable leaves nothing behind: shutting down right after it is clean', async () => {
  // A probe through the SDK's retrying connection schedules its next attempt on a timer that outlives the
  // probe's deadline; closing the connection before it fires threw "Channel has been shut down" from that
  // timer, outside any request. The probe connection has no retry interceptor, so there is none to fire.
  const own = await createServiceDeps(cfg);
  const thrown: unknown[] = [];
  const onUncaught = (err: unknown) => thrown.push(err);
  process.on('uncaughtException', onUncaught);
  try {
    await temporal.down();
    const started = Date.now();
    const r = await checkReadiness(own).then(
      () => 'ready',
      (err: ApiError) => err.code,
    );
    expect([r, Date.now() - started <= HEALTH_TIMEOUT_MS + 4000]).toEqual(['service_unavailable', true]);
    await closeServiceDeps(own);
    // The SDK's retry delay is at most 5 s with 20 % jitter.
    await new Promise((resolve) => setTimeout(resolve, 6500));
    expect(thrown).toEqual([]);
  } finally {
    process.off('uncaughtException', onUncaught);
    await temporal.up();
  }
  expect(await readyzUntil(200)).toEqual({ status: 200, body: READY });
}, 30_000);

test('a migration of this build the database has not applied: not ready, naming it', async () => {
  const last = migrationFiles().at(-1)!;
  await deps.db.query('DELETE FROM schema_migrations WHERE name = $1', [last]);
  try {
    const pending = await readyz();
    expect([pending.status, pending.body.dependencies, pending.body.migrations, pending.body.pendingMigrations]).toEqual([
      503,
      { database: 'up', blobStorage: 'up', temporal: 'up' },
      'pending',
      [last],
    ]);
    expect(pending.body.detail).toBe(`not ready: migrations not applied (${last}); retry shortly`);
  } finally {
    await deps.db.query('INSERT INTO schema_migrations (name) VALUES ($1) ON CONFLICT (name) DO NOTHING', [last]);
  }
  expect(await readyz()).toEqual({ status: 200, body: READY });
});
