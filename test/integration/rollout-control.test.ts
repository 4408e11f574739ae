/**
 * Rollout control over the real services: policies with several waves, bake time, manual
 * gates, maintenance windows, pause / resume / promote / abort updates, the failure threshold with
 * automatic rollback, manual rollback, the rollout routes (list, detail, paging, filters) and their bad
 * inputs, and the dry-run delta plan against what real agents then fetched.
 *
 * Agents: `heldFleet` answers sync_pull commands through the tables the agent routes write and can hold
 * chosen machines (their commands stay undelivered until released), so a test can act in the middle of
 * a wave without timing assumptions; the delta-plan test runs real reference agents (agent/fleet.ts).
 * Set ROOST_RECORD_HISTORIES=1 to (re)record the control histories under test/replay/histories/.
 */
import { EXIT } from '../../cli/context';
import fs from 'node:fs/promises';
import path from 'node:path';
import { cliRunner } from '../support/cli';
import { type Harness, idemKey } from '../support/harness';
import { recordHistory } from '../../scripts/record-history';
import { CONTROL_UPDATE_WAIT_MS, controlRollout, rollbackWorkflowId, rolloutWorkflowId } from '../../workflows/client';
import { startFleet } from '../../agent/fleet';
import { abortDeletedRoostRollouts, DELETED_ROOST_ABORT_BY } from '../../services/rollouts';
import { resolveExtractDir } from '../../agent/agent';
import { waitFor } from '../support/wait';
import {
  type TestWorker,
  dbFleet,
  enrolMachineRows,
  machineIds,
  machineStatuses,
  publishFiles,
  rolloutEvents,
  scopedKey,
  seedRoost,
  openRolloutSuite,
  closeRolloutSuite,
  startTestWorker,
} from './rollout-fixtures';

process.env.ROOST_ROLLOUT_POLL_MS = '100';
const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories');

let h: Harness;
let w: TestWorker;
let tmpRoot: string;
const workflows: string[] = [];

beforeAll(async () => {
  ({ h, w, tmpRoot } = await openRolloutSuite('control'));
});
afterAll(() => closeRolloutSuite({ h, w, tmpRoot }, workflows));

type Decision = 'commit' | 'fail' | 'hold';

/**
 * A stand-in fleet: every `intervalMs` it takes the site's undelivered sync_pull commands and answers
 * them as `decide` says (per machine, attempt and version). `hold` leaves the command undelivered, to be
 * decided again on the next pass.
 */
function heldFleet(
  decide: (machineId: string, attempt: number, versionId: string) => Decision = () => 'commit',
  intervalMs = 50,
): { stop(): Promise<void> } {
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const { rows } = await h.deps.db.query<{
        machine_id: string;
        command_id: string;
        params: { roostId: string; versionId: string; attempt: number };
      }>(
        `SELECT machine_id, command_id, params FROM commands WHERE site_id = $1 AND type = 'sync_pull' AND status = 'pending' AND delivered_at IS NULL`,
        [h.siteId],
      );
      for (const r of rows) {
        const d = decide(r.machine_id, Number(r.params.attempt), r.params.versionId);
        if (d === 'hold') continue;
        const ok = d === 'commit';
        await h.deps.db.query(
          `INSERT INTO roost_target_states (site_id, machine_id, roost_id, reported_version_id, status, error, bytes_fetched, updated_at)
           VALUES ($1, $2, $3, $4, $5, $6, 0, now())
           ON CONFLICT (site_id, machine_id, roost_id) DO UPDATE SET reported_version_id = excluded.reported_version_id,
             status = excluded.status, error = excluded.error, updated_at = now()`,
          [h.siteId, r.machine_id, r.params.roostId, r.params.versionId, ok ? 'committed' : 'failed', ok ? null : 'simulated failure'],
        );
        await h.deps.db.query(
          `UPDATE commands SET delivered_at = now(), status = $4, result = $5, error = $6, completed_at = now(), updated_at = now()
            WHERE site_id = $1 AND machine_id = $2 AND command_id = $3 AND completed_at IS NULL`,
          [h.siteId, r.machine_id, r.command_id, ok ? 'completed' : 'failed', ok ? 'success' : null, ok ? null : 'simulated failure'],
        );
      }
      await new Promise((res) => setTimeout(res, intervalMs));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
    },
  };
}

async function deploy(roostId: string, body: Record<string, unknown>) {
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/deploy`,
    body: { siteId: h.siteId, ...body },
    idempotencyKey: true,
  });
  if (res.statusCode !== 202) throw new Error(`deploy failed: ${res.statusCode} ${res.body}`);
  const r = res.json();
  if (!r.dryRun) workflows.push(rolloutWorkflowId(h.siteId, roostId, r.versionId));
  return { ...r, workflowId: rolloutWorkflowId(h.siteId, roostId, r.versionId) };
}

function control(
  roostId: string,
  rolloutId: string,
  action: string,
  opts: { key?: string; idem?: boolean; body?: unknown; query?: string } = {},
) {
  return h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/rollouts/${rolloutId}/${action}${opts.query ?? ''}`,
    body: opts.body ?? { siteId: h.siteId },
    key: opts.key,
    ...(opts.idem === false ? {} : { idempotencyKey: true }),
  });
}

async function detail(roostId: string, rolloutId: string, query = '') {
  const res = await h.request({ method: 'GET', url: `/api/roosts/${roostId}/rollouts/${rolloutId}?siteId=${h.siteId}${query}` });
  expect(res.statusCode).toBe(200);
  return res.json();
}

/** The workflow's `status` query (null fields until the workflow registered its handler). */
async function status(workflowId: string): Promise<{ state: string | null; waiting: string | null; wave: number | null }> {
  try {
    return await h.deps.temporal.workflow
      .getHandle(workflowId)
      .query<{ state: string; waiting: string | null; wave: number | null }>('status');
  } catch (err) {
    if ((err as Error).name === 'QueryNotRegisteredError') return { state: null, waiting: null, wave: null };
    throw err;
  }
}

function result(workflowId: string) {
  return h.deps.temporal.workflow.getHandle(workflowId).result();
}

async function maybeRecord(workflowId: string, name: string) {
  if (RECORD) await recordHistory(h.deps.temporal, workflowId, path.join(HISTORIES, `${name}.json`));
}

/** Machines of a rollout's wave (by stored wave name). */
async function waveMachines(rolloutId: string, wave: string): Promise<string[]> {
  const { rows } = await h.deps.db.query(
    'SELECT machine_id FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 AND wave = $3 ORDER BY machine_id',
    [h.siteId, rolloutId, wave],
  );
  return rows.map((r) => r.machine_id);
}

/** Marks `ids` as reporting `versionId` committed for the roost (what a previous rollout would leave). */
async function commitVersion(ids: string[], roostId: string, versionId: string) {
  await h.deps.db.query(
    `INSERT INTO roost_target_states (site_id, machine_id, roost_id, reported_version_id, status, updated_at)
     SELECT $1, m, $2, $3, 'committed', now() FROM UNNEST($4::text[]) AS t (m)
     ON CONFLICT (site_id, machine_id, roost_id) DO UPDATE SET reported_version_id = excluded.reported_version_id, status = 'committed', updated_at = now()`,
    [h.siteId, roostId, versionId, ids],
  );
}

async function reported(roostId: string): Promise<Record<string, string>> {
  const { rows } = await h.deps.db.query(
    `SELECT machine_id, reported_version_id, status FROM roost_target_states WHERE site_id = $1 AND roost_id = $2`,
    [h.siteId, roostId],
  );
  return Object.fromEntries(rows.map((r) => [r.machine_id, `${r.reported_version_id}:${r.status}`]));
}

describe('policies', () => {
  it('runs the waves of a policy with bake time, and the routes show waves, counts and history', async () => {
    const ids = machineIds(10);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      const r = await deploy(roost.roostId, {
        policy: { canary: { count: 1 }, waves: [40, 100], bakeSeconds: 0.2, retryBackoffSeconds: 0.1 },
      });
      expect(r.waves).toEqual([
        { index: 0, name: 'canary', size: 1 },
        { index: 1, name: 'wave-1', size: 3 },
        { index: 2, name: 'wave-2', size: 6 },
      ]);
      expect(r.policy).toMatchObject({
        canary: { count: 1 },
        waves: [40, 100],
        bakeSeconds: 0.2,
        failureThreshold: { count: 0 },
        activation: 'immediate',
      });
      const out = await result(r.workflowId);
      expect(out).toEqual({ rolloutId: r.rolloutId, stage: 'completed', succeeded: 10, failed: 0, abortReason: null });
      const d = await detail(roost.roostId, r.rolloutId);
      expect(d).toMatchObject({ stage: 'completed', state: 'completed', active: false, currentWave: 2, waveCount: 3, succeeded: 10 });
      expect(d.waves.map((x: { counts: { succeeded: number } }) => x.counts.succeeded)).toEqual([1, 3, 6]);
      expect(d.counts).toMatchObject({ total: 10, succeeded: 10, failed: 0 });
      expect(d.workflowUrl).toContain(encodeURIComponent(r.workflowId));
      expect(d.machines).toHaveLength(10);
      expect(d.machines[0]).toMatchObject({ status: 'succeeded', attempts: 1, lastError: null, versionId: roost.versionId });
      expect(typeof d.machines[0].dispatchedAt).toBe('string');
      const events = await rolloutEvents(h, r.rolloutId);
      expect(events.map((e) => e.type)).toEqual(['deployment.started', 'deployment.completed']);
      const desc = await h.deps.temporal.workflow.getHandle(r.workflowId).describe();
      expect(desc.searchAttributes).toMatchObject({ RoostStage: ['completed'] });
      await maybeRecord(r.workflowId, 'rollout-policy-waves');
    } finally {
      await fleet.stop();
    }
  });

  it('refuses a bad policy with errors keyed by dotted path, writing nothing', async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const res = await h.request({
      method: 'POST',
      url: `/api/roosts/${roost.roostId}/deploy`,
      body: { siteId: h.siteId, policy: { waves: [50, 20], failureThreshold: { fraction: 3 }, activation: 'later' } },
      idempotencyKey: true,
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: 'validation_failed', param: 'policy' });
    expect(Object.keys(res.json().errors).sort()).toEqual(['policy.activation', 'policy.failureThreshold.fraction', 'policy.waves.1']);
    const { rows } = await h.deps.db.query('SELECT count(*)::int AS n FROM rollouts WHERE site_id = $1 AND roost_id = $2', [
      h.siteId,
      roost.roostId,
    ]);
    expect(rows[0].n).toBe(0);
  });
});

describe('control while running', () => {
  it('pauses in the middle of a wave (dispatched machines finish, the next wave waits) and resumes', async () => {
    const ids = machineIds(10);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    let hold = new Set<string>();
    const fleet = heldFleet((m) => (hold.has(m) ? 'hold' : 'commit'));
    try {
      const planned = await deploy(roost.roostId, { dryRun: true, policy: { canary: { count: 2 }, waves: [50, 100] } });
      expect(planned.waves.map((x: { size: number }) => x.size)).toEqual([2, 3, 5]);
      hold = new Set(ids); // hold everything until we know the waves
      const r = await deploy(roost.roostId, { policy: { canary: { count: 2 }, waves: [50, 100], retryBackoffSeconds: 0.1 } });
      const wave1 = await waveMachines(r.rolloutId, 'wave-1');
      const wave2 = await waveMachines(r.rolloutId, 'wave-2');
      hold = new Set([...wave1, ...wave2]);
      await waitFor('three machines dispatched', async () => (await machineStatuses(h, r.rolloutId)).dispatched === 3);

      const paused = await control(roost.roostId, r.rolloutId, 'pause', { body: { siteId: h.siteId, reason: 'checking dashboards' } });
      expect(paused.statusCode).toBe(200);
      expect(paused.json()).toMatchObject({ rolloutId: r.rolloutId, state: 'paused', stage: 'started', currentWave: 1 });
      expect((await control(roost.roostId, r.rolloutId, 'pause')).json()).toMatchObject({ code: 'conflict', state: 'paused' });

      hold = new Set(wave2); // the dispatched wave finishes while paused
      await waitFor('the workflow waiting in its pause', async () => (await status(r.workflowId)).waiting === 'pause');
      const d = await detail(roost.roostId, r.rolloutId);
      expect(d.state).toBe('paused');
      expect(d.waves[1].counts).toMatchObject({ succeeded: 3 });
      expect(d.waves[2].counts).toMatchObject({ pending: 5, dispatched: 0 });
      const { rows } = await h.deps.db.query(
        'SELECT count(*)::int AS n FROM commands WHERE site_id = $1 AND rollout_id = $2 AND machine_id = ANY($3::text[])',
        [h.siteId, r.rolloutId, wave2],
      );
      expect(rows[0].n).toBe(0);
      expect((await h.deps.temporal.workflow.getHandle(r.workflowId).describe()).searchAttributes).toMatchObject({
        RoostStage: ['paused'],
      });

      hold = new Set();
      const resumed = await control(roost.roostId, r.rolloutId, 'resume', { query: `?siteId=${h.siteId}`, body: {} });
      expect(resumed.statusCode).toBe(200);
      expect(resumed.json().state).toBe('running');
      expect((await control(roost.roostId, r.rolloutId, 'resume')).statusCode).toBe(409);
      expect(await result(r.workflowId)).toMatchObject({ stage: 'completed', succeeded: 10, failed: 0 });
      const end = await detail(roost.roostId, r.rolloutId);
      const actions = end.history.map((e: { action: string }) => e.action);
      expect(actions).toEqual(expect.arrayContaining(['pause', 'resume']));
      expect(end.history.find((e: { action: string }) => e.action === 'pause')).toMatchObject({
        by: h.userId,
        state: 'paused',
        detail: { reason: 'checking dashboards' },
      });
      await maybeRecord(r.workflowId, 'rollout-pause-resume');
    } finally {
      await fleet.stop();
    }
  });

  it('waits at a manual gate after the canary until promote', async () => {
    const ids = machineIds(5);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      const r = await deploy(roost.roostId, { policy: { requirePromotion: 'canary', retryBackoffSeconds: 0.1 } });
      await waitFor('the workflow waiting for promotion', async () => (await status(r.workflowId)).waiting === 'promotion');
      const d = await detail(roost.roostId, r.rolloutId);
      expect(d).toMatchObject({ state: 'awaiting_promotion', stage: 'started' });
      expect(d.waves[1].counts).toMatchObject({ pending: 4 });
      const promoted = await control(roost.roostId, r.rolloutId, 'promote');
      expect(promoted.statusCode).toBe(200);
      const again = await control(roost.roostId, r.rolloutId, 'promote');
      expect(again.statusCode).toBe(409);
      expect(again.json().code).toBe('conflict');
      expect(await result(r.workflowId)).toMatchObject({ stage: 'completed', succeeded: 5 });
      await maybeRecord(r.workflowId, 'rollout-manual-gate');
    } finally {
      await fleet.stop();
    }
  });

  it('deleting the roost aborts its rollout waiting for promotion; its rollout routes are 404 from then on', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      const r = await deploy(roost.roostId, { policy: { requirePromotion: 'canary', canary: { count: 1 } } });
      await waitFor('the workflow waiting for promotion', async () => (await status(r.workflowId)).waiting === 'promotion');
      const del = await h.request({ method: 'DELETE', url: `/api/roosts/${roost.roostId}?siteId=${h.siteId}` });
      expect([del.statusCode, del.json().deleted]).toEqual([200, true]);
      // Ended by the delete, not left waiting for a promotion nobody can send.
      expect(await result(r.workflowId)).toMatchObject({ rolloutId: r.rolloutId, stage: 'failed', abortReason: 'aborted' });
      const { rows } = await h.deps.db.query('SELECT active, state FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
        h.siteId,
        r.rolloutId,
      ]);
      expect(rows[0]).toEqual({ active: false, state: 'aborted' });
      expect(await machineStatuses(h, r.rolloutId)).toMatchObject({ cancelled: 2 });
      for (const action of ['pause', 'resume', 'promote', 'abort', 'rollback']) {
        const res = await control(roost.roostId, r.rolloutId, action);
        expect([action, res.statusCode, res.json().code]).toEqual([action, 404, 'not_found']);
      }
      const read = await h.request({ method: 'GET', url: `/api/roosts/${roost.roostId}/rollouts/${r.rolloutId}?siteId=${h.siteId}` });
      expect(read.statusCode).toBe(404);
      // Repeating the delete is harmless: nothing left to abort.
      const again = await h.request({ method: 'DELETE', url: `/api/roosts/${roost.roostId}?siteId=${h.siteId}` });
      expect([again.statusCode, again.json().alreadyDeleted]).toEqual([200, true]);
    } finally {
      await fleet.stop();
    }
  });

  it('a rollout whose roost was deleted without its abort (a delete during a Temporal outage) is aborted by the API pass', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      const r = await deploy(roost.roostId, { policy: { requirePromotion: 'canary', canary: { count: 1 } } });
      await waitFor('the workflow waiting for promotion', async () => (await status(r.workflowId)).waiting === 'promotion');
      // The delete committed; its abort never reached the workflow.
      await h.deps.db.query(`UPDATE roosts SET deleted_at = now() - INTERVAL '5 minutes' WHERE site_id = $1 AND roost_id = $2`, [
        h.siteId,
        roost.roostId,
      ]);
      // Rows deleted a minute ago at least: this test's row, and at most other files' rollouts of deleted roosts.
      expect(await abortDeletedRoostRollouts(h.deps, { deletedBeforeMs: 4 * 60_000 })).toContain(r.rolloutId);
      expect(await result(r.workflowId)).toMatchObject({ rolloutId: r.rolloutId, stage: 'failed', abortReason: 'aborted' });
      const { rows } = await h.deps.db.query<{ active: boolean; state: string; history: { action: string; by?: string }[] }>(
        'SELECT active, state, history FROM rollouts WHERE site_id = $1 AND rollout_id = $2',
        [h.siteId, r.rolloutId],
      );
      expect(rows[0]).toMatchObject({ active: false, state: 'aborted' });
      expect(rows[0].history.filter((e) => e.action === 'abort')).toEqual([expect.objectContaining({ by: DELETED_ROOST_ABORT_BY })]);
      // Nothing left for the next pass.
      expect(await abortDeletedRoostRollouts(h.deps, { deletedBeforeMs: 4 * 60_000 })).not.toContain(r.rolloutId);
    } finally {
      await fleet.stop();
    }
  });

  it('takes an abort sent right after the deploy; an aborted scheduled rollout ends at once and frees its version', async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      // Sent at once: the workflow may not have registered its control handlers yet (it loads its plan
      // first); the API waits for them instead of answering 409.
      const r = await deploy(roost.roostId, { scheduleAt: new Date(Date.now() + 10 * 60_000).toISOString() });
      const aborted = await control(roost.roostId, r.rolloutId, 'abort', { body: { siteId: h.siteId, reason: 'wrong build' } });
      expect([aborted.statusCode, aborted.json().state]).toEqual([200, 'aborted']);
      // Ten minutes before its schedule, the rollout has ended: failed / aborted, machines cancelled.
      expect(await result(r.workflowId)).toMatchObject({ rolloutId: r.rolloutId, stage: 'failed', abortReason: 'aborted' });
      const d = await detail(roost.roostId, r.rolloutId);
      expect(d).toMatchObject({ state: 'aborted', stage: 'failed', active: false });
      expect(await machineStatuses(h, r.rolloutId)).toEqual({ cancelled: 2 });
      const { rows } = await h.deps.db.query('SELECT count(*)::int AS n FROM commands WHERE site_id = $1 AND rollout_id = $2', [
        h.siteId,
        r.rolloutId,
      ]);
      expect(rows[0].n).toBe(0); // nothing was ever dispatched
      // The version is free: a new deploy makes a new rollout.
      const again = await deploy(roost.roostId, { scheduleAt: new Date(Date.now() + 10 * 60_000).toISOString() });
      expect([again.alreadyRunning, again.rolloutId === r.rolloutId]).toEqual([false, false]);
      const second = await control(roost.roostId, again.rolloutId, 'abort');
      expect(second.statusCode).toBe(200);
      await result(again.workflowId);
      await maybeRecord(again.workflowId, 'rollout-schedule-abort');
    } finally {
      await fleet.stop();
    }
  });

  it('defers a wave until the maintenance window opens, in the site timezone', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    await h.deps.db.query(`UPDATE sites SET timezone = 'Asia/Kolkata' WHERE site_id = $1`, [h.siteId]);
    const fleet = heldFleet();
    try {
      const opensAt = Date.now() + 4000;
      const local = (ms: number) =>
        new Intl.DateTimeFormat('en-GB', {
          timeZone: 'Asia/Kolkata',
          hourCycle: 'h23',
          hour: '2-digit',
          minute: '2-digit',
          second: '2-digit',
        }).format(new Date(ms));
      const start = local(opensAt);
      const r = await deploy(roost.roostId, {
        policy: { maintenanceWindow: { start, end: local(opensAt + 3600_000) }, retryBackoffSeconds: 0.1 },
      });
      await waitFor('the workflow waiting for its window', async () => (await status(r.workflowId)).waiting === 'window');
      expect((await detail(roost.roostId, r.rolloutId)).state).toBe('waiting_window');
      expect(await result(r.workflowId)).toMatchObject({ stage: 'completed', succeeded: 3 });
      const { rows } = await h.deps.db.query('SELECT min(created_at) AS first FROM commands WHERE site_id = $1 AND rollout_id = $2', [
        h.siteId,
        r.rolloutId,
      ]);
      expect(rows[0].first.getTime()).toBeGreaterThanOrEqual(Math.floor(opensAt / 1000) * 1000 - 50);
      const actions = (await detail(roost.roostId, r.rolloutId)).history.map((e: { action: string }) => e.action);
      expect(actions).toEqual(expect.arrayContaining(['waiting_window', 'window_open']));
      await maybeRecord(r.workflowId, 'rollout-maintenance-window');
    } finally {
      await fleet.stop();
      await h.deps.db.query(`UPDATE sites SET timezone = 'UTC' WHERE site_id = $1`, [h.siteId]);
    }
  });

  it('an abort while waiting for the maintenance window ends the rollout without recording that the window opened', async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      // A window an hour from now (UTC site): the first wave waits for it.
      const hhmm = (ms: number) => new Date(ms).toISOString().slice(11, 16);
      const r = await deploy(roost.roostId, {
        policy: { maintenanceWindow: { start: hhmm(Date.now() + 3600_000), end: hhmm(Date.now() + 3660_000) } },
      });
      await waitFor('the workflow waiting for its window', async () => (await status(r.workflowId)).waiting === 'window');
      expect((await control(roost.roostId, r.rolloutId, 'abort')).statusCode).toBe(200);
      expect(await result(r.workflowId)).toMatchObject({ rolloutId: r.rolloutId, stage: 'failed', abortReason: 'aborted' });
      const actions = (await detail(roost.roostId, r.rolloutId)).history.map((e: { action: string }) => e.action);
      expect(actions).toContain('waiting_window');
      expect(actions).toContain('abort');
      expect(actions).not.toContain('window_open');
      await maybeRecord(r.workflowId, 'rollout-window-abort');
    } finally {
      await fleet.stop();
    }
  });

  it('aborts (pending machines and commands cancelled), refuses control afterwards, and rolls back switched machines', async () => {
    const ids = machineIds(6);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const v1 = roost.versionId;
    await commitVersion(ids, roost.roostId, v1);
    const v2 = await publishFiles(h, roost.roostId, { 'app.txt': 'version two\n' });
    let hold = new Set<string>(ids);
    const fleet = heldFleet((m) => (hold.has(m) ? 'hold' : 'commit'));
    try {
      const r = await deploy(roost.roostId, { versionId: v2.versionId, policy: { canary: { count: 2 }, retryBackoffSeconds: 0.1 } });
      const canary = await waveMachines(r.rolloutId, 'canary');
      const rest = ids.filter((m) => !canary.includes(m));
      hold = new Set(rest);
      await waitFor('four machines dispatched', async () => (await machineStatuses(h, r.rolloutId)).dispatched === 4);
      const aborted = await control(roost.roostId, r.rolloutId, 'abort', { body: { siteId: h.siteId, reason: 'bad build' } });
      expect(aborted.statusCode).toBe(200);
      expect(['aborted', 'failed']).toContain(aborted.json().state);
      expect(await result(r.workflowId)).toEqual({
        rolloutId: r.rolloutId,
        stage: 'failed',
        succeeded: 2,
        failed: 0,
        abortReason: 'aborted',
      });
      expect(await machineStatuses(h, r.rolloutId)).toEqual({ succeeded: 2, cancelled: 4 });
      const { rows: cmds } = await h.deps.db.query(
        'SELECT DISTINCT status FROM commands WHERE site_id = $1 AND rollout_id = $2 AND machine_id = ANY($3::text[])',
        [h.siteId, r.rolloutId, rest],
      );
      expect(cmds).toEqual([{ status: 'cancelled' }]);
      expect((await rolloutEvents(h, r.rolloutId)).map((e) => e.type)).toEqual(['deployment.started', 'deployment.failed']);
      expect((await detail(roost.roostId, r.rolloutId)).state).toBe('aborted');
      for (const a of ['pause', 'resume', 'promote', 'abort']) {
        const res = await control(roost.roostId, r.rolloutId, a);
        expect(res.statusCode).toBe(409);
        expect(res.json()).toMatchObject({ code: 'conflict', state: 'aborted' });
      }
      await maybeRecord(r.workflowId, 'rollout-abort');

      hold = new Set();
      // Three rollbacks at once: one creates the rollback rollout, the others answer as a later one would.
      const auditCount = async () =>
        (
          await h.deps.db.query(
            `SELECT count(*)::int AS n FROM audit_records WHERE site_id = $1 AND kind LIKE '%rollback%' AND attributes::text LIKE $2`,
            [h.siteId, `%${r.rolloutId}%`],
          )
        ).rows[0].n;
      const auditBefore = await auditCount();
      const all = await Promise.all([1, 2, 3].map(() => control(roost.roostId, r.rolloutId, 'rollback')));
      expect(all.map((x) => x.statusCode).sort()).toEqual([202, 409, 409]);
      const rb = all.find((x) => x.statusCode === 202)!;
      for (const x of all.filter((y) => y.statusCode === 409)) {
        expect(x.json()).toMatchObject({ code: 'conflict', rollbackRolloutId: rb.json().rolloutId });
      }
      expect(await auditCount()).toBe(auditBefore + 1);
      const rbBody = rb.json();
      expect(rbBody).toMatchObject({ rollbackOf: r.rolloutId, versionId: v1, stage: 'started', waveCount: 1, counts: { total: 2 } });
      workflows.push(rbBody.workflowId);
      expect(rbBody.workflowId).toBe(rollbackWorkflowId(h.siteId, r.rolloutId));
      expect(await result(rbBody.workflowId)).toMatchObject({ stage: 'completed', succeeded: 2, failed: 0 });
      const now = await reported(roost.roostId);
      for (const m of ids) expect(now[m]).toBe(`${v1}:committed`);
      const original = await detail(roost.roostId, r.rolloutId);
      expect(original).toMatchObject({ state: 'rolled_back', rolledBackBy: rbBody.rolloutId, stage: 'failed' });
      expect((await control(roost.roostId, r.rolloutId, 'rollback')).json()).toMatchObject({
        code: 'conflict',
        rollbackRolloutId: rbBody.rolloutId,
      });
      expect((await control(roost.roostId, rbBody.rolloutId, 'rollback')).statusCode).toBe(409);
      await maybeRecord(rbBody.workflowId, 'rollout-rollback');
    } finally {
      await fleet.stop();
    }
  });

  it('rolls back automatically when the canary trips the failure threshold: every machine ends on its previous version', async () => {
    const ids = machineIds(10);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const v1 = roost.versionId;
    await commitVersion(ids, roost.roostId, v1);
    const v2 = await publishFiles(h, roost.roostId, { 'app.txt': 'broken build\n' });
    let bad = '';
    const fleet = heldFleet((m, _a, v) => (m === bad && v === v2.versionId ? 'fail' : bad === '' ? 'hold' : 'commit'));
    try {
      const r = await deploy(roost.roostId, {
        versionId: v2.versionId,
        policy: { canary: { count: 3 }, autoRollback: true, retries: 1, retryBackoffSeconds: 0.1 },
      });
      bad = (await waveMachines(r.rolloutId, 'canary'))[0];
      const out = await result(r.workflowId);
      expect(out).toMatchObject({ rolloutId: r.rolloutId, stage: 'failed', abortReason: 'canary_failed', succeeded: 2, failed: 1 });
      expect(out.rollback).toMatchObject({ stage: 'completed', succeeded: 2, failed: 0 });
      workflows.push(rollbackWorkflowId(h.siteId, r.rolloutId));
      const now = await reported(roost.roostId);
      for (const m of ids) {
        if (m === bad)
          expect(now[m]).toBe(`${v2.versionId}:failed`); // never switched: left alone (its files are v1)
        else expect(now[m]).toBe(`${v1}:committed`);
      }
      const d = await detail(roost.roostId, r.rolloutId);
      expect(d).toMatchObject({ state: 'rolled_back', rolledBackBy: out.rollback.rolloutId });
      expect(d.history.map((e: { action: string }) => e.action)).toEqual(expect.arrayContaining(['rollback_started', 'rolled_back']));
      const rbEvents = await rolloutEvents(h, out.rollback.rolloutId);
      expect(rbEvents.map((e) => e.type)).toEqual(['deployment.started', 'deployment.completed']);
      expect((await h.deps.temporal.workflow.getHandle(r.workflowId).describe()).searchAttributes).toMatchObject({
        RoostStage: ['rolled_back'],
      });
      await maybeRecord(r.workflowId, 'rollout-auto-rollback');
    } finally {
      await fleet.stop();
    }
  });
});

describe('rollout routes', () => {
  it('lists rollouts newest first with paging and a stage filter, and answers bad inputs', async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const v2 = await publishFiles(h, roost.roostId, { 'app.txt': 'two\n' });
    let hold = true;
    const fleet = heldFleet(() => (hold ? 'hold' : 'commit'));
    try {
      hold = false;
      const first = await deploy(roost.roostId, { versionId: roost.versionId, policy: { retryBackoffSeconds: 0.1 } });
      await result(first.workflowId);
      hold = true;
      const second = await deploy(roost.roostId, { versionId: v2.versionId, policy: { retryBackoffSeconds: 0.1 } });
      await waitFor('the second rollout dispatched', async () => (await machineStatuses(h, second.rolloutId)).dispatched === 1);

      const list = (q: string) => h.request({ method: 'GET', url: `/api/roosts/${roost.roostId}/rollouts?siteId=${h.siteId}${q}` });
      const all = (await list('')).json();
      expect(all.rollouts.map((x: { rolloutId: string }) => x.rolloutId)).toEqual([second.rolloutId, first.rolloutId]);
      expect(all.next_page_token).toBe('');
      const p1 = (await list('&page_size=1')).json();
      expect(p1.rollouts).toHaveLength(1);
      expect(p1.nextPageToken).toBe(p1.next_page_token);
      const p2 = (await list(`&limit=1&cursor=${p1.next_page_token}`)).json();
      expect(p2.rollouts.map((x: { rolloutId: string }) => x.rolloutId)).toEqual([first.rolloutId]);
      expect(p2.next_page_token).toBe('');
      expect((await list('&stage=completed')).json().rollouts.map((x: { rolloutId: string }) => x.rolloutId)).toEqual([first.rolloutId]);
      expect((await list('&stage=canary')).json().rollouts.map((x: { rolloutId: string }) => x.rolloutId)).toEqual([second.rolloutId]);
      expect((await list('&stage=paused')).statusCode).toBe(400);
      expect((await list('&page_size=0')).json().code).toBe('validation_failed');
      expect((await list('&page_token=garbage')).statusCode).toBe(400);
      expect((await h.request({ method: 'GET', url: `/api/roosts/${roost.roostId}/rollouts` })).statusCode).toBe(400);

      // Detail: machine paging and filters.
      const d1 = await detail(roost.roostId, first.rolloutId, '&page_size=1');
      expect(d1.machines).toHaveLength(1);
      const d2 = await detail(roost.roostId, first.rolloutId, `&page_size=1&page_token=${d1.next_page_token}`);
      expect(d2.machines).toHaveLength(1);
      expect(d2.machines[0].machineId > d1.machines[0].machineId).toBe(true);
      expect(d2.next_page_token).toBe('');
      expect((await detail(roost.roostId, second.rolloutId, '&status=dispatched')).machines).toHaveLength(1);
      expect((await detail(roost.roostId, second.rolloutId, '&wave=fleet')).machines).toHaveLength(1);

      // Bad inputs.
      const get = (url: string, key?: string) => h.request({ method: 'GET', url, key });
      expect((await get(`/api/roosts/${roost.roostId}/rollouts/rol_unknown?siteId=${h.siteId}`)).json()).toMatchObject({
        code: 'not_found',
      });
      const otherRoost = await seedRoost(h, { targets: ids });
      expect((await get(`/api/roosts/${otherRoost.roostId}/rollouts/${first.rolloutId}?siteId=${h.siteId}`)).statusCode).toBe(404);
      expect((await get(`/api/roosts/${roost.roostId}/rollouts/bad%20id?siteId=${h.siteId}`)).statusCode).toBe(400);
      const other = await h.other();
      expect((await get(`/api/roosts/${roost.roostId}/rollouts/${first.rolloutId}?siteId=${h.siteId}`, other.apiKey)).statusCode).toBe(404);
      expect((await get(`/api/roosts/${roost.roostId}/rollouts?siteId=${h.siteId}`, other.apiKey)).statusCode).toBe(404);
      expect((await control(roost.roostId, second.rolloutId, 'pause', { key: other.apiKey })).statusCode).toBe(404);
      expect((await control(roost.roostId, 'rol_unknown', 'pause')).json()).toMatchObject({ code: 'not_found' });

      const readOnly = await scopedKey(h, [{ resource: 'roost', id: roost.roostId, permissions: ['read'] }]);
      const listed = await get(`/api/roosts/${roost.roostId}/rollouts?siteId=${h.siteId}`, readOnly);
      expect(listed.body).toContain('"rollouts"');
      expect(listed.statusCode).toBe(200);
      const denied = await control(roost.roostId, second.rolloutId, 'pause', { key: readOnly });
      expect(denied.statusCode).toBe(403);
      expect(denied.json()).toMatchObject({ code: 'scope_insufficient' });
      expect(denied.json().required).toBeDefined();
      const deployOnly = await scopedKey(h, [{ resource: 'roost', id: roost.roostId, permissions: ['deploy'] }]);
      expect((await get(`/api/roosts/${roost.roostId}/rollouts?siteId=${h.siteId}`, deployOnly)).json()).toMatchObject({
        code: 'scope_insufficient',
      });

      const noKey = await control(roost.roostId, second.rolloutId, 'pause', { idem: false });
      expect(noKey.json()).toMatchObject({ code: 'idempotency_key_required' });
      expect((await control(roost.roostId, second.rolloutId, 'pause', { body: {} })).json()).toMatchObject({
        code: 'validation_failed',
        param: 'siteId',
      });
      expect((await control(roost.roostId, second.rolloutId, 'pause', { body: { siteId: h.siteId, extra: 1 } })).statusCode).toBe(400);
      expect((await control(roost.roostId, second.rolloutId, 'promote')).json()).toMatchObject({ code: 'conflict' }); // no gate
      expect((await control(roost.roostId, second.rolloutId, 'resume')).json()).toMatchObject({ code: 'conflict' }); // not paused
      expect((await control(roost.roostId, second.rolloutId, 'rollback')).json()).toMatchObject({
        code: 'conflict',
        reason: 'not_terminal',
      });
      expect((await control(roost.roostId, first.rolloutId, 'rollback')).json()).toMatchObject({ code: 'conflict', reason: 'completed' });

      // Idempotent replay of a control call.
      const key = idemKey();
      const a = await h.request({
        method: 'POST',
        url: `/api/roosts/${roost.roostId}/rollouts/${second.rolloutId}/pause`,
        body: { siteId: h.siteId },
        idempotencyKey: key,
      });
      const b = await h.request({
        method: 'POST',
        url: `/api/roosts/${roost.roostId}/rollouts/${second.rolloutId}/pause`,
        body: { siteId: h.siteId },
        idempotencyKey: key,
      });
      expect(a.statusCode).toBe(200);
      expect(b.statusCode).toBe(200);
      expect(b.headers['idempotent-replayed']).toBe('true');
      await control(roost.roostId, second.rolloutId, 'abort');
      await result(second.workflowId);
    } finally {
      await fleet.stop();
    }
  });
});

describe('history size with waves', () => {
  it('does not depend on the number of machines: 3 waves for 11 and for 3,000 machines', async () => {
    const lengths: number[] = [];
    for (const n of [11, 3000]) {
      const ids = machineIds(n);
      await enrolMachineRows(h, ids);
      const roost = await seedRoost(h, { targets: ids });
      const fleet = dbFleet(h, () => 'commit', 100);
      try {
        const r = await deploy(roost.roostId, { policy: { canary: { count: 1 }, waves: [50, 100], retryBackoffSeconds: 0.1 } });
        expect(await result(r.workflowId)).toMatchObject({ stage: 'completed', succeeded: n });
        lengths.push((await h.deps.temporal.workflow.getHandle(r.workflowId).fetchHistory()).events!.length);
      } finally {
        await fleet.stop();
      }
    }
    // Bound (docs/decisions/rollout-control.md): 66 events for 2 waves (58 + the chunk verification step)
    // + 12 per further wave, whatever the machines.
    expect(lengths[1]).toBe(lengths[0]);
    expect(lengths[0]).toBeLessThanOrEqual(66 + 12);
  });
});

describe('dry-run delta plan', () => {
  it('lists per machine the bytes and chunks it would fetch, writes nothing, and matches what real agents fetched', async () => {
    const baseUrl = await h.listen();
    const secret = await h.enrolmentSecret();
    const fleet = await startFleet({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      count: 3,
      rootDir: path.join(tmpRoot, 'delta'),
      pollWaitSeconds: 5,
      heartbeatMs: 0,
    });
    try {
      const [m0, m1, m2] = fleet.machineIds;
      const big = 'x'.repeat(5000);
      const roost = await seedRoost(h, {
        targets: fleet.machineIds,
        files: { 'a.txt': `alpha ${big}`, 'b.txt': `beta ${big}`, 'c.txt': 'gamma' },
      });
      const first = await deploy(roost.roostId, { machines: [m0, m1], policy: { retryBackoffSeconds: 0.1 } });
      expect((await result(first.workflowId)).stage).toBe('completed');
      const v2 = await publishFiles(h, roost.roostId, { 'a.txt': `alpha ${big}`, 'b.txt': `beta two ${big}`, 'd.txt': 'delta' });

      const tables = ['rollouts', 'rollout_machines', 'commands', 'events', 'roost_target_states'];
      const countRows = async () =>
        Promise.all(
          tables.map(async (t) => (await h.deps.db.query(`SELECT count(*)::int AS n FROM ${t} WHERE site_id = $1`, [h.siteId])).rows[0].n),
        );
      const before = await countRows();
      const plan = await deploy(roost.roostId, { versionId: v2.versionId, dryRun: true });
      expect(await countRows()).toEqual(before);
      const bChunk = Buffer.byteLength(`beta two ${big}`);
      const dChunk = Buffer.byteLength('delta');
      const aChunk = Buffer.byteLength(`alpha ${big}`);
      const byMachine = Object.fromEntries(plan.delta.machines.map((x: { machineId: string }) => [x.machineId, x]));
      expect(byMachine[m0]).toEqual({ machineId: m0, currentVersionId: roost.versionId, bytes: bChunk + dChunk, chunks: 2 });
      expect(byMachine[m1]).toEqual({ machineId: m1, currentVersionId: roost.versionId, bytes: bChunk + dChunk, chunks: 2 });
      expect(byMachine[m2]).toEqual({ machineId: m2, currentVersionId: null, bytes: aChunk + bChunk + dChunk, chunks: 3 });
      expect(plan.delta.totals).toEqual({ machines: 3, bytes: 2 * (bChunk + dChunk) + aChunk + bChunk + dChunk, chunks: 7 });
      expect(plan.delta).toMatchObject({ versionId: v2.versionId, machinesListed: 3, truncated: false });
      expect(plan.delta.byCurrentVersion).toEqual(
        expect.arrayContaining([
          { currentVersionId: roost.versionId, machines: 2, bytes: 2 * (bChunk + dChunk), chunks: 4 },
          { currentVersionId: null, machines: 1, bytes: aChunk + bChunk + dChunk, chunks: 3 },
        ]),
      );

      const real = await deploy(roost.roostId, { versionId: v2.versionId, policy: { retryBackoffSeconds: 0.1 } });
      expect((await result(real.workflowId)).stage).toBe('completed');
      const { rows } = await h.deps.db.query(
        'SELECT machine_id, bytes_fetched FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2',
        [h.siteId, real.rolloutId],
      );
      expect(Object.fromEntries(rows.map((r) => [r.machine_id, Number(r.bytes_fetched)]))).toEqual({
        [m0]: bChunk + dChunk,
        [m1]: bChunk + dChunk,
        [m2]: aChunk + bChunk + dChunk,
      });
      for (const m of fleet.machineIds) {
        const dir = resolveExtractDir(path.join(tmpRoot, 'delta', m), 'apps/test');
        expect(await fs.readFile(path.join(dir, 'd.txt'), 'utf8')).toBe('delta');
      }
    } finally {
      await fleet.stop();
    }
  });
});

describe('the roost CLI', () => {
  let base = '';
  /** The real `roost` binary against this harness on a real port. */
  const { roost } = cliRunner(() => ({ ROOST_API_URL: base, ROOST_API_KEY: h.apiKey, ROOST_SITE_ID: h.siteId }));
  beforeAll(async () => {
    base = await h.listen();
  });

  it('deploys with --policy, then lists, shows and promotes the rollout with `roost rollout`; a second promote is refused', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost0 = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      const dep = await roost([
        'deploy',
        roost0.roostId,
        '--policy',
        JSON.stringify({ requirePromotion: 'canary', canary: { count: 1 } }),
        '--json',
      ]);
      expect([dep.code, dep.stderr]).toEqual([0, '']);
      const { rolloutId, versionId } = JSON.parse(dep.stdout);
      const workflowId = rolloutWorkflowId(h.siteId, roost0.roostId, versionId);
      workflows.push(workflowId);
      await waitFor('the workflow waiting for promotion', async () => (await status(workflowId)).waiting === 'promotion');

      const list = await roost(['rollout', 'list', roost0.roostId, '--json']);
      expect(list.code).toBe(0);
      expect(JSON.parse(list.stdout).rollouts.map((r: { rolloutId: string }) => r.rolloutId)).toEqual([rolloutId]);
      const show = await roost(['rollout', 'show', roost0.roostId, rolloutId, '--json']);
      expect(JSON.parse(show.stdout)).toMatchObject({ rolloutId, state: 'awaiting_promotion', stage: 'started' });

      const promote = await roost(['rollout', 'promote', roost0.roostId, rolloutId, '--reason', 'canary looks good', '--json']);
      expect(promote.code).toBe(0);
      expect(JSON.parse(promote.stdout)).toMatchObject({ rolloutId, state: 'running' });
      expect(await result(workflowId)).toMatchObject({ stage: 'completed', succeeded: 3 });
      const history = (await detail(roost0.roostId, rolloutId)).history as Array<{ action: string; detail?: { reason?: string } }>;
      expect(history.find((e) => e.action === 'promote')?.detail).toEqual({ reason: 'canary looks good' });

      const again = await roost(['rollout', 'promote', roost0.roostId, rolloutId]);
      expect(again.code).toBe(EXIT.conflict);
      expect(again.stderr).toMatch(/conflict/);
      // Usage errors: an unknown action, an action without its rollout id.
      for (const args of [
        ['rollout', 'explode', roost0.roostId, rolloutId],
        ['rollout', 'pause', roost0.roostId],
      ]) {
        const bad = await roost([...args, '--json']);
        expect([bad.code, JSON.parse(bad.stdout).error.code]).toEqual([EXIT.usage, 'usage_error']);
      }
    } finally {
      await fleet.stop();
    }
  });
});

describe('control while no worker runs', () => {
  it('sends nothing and answers at once when no worker polls the task queue', async () => {
    // A rollout workflow on a task queue no worker has ever polled: it stays running and takes no update.
    const workflowId = `control-no-poller-${idemKey()}`;
    const rolloutId = 'rol_000000000000000000000000';
    const handle = await h.deps.temporal.workflow.start('rolloutWorkflow', {
      workflowId,
      taskQueue: `nobody-polls-${idemKey()}`,
      args: [],
      memo: { rolloutId },
    });
    try {
      const started = Date.now();
      await expect(controlRollout(h.deps.temporal, workflowId, rolloutId, 'pause', { by: h.userId })).rejects.toMatchObject({
        name: 'NoWorker',
        reason: 'none',
      });
      expect(Date.now() - started).toBeLessThan(CONTROL_UPDATE_WAIT_MS);
      const { events } = await handle.fetchHistory();
      expect(
        (events ?? []).some((e) => e.workflowExecutionUpdateAcceptedEventAttributes || e.workflowExecutionUpdateAdmittedEventAttributes),
      ).toBe(false);
    } finally {
      await handle.terminate('test over');
    }
  });

  it('answers 503 after the bounded wait instead of holding the request; the update applies when a worker is back, and a retry with the same Idempotency-Key gets its outcome', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const fleet = heldFleet();
    try {
      const r = await deploy(roost.roostId, { policy: { requirePromotion: 'canary', canary: { count: 1 } } });
      await waitFor('the workflow waiting for promotion', async () => (await status(r.workflowId)).waiting === 'promotion');
      // The worker goes away (it polled a moment ago, so the update is sent and waits for one to accept it).
      await w.stop();
      const idem = idemKey();
      const send = () =>
        h.request({
          method: 'POST',
          url: `/api/roosts/${roost.roostId}/rollouts/${r.rolloutId}/pause`,
          body: { siteId: h.siteId },
          idempotencyKey: idem,
        });
      const started = Date.now();
      const refused = await send();
      expect([refused.statusCode, refused.json().code]).toEqual([503, 'service_unavailable']);
      expect(refused.json().detail).toMatch(/no worker took pause within 15 s; it is applied when a worker takes it/);
      expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
      expect(refused.json().retryAfter).toBe(Number(refused.headers['retry-after']));
      expect(Date.now() - started).toBeLessThan(CONTROL_UPDATE_WAIT_MS + 10_000);

      // A worker again: the update that was handed over is applied, once.
      w = await startTestWorker(h, 'control-worker-back');
      await waitFor('the pause applied by the new worker', async () => (await detail(roost.roostId, r.rolloutId)).state === 'paused');
      // The retry with the same key is that update's outcome (200), not a second pause (which is refused).
      const retried = await send();
      expect([retried.statusCode, retried.json().state]).toEqual([200, 'paused']);
      const second = await control(roost.roostId, r.rolloutId, 'pause');
      expect([second.statusCode, second.json().code]).toEqual([409, 'conflict']);
      const history = (await detail(roost.roostId, r.rolloutId)).history as { action: string }[];
      expect(history.filter((e) => e.action === 'pause')).toHaveLength(1);

      // An abort handed over the same way ends the rollout: its retry with the same key answers the
      // ended rollout (200), not 409 "the rollout has ended"; an abort with a new key is that 409.
      await w.stop();
      const abortKey = idemKey();
      const abort = () =>
        h.request({
          method: 'POST',
          url: `/api/roosts/${roost.roostId}/rollouts/${r.rolloutId}/abort`,
          body: { siteId: h.siteId },
          idempotencyKey: abortKey,
        });
      expect((await abort()).statusCode).toBe(503);
      w = await startTestWorker(h, 'control-worker-back-again');
      expect(await result(r.workflowId)).toMatchObject({ rolloutId: r.rolloutId, stage: 'failed', abortReason: 'aborted' });
      const abortRetried = await abort();
      expect([abortRetried.statusCode, abortRetried.json().state]).toEqual([200, 'aborted']);
      const abortAgain = await control(roost.roostId, r.rolloutId, 'abort');
      expect([abortAgain.statusCode, abortAgain.json().code]).toEqual([409, 'conflict']);
    } finally {
      await fleet.stop();
    }
  });
});
