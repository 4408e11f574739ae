/**
 * An API process started while Temporal and blob storage are down (docs/decisions/outages.md "Starting during
 * an outage"): it listens at once, `/healthz` is 200, `/readyz` is 503 naming what is down, routes that need a
 * missing dependency answer 503 `service_unavailable` with Retry-After, routes that need only the database
 * work, and it serves everything once the dependencies come back, without a restart. It used to exit:
 * after ~23 s ("connect ECONNREFUSED") while ensuring the blob containers, after ~37 s ("Failed to connect
 * before the deadline") while connecting to Temporal.
 *
 * The real `node api/server.ts` (test/support/api-child.ts), its database reached through a proxy in front of
 * the suite's PostgreSQL, its Temporal and Azurite through TCP proxies of this file that start closed (the
 * suite's own services keep serving the other files).
 */
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { azuriteConnectionString } from '../../config/env';
import { checkReadiness } from '../../services/identity';
import { closeServiceDeps, createServiceDeps } from '../../services/deps';
import { BlobStore } from '../../storage/blob';
import { rolloutWorkflowId } from '../../workflows/client';
import { PgProxy, killHard, startApiChild } from '../support/api-child';
import { testConfig } from '../support/env';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy';
import { waitFor } from '../support/wait';
import { enrolMachineRows, machineIds, type SeededRoost, seedRoost, terminateAll } from './rollout-fixtures';

let h: Harness;
let db: PgProxy;
let temporal: TcpProxy;
let azurite: TcpProxy;
let child: ChildProcess | undefined;
let roost: SeededRoost;
const workflows = new Set<string>();

beforeAll(async () => {
  h = await createHarness();
  const ids = machineIds(2);
  await enrolMachineRows(h, ids);
  roost = await seedRoost(h, { targets: ids });
  db = new PgProxy();
  await db.open();
  const suite = testConfig();
  temporal = await startTcpProxy(Number(suite.temporalAddress.split(':').pop()));
  azurite = await startTcpProxy(suite.ROOST_AZURITE_PORT);
  await temporal.down();
  await azurite.down();
}, 120_000);

afterAll(async () => {
  if (child) await killHard(child);
  await terminateAll(h, workflows);
  await temporal?.close();
  await azurite?.close();
  await db?.close();
  await h?.close();
});

test('an API started with Temporal and blob storage down listens, answers 503 for what needs them, and recovers without a restart', async () => {
  const started = Date.now();
  const api = await startApiChild(db, {
    TEMPORAL_ADDRESS: `127.0.0.1:${temporal.port}`,
    AZURE_STORAGE_CONNECTION_STRING: azuriteConnectionString(azurite.port),
    ROOST_TASK_QUEUE: `start-outage-${randomBytes(3).toString('hex')}`,
  });
  child = api.child;
  // Listening is not held back by either dependency (it used to take ~23 s to fail on blob storage alone).
  expect(Date.now() - started).toBeLessThan(20_000);
  const call = async (method: string, url: string, body?: unknown) => {
    const res = await fetch(`${api.url}${url}`, {
      method,
      headers: {
        authorization: `Bearer ${h.apiKey}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json', 'idempotency-key': idemKey() }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.status, retryAfter: res.headers.get('retry-after'), body: (await res.json()) as any };
  };
  const deploy = () => call('POST', `/api/roosts/${roost.roostId}/deploy`, { siteId: h.siteId });

  // Both down.
  expect((await call('GET', '/healthz')).status).toBe(200);
  const both = await call('GET', '/readyz');
  expect([both.status, both.body.code, both.body.dependencies, both.body.detail, Number(both.retryAfter) > 0]).toEqual([
    503,
    'service_unavailable',
    { database: 'up', blobStorage: 'down', temporal: 'down' },
    'not ready: blob storage, Temporal; retry shortly',
    true,
  ]);
  // Database only: served.
  const versions = await call('GET', `/api/roosts/${roost.roostId}/versions?siteId=${h.siteId}`);
  expect([versions.status, versions.body.versions?.map((v: { versionId: string }) => v.versionId)]).toEqual([200, [roost.versionId]]);
  // A version's files are read from its body in blob storage.
  const files = await call('GET', `/api/roosts/${roost.roostId}/versions/${roost.versionId}/files?siteId=${h.siteId}`);
  expect([files.status, files.body.code, files.retryAfter]).toEqual([503, 'service_unavailable', '5']);

  // Blob storage back: the version's files are served; a deploy (blob storage, then Temporal) is 503 for Temporal.
  await azurite.up();
  const onlyTemporal = await waitFor('readyz naming Temporal only', async () => {
    const r = await call('GET', '/readyz');
    return r.body.dependencies?.blobStorage === 'up' && r;
  });
  expect([onlyTemporal.status, onlyTemporal.body.dependencies, onlyTemporal.body.detail]).toEqual([
    503,
    { database: 'up', blobStorage: 'up', temporal: 'down' },
    'not ready: Temporal; retry shortly',
  ]);
  expect((await call('GET', `/api/roosts/${roost.roostId}/versions/${roost.versionId}/files?siteId=${h.siteId}`)).status).toBe(200);
  const refused = await deploy();
  expect([refused.status, refused.body.code, refused.retryAfter, refused.body.retryAfter]).toEqual([503, 'service_unavailable', '5', 5]);

  // Temporal back: ready, and the deploy goes through on the same process.
  await temporal.up();
  const ready = await waitFor('readyz 200', async () => {
    const r = await call('GET', '/readyz');
    return r.status === 200 && r;
  });
  expect(ready.body.dependencies).toEqual({ database: 'up', blobStorage: 'up', temporal: 'up' });
  const deployed = await deploy();
  expect([deployed.status, deployed.body.alreadyRunning]).toEqual([202, false]);
  workflows.add(rolloutWorkflowId(h.siteId, roost.roostId, deployed.body.versionId));
  expect(child.exitCode).toBeNull();
}, 180_000);

test('blob containers missing at start are created once blob storage answers, in the background', async () => {
  const prefix = `so${randomBytes(4).toString('hex')}-`;
  await azurite.down();
  const cfg = testConfig({
    AZURE_STORAGE_CONNECTION_STRING: azuriteConnectionString(azurite.port),
    ROOST_BLOB_CONTAINER_PREFIX: prefix,
  });
  const deps = await createServiceDeps(cfg, 1);
  const direct = BlobStore.fromConfig(testConfig({ ROOST_BLOB_CONTAINER_PREFIX: prefix }));
  try {
    const down = await checkReadiness(deps).catch((err: { extras?: { dependencies?: unknown } }) => err.extras?.dependencies);
    expect(down).toMatchObject({ blobStorage: 'down' });
    await azurite.up();
    await waitFor('the containers', () => direct.container('installers').exists(), 60_000, 200);
    expect(await direct.container('chunks').exists()).toBe(true);
  } finally {
    await closeServiceDeps(deps);
    await direct.deleteContainers();
  }
}, 120_000);
