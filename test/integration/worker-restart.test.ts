/**
 * Durability of a rollout across a worker restart (docs/architecture.md "Temporal"): deploy to a fleet of reference
 * agents that take a while per sync, shut the only worker down while the fleet wave runs, start a new
 * worker, and the same rollout completes with every machine committed. The fleet wave's watcher was
 * cancelled by the shutdown and retried by the new worker, which replayed the workflow from history.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { temporal } from '@temporalio/proto';
import { startFleet, type Fleet } from '../../agent/fleet';
import { closeWorkerConnections } from '../../worker/worker';
import { createHarness, type Harness } from '../support/harness';
import { waitFor } from '../support/wait';
import { type TestWorker, deployRoute, machineStatuses, rolloutEvents, seedRoost, startTestWorker, terminateAll } from './rollout-fixtures';

let h: Harness;
let tmpRoot: string;
let fleet: Fleet | undefined;
const workers: TestWorker[] = [];
const workflows: string[] = [];

beforeAll(async () => {
  h = await createHarness();
  await h.app.listen({ port: 0, host: '127.0.0.1' });
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-restart-test-'));
});
afterAll(async () => {
  await fleet?.stop();
  await terminateAll(h, workflows);
  for (const w of workers) await w.stop();
  await closeWorkerConnections();
  h?.app.server.closeAllConnections(); // the agents' keep-alive sockets would hold close() for a minute
  await h?.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

async function rolloutStage(rolloutId: string): Promise<{ stage: string; active: boolean }> {
  const { rows } = await h.deps.db.query('SELECT stage, active FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
    h.siteId,
    rolloutId,
  ]);
  return rows[0];
}

it('completes a rollout after its worker is shut down mid-fleet-wave and a new worker starts', async () => {
  const baseUrl = `http://127.0.0.1:${(h.app.server.address() as AddressInfo).port}`;
  const secret = await h.enrolmentSecret();
  fleet = await startFleet({
    baseUrl,
    siteId: h.siteId,
    enrolmentSecret: secret,
    count: 8,
    rootDir: tmpRoot,
    syncDelayMs: 3000,
    pollWaitSeconds: 5,
    heartbeatMs: 0,
  });
  const first = await startTestWorker(h, 'worker-before-restart');
  workers.push(first);
  const roost = await seedRoost(h, { targets: fleet.machineIds });
  const r = await deployRoute(h, roost.roostId);
  workflows.push(r.workflowId);

  // Wait until the fleet wave's watcher runs on the first worker (stage started), then take the only
  // worker away.
  const handle = h.deps.temporal.workflow.getHandle(r.workflowId);
  await waitFor('the fleet wave watched on the first worker', async () => {
    if ((await rolloutStage(r.rolloutId)).stage !== 'started') return false;
    const pending = (await handle.describe()).raw.pendingActivities ?? [];
    return pending.some(
      (a) => a.activityType?.name === 'watchWave' && a.state === temporal.api.enums.v1.PendingActivityState.PENDING_ACTIVITY_STATE_STARTED,
    );
  });
  expect((await machineStatuses(h, r.rolloutId)).succeeded ?? 0).toBeLessThan(8);
  await first.stop();
  expect(await rolloutStage(r.rolloutId)).toEqual({ stage: 'started', active: true });

  const second = await startTestWorker(h, 'worker-after-restart');
  workers.push(second);
  const out = await handle.result();
  expect(out).toEqual({ rolloutId: r.rolloutId, stage: 'completed', succeeded: 8, failed: 0, abortReason: null });

  expect(await rolloutStage(r.rolloutId)).toEqual({ stage: 'completed', active: false });
  expect(await machineStatuses(h, r.rolloutId)).toEqual({ succeeded: 8 });
  const { rows } = await h.deps.db.query(
    `SELECT machine_id, reported_version_id, status FROM roost_target_states WHERE site_id = $1 AND roost_id = $2 ORDER BY machine_id`,
    [h.siteId, roost.roostId],
  );
  expect(rows).toEqual(fleet.machineIds.map((m) => ({ machine_id: m, reported_version_id: roost.versionId, status: 'committed' })));
  expect((await rolloutEvents(h, r.rolloutId)).map((e) => e.type)).toEqual(['deployment.started', 'deployment.completed']);
  // Each machine got one sync_pull: the restart re-dispatched nothing.
  const { rows: cmds } = await h.deps.db.query(`SELECT count(*)::int AS n FROM commands WHERE site_id = $1 AND rollout_id = $2`, [
    h.siteId,
    r.rolloutId,
  ]);
  expect(cmds[0].n).toBe(8);

  // The fleet watcher ran again on the new worker (attempt 2 or later).
  const history = await handle.fetchHistory();
  const events = history.events ?? [];
  const watchFleet = events.filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'watchWave').pop();
  const started = events.find(
    (e) => e.activityTaskStartedEventAttributes?.scheduledEventId?.toString() === watchFleet?.eventId?.toString(),
  );
  expect(started?.activityTaskStartedEventAttributes?.attempt).toBeGreaterThanOrEqual(2);
  expect(started?.activityTaskStartedEventAttributes?.identity).toBe('worker-after-restart');
  const identities = new Set(events.map((e) => e.workflowTaskCompletedEventAttributes?.identity).filter(Boolean));
  expect(identities).toEqual(new Set(['worker-before-restart', 'worker-after-restart']));
});
