/**
 * The reconciliation statements of db/rollouts.ts on their own, against PostgreSQL: which dispatched
 * machine a pass fails and with which `last_error` (target state's error, else the command's error, else
 * `command <status>`), which it leaves alone (a failed state older than the dispatch, a command still
 * pending), which it succeeds although a newer version's report replaced the target state, and which
 * syncs `stalledSyncs` reports for a given stall bound.
 */
import { type Harness, createHarness } from '../support/harness';
import { dispatchDueIn, getWaveTarget, reconcileWaves, stalledSyncs } from '../../db/rollouts';
import { enrolMachineRows, insertRolloutRow, machineIds, publishFiles, seedRoost } from './rollout-fixtures';

let h: Harness;

beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h?.close());

async function setTargetState(machineId: string, roostId: string, versionId: string, status: string, error: string | null, agoMs: number) {
  await h.deps.db.query(
    `INSERT INTO roost_target_states (site_id, machine_id, roost_id, reported_version_id, status, error, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, now() - $7::float8 * INTERVAL '1 millisecond')
     ON CONFLICT (site_id, machine_id, roost_id) DO UPDATE SET reported_version_id = $4, status = $5, error = $6, updated_at = EXCLUDED.updated_at`,
    [h.siteId, machineId, roostId, versionId, status, error, agoMs],
  );
}

async function setCommand(rolloutId: string, machineId: string, status: string, error: string | null, agoMs = 0) {
  await h.deps.db.query(
    `UPDATE commands SET status = $4, error = $5, updated_at = now() - $6::float8 * INTERVAL '1 millisecond'
      WHERE site_id = $1 AND rollout_id = $2 AND machine_id = $3`,
    [h.siteId, rolloutId, machineId, status, error, agoMs],
  );
}

describe('reconcileWaves: failed syncs', () => {
  it('fails by target state, command error or command status, and leaves a stale state or a pending command alone', async () => {
    const ids = machineIds(5);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const { rolloutId } = await insertRolloutRow(h, {
      roostId: roost.roostId,
      versionId: roost.versionId,
      machines: ids,
      waves: { canary: ids, fleet: [] },
      policy: { retries: 0 },
    });
    const t = (await getWaveTarget(h.deps.db, h.siteId, rolloutId))!;
    // A failed state from before the dispatch must not count: written first, then the dispatch moves past it.
    await setTargetState(ids[3], roost.roostId, roost.versionId, 'failed', 'old failure', 60_000);
    expect(await dispatchDueIn(h.deps.db, t, ['canary'], 600_000, {})).toBe(5);

    await setTargetState(ids[0], roost.roostId, roost.versionId, 'failed', 'disk full', 0);
    await setCommand(rolloutId, ids[0], 'failed', 'the command error loses to the state');
    await setCommand(rolloutId, ids[1], 'failed', 'boom');
    await setCommand(rolloutId, ids[2], 'cancelled', null);
    // ids[4]: command pending, no state: still dispatched.

    const counts = await reconcileWaves(h.deps.db, t, ['canary']);
    expect(counts.get('canary')).toMatchObject({ dispatched: 2, failed: 3 });
    const { rows } = await h.deps.db.query<{ machine_id: string; status: string; last_error: string | null }>(
      'SELECT machine_id, status, last_error FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 ORDER BY machine_id',
      [h.siteId, rolloutId],
    );
    expect(rows).toEqual([
      { machine_id: ids[0], status: 'failed', last_error: 'disk full' },
      { machine_id: ids[1], status: 'failed', last_error: 'boom' },
      { machine_id: ids[2], status: 'failed', last_error: 'command cancelled' },
      { machine_id: ids[3], status: 'dispatched', last_error: null },
      { machine_id: ids[4], status: 'dispatched', last_error: null },
    ]);
    // Idempotent: a second pass changes nothing.
    expect((await reconcileWaves(h.deps.db, t, ['canary'])).get('canary')).toMatchObject({ dispatched: 2, failed: 3 });

    // stalledSyncs: a sync the agent took (status no longer pending) with no progress for the bound.
    await h.deps.db.query(
      `UPDATE rollout_machines SET dispatched_at = now() - INTERVAL '10 minutes' WHERE site_id = $1 AND rollout_id = $2 AND machine_id = ANY($3::text[])`,
      [h.siteId, rolloutId, [ids[3], ids[4]]],
    );
    await setTargetState(ids[3], roost.roostId, roost.versionId, 'downloading', null, 9 * 60_000);
    await setCommand(rolloutId, ids[3], 'downloading', null, 9 * 60_000);
    await setCommand(rolloutId, ids[4], 'downloading', null, 1000);
    const stalled = await stalledSyncs(h.deps.db, t, ['canary'], 5 * 60_000);
    expect(stalled.map((s) => s.machineId)).toEqual([ids[3]]);
    expect(Date.now() - stalled[0].progressAt).toBeGreaterThan(8 * 60_000);
    expect(await stalledSyncs(h.deps.db, t, ['canary'], 20 * 60_000)).toEqual([]);
  });
});

describe("reconcileWaves: a newer version reported after this rollout's sync", () => {
  it('succeeds a machine whose sync completed before another version replaced its target state, and only that one', async () => {
    const ids = machineIds(4);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    const newer = await publishFiles(h, roost.roostId, { 'app.txt': 'newer\n' });
    const { rolloutId } = await insertRolloutRow(h, {
      roostId: roost.roostId,
      versionId: roost.versionId,
      machines: ids,
      waves: { canary: ids, fleet: [] },
      policy: { retries: 0 },
    });
    const t = (await getWaveTarget(h.deps.db, h.siteId, rolloutId))!;
    // ids[3]: the newer version was reported before this dispatch (the machine has not synced ours yet).
    await setTargetState(ids[3], roost.roostId, newer.versionId, 'committed', null, 60_000);
    expect(await dispatchDueIn(h.deps.db, t, ['canary'], 600_000, {})).toBe(4);
    await h.deps.db.query('UPDATE rollout_machines SET bytes_fetched = 7 WHERE site_id = $1 AND rollout_id = $2', [h.siteId, rolloutId]);

    // ids[0]: our sync completed, then the newer rollout's sync committed its version over the state.
    await setCommand(rolloutId, ids[0], 'completed', null);
    await setTargetState(ids[0], roost.roostId, newer.versionId, 'committed', null, 0);
    // ids[1]: the newer version was reported after our dispatch, but our command has not completed.
    await setCommand(rolloutId, ids[1], 'downloading', null);
    await setTargetState(ids[1], roost.roostId, newer.versionId, 'downloading', null, 0);
    // ids[2]: our command completed as staged: staging is not success, whatever the state says.
    await h.deps.db.query(
      `UPDATE commands SET status = 'completed', result = 'staged' WHERE site_id = $1 AND rollout_id = $2 AND machine_id = $3`,
      [h.siteId, rolloutId, ids[2]],
    );
    await setTargetState(ids[2], roost.roostId, newer.versionId, 'committed', null, 0);
    // ids[3]: our command completed, but no report came after the dispatch: the state predates it.
    await setCommand(rolloutId, ids[3], 'completed', null);
    // The newer version's byte count, which is not this rollout's to take.
    await h.deps.db.query('UPDATE roost_target_states SET bytes_fetched = 999 WHERE site_id = $1 AND roost_id = $2', [
      h.siteId,
      roost.roostId,
    ]);

    const counts = await reconcileWaves(h.deps.db, t, ['canary']);
    expect(counts.get('canary')).toMatchObject({ succeeded: 1, staged: 1, dispatched: 2 });
    const { rows } = await h.deps.db.query<{ machine_id: string; status: string; bytes_fetched: string }>(
      'SELECT machine_id, status, bytes_fetched::text FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 ORDER BY machine_id',
      [h.siteId, rolloutId],
    );
    expect(rows).toEqual([
      { machine_id: ids[0], status: 'succeeded', bytes_fetched: '7' },
      { machine_id: ids[1], status: 'dispatched', bytes_fetched: '7' },
      { machine_id: ids[2], status: 'staged', bytes_fetched: '7' },
      { machine_id: ids[3], status: 'dispatched', bytes_fetched: '7' },
    ]);
    expect((await reconcileWaves(h.deps.db, t, ['canary'])).get('canary')).toMatchObject({ succeeded: 1, staged: 1, dispatched: 2 });
  });
});
