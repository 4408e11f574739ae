/**
 * The rollout workflow end to end over the real services (workflows/rollout.ts, activities/rollout.ts,
 * db/rollouts.ts): canary then fleet, per-machine retries, wave timeout, scheduled start, cancellation,
 * the USE_EXISTING start, and a history whose length does not depend on the number of machines.
 *
 * Agents: `dbFleet` answers sync_pull commands through the tables the agent routes write (bulk, so
 * thousands of machines stay fast); the first test runs real reference agents (agent/fleet.ts) over HTTP.
 * Set ROOST_RECORD_HISTORIES=1 to refresh test/replay/histories/ from these runs.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { WorkflowFailedError } from '@temporalio/client';
import type { Harness } from '../support/harness';
import { startRolloutWorkflow, WorkflowIdBusyError } from '../../workflows/client';
import { withTx } from '../../db/pool';
import { insertRollout, syncPullCommandId } from '../../db/rollouts';
import { splitWaves, DEFAULT_POLICY } from '../../domain/rollout-policy';
import { newId } from '../../domain/hex';
import { recordHistory } from '../../scripts/record-history';
import { startFleet } from '../../agent/fleet';
import { resolveExtractDir } from '../../agent/agent';
import { defaultExtractRoot } from '../../agent/machine-root';
import { waitFor } from '../support/wait';
import {
  type TestWorker,
  createRollout,
  deployRoute,
  dbFleet,
  enrolMachineRows,
  machineIds,
  machineStatuses,
  rolloutEvents,
  seedRoost,
  openRolloutSuite,
  closeRolloutSuite,
} from './rollout-fixtures';

const FAST = { pollIntervalMs: 100, retryBackoffMs: 100 };
const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories');

let h: Harness;
let w: TestWorker;
let tmpRoot: string;
const workflows: string[] = [];

beforeAll(async () => {
  ({ h, w, tmpRoot } = await openRolloutSuite('rollout'));
});
afterAll(() => closeRolloutSuite({ h, w, tmpRoot }, workflows));

async function result(workflowId: string) {
  return h.deps.temporal.workflow.getHandle(workflowId).result();
}

async function historyOf(workflowId: string) {
  return h.deps.temporal.workflow.getHandle(workflowId).fetchHistory();
}

async function rolloutRow(rolloutId: string) {
  const { rows } = await h.deps.db.query('SELECT * FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [h.siteId, rolloutId]);
  return rows[0];
}

/** Records a history only when it is not there yet: these three were recorded before the rollout-control path (the replay test checks that). */
async function maybeRecord(workflowId: string, name: string) {
  if (RECORD && !(await fs.stat(path.join(HISTORIES, `${name}.json`)).catch(() => null)))
    await recordHistory(h.deps.temporal, workflowId, path.join(HISTORIES, `${name}.json`));
}

describe('rolloutWorkflow with reference agents', () => {
  it('deploys through the API to a fleet of agents: every machine commits the version on disk', async () => {
    const baseUrl = await h.listen();
    const secret = await h.enrolmentSecret();
    const fleet = await startFleet({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      count: 6,
      rootDir: path.join(tmpRoot, 'fleet'),
      pollWaitSeconds: 5,
      heartbeatMs: 0,
    });
    try {
      const roost = await seedRoost(h, { targets: fleet.machineIds, extractPath: 'D:\\Apps\\kiosk' });
      const deployed = await deployRoute(h, roost.roostId);
      workflows.push(deployed.workflowId);
      const out = await result(deployed.workflowId);
      expect(out).toEqual({ rolloutId: deployed.rolloutId, stage: 'completed', succeeded: 6, failed: 0, abortReason: null });
      const { rows } = await h.deps.db.query(
        `SELECT machine_id, reported_version_id, status FROM roost_target_states WHERE site_id = $1 AND roost_id = $2 ORDER BY machine_id`,
        [h.siteId, roost.roostId],
      );
      expect(rows).toEqual(fleet.machineIds.map((m) => ({ machine_id: m, reported_version_id: roost.versionId, status: 'committed' })));
      for (const m of fleet.machineIds) {
        const dir = resolveExtractDir(path.join(tmpRoot, 'fleet', m), 'D:\\Apps\\kiosk');
        for (const [file, text] of Object.entries(roost.files))
          expect(await fs.readFile(path.join(dir, ...file.split('/')), 'utf8')).toBe(text);
      }
      const { rows: cmds } = await h.deps.db.query(`SELECT status, result FROM commands WHERE site_id = $1 AND rollout_id = $2`, [
        h.siteId,
        deployed.rolloutId,
      ]);
      expect(cmds).toHaveLength(6);
      expect(cmds.every((c) => c.status === 'completed' && c.result === 'success')).toBe(true);
      await maybeRecord(deployed.workflowId, 'rollout-completed');
    } finally {
      await fleet.stop();
    }
  });

  it("extracts a roost that names no extract path to the agent's default, roosts/<roostId>", async () => {
    const baseUrl = await h.listen();
    const fleet = await startFleet({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: await h.enrolmentSecret(),
      count: 2,
      rootDir: path.join(tmpRoot, 'fleet-default-root'),
      pollWaitSeconds: 5,
      heartbeatMs: 0,
    });
    try {
      const roost = await seedRoost(h, { targets: fleet.machineIds, extractPath: '' });
      const deployed = await deployRoute(h, roost.roostId);
      workflows.push(deployed.workflowId);
      expect(await result(deployed.workflowId)).toMatchObject({ stage: 'completed', succeeded: 2, failed: 0 });
      for (const m of fleet.machineIds) {
        const dir = path.join(tmpRoot, 'fleet-default-root', m, 'roosts', roost.roostId);
        expect(resolveExtractDir(path.join(tmpRoot, 'fleet-default-root', m), defaultExtractRoot(roost.roostId))).toBe(dir);
        for (const [file, text] of Object.entries(roost.files))
          expect(await fs.readFile(path.join(dir, ...file.split('/')), 'utf8')).toBe(text);
      }
    } finally {
      await fleet.stop();
    }
  });
});

describe('rolloutWorkflow with stand-in agents', () => {
  it('runs canary then fleet to completed, with events, counts and search attributes', async () => {
    const ids = machineIds(12);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = dbFleet(h);
    try {
      const r = await createRollout(h, { roostId: roost.roostId, versionId: roost.versionId, machines: ids, policy: FAST });
      workflows.push(r.workflowId);
      expect(r.canary).toHaveLength(2);
      const out = await result(r.workflowId);
      expect(out).toEqual({ rolloutId: r.rolloutId, stage: 'completed', succeeded: 12, failed: 0, abortReason: null });
      const row = await rolloutRow(r.rolloutId);
      expect(row).toMatchObject({ stage: 'completed', active: false, succeeded: 12, failed: 0, abort_reason: null });
      expect(row.completed_at).toBeInstanceOf(Date);
      expect(await machineStatuses(h, r.rolloutId)).toEqual({ succeeded: 12 });
      const events = await rolloutEvents(h, r.rolloutId);
      expect(events.map((e) => e.type)).toEqual(['deployment.started', 'deployment.completed']);
      expect(events[0].data).toEqual({ rolloutId: r.rolloutId, roostId: roost.roostId, siteId: h.siteId, stage: 'canary' });
      expect(events[1].data).toEqual({
        rolloutId: r.rolloutId,
        roostId: roost.roostId,
        siteId: h.siteId,
        stage: 'completed',
        succeeded: 12,
        failed: 0,
      });
      // Every machine got exactly one sync_pull with the protocol's params.
      const { rows: cmds } = await h.deps.db.query(
        `SELECT machine_id, command_id, params, status FROM commands WHERE site_id = $1 AND rollout_id = $2 ORDER BY machine_id`,
        [h.siteId, r.rolloutId],
      );
      expect(cmds).toHaveLength(12);
      expect(cmds[0].params).toEqual({
        roostId: roost.roostId,
        versionId: roost.versionId,
        versionNumber: roost.versionNumber,
        rolloutId: r.rolloutId,
        extractRoot: 'apps/test',
        attempt: 1,
      });
      expect(cmds[0].command_id).toBe(syncPullCommandId(r.rolloutId, cmds[0].machine_id, 1));
      const desc = await h.deps.temporal.workflow.getHandle(r.workflowId).describe();
      expect(desc.searchAttributes).toMatchObject({
        RoostSiteId: [h.siteId],
        RoostRoostId: [roost.roostId],
        RoostVersionId: [roost.versionId],
        RoostStage: ['completed'],
      });
    } finally {
      await fleet.stop();
    }
  });

  it('fails at the canary when a canary machine exhausts its retry budget; the fleet is never dispatched', async () => {
    const ids = machineIds(12);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    let failing = '';
    const fleet = dbFleet(h, (m) => (m === failing ? 'fail' : 'commit'));
    try {
      const rolloutId = newId('rol');
      const waves = splitWaves(rolloutId, ids);
      failing = waves.canary[0];
      const workflowId = await insertAndStart(roost, rolloutId, ids, { ...FAST, retries: 2 });
      const out = await result(workflowId);
      expect(out).toEqual({ rolloutId, stage: 'failed', succeeded: 1, failed: 1, abortReason: 'canary_failed' });
      expect(await machineStatuses(h, rolloutId)).toEqual({ succeeded: 1, failed: 1, cancelled: 10 });
      const { rows: attempts } = await h.deps.db.query(
        `SELECT params->>'attempt' AS attempt, status FROM commands WHERE site_id = $1 AND rollout_id = $2 AND machine_id = $3 ORDER BY 1`,
        [h.siteId, rolloutId, failing],
      );
      expect(attempts).toEqual([
        { attempt: '1', status: 'failed' },
        { attempt: '2', status: 'failed' },
        { attempt: '3', status: 'failed' },
      ]);
      const { rows: fleetCmds } = await h.deps.db.query(
        `SELECT count(*)::int AS n FROM commands WHERE site_id = $1 AND rollout_id = $2 AND machine_id = ANY($3::text[])`,
        [h.siteId, rolloutId, waves.fleet],
      );
      expect(fleetCmds[0].n).toBe(0);
      const { rows: m } = await h.deps.db.query(
        'SELECT attempts, last_error FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 AND machine_id = $3',
        [h.siteId, rolloutId, failing],
      );
      expect(m[0]).toEqual({ attempts: 3, last_error: 'simulated failure' });
      const events = await rolloutEvents(h, rolloutId);
      expect(events.map((e) => e.type)).toEqual(['deployment.started', 'deployment.failed']);
      expect(events[1].data).toEqual({
        rolloutId,
        roostId: roost.roostId,
        siteId: h.siteId,
        stage: 'failed',
        abortReason: 'canary_failed',
        succeeded: 1,
        failed: 1,
      });
      expect(await rolloutRow(rolloutId)).toMatchObject({
        stage: 'failed',
        active: false,
        abort_reason: 'canary_failed',
        succeeded: 1,
        failed: 1,
      });
      await maybeRecord(workflowId, 'rollout-canary-failed');
    } finally {
      await fleet.stop();
    }
  });

  it('retries a failed machine with a new sync_pull (attempt 2) and completes', async () => {
    const ids = machineIds(5);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const flaky = ids[4];
    const fleet = dbFleet(h, (m, attempt) => (m === flaky && attempt === 1 ? 'fail' : 'commit'));
    try {
      const rolloutId = newId('rol');
      const workflowId = await insertAndStart(roost, rolloutId, ids, FAST);
      const out = await result(workflowId);
      expect(out).toMatchObject({ stage: 'completed', succeeded: 5, failed: 0 });
      const { rows } = await h.deps.db.query(
        `SELECT command_id, params->>'attempt' AS attempt, status FROM commands WHERE site_id = $1 AND rollout_id = $2 AND machine_id = $3 ORDER BY 2`,
        [h.siteId, rolloutId, flaky],
      );
      expect(rows).toEqual([
        { command_id: syncPullCommandId(rolloutId, flaky, 1), attempt: '1', status: 'failed' },
        { command_id: syncPullCommandId(rolloutId, flaky, 2), attempt: '2', status: 'completed' },
      ]);
      const { rows: m } = await h.deps.db.query(
        'SELECT status, attempts, command_id FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 AND machine_id = $3',
        [h.siteId, rolloutId, flaky],
      );
      expect(m[0]).toEqual({ status: 'succeeded', attempts: 2, command_id: syncPullCommandId(rolloutId, flaky, 2) });
    } finally {
      await fleet.stop();
    }
  });

  it('fails the fleet wave when a machine exhausts its budget (retry_budget_exhausted)', async () => {
    const ids = machineIds(12);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const rolloutId = newId('rol');
    const failing = splitWaves(rolloutId, ids).fleet[0];
    const fleet = dbFleet(h, (m) => (m === failing ? 'fail' : 'commit'));
    try {
      const workflowId = await insertAndStart(roost, rolloutId, ids, { ...FAST, retries: 1 });
      const out = await result(workflowId);
      expect(out).toEqual({ rolloutId, stage: 'failed', succeeded: 11, failed: 1, abortReason: 'retry_budget_exhausted' });
      const events = await rolloutEvents(h, rolloutId);
      expect(events[1]).toMatchObject({
        type: 'deployment.failed',
        data: { abortReason: 'retry_budget_exhausted', succeeded: 11, failed: 1 },
      });
      const { rows } = await h.deps.db.query(
        `SELECT count(*)::int AS n FROM commands WHERE site_id = $1 AND rollout_id = $2 AND machine_id = $3`,
        [h.siteId, rolloutId, failing],
      );
      expect(rows[0].n).toBe(2);
    } finally {
      await fleet.stop();
    }
  });

  it('fails machines that never answer at the wave timeout and cancels their commands (wave_timeout)', async () => {
    const ids = machineIds(12);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const rolloutId = newId('rol');
    const silent = splitWaves(rolloutId, ids).fleet.slice(0, 2);
    const fleet = dbFleet(h, (m) => (silent.includes(m) ? 'ignore' : 'commit'));
    try {
      const workflowId = await insertAndStart(roost, rolloutId, ids, { ...FAST, waveTimeoutMs: 1500 });
      const out = await result(workflowId);
      expect(out).toEqual({ rolloutId, stage: 'failed', succeeded: 10, failed: 2, abortReason: 'wave_timeout' });
      const { rows } = await h.deps.db.query(
        `SELECT rm.status, rm.last_error, c.status AS command_status FROM rollout_machines rm
           JOIN commands c ON c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.machine_id = ANY($3::text[])`,
        [h.siteId, rolloutId, silent],
      );
      expect(rows).toEqual([
        { status: 'failed', last_error: 'timeout', command_status: 'cancelled' },
        { status: 'failed', last_error: 'timeout', command_status: 'cancelled' },
      ]);
    } finally {
      await fleet.stop();
    }
  });

  it('waits on a durable timer until scheduleAt before it starts', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = dbFleet(h);
    try {
      const scheduleAt = new Date(Date.now() + 6000); // still ahead once planning runs on a slow machine
      const r = await createRollout(h, { roostId: roost.roostId, versionId: roost.versionId, machines: ids, policy: FAST, scheduleAt });
      workflows.push(r.workflowId);
      const out = await result(r.workflowId);
      expect(out.stage).toBe('completed');
      const history = await historyOf(r.workflowId);
      const timers = history.events!.filter((e) => e.timerStartedEventAttributes);
      expect(timers).toHaveLength(1);
      expect(history.events!.some((e) => e.timerFiredEventAttributes)).toBe(true);
      const events = await rolloutEvents(h, r.rolloutId);
      expect(events[0].type).toBe('deployment.started');
      expect(events[0].occurred_at.getTime()).toBeGreaterThanOrEqual(scheduleAt.getTime() - 50);
      const { rows } = await h.deps.db.query('SELECT min(created_at) AS first FROM commands WHERE site_id = $1 AND rollout_id = $2', [
        h.siteId,
        r.rolloutId,
      ]);
      expect(rows[0].first.getTime()).toBeGreaterThanOrEqual(scheduleAt.getTime() - 50);
      await maybeRecord(r.workflowId, 'rollout-scheduled');
    } finally {
      await fleet.stop();
    }
  });

  it('ends as failed (roost_deleted) when the roost is deleted before the wave is dispatched', async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    await h.deps.db.query('UPDATE roosts SET deleted_at = now() WHERE site_id = $1 AND roost_id = $2', [h.siteId, roost.roostId]);
    const rolloutId = newId('rol');
    const workflowId = await insertAndStart(roost, rolloutId, ids, FAST);
    const out = await result(workflowId);
    expect(out).toEqual({ rolloutId, stage: 'failed', succeeded: 0, failed: 0, abortReason: 'roost_deleted' });
    expect(await machineStatuses(h, rolloutId)).toEqual({ cancelled: 2 });
  });

  it('marks the rollout failed (cancelled) when its workflow is cancelled, closing pending commands', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const rolloutId = newId('rol');
    const workflowId = await insertAndStart(roost, rolloutId, ids, FAST);
    await waitFor('one machine dispatched', async () => (await machineStatuses(h, rolloutId)).dispatched === 1);
    await h.deps.temporal.workflow.getHandle(workflowId).cancel();
    await expect(result(workflowId)).rejects.toBeInstanceOf(WorkflowFailedError);
    expect(await rolloutRow(rolloutId)).toMatchObject({ stage: 'failed', active: false, abort_reason: 'cancelled' });
    const { rows } = await h.deps.db.query(`SELECT status FROM commands WHERE site_id = $1 AND rollout_id = $2`, [h.siteId, rolloutId]);
    expect(rows).toEqual([{ status: 'cancelled' }]);
    expect((await rolloutEvents(h, rolloutId)).map((e) => e.type)).toEqual(['deployment.started', 'deployment.failed']);
  });
});

describe('starting rollout workflows', () => {
  it("attaches to the running workflow with USE_EXISTING and refuses to hijack another rollout's run", async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const first = newId('rol');
    const workflowId = await insertAndStart(roost, first, ids, FAST); // no agents: it keeps watching
    const again = await startRolloutWorkflow(h.deps.temporal, h.deps.cfg, {
      siteId: h.siteId,
      roostId: roost.roostId,
      versionId: roost.versionId,
      rolloutId: first,
    });
    const desc = await h.deps.temporal.workflow.getHandle(workflowId).describe();
    expect(again.runId).toBe(desc.runId);
    expect(again.workflowId).toBe(workflowId);
    expect(again.url).toContain(encodeURIComponent(workflowId));

    // The first rollout ends in the database while its run is still open (watching its canary): a new
    // rollout of the same version must not be attached to that run.
    await waitFor('the first rollout dispatched', async () => (await machineStatuses(h, first)).dispatched === 1);
    await h.deps.db.query(`UPDATE rollouts SET active = false, stage = 'failed' WHERE site_id = $1 AND rollout_id = $2`, [h.siteId, first]);
    const second = newId('rol');
    await withTx(h.deps.db, (tx) =>
      insertRollout(tx, {
        siteId: h.siteId,
        rolloutId: second,
        roostId: roost.roostId,
        versionId: roost.versionId,
        ...splitWaves(second, ids),
        extractRoot: 'apps/test',
        policy: { ...DEFAULT_POLICY, ...FAST },
        scheduleAt: null,
        workflowId,
        createdBy: h.userId,
      }),
    );
    await expect(
      startRolloutWorkflow(
        h.deps.temporal,
        h.deps.cfg,
        { siteId: h.siteId, roostId: roost.roostId, versionId: roost.versionId, rolloutId: second },
        { waitMs: 100 },
      ),
    ).rejects.toBeInstanceOf(WorkflowIdBusyError);
    await h.deps.temporal.workflow.getHandle(workflowId).terminate('test');
    const started = await startRolloutWorkflow(h.deps.temporal, h.deps.cfg, {
      siteId: h.siteId,
      roostId: roost.roostId,
      versionId: roost.versionId,
      rolloutId: second,
    });
    expect(started.runId).not.toBe(desc.runId);
    expect((await h.deps.temporal.workflow.getHandle(workflowId).describe()).memo).toEqual({ rolloutId: second });
  });
});

describe('history size', () => {
  it('is the same for 11 and 10,000 machines', async () => {
    const lengths: number[] = [];
    for (const n of [11, 10_000]) {
      const ids = machineIds(n);
      await enrolMachineRows(h, ids);
      const roost = await seedRoost(h, { targets: [] });
      const fleet = dbFleet(h, () => 'commit', 200);
      try {
        const rolloutId = newId('rol');
        const workflowId = await insertAndStart(roost, rolloutId, ids, { pollIntervalMs: 250, retryBackoffMs: 100 });
        const out = await result(workflowId);
        expect(out).toMatchObject({ stage: 'completed', succeeded: n, failed: 0 });
        lengths.push((await historyOf(workflowId)).events!.length);
      } finally {
        await fleet.stop();
      }
    }
    console.log(`rollout history length: ${lengths[0]} events for 11 machines, ${lengths[1]} for 10,000`);
    expect(lengths[1]).toBe(lengths[0]);
    expect(lengths[0]).toBeLessThan(100);
  });
});

/** Inserts a rollout with `rolloutId` and custom policy, starts its workflow, returns the workflow id. */
async function insertAndStart(
  roost: { roostId: string; versionId: string },
  rolloutId: string,
  ids: string[],
  policy: Partial<typeof DEFAULT_POLICY>,
): Promise<string> {
  const { workflowId } = await createRollout(h, { ...roost, machines: ids, policy, rolloutId });
  workflows.push(workflowId);
  return workflowId;
}
