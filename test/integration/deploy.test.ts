/**
 * POST /api/roosts/{roostId}/deploy over the real services (docs/contract.md deploy row, "Rollout"): planning,
 * storage, workflow start, alreadyRunning, dryRun, scheduleAt, Idempotency-Key, scopes, and every
 * client error. A worker runs so started workflows really progress (no agents answer them; they are
 * terminated at the end).
 */
import { Client, Connection } from '@temporalio/client';
import { buildApp } from '../../api/app';
import { describeWorkflow, rolloutWorkflowId } from '../../workflows/client';
import { splitWaves } from '../../domain/rollout-policy';
import { closeWorkerConnections } from '../../worker/worker';
import { createHarness, type Harness, idemKey } from '../support/harness';
import {
  type TestWorker,
  enrolMachineRows,
  machineIds,
  publishFiles,
  scopedKey,
  seedRoost,
  startTestWorker,
  terminateAll,
} from './rollout-fixtures';
import { testLogger } from '../support/test-log';
import { waitFor } from '../support/wait';

let h: Harness;
let w: TestWorker;
const workflows = new Set<string>();
let ids: string[];

beforeAll(async () => {
  h = await createHarness();
  w = await startTestWorker(h);
  ids = machineIds(20);
  await enrolMachineRows(h, ids);
});
afterAll(async () => {
  await terminateAll(h, workflows);
  await w?.stop();
  await closeWorkerConnections();
  await h?.close();
});

async function deploy(
  roostId: string,
  body: Record<string, unknown> = {},
  opts: { key?: string | null; idempotencyKey?: string | false } = {},
) {
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/deploy`,
    body: { siteId: h.siteId, ...body },
    key: opts.key,
    idempotencyKey: opts.idempotencyKey === false ? undefined : (opts.idempotencyKey ?? idemKey()),
  });
  if (res.statusCode === 202) workflows.add(rolloutWorkflowId(h.siteId, roostId, res.json().versionId));
  return res;
}

async function rolloutCount(roostId: string): Promise<number> {
  const { rows } = await h.deps.db.query('SELECT count(*)::int AS n FROM rollouts WHERE site_id = $1 AND roost_id = $2', [
    h.siteId,
    roostId,
  ]);
  return rows[0].n;
}

/** Polls the workflow's history every 100 ms until `pred` holds for one of its events, and returns that event. */
function waitForEvent(workflowId: string, pred: (e: any) => boolean): Promise<any> {
  return waitFor(
    `an event of ${workflowId}`,
    async () => (await h.deps.temporal.workflow.getHandle(workflowId).fetchHistory()).events?.find(pred),
    60_000,
    100,
  );
}

describe('POST /api/roosts/{roostId}/deploy', () => {
  it('deploys the current version to the roost targets: 202 rollout record, stored rows, a running workflow', async () => {
    const roost = await seedRoost(h, { targets: ids, extractPath: 'C:\\Roost\\kiosk' });
    const res = await deploy(roost.roostId);
    expect(res.statusCode).toBe(202);
    const r = res.json();
    expect(Object.keys(r).sort()).toEqual(
      [
        'alreadyRunning',
        'canary',
        'dryRun',
        'extractRoot',
        'fleet',
        'roostId',
        'rolloutId',
        'scheduleAt',
        'siteId',
        'stage',
        'versionId',
        'versionUrl',
      ].sort(),
    );
    expect(r).toMatchObject({
      versionId: roost.versionId,
      siteId: h.siteId,
      roostId: roost.roostId,
      stage: 'canary',
      extractRoot: 'C:\\Roost\\kiosk',
      alreadyRunning: false,
      dryRun: false,
      scheduleAt: null,
    });
    expect(r.rolloutId).toMatch(/^rol_[0-9a-f]{24}$/);
    expect(r.versionUrl).toMatch(
      new RegExp(`/${h.deps.blob.containerName('versions')}/sites/${h.siteId}/roosts/${roost.roostId}/versions/${roost.versionId}\\.json$`),
    );
    // ceil(10 %) of 20 targets, chosen by hash of rolloutId + machineId; the fleet keeps target order.
    expect(r.canary).toHaveLength(2);
    expect({ canary: r.canary, fleet: r.fleet }).toEqual(splitWaves(r.rolloutId, ids));
    expect([...r.canary, ...r.fleet].sort()).toEqual([...ids].sort());

    const workflowId = rolloutWorkflowId(h.siteId, roost.roostId, roost.versionId);
    expect(res.headers['x-roost-workflow-url']).toContain(`/workflows/${encodeURIComponent(workflowId)}/`);
    const { rows } = await h.deps.db.query('SELECT * FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [h.siteId, r.rolloutId]);
    expect(rows[0]).toMatchObject({
      stage: 'canary',
      active: true,
      workflow_id: workflowId,
      created_by: h.userId,
      canary: r.canary,
      fleet: r.fleet,
      schedule_at: null,
    });
    const { rows: waves } = await h.deps.db.query(
      `SELECT wave, count(*)::int AS n FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 GROUP BY wave ORDER BY wave`,
      [h.siteId, r.rolloutId],
    );
    expect(waves).toEqual([
      { wave: 'canary', n: 2 },
      { wave: 'fleet', n: 18 },
    ]);
    const desc = await h.deps.temporal.workflow.getHandle(workflowId).describe();
    expect(desc.memo).toEqual({ rolloutId: r.rolloutId });
    expect(desc.searchAttributes).toMatchObject({
      RoostSiteId: [h.siteId],
      RoostRoostId: [roost.roostId],
      RoostVersionId: [roost.versionId],
    });
    // The workflow really runs: the canary gets its sync_pull commands.
    await waitForEvent(workflowId, (e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'watchWave');
    const { rows: cmds } = await h.deps.db.query(
      `SELECT machine_id, type FROM commands WHERE site_id = $1 AND rollout_id = $2 ORDER BY machine_id`,
      [h.siteId, r.rolloutId],
    );
    expect(cmds).toEqual([...r.canary].sort().map((m: string) => ({ machine_id: m, type: 'sync_pull' })));
  });

  it('returns the running rollout with alreadyRunning true for the same version', async () => {
    const roost = await seedRoost(h, { targets: ids });
    const first = (await deploy(roost.roostId)).json();
    const res = await deploy(roost.roostId, { machines: ids.slice(0, 3), versionId: roost.versionId });
    expect(res.statusCode).toBe(202);
    expect(res.json()).toEqual({ ...first, alreadyRunning: true });
    expect(await rolloutCount(roost.roostId)).toBe(1);
  });

  it('lets exactly one of two concurrent deploys of a version create the rollout', async () => {
    const roost = await seedRoost(h, { targets: ids });
    const [a, b] = await Promise.all([deploy(roost.roostId), deploy(roost.roostId)]);
    expect([a.statusCode, b.statusCode]).toEqual([202, 202]);
    expect(a.json().rolloutId).toBe(b.json().rolloutId);
    expect([a.json().alreadyRunning, b.json().alreadyRunning].sort()).toEqual([false, true]);
    expect(await rolloutCount(roost.roostId)).toBe(1);
  });

  it('deploys an explicit version (64 hex or vrs_ prefix) to explicit machines, duplicates folded', async () => {
    const roost = await seedRoost(h, { targets: ids });
    await publishFiles(h, roost.roostId, { 'app.txt': 'v2\n' }); // v1 is no longer current
    const res = await deploy(roost.roostId, { versionId: roost.versionId, machines: [ids[0], ids[1], ids[0], ids[2]] });
    expect(res.statusCode).toBe(202);
    const r = res.json();
    expect(r.versionId).toBe(roost.versionId);
    expect(r.canary).toHaveLength(1);
    expect([...r.canary, ...r.fleet].sort()).toEqual(ids.slice(0, 3).sort());
    const again = await deploy(roost.roostId, { versionId: `vrs_${roost.versionId.slice(0, 12)}`, machines: [ids[0]] });
    expect(again.json()).toMatchObject({ rolloutId: r.rolloutId, versionId: roost.versionId, alreadyRunning: true });
  });

  it('replays a repeated Idempotency-Key and refuses it with a different body; requires the header', async () => {
    const roost = await seedRoost(h, { targets: ids });
    const key = idemKey();
    const a = await deploy(roost.roostId, {}, { idempotencyKey: key });
    const b = await deploy(roost.roostId, {}, { idempotencyKey: key });
    expect(b.statusCode).toBe(202);
    expect(b.headers['idempotent-replayed']).toBe('true');
    expect(b.json()).toEqual(a.json());
    expect(b.headers['x-roost-workflow-url']).toBe(a.headers['x-roost-workflow-url']);
    const c = await deploy(roost.roostId, { dryRun: true }, { idempotencyKey: key });
    expect(c.statusCode).toBe(422);
    expect(c.json().code).toBe('idempotency_key_mismatch');
    const d = await deploy(roost.roostId, {}, { idempotencyKey: false });
    expect(d.statusCode).toBe(400);
    expect(d.json().code).toBe('idempotency_key_required');
    expect(await rolloutCount(roost.roostId)).toBe(1);
  });

  it('plans a dry run without writing or starting anything, and reports an existing rollout', async () => {
    const roost = await seedRoost(h, { targets: ids });
    const res = await deploy(roost.roostId, { dryRun: true });
    expect(res.statusCode).toBe(202);
    const plan = res.json();
    expect(plan).toMatchObject({ versionId: roost.versionId, stage: 'canary', dryRun: true, alreadyRunning: false });
    expect({ canary: plan.canary, fleet: plan.fleet }).toEqual(splitWaves(plan.rolloutId, ids));
    expect(await rolloutCount(roost.roostId)).toBe(0);
    expect(await describeWorkflow(h.deps.temporal, rolloutWorkflowId(h.siteId, roost.roostId, roost.versionId))).toBeNull();
    const real = (await deploy(roost.roostId)).json();
    const dry = await deploy(roost.roostId, { dryRun: true });
    expect(dry.json()).toEqual({ ...real, alreadyRunning: true, dryRun: true });
    expect(await rolloutCount(roost.roostId)).toBe(1);
  });

  it('stores scheduleAt more than 60 s ahead and waits on a durable timer; nearer or past values deploy now', async () => {
    const roost = await seedRoost(h, { targets: ids.slice(0, 2) });
    const at = new Date(Date.now() + 120_000);
    const res = await deploy(roost.roostId, { scheduleAt: at.toISOString() });
    expect(res.statusCode).toBe(202);
    const r = res.json();
    expect(r).toMatchObject({ stage: 'canary', scheduleAt: at.toISOString(), alreadyRunning: false });
    const { rows } = await h.deps.db.query('SELECT schedule_at FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
      h.siteId,
      r.rolloutId,
    ]);
    expect(rows[0].schedule_at.toISOString()).toBe(at.toISOString());
    const timer = await waitForEvent(rolloutWorkflowId(h.siteId, roost.roostId, roost.versionId), (e) => e.timerStartedEventAttributes);
    const seconds = Number(timer.timerStartedEventAttributes.startToFireTimeout.seconds);
    expect(seconds).toBeGreaterThan(60);
    expect(seconds).toBeLessThanOrEqual(120);
    const { rows: cmds } = await h.deps.db.query('SELECT count(*)::int AS n FROM commands WHERE site_id = $1 AND rollout_id = $2', [
      h.siteId,
      r.rolloutId,
    ]);
    expect(cmds[0].n).toBe(0);
    const { rows: started } = await h.deps.db.query(
      `SELECT count(*)::int AS n FROM events WHERE site_id = $1 AND data->>'rolloutId' = $2`,
      [h.siteId, r.rolloutId],
    );
    expect(started[0].n).toBe(0);

    for (const offset of [30_000, -3_600_000]) {
      const other = await seedRoost(h, { targets: ids.slice(0, 2) });
      const now = await deploy(other.roostId, { scheduleAt: new Date(Date.now() + offset).toISOString() });
      expect(now.statusCode).toBe(202);
      expect(now.json().scheduleAt).toBeNull();
    }
  });

  it('accepts a key scoped to this roost with deploy, and refuses one without deploy (scope_insufficient)', async () => {
    const roost = await seedRoost(h, { targets: ids.slice(0, 2) });
    const readOnly = await scopedKey(h, [{ resource: 'roost', id: roost.roostId, permissions: ['read', 'write', 'rollback'] }]);
    const denied = await deploy(roost.roostId, {}, { key: readOnly });
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({
      code: 'scope_insufficient',
      required: { resource: 'roost', id: roost.roostId, permission: 'deploy' },
    });
    const otherRoost = await scopedKey(h, [{ resource: 'roost', id: 'rst_000000000000000000000000', permissions: ['deploy'] }]);
    expect((await deploy(roost.roostId, {}, { key: otherRoost })).statusCode).toBe(403);
    expect(await rolloutCount(roost.roostId)).toBe(0);
    const deployer = await scopedKey(h, [{ resource: 'roost', id: roost.roostId, permissions: ['deploy'] }]);
    expect((await deploy(roost.roostId, {}, { key: deployer })).statusCode).toBe(202);
    const siteDeployer = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['deploy'] }]);
    expect((await deploy(roost.roostId, { dryRun: true }, { key: siteDeployer })).statusCode).toBe(202);
  });

  it('hides another site and missing roosts and versions (404)', async () => {
    const roost = await seedRoost(h, { targets: ids.slice(0, 2) });
    const other = await h.other();
    const foreign = await deploy(roost.roostId, {}, { key: other.apiKey });
    expect(foreign.statusCode).toBe(404);
    expect(foreign.json().code).toBe('not_found');
    const crossed = await h.request({
      method: 'POST',
      url: `/api/roosts/${roost.roostId}/deploy`,
      body: { siteId: other.siteId },
      idempotencyKey: true,
      key: other.apiKey,
    });
    expect(crossed.statusCode).toBe(404);
    const missing = await deploy('rst_000000000000000000000000');
    expect(missing.statusCode).toBe(404);
    expect(missing.json().code).toBe('not_found');
    const noVersion = await deploy(roost.roostId, { versionId: 'a'.repeat(64) });
    expect(noVersion.statusCode).toBe(404);
    expect(noVersion.json()).toMatchObject({ code: 'version_not_found', param: 'versionId' });
    expect(await rolloutCount(roost.roostId)).toBe(0);
  });

  it('rejects malformed input with validation_failed and writes nothing', async () => {
    const roost = await seedRoost(h, { targets: ids.slice(0, 2) });
    const cases: [Record<string, unknown>, string][] = [
      [{ siteId: undefined }, 'siteId'],
      [{ siteId: 'bad site!' }, 'siteId'],
      [{ machines: [] }, 'machines'],
      [{ machines: ['bad id!'] }, 'machines.0'],
      [{ machines: machineIds(10_001) }, 'machines'],
      [{ versionId: 'current' }, 'versionId'],
      [{ versionId: '3' }, 'versionId'],
      [{ versionId: 'XYZ' }, 'versionId'],
      [{ scheduleAt: 'tomorrow' }, 'scheduleAt'],
      [{ scheduleAt: new Date(Date.now() + 2 * 365 * 86_400_000).toISOString() }, 'scheduleAt'],
      [{ dryRun: 'maybe' }, 'dryRun'],
      [{ priority: 'high' }, 'priority'],
    ];
    for (const [body, param] of cases) {
      const res = await deploy(roost.roostId, body);
      expect({ param, status: res.statusCode, code: res.json().code }).toEqual({ param, status: 400, code: 'validation_failed' });
      expect(Object.keys(res.json().errors ?? {})).toContain(param);
    }
    const badPath = await deploy('bad%20roost!');
    expect(badPath.statusCode).toBe(400);
    expect(badPath.json().code).toBe('validation_failed');
    expect(await rolloutCount(roost.roostId)).toBe(0);
  });

  it('lists machines that are not enrolled machines of the site', async () => {
    const roost = await seedRoost(h, { targets: ids.slice(0, 2) });
    const other = await h.other();
    await enrolMachineRows(h, ['foreign-1'], other.siteId);
    const res = await deploy(roost.roostId, { machines: [ids[0], 'ghost-1', 'foreign-1'] });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({
      code: 'validation_failed',
      param: 'machines',
      unknownMachines: ['ghost-1', 'foreign-1'],
      unknownCount: 2,
    });
    expect(res.json().errors.machines[0]).toContain('ghost-1');
    expect(await rolloutCount(roost.roostId)).toBe(0);
  });

  it('answers 409 conflict for a deleted roost, no current version, a missing version body, or unusable targets', async () => {
    const deleted = await seedRoost(h, { targets: ids.slice(0, 2) });
    await h.deps.db.query('UPDATE roosts SET deleted_at = now() WHERE site_id = $1 AND roost_id = $2', [h.siteId, deleted.roostId]);
    const empty = (
      await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'never published', targets: ids.slice(0, 2) } })
    ).json();
    const bodyless = await seedRoost(h, { targets: ids.slice(0, 2) });
    const { rows } = await h.deps.db.query('SELECT blob_name FROM roost_versions WHERE site_id = $1 AND roost_id = $2', [
      h.siteId,
      bodyless.roostId,
    ]);
    await h.deps.blob.delete('versions', rows[0].blob_name);
    const ghosts = await seedRoost(h, { targets: [ids[0], 'ghost-2'] });
    const untargeted = await seedRoost(h, { targets: [] });
    for (const roostId of [deleted.roostId, empty.roostId, bodyless.roostId, ghosts.roostId, untargeted.roostId]) {
      const res = await deploy(roostId);
      expect({ roostId, status: res.statusCode, code: res.json().code }).toEqual({ roostId, status: 409, code: 'conflict' });
      expect(await rolloutCount(roostId)).toBe(0);
    }
    expect((await deploy(ghosts.roostId)).json()).toMatchObject({ unknownMachines: ['ghost-2'], unknownCount: 1 });
  });

  it('answers 503 and leaves no active rollout when the workflow cannot start; a retry then deploys', async () => {
    const roost = await seedRoost(h, { targets: ids.slice(0, 2) });
    const connection = Connection.lazy({ address: '127.0.0.1:1', interceptors: [] });
    const broken = await buildApp(
      { ...h.deps, temporal: new Client({ connection, namespace: h.deps.cfg.TEMPORAL_NAMESPACE }) },
      { loggerInstance: testLogger('roost-api') },
    );
    try {
      await broken.ready();
      const res = await broken.inject({
        method: 'POST',
        url: `/api/roosts/${roost.roostId}/deploy`,
        headers: { authorization: `Bearer ${h.apiKey}`, 'idempotency-key': idemKey() },
        payload: { siteId: h.siteId },
      });
      expect(res.statusCode).toBe(503);
      expect(res.json().code).toBe('service_unavailable');
      expect(res.headers['retry-after']).toBe('5');
    } finally {
      await broken.close();
      await connection.close().catch(() => undefined);
    }
    const { rows } = await h.deps.db.query('SELECT stage, active, abort_reason FROM rollouts WHERE site_id = $1 AND roost_id = $2', [
      h.siteId,
      roost.roostId,
    ]);
    expect(rows).toEqual([{ stage: 'failed', active: false, abort_reason: 'workflow_start_failed' }]);
    const retry = await deploy(roost.roostId);
    expect(retry.statusCode).toBe(202);
    expect(retry.json().alreadyRunning).toBe(false);
  });
});
