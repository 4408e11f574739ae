/**
 * Stage-then-activate with real agents (docs/agent-protocol.md "Staged sync and activation";
 * docs/decisions/stage-activate.md): sync_pull with `activation: 'staged'` builds the complete tree in
 * `<rootDir>/staging/<roostId>/<versionId>/` and leaves the live tree alone; roost_activate (queued by
 * db/activation.ts dispatchActivation) switches it in; a machine that fails to stage keeps its old files;
 * activating what was not staged is `not_staged`; superseded staging areas are removed. Commands are
 * inserted directly (no rollout workflow).
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { createHarness, type Harness } from '../support/harness';
import { newId, sha256Hex } from '../../domain/hex';
import { CHUNK_SIZE, type VersionBody, VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName } from '../../storage/blob';
import { activateCommandId, dispatchActivation } from '../../db/activation';
import { NOT_STAGED } from '../../agent/agent';
import { type Fleet, startFleet, verifyTree } from '../../agent/fleet';

let h: Harness;
let baseUrl: string;
let tmpRoot: string;
let fleet: Fleet;
let roostId: string;
const M = ['stg-0000', 'stg-0001', 'stg-0002'];
const FAILS_TO_STAGE = 'stg-0002';
const ROLLOUT = 'rol_staging_test';
const EXTRACT = 'apps/kiosk';

const v1Files = {
  'kiosk.exe': randomBytes(CHUNK_SIZE + 5000),
  'keep.dat': randomBytes(30_000),
  'old/gone.txt': Buffer.from('dropped in v2'),
};
const v2Files = {
  'kiosk.exe': randomBytes(CHUNK_SIZE + 7000),
  'keep.dat': v1Files['keep.dat'],
  'new/added.txt': Buffer.from('added in v2'),
};

beforeAll(async () => {
  h = await createHarness();
  baseUrl = await h.listen();
  const secret = await h.enrolmentSecret();
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-staging-test-'));
  await writeTree(src('v1'), v1Files);
  await writeTree(src('v2'), v2Files);
  fleet = await startFleet({
    baseUrl,
    siteId: h.siteId,
    enrolmentSecret: secret,
    count: M.length,
    machinePrefix: 'stg-',
    rootDir: path.join(tmpRoot, 'fleet'),
    heartbeatMs: 0,
    pollWaitSeconds: 5,
    failStageMachines: [FAILS_TO_STAGE],
  });
  const res = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: h.siteId, name: 'staged kiosk', extractPath: EXTRACT },
  });
  roostId = res.json().roostId;
});
afterAll(async () => {
  await fleet?.stop();
  await h.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

function src(name: string): string {
  return path.join(tmpRoot, 'src', name);
}
function live(machineId: string): string {
  return path.join(tmpRoot, 'fleet', machineId, ...EXTRACT.split('/'));
}
function staged(machineId: string, versionId: string): string {
  return fleet.agent(machineId)!.stagingDir(roostId, versionId);
}

async function writeTree(dir: string, files: Record<string, Buffer>): Promise<void> {
  for (const [p, data] of Object.entries(files)) {
    await fs.mkdir(path.dirname(path.join(dir, p)), { recursive: true });
    await fs.writeFile(path.join(dir, p), data);
  }
}

async function exists(p: string): Promise<boolean> {
  return fs.stat(p).then(
    () => true,
    () => false,
  );
}

/** Publishes `files` through the API (chunks put in blob storage first); returns the version id. */
async function publish(files: Record<string, Buffer>): Promise<string> {
  const entries: VersionBody['files'] = [];
  for (const [p, data] of Object.entries(files)) {
    const chunks = [];
    for (let off = 0; off < data.length; off += CHUNK_SIZE) {
      const part = Buffer.from(data.subarray(off, Math.min(data.length, off + CHUNK_SIZE)));
      chunks.push({ hash: sha256Hex(part), size: part.length });
      await h.deps.blob.put('chunks', chunkBlobName(h.siteId, sha256Hex(part)), part, 'application/octet-stream');
    }
    entries.push({ path: p, size: data.length, chunks });
  }
  const version: VersionBody = { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'staging.test' }, files: entries };
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    idempotencyKey: true,
    body: { siteId: h.siteId, version },
  });
  expect([200, 201]).toContain(res.statusCode);
  return res.json().versionId;
}

/** Queues a sync_pull per machine (as a rollout does); returns machineId → commandId. */
async function syncPull(machineIds: string[], versionId: string, activation?: string): Promise<Map<string, string>> {
  const ids = machineIds.map(() => newId('cmd'));
  const params = {
    roostId,
    versionId,
    versionNumber: 1,
    rolloutId: ROLLOUT,
    extractRoot: EXTRACT,
    attempt: 1,
    ...(activation ? { activation } : {}),
  };
  await h.deps.db.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, rollout_id, expires_at)
     SELECT $1, m, c, 'sync_pull', 'pending', $4, $5, now() + INTERVAL '10 minutes' FROM UNNEST($2::TEXT[], $3::TEXT[]) AS t(m, c)`,
    [h.siteId, machineIds, ids, JSON.stringify(params), ROLLOUT],
  );
  return new Map(machineIds.map((m, i) => [m, ids[i]]));
}

async function activate(machineIds: string[], versionId: string, attempt = 1): Promise<Map<string, string>> {
  const r = await dispatchActivation(
    h.deps.db,
    { siteId: h.siteId, rolloutId: ROLLOUT, roostId, versionId, extractRoot: EXTRACT, createdBy: h.userId },
    machineIds,
    { attempt },
  );
  return r.commandIds;
}

async function commandRows(ids: Map<string, string>) {
  const { rows } = await h.deps.db.query(
    `SELECT machine_id, type, status, result, error, params FROM commands WHERE site_id = $1 AND command_id = ANY($2::TEXT[]) ORDER BY machine_id`,
    [h.siteId, [...ids.values()]],
  );
  return rows;
}

async function states() {
  const { rows } = await h.deps.db.query(
    `SELECT machine_id, reported_version_id, status, error, files_total, files_assembled, files_skipped, chunks_total, chunks_dedup, chunks_fetched, bytes_fetched
       FROM roost_target_states WHERE site_id = $1 AND roost_id = $2 ORDER BY machine_id`,
    [h.siteId, roostId],
  );
  return new Map(rows.map((r) => [r.machine_id, r]));
}

// ---------------------------------------------------------------------------------------------------

describe('stage, then activate', () => {
  let v1: string;
  let v2: string;

  it('commits v1 everywhere immediately (activation absent = immediate)', async () => {
    v1 = await publish(v1Files);
    const outcomes = await fleet.waitForCommands(await syncPull(M, v1));
    expect(outcomes.map((o) => [o.status, o.result])).toEqual(M.map(() => ['completed', 'success']));
    for (const m of M) expect(await verifyTree(src('v1'), live(m))).toEqual([]);
  });

  it('stages v2 completely outside the live tree, which stays on v1; the failing machine keeps nothing staged', async () => {
    v2 = await publish(v2Files);
    const cmds = await syncPull(M, v2, 'staged');
    const outcomes = await fleet.waitForCommands(cmds);
    expect(outcomes.map((o) => [o.status, o.result ?? null])).toEqual([
      ['completed', 'staged'],
      ['completed', 'staged'],
      ['failed', null],
    ]);
    const rows = await commandRows(cmds);
    expect(rows.map((r) => [r.machine_id, r.status, r.result])).toEqual([
      ['stg-0000', 'completed', 'staged'],
      ['stg-0001', 'completed', 'staged'],
      ['stg-0002', 'failed', null],
    ]);
    expect(rows[2].error).toMatch(/injected staging failure/);

    const st = await states();
    for (const m of ['stg-0000', 'stg-0001']) {
      // Complete staged tree; live tree and manifest untouched.
      expect(await verifyTree(src('v2'), staged(m, v2))).toEqual([]);
      expect(await verifyTree(src('v1'), live(m))).toEqual([]);
      expect((await fleet.agent(m)!.readManifest(roostId))?.versionId).toBe(v1);
      // keep.dat reused from the live tree (linked, not downloaded); kiosk.exe's 2 chunks + added.txt fetched.
      expect(st.get(m)).toMatchObject({
        reported_version_id: v2,
        status: 'assembling',
        error: null,
        files_total: 3,
        files_skipped: 1,
        files_assembled: 2,
        chunks_total: 3,
        chunks_fetched: 3,
        chunks_dedup: 0,
      });
    }
    expect(st.get(FAILS_TO_STAGE)).toMatchObject({ reported_version_id: v2, status: 'failed' });
    expect(st.get(FAILS_TO_STAGE)!.error).toMatch(/injected staging failure/);
    expect(await verifyTree(src('v1'), live(FAILS_TO_STAGE))).toEqual([]);
    expect(await exists(staged(FAILS_TO_STAGE, v2))).toBe(false);
    expect(await exists(path.join(tmpRoot, 'fleet', FAILS_TO_STAGE, 'staging', roostId, `${v2}.json`))).toBe(false);
  });

  it('activation flips the staged machines to v2 without downloading; the one that did not stage gets not_staged and keeps v1', async () => {
    const before = fleet.stats().chunksFetched;
    const cmds = await activate(M, v2);
    expect([...cmds.values()]).toEqual(M.map((m) => activateCommandId(ROLLOUT, m, v2)));
    // Idempotent: a retried dispatch queues nothing new.
    expect(
      (
        await dispatchActivation(
          h.deps.db,
          { siteId: h.siteId, rolloutId: ROLLOUT, roostId, versionId: v2, extractRoot: EXTRACT, createdBy: h.userId },
          M,
        )
      ).queued,
    ).toBe(0);
    const outcomes = await fleet.waitForCommands(cmds);
    expect(outcomes.map((o) => o.status)).toEqual(['completed', 'completed', 'failed']);
    expect(outcomes[2].error).toBe(NOT_STAGED);
    const rows = await commandRows(cmds);
    expect(rows.map((r) => [r.type, r.status, r.result, r.error])).toEqual([
      ['roost_activate', 'completed', 'success', null],
      ['roost_activate', 'completed', 'success', null],
      ['roost_activate', 'failed', null, NOT_STAGED],
    ]);
    expect(rows[0].params).toEqual({ roostId, versionId: v2, rolloutId: ROLLOUT, extractRoot: EXTRACT });

    const st = await states();
    for (const m of ['stg-0000', 'stg-0001']) {
      expect(await verifyTree(src('v2'), live(m))).toEqual([]); // old/gone.txt removed, new/added.txt in
      expect((await fleet.agent(m)!.readManifest(roostId))?.versionId).toBe(v2);
      // committed, carrying the staging run's counters (what this machine fetched for v2)
      expect(st.get(m)).toMatchObject({
        reported_version_id: v2,
        status: 'committed',
        error: null,
        files_skipped: 1,
        files_assembled: 2,
        chunks_fetched: 3,
      });
      expect(Number(st.get(m)!.bytes_fetched)).toBe(v2Files['kiosk.exe'].length + v2Files['new/added.txt'].length);
      expect(await exists(path.join(tmpRoot, 'fleet', m, 'staging', roostId))).toBe(false);
    }
    expect(fleet.stats().chunksFetched).toBe(before);
    expect(await verifyTree(src('v1'), live(FAILS_TO_STAGE))).toEqual([]);
    expect(st.get(FAILS_TO_STAGE)).toMatchObject({ reported_version_id: v2, status: 'failed' });
  });

  it('answers not_staged for a version that was never staged (or already activated), changing nothing', async () => {
    const m = 'stg-0000';
    const cmds = await activate([m], v1);
    const [outcome] = await fleet.waitForCommands(cmds);
    expect(outcome).toMatchObject({ status: 'failed', error: NOT_STAGED });
    const again = await activate([m], v2, 2);
    expect((await fleet.waitForCommands(again))[0]).toMatchObject({ status: 'failed', error: NOT_STAGED });
    expect(await verifyTree(src('v2'), live(m))).toEqual([]);
    expect((await states()).get(m)).toMatchObject({ reported_version_id: v2, status: 'committed' });
  });

  it('a newer staging supersedes an older staged version; a bad activation value fails the sync', async () => {
    const m = 'stg-0001';
    const v3 = await publish({ ...v2Files, 'v3.txt': Buffer.from('three') });
    const v4 = await publish({ ...v2Files, 'v4.txt': Buffer.from('four') });
    expect((await fleet.waitForCommands(await syncPull([m], v3, 'staged')))[0]).toMatchObject({ status: 'completed', result: 'staged' });
    expect(await exists(staged(m, v3))).toBe(true);
    expect((await fleet.waitForCommands(await syncPull([m], v4, 'staged')))[0]).toMatchObject({ status: 'completed', result: 'staged' });
    expect(await exists(staged(m, v3))).toBe(false);
    expect(await exists(staged(m, v4))).toBe(true);
    expect((await fleet.waitForCommands(await activate([m], v3)))[0]).toMatchObject({ status: 'failed', error: NOT_STAGED });
    expect((await fleet.waitForCommands(await activate([m], v4)))[0]).toMatchObject({ status: 'completed' });
    expect(await verifyTree(src('v2'), live(m))).toEqual([{ path: 'v4.txt', kind: 'extra' }]);

    const bad = await fleet.waitForCommands(await syncPull([m], v3, 'later'));
    expect(bad[0].status).toBe('failed');
    expect(bad[0].error).toMatch(/activation/);
    expect((await fleet.agent(m)!.readManifest(roostId))?.versionId).toBe(v4);
  });
});
