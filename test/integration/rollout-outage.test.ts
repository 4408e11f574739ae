/**
 * A database outage in the middle of a fleet wave does not strand the rollout (docs/decisions/outages.md).
 *
 * The API and the worker reach the suite's PostgreSQL through a TCP proxy of this test; closing it for 60 s is
 * their outage: every connection they hold is cut and new ones are refused, exactly what they see when the
 * server is stopped. (The suite's PostgreSQL itself is shared by the test files running beside this one, so it
 * is not stopped; the test's own checks read through a direct connection.) Real reference agents (one process,
 * agent/fleet.ts) sync through the API meanwhile. One agent dies in the middle of its sync just before the
 * outage and comes back after it with no memory of the command, which stays `downloading` for good.
 *
 * Expected: the agents keep their syncs and reports going through the outage (503 with Retry-After, retried
 * until they land), the watcher notices the dead agent's sync made no progress and re-dispatches it within the
 * retry budget, the rollout resumes by itself and completes, and every machine committed exactly once.
 */
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Pool } from 'pg';
import { Agent } from '../../agent/agent';
import { startFleet, type Fleet } from '../../agent/fleet';
import { createPool } from '../../db/pool';
import { closeWorkerConnections } from '../../worker/worker';
import { createHarness, type Harness } from '../support/harness';
import { testConfig } from '../support/env';
import { waitFor } from '../support/wait';
import { type TestWorker, deployRoute, seedRoost, startTestWorker, terminateAll } from './rollout-fixtures';

const OUTAGE_MS = 60_000;
const STALL_MS = 10_000;

let h: Harness;
let direct: Pool;
let proxy: net.Server;
let proxyPort = 0;
const sockets = new Set<net.Socket>();
let tmpRoot: string;
let fleet: Fleet | undefined;
let revived: Agent | undefined;
let worker: TestWorker | undefined;
const workflows: string[] = [];

function openProxy(): Promise<void> {
  const pg = testConfig().ROOST_PG_PORT;
  proxy = net.createServer((client) => {
    const upstream = net.connect(pg, '127.0.0.1');
    sockets.add(client).add(upstream);
    client.pipe(upstream).pipe(client);
    const end = () => (client.destroy(), upstream.destroy());
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  return new Promise((resolve) =>
    proxy.listen(proxyPort, '127.0.0.1', () => ((proxyPort = (proxy.address() as net.AddressInfo).port), resolve())),
  );
}

async function closeProxy(): Promise<void> {
  const closed = new Promise<void>((resolve) => proxy.close(() => resolve()));
  for (const s of sockets) s.destroy();
  sockets.clear();
  await closed;
}

beforeAll(async () => {
  await openProxy();
  const cfg = testConfig();
  h = await createHarness({
    DATABASE_URL: cfg.databaseUrl.replace(`:${cfg.ROOST_PG_PORT}/`, `:${proxyPort}/`),
    ROOST_COMMAND_STALL_MS: String(STALL_MS),
  });
  direct = createPool(cfg.databaseUrl, 2);
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-outage-test-'));
});

afterAll(async () => {
  await revived?.stop();
  await fleet?.stop();
  await terminateAll(h, workflows);
  await worker?.stop();
  await closeWorkerConnections();
  h?.app.server.closeAllConnections();
  await h?.close();
  await direct?.end();
  if (proxy.listening) await closeProxy();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

it('survives a 60 s database outage mid-wave: syncs and reports land, a dead agent is re-dispatched, every machine commits once', async () => {
  const base = await h.listen();
  const secret = await h.enrolmentSecret();
  fleet = await startFleet({
    baseUrl: base,
    siteId: h.siteId,
    enrolmentSecret: secret,
    count: 6,
    rootDir: tmpRoot,
    syncDelayMs: 1500,
    pollWaitSeconds: 5,
    heartbeatMs: 0,
  });
  worker = await startTestWorker(h, 'outage-worker');
  const roost = await seedRoost(h, { targets: fleet.machineIds });
  const r = await deployRoute(h, roost.roostId);
  workflows.push(r.workflowId);

  // The fleet wave is under way: its agents took their commands (downloading) and sit in their syncs.
  const commandStatus = async (machineId: string) => {
    const { rows } = await direct.query(
      `SELECT c.status FROM rollout_machines rm JOIN commands c ON c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.machine_id = $3`,
      [h.siteId, r.rolloutId, machineId],
    );
    return rows[0]?.status as string | undefined;
  };
  const dead = r.fleet[0];
  await waitFor(`${dead} downloading`, async () => (await commandStatus(dead)) === 'downloading');

  // The agent of `dead` dies in the middle of its sync (nothing reported), then the database goes away.
  const deadAgent = fleet.agent(dead)!;
  await deadAgent.stop();
  await closeProxy();
  const outageStart = Date.now();
  const during = await fetch(`${base}/readyz`);
  expect([during.status, ((await during.json()) as { dependencies: unknown }).dependencies]).toEqual([
    503,
    { database: 'down', blobStorage: 'up', temporal: 'up' },
  ]);
  await new Promise((resolve) => setTimeout(resolve, OUTAGE_MS - (Date.now() - outageStart)));
  const { rows: mid } = await direct.query(
    `SELECT count(*)::int AS n FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 AND status = 'succeeded'`,
    [h.siteId, r.rolloutId],
  );
  expect(mid[0].n).toBeLessThan(6); // the outage held the wave

  // The database is back; the dead machine's agent restarts with no memory of its command.
  await openProxy();
  revived = new Agent({
    baseUrl: base,
    siteId: h.siteId,
    enrolmentSecret: secret,
    machineId: dead,
    rootDir: deadAgent.rootDir,
    pollWaitSeconds: 5,
    heartbeatMs: 0,
  });
  await revived.start();

  const out = await h.deps.temporal.workflow.getHandle(r.workflowId).result();
  expect(out).toMatchObject({ rolloutId: r.rolloutId, stage: 'completed', succeeded: 6, failed: 0 });

  const { rows: states } = await direct.query(
    `SELECT machine_id, reported_version_id, status FROM roost_target_states WHERE site_id = $1 AND roost_id = $2 ORDER BY machine_id`,
    [h.siteId, roost.roostId],
  );
  expect(states).toEqual(fleet.machineIds.map((m) => ({ machine_id: m, reported_version_id: roost.versionId, status: 'committed' })));
  // Exactly one commit per machine: the dead agent committed nothing, its restart once, every other agent once.
  expect(deadAgent.stats.syncsCommitted).toBe(0);
  expect(revived.stats.syncsCommitted).toBe(1);
  for (const a of fleet.agents) if (a !== deadAgent) expect([a.machineId, a.stats.syncsCommitted]).toEqual([a.machineId, 1]);
  // The dead agent's sync was given up as stalled and sent again as a second attempt; nobody else needed one.
  const { rows: machines } = await direct.query(
    `SELECT machine_id, attempts FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 ORDER BY machine_id`,
    [h.siteId, r.rolloutId],
  );
  expect(machines).toEqual(fleet.machineIds.map((m) => ({ machine_id: m, attempts: m === dead ? 2 : 1 })));
  const { rows: cmds } = await direct.query(
    `SELECT status, error FROM commands WHERE site_id = $1 AND machine_id = $2 AND rollout_id = $3 ORDER BY created_at`,
    [h.siteId, dead, r.rolloutId],
  );
  expect(cmds).toEqual([
    { status: 'cancelled', error: 'stalled' },
    { status: 'completed', error: null },
  ]);
}, 400_000);
