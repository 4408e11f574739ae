/**
 * Workflow starts lost to a killed API process (api/lost-starts.ts; docs/decisions/outages.md "Lost workflow
 * starts"): a rollout committed `running` whose workflow was never started is failed with
 * `workflow_start_failed` (services/rollouts.ts failLostRolloutStarts), a classic deployment committed
 * `pending` without its workflow is deleted (services/classic-deployments.ts dropLostDeploymentStarts), as the
 * request itself settles a failed start. A rollout whose workflow runs (scheduled, nothing dispatched yet), a
 * younger row and a second pass are left alone. Rows are backdated an hour and the pass asked for rows older
 * than 30 minutes, so rows of other test files in the shared database are never candidates.
 */
import { createHarness, type Harness } from '../support/harness';
import { newId } from '../../domain/hex';
import { insertDeployment } from '../../db/classic-deployments';
import { classicDeploymentWorkflowId } from '../../domain/classic';
import { failLostRolloutStarts } from '../../services/rollouts';
import { dropLostDeploymentStarts } from '../../services/classic-deployments';
import { deployRoute, enrolMachineRows, insertRolloutRow, machineIds, publishFiles, seedRoost, terminateAll } from './rollout-fixtures';

let h: Harness;
const workflows = new Set<string>();
const OLDER_THAN_MS = 30 * 60_000;

beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => {
  await terminateAll(h, workflows);
  await h?.close();
});

const backdate = (table: 'rollouts' | 'classic_deployments', idColumn: string, id: string) =>
  h.deps.db.query(`UPDATE ${table} SET created_at = now() - INTERVAL '1 hour' WHERE site_id = $1 AND ${idColumn} = $2`, [h.siteId, id]);

async function rolloutRow(rolloutId: string) {
  const { rows } = await h.deps.db.query<{ stage: string; state: string; active: boolean; abort_reason: string | null }>(
    'SELECT stage, state, active, abort_reason FROM rollouts WHERE site_id = $1 AND rollout_id = $2',
    [h.siteId, rolloutId],
  );
  return rows[0];
}

describe('lost rollout starts', () => {
  it('fails an old running rollout without a workflow, and leaves a scheduled one with its workflow and a young one alone', async () => {
    const ids = machineIds(3);
    await enrolMachineRows(h, ids);
    const roost = await seedRoost(h, { targets: ids });
    // The lost one: its row committed, its workflow never started.
    const lost = await insertRolloutRow(h, { roostId: roost.roostId, versionId: roost.versionId, machines: ids });
    await backdate('rollouts', 'rollout_id', lost.rolloutId);
    // A scheduled rollout of another version: its workflow runs and waits, nothing dispatched.
    const v2 = await publishFiles(h, roost.roostId, { 'b.txt': 'b\n' });
    const scheduled = await deployRoute(h, roost.roostId, { scheduleAt: new Date(Date.now() + 60 * 60_000).toISOString() });
    workflows.add(scheduled.workflowId);
    expect(scheduled.versionId).toBe(v2.versionId);
    await backdate('rollouts', 'rollout_id', scheduled.rolloutId);
    // A young one of a third version (its deploy may still be starting it).
    const v3 = await publishFiles(h, roost.roostId, { 'c.txt': 'c\n' });
    const young = await insertRolloutRow(h, { roostId: roost.roostId, versionId: v3.versionId, machines: ids });

    expect(await failLostRolloutStarts(h.deps, { olderThanMs: OLDER_THAN_MS })).toEqual([lost.rolloutId]);
    expect(await rolloutRow(lost.rolloutId)).toEqual({
      stage: 'failed',
      state: 'failed',
      active: false,
      abort_reason: 'workflow_start_failed',
    });
    const { rows } = await h.deps.db.query<{ status: string }>(
      'SELECT DISTINCT status FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2',
      [h.siteId, lost.rolloutId],
    );
    expect(rows.map((r) => r.status)).toEqual(['cancelled']);
    expect(await rolloutRow(scheduled.rolloutId)).toMatchObject({ active: true });
    expect(await rolloutRow(young.rolloutId)).toMatchObject({ active: true });
    // Its version is free again: a new deploy of it is a new rollout, not "already running".
    const again = await h.request({
      method: 'POST',
      url: `/api/roosts/${roost.roostId}/deploy`,
      body: { siteId: h.siteId, versionId: roost.versionId, dryRun: true },
      idempotencyKey: true,
    });
    expect([again.statusCode, again.json().alreadyRunning]).toEqual([202, false]);
    // A second pass finds nothing.
    expect(await failLostRolloutStarts(h.deps, { olderThanMs: OLDER_THAN_MS })).toEqual([]);
  });
});

describe('lost classic deployment starts', () => {
  it('deletes an old pending deployment without a workflow (rows and targets) and leaves a young one', async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const insert = (deploymentId: string) =>
      insertDeployment(h.deps.db, {
        siteId: h.siteId,
        deploymentId,
        name: 'lost start',
        installerUrl: 'https://installers.example/app.exe',
        installerName: 'app.exe',
        silentFlags: '/S',
        verifyPath: null,
        sha256: null,
        closeProcesses: [],
        suppressProjects: [],
        parallelInstall: false,
        timeoutSeconds: null,
        templateId: null,
        workflowId: classicDeploymentWorkflowId(h.siteId, deploymentId),
        createdBy: h.userId,
        machines: ids,
      });
    const lost = newId('dep');
    await insert(lost);
    await backdate('classic_deployments', 'deployment_id', lost);
    const young = newId('dep');
    await insert(young);

    expect(await dropLostDeploymentStarts(h.deps, { olderThanMs: OLDER_THAN_MS })).toEqual([lost]);
    const count = async (table: string, id: string) =>
      Number(
        (await h.deps.db.query(`SELECT count(*) AS n FROM ${table} WHERE site_id = $1 AND deployment_id = $2`, [h.siteId, id])).rows[0].n,
      );
    expect([await count('classic_deployments', lost), await count('classic_deployment_targets', lost)]).toEqual([0, 0]);
    expect([await count('classic_deployments', young), await count('classic_deployment_targets', young)]).toEqual([1, 2]);
    expect((await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/deployments/${lost}` })).statusCode).toBe(404);
    expect(await dropLostDeploymentStarts(h.deps, { olderThanMs: OLDER_THAN_MS })).toEqual([]);
  });
});
