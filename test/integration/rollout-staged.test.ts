/**
 * Stage, then activate (docs/decisions/stage-activate.md): with `activation:
 * 'wave'` each wave stages (sync_pull with activation 'staged') and then activates its staged machines
 * together with roost_activate; with `'fleet'` every wave stages first and one activation flips the
 * whole fleet. A machine that fails to stage keeps its old files and counts as failed (the failure
 * threshold decides the rollout). Real reference agents (agent/fleet.ts) over HTTP.
 * Set ROOST_RECORD_HISTORIES=1 to (re)record test/replay/histories/rollout-staged.json.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createHarness, type Harness } from '../support/harness';
import { closeWorkerConnections } from '../../worker/worker';
import { recordHistory } from '../../scripts/record-history';
import { rolloutWorkflowId } from '../../workflows/client';
import { startFleet, type Fleet, fleetMachineIds } from '../../agent/fleet';
import { resolveExtractDir } from '../../agent/agent';
import { type TestWorker, publishFiles, seedRoost, startTestWorker, terminateAll } from './rollout-fixtures';

process.env.ROOST_ROLLOUT_POLL_MS = '100';
const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories');

let h: Harness;
let w: TestWorker;
let tmpRoot: string;
let fleet: Fleet | undefined;
const workflows: string[] = [];
const PREFIX = 'stg-';
const ids = fleetMachineIds(5, PREFIX);
const failing = ids[3];

beforeAll(async () => {
  h = await createHarness();
  w = await startTestWorker(h);
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-staged-test-'));
  const baseUrl = await h.listen();
  const secret = await h.enrolmentSecret();
  fleet = await startFleet({
    baseUrl,
    siteId: h.siteId,
    enrolmentSecret: secret,
    count: ids.length,
    machinePrefix: PREFIX,
    rootDir: tmpRoot,
    pollWaitSeconds: 5,
    heartbeatMs: 0,
    failStageMachines: [failing],
  });
});
afterAll(async () => {
  await fleet?.stop();
  await terminateAll(h, workflows);
  await w?.stop();
  await closeWorkerConnections();
  h?.app.server.closeAllConnections();
  await h?.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

async function deploy(roostId: string, body: Record<string, unknown>) {
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/deploy`,
    body: { siteId: h.siteId, ...body },
    idempotencyKey: true,
  });
  if (res.statusCode !== 202) throw new Error(`deploy failed: ${res.statusCode} ${res.body}`);
  const r = res.json();
  const workflowId = rolloutWorkflowId(h.siteId, roostId, r.versionId);
  workflows.push(workflowId);
  return { ...r, workflowId };
}

const result = (workflowId: string) => h.deps.temporal.workflow.getHandle(workflowId).result();

async function fileOn(machineId: string, file: string): Promise<string> {
  return fs.readFile(path.join(resolveExtractDir(path.join(tmpRoot, machineId), 'apps/test'), file), 'utf8');
}

async function commandTimes(rolloutId: string, type: string): Promise<Map<string, Date>> {
  const { rows } = await h.deps.db.query(
    'SELECT machine_id, created_at FROM commands WHERE site_id = $1 AND rollout_id = $2 AND type = $3',
    [h.siteId, rolloutId, type],
  );
  return new Map(rows.map((r) => [r.machine_id, r.created_at]));
}

it.each(['wave', 'fleet'] as const)(
  'stages then activates (%s): the machine that fails to stage keeps its old files, the others flip',
  async (activation) => {
    const roost = await seedRoost(h, { targets: ids, files: { 'app.txt': 'old\n', 'gone.txt': 'dropped later\n' } });
    const v1 = await deploy(roost.roostId, { policy: { retryBackoffSeconds: 0.1 } });
    expect((await result(v1.workflowId)).stage).toBe('completed');
    for (const m of ids) expect(await fileOn(m, 'app.txt')).toBe('old\n');

    const v2 = await publishFiles(h, roost.roostId, { 'app.txt': 'new\n', 'added.txt': 'added\n' });
    const r = await deploy(roost.roostId, {
      versionId: v2.versionId,
      policy: { activation, canary: { count: 2 }, failureThreshold: { count: 1 }, retries: 0, retryBackoffSeconds: 0.1 },
    });
    expect(r.policy.activation).toBe(activation);
    const out = await result(r.workflowId);
    expect(out).toMatchObject({ stage: 'completed', succeeded: 4, failed: 1 });

    for (const m of ids) {
      if (m === failing) {
        expect(await fileOn(m, 'app.txt')).toBe('old\n');
        expect(await fileOn(m, 'gone.txt')).toBe('dropped later\n');
      } else {
        expect(await fileOn(m, 'app.txt')).toBe('new\n');
        expect(await fileOn(m, 'added.txt')).toBe('added\n');
        await expect(fileOn(m, 'gone.txt')).rejects.toThrow();
      }
    }
    const { rows } = await h.deps.db.query(
      'SELECT machine_id, status, last_error, staged_at FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2',
      [h.siteId, r.rolloutId],
    );
    for (const row of rows) {
      if (row.machine_id === failing) expect(row).toMatchObject({ status: 'failed', staged_at: null });
      else {
        expect(row.status).toBe('succeeded');
        expect(row.staged_at).toBeInstanceOf(Date);
      }
    }
    // Every sync_pull asked for staging; activation came only after every machine of the scope staged.
    const { rows: syncs } = await h.deps.db.query(
      `SELECT DISTINCT params->>'activation' AS a FROM commands WHERE site_id = $1 AND rollout_id = $2 AND type = 'sync_pull'`,
      [h.siteId, r.rolloutId],
    );
    expect(syncs).toEqual([{ a: 'staged' }]);
    const pulls = await commandTimes(r.rolloutId, 'sync_pull');
    const activations = await commandTimes(r.rolloutId, 'roost_activate');
    expect([...activations.keys()].sort()).toEqual(ids.filter((m) => m !== failing).sort());
    const { rows: waves } = await h.deps.db.query('SELECT machine_id, wave FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2', [
      h.siteId,
      r.rolloutId,
    ]);
    const waveOf = new Map(waves.map((x) => [x.machine_id, x.wave]));
    for (const [m, at] of activations) {
      const scope = activation === 'fleet' ? ids : ids.filter((x) => waveOf.get(x) === waveOf.get(m));
      for (const s of scope) expect(at.getTime()).toBeGreaterThanOrEqual(pulls.get(s)!.getTime());
    }
    if (activation === 'fleet') {
      const times = [...activations.values()].map((d) => d.getTime());
      const lastPull = Math.max(...[...pulls.values()].map((d) => d.getTime()));
      expect(Math.min(...times)).toBeGreaterThanOrEqual(lastPull);
    }
    const { rows: ts } = await h.deps.db.query(
      'SELECT machine_id, reported_version_id, status FROM roost_target_states WHERE site_id = $1 AND roost_id = $2',
      [h.siteId, roost.roostId],
    );
    for (const t of ts) {
      if (t.machine_id === failing) expect(t).toMatchObject({ reported_version_id: v2.versionId, status: 'failed' });
      else expect(t).toMatchObject({ reported_version_id: v2.versionId, status: 'committed' });
    }
    if (RECORD && activation === 'wave') await recordHistory(h.deps.temporal, r.workflowId, path.join(HISTORIES, 'rollout-staged.json'));
  },
);
