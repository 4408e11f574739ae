/**
 * Background sweeps (docs/decisions/sweeps.md; docs/contract.md Event catalog machine.offline/online,
 * chunk.garbage_collected, chunk.verify_failed, api_key.expired): each sweep workflow is run once directly
 * on a worker of the harness's task queue over prepared rows and real blob bytes, then again to prove a
 * re-run emits nothing twice; `ensureBackgroundWorkflows` creates one schedule per sweep, idempotently.
 *
 * The harness runs with ROOST_CHUNK_GC_SAFETY_SECONDS=0 so one GC run both condemns and reclaims; the
 * 30-day grace stays the default and the rows are backdated instead.
 * Set ROOST_RECORD_HISTORIES=1 to refresh test/replay/histories/sweeps/sweep-*.json from these runs.
 */
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import type { Client } from '@temporalio/client';
import { createHarness, type Harness } from '../support/harness';
import { insertKey } from '../support/identity';
import { seedRoost, startTestWorker, type TestWorker } from './rollout-fixtures';
import { newId, randomToken, sha256Hex } from '../../domain/hex';
import { chunkBlobName } from '../../storage/blob';
import { quotaSnapshot, quotaTiers, withUsage } from '../../db/quota';
import { recordHistory } from '../../scripts/record-history';
import { ensureBackgroundWorkflows, eventRelayWorkflowId, sweepSchedules, sweepScheduleId } from '../../worker/background';
import { countChunks } from '../../db/chunks';
import { ownDatabase, type OwnDatabase } from '../support/own-database';

const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories', 'sweeps');

let h: Harness;
let worker: TestWorker;
let client: Client;

/**
 * Sweeps look at every site, so these tests get a database of their own: in the shared test database
 * other files' machines, chunks and keys would be swept too and the counts below would not be theirs.
 */
let db: OwnDatabase | undefined;

beforeAll(async () => {
  db = await ownDatabase('sweeps');
  h = await createHarness({ ROOST_CHUNK_GC_SAFETY_SECONDS: '0', ...db.overrides });
  worker = await startTestWorker(h);
  client = h.deps.temporal;
});

afterAll(async () => {
  await worker?.stop();
  await h?.close();
  db?.drop();
});

/** Runs a sweep workflow to completion on the harness's queue; records its history when asked to. */
async function runSweep<T = Record<string, number>>(workflowType: string, input: Record<string, number> = {}, record?: string): Promise<T> {
  const workflowId = `sweep-test-${workflowType}-${randomBytes(4).toString('hex')}`;
  const result = await client.workflow.execute(workflowType, { taskQueue: h.deps.cfg.ROOST_TASK_QUEUE, workflowId, args: [input] });
  if (RECORD && record) await recordHistory(client, workflowId, path.join(HISTORIES, `sweep-${record}.json`));
  return result as T;
}

async function events(type: string, siteId = h.siteId): Promise<Record<string, unknown>[]> {
  const { rows } = await h.deps.db.query<{ data: Record<string, unknown> }>(
    'SELECT data FROM events WHERE site_id = $1 AND type = $2 ORDER BY occurred_at, event_id',
    [siteId, type],
  );
  return rows.map((r) => r.data);
}

/** Puts `bytes` as a chunk blob of the site and records its `chunks` row, `ageDays` old. Returns the hash. */
async function storedChunk(bytes: Buffer, ageDays: number, siteId = h.siteId, hash = sha256Hex(bytes)): Promise<string> {
  await h.deps.blob.put('chunks', chunkBlobName(siteId, hash), bytes, 'application/octet-stream');
  await h.deps.db.query(
    withUsage(
      `INSERT INTO chunks (site_id, hash, size, created_at) VALUES ($1, $2, $3, now() - ($4::INT * INTERVAL '1 day')) RETURNING size`,
      1,
    ),
    [siteId, hash, bytes.length, ageDays],
  );
  return hash;
}

async function chunkRow(hash: string, siteId = h.siteId) {
  const { rows } = await h.deps.db.query('SELECT * FROM chunks WHERE site_id = $1 AND hash = $2', [siteId, hash]);
  return rows[0] as { size: number; verified_at: Date | null; verify_failed_digest: string | null } | undefined;
}

describe('heartbeat staleness sweep', () => {
  async function machine(id: string, online: boolean, heartbeatAgo: string | null, siteId = h.siteId): Promise<string> {
    const token = `sat_${randomToken()}`;
    await h.deps.db.query(
      `INSERT INTO machines (site_id, machine_id, hostname, agent_token_hash, agent_version, online, last_heartbeat)
       VALUES ($1, $2, $2, $3, '1.0.0', $4, CASE WHEN $5::TEXT IS NULL THEN NULL ELSE now() - CAST($5::TEXT AS INTERVAL) END)`,
      [siteId, id, sha256Hex(token), online, heartbeatAgo],
    );
    return token;
  }

  it('flags a stale machine offline once (machine.offline), and its next heartbeat brings machine.online once', async () => {
    const other = await h.other();
    const staleToken = await machine('sw-stale', true, '1 hour');
    await machine('sw-fresh', true, '1 second');
    await machine('sw-already-off', false, '2 hours');
    await machine('sw-other-site', true, '1 hour', other.siteId);
    const before = await h.deps.db.query<{ last_heartbeat: Date }>(
      `SELECT last_heartbeat FROM machines WHERE site_id = $1 AND machine_id = 'sw-stale'`,
      [h.siteId],
    );

    const first = await runSweep<{ emitted: number }>('heartbeatStalenessSweepWorkflow', { batchSize: 2 }, 'staleness');
    expect(first.emitted).toBe(2);
    const offline = await events('machine.offline');
    expect(offline).toEqual([{ machineId: 'sw-stale', siteId: h.siteId, lastHeartbeat: before.rows[0].last_heartbeat.toISOString() }]);
    expect(await events('machine.offline', other.siteId)).toEqual([
      expect.objectContaining({ machineId: 'sw-other-site', siteId: other.siteId }),
    ]);
    const flags = await h.deps.db.query<{ machine_id: string; online: boolean }>(
      `SELECT machine_id, online FROM machines WHERE site_id = $1 AND machine_id LIKE 'sw-%' ORDER BY machine_id`,
      [h.siteId],
    );
    expect(flags.rows).toEqual([
      { machine_id: 'sw-already-off', online: false },
      { machine_id: 'sw-fresh', online: true },
      { machine_id: 'sw-stale', online: false },
    ]);

    // A second run changes and emits nothing.
    expect((await runSweep<{ emitted: number }>('heartbeatStalenessSweepWorkflow')).emitted).toBe(0);
    expect(await events('machine.offline')).toHaveLength(1);

    // Heartbeats resume: machine.online once, not once per heartbeat; the sweep leaves it alone.
    const onlineBefore = (await events('machine.online')).length;
    for (let i = 0; i < 2; i++) {
      const res = await h.request({ method: 'POST', url: '/api/agent/heartbeat', key: staleToken, body: {} });
      expect(res.statusCode).toBe(200);
    }
    const online = (await events('machine.online')).slice(onlineBefore);
    expect(online).toEqual([{ machineId: 'sw-stale', siteId: h.siteId, lastHeartbeat: expect.any(String) }]);
    expect((await runSweep<{ emitted: number }>('heartbeatStalenessSweepWorkflow')).emitted).toBe(0);
    expect(await events('machine.offline')).toHaveLength(1);
  });
});

describe('chunk garbage collection sweep', () => {
  it('reclaims unreferenced chunks past the grace (blob, row, event, usage) and keeps referenced or young ones', async () => {
    const tiers = quotaTiers(h.deps.cfg);
    // Collectable: never referenced, recorded 31 days ago.
    const orphan = await storedChunk(randomBytes(1500), 31);
    // Kept: young orphan; old chunk mounted into a live roost.
    const young = await storedChunk(randomBytes(700), 1);
    const mounted = await storedChunk(randomBytes(800), 40);
    const live = await seedRoost(h, { files: { 'a.txt': `live ${randomBytes(6).toString('hex')}` } });
    await h.deps.db.query(
      `INSERT INTO chunk_referrers (site_id, hash, entry_id, source, roost_id, from_roost_id, to_roost_id, created_by)
       VALUES ($1, $2, $3, 'mount', $4, $4, $4, 'test')`,
      [h.siteId, mounted, newId('ent'), live.roostId],
    );
    // Kept: referenced by a live roost's version, though recorded long ago.
    const liveHash = sha256Hex(Buffer.from(live.files['a.txt']));
    // Collectable: only referenced by a roost deleted 31 days ago. Kept: roost deleted yesterday.
    const gone = await seedRoost(h, { files: { 'g.txt': `gone ${randomBytes(6).toString('hex')}` } });
    const goneHash = sha256Hex(Buffer.from(gone.files['g.txt']));
    const recent = await seedRoost(h, { files: { 'r.txt': `recent ${randomBytes(6).toString('hex')}` } });
    const recentHash = sha256Hex(Buffer.from(recent.files['r.txt']));
    await h.deps.db.query(`UPDATE chunks SET created_at = now() - INTERVAL '60 days' WHERE site_id = $1 AND hash = ANY($2)`, [
      h.siteId,
      [liveHash, goneHash, recentHash],
    ]);
    await h.deps.db.query(`UPDATE roosts SET deleted_at = now() - INTERVAL '31 days' WHERE site_id = $1 AND roost_id = $2`, [
      h.siteId,
      gone.roostId,
    ]);
    await h.deps.db.query(`UPDATE roosts SET deleted_at = now() - INTERVAL '1 day' WHERE site_id = $1 AND roost_id = $2`, [
      h.siteId,
      recent.roostId,
    ]);
    // Another site's old orphan is collected in its own site.
    const other = await h.other();
    const otherOrphan = await storedChunk(randomBytes(300), 45, other.siteId);
    const goneSize = Buffer.from(gone.files['g.txt']).length;

    const usedBefore = (await quotaSnapshot(h.deps.db, h.siteId, tiers)).usedBytes;
    const first = await runSweep<{ condemned: number; reclaimed: number }>('chunkGcSweepWorkflow', { batchSize: 3 }, 'chunk-gc');
    expect(first).toMatchObject({ condemned: 3, reclaimed: 3 });

    for (const hash of [orphan, goneHash]) {
      expect(await chunkRow(hash)).toBeUndefined();
      expect(await h.deps.blob.get('chunks', chunkBlobName(h.siteId, hash))).toBeNull();
    }
    for (const hash of [young, mounted, liveHash, recentHash]) {
      expect(await chunkRow(hash)).toBeDefined();
      expect(await h.deps.blob.get('chunks', chunkBlobName(h.siteId, hash))).not.toBeNull();
    }
    const gc = await events('chunk.garbage_collected');
    expect(gc).toHaveLength(2);
    expect(gc).toEqual(
      expect.arrayContaining([
        { siteId: h.siteId, hash: orphan, sizeBytes: 1500 },
        { siteId: h.siteId, hash: goneHash, sizeBytes: goneSize },
      ]),
    );
    expect(await events('chunk.garbage_collected', other.siteId)).toEqual([{ siteId: other.siteId, hash: otherOrphan, sizeBytes: 300 }]);
    expect((await quotaSnapshot(h.deps.db, h.siteId, tiers)).usedBytes).toBe(usedBefore - 1500 - goneSize);
    // The kept count (site_usage) is what summing the rows gives, in both sites.
    for (const siteId of [h.siteId, other.siteId]) {
      const { rows: sum } = await h.deps.db.query<{ n: string }>('SELECT COALESCE(SUM(size), 0) AS n FROM chunks WHERE site_id = $1', [
        siteId,
      ]);
      expect((await quotaSnapshot(h.deps.db, siteId, tiers)).usedBytes).toBe(Number(sum[0].n));
      const { rows: count } = await h.deps.db.query<{ n: string }>('SELECT count(*) AS n FROM chunks WHERE site_id = $1', [siteId]);
      expect(await countChunks(h.deps.db, siteId)).toBe(Number(count[0].n));
    }
    const { rows: tombs } = await h.deps.db.query('SELECT 1 FROM chunk_gc_tombstones');
    expect(tombs).toHaveLength(0);

    // A re-run emits nothing new.
    const second = await runSweep<{ condemned: number; reclaimed: number }>('chunkGcSweepWorkflow');
    expect(second).toMatchObject({ condemned: 0, reclaimed: 0 });
    expect(await events('chunk.garbage_collected')).toHaveLength(2);
  });

  it('restores a condemned chunk that a publish referenced after condemnation, and never deletes its blob', async () => {
    // The race: phase 1 condemned the chunk (row gone, tombstone written) while a publish that had
    // already checked it present was committing; the version now references it.
    const roost = await seedRoost(h, { files: { 'x.txt': `raced ${randomBytes(6).toString('hex')}` } });
    const hash = sha256Hex(Buffer.from(roost.files['x.txt']));
    const size = (await chunkRow(hash))!.size;
    await h.deps.db.query('DELETE FROM chunks WHERE site_id = $1 AND hash = $2', [h.siteId, hash]);
    await h.deps.db.query(
      `INSERT INTO chunk_gc_tombstones (site_id, hash, size, chunk_created_at, condemned_at) VALUES ($1, $2, $3, now() - INTERVAL '40 days', now() - INTERVAL '2 hours')`,
      [h.siteId, hash, size],
    );
    const gcBefore = (await events('chunk.garbage_collected')).length;
    const r = await runSweep<{ restored: number; reclaimed: number }>('chunkGcSweepWorkflow');
    expect(r).toMatchObject({ restored: 1, reclaimed: 0 });
    expect(await chunkRow(hash)).toMatchObject({ size });
    expect(await h.deps.blob.get('chunks', chunkBlobName(h.siteId, hash))).not.toBeNull();
    expect(await events('chunk.garbage_collected')).toHaveLength(gcBefore);
    // The chunk counts as present again.
    const check = await h.request({ method: 'POST', url: '/api/chunks/check', body: { siteId: h.siteId, hashes: [hash] } });
    expect(check.statusCode).toBe(200);
    expect(check.json().missing).toEqual([]);
  });
});

describe('chunk verification sweep', () => {
  it('re-hashes stored bytes: corrupted bytes give chunk.verify_failed once with both digests', async () => {
    const good = randomBytes(2048);
    const hash = await storedChunk(good, 0);
    const missing = sha256Hex(randomBytes(64));
    await h.deps.db.query(withUsage('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, 64) RETURNING size', 1), [h.siteId, missing]);

    const first = await runSweep<{ emitted: number; processed: number }>(
      'chunkVerifySweepWorkflow',
      { batchSize: 4, maxBatches: 100 },
      'chunk-verify',
    );
    expect(first.processed).toBeGreaterThanOrEqual(2);
    expect((await chunkRow(hash))!.verified_at).toBeInstanceOf(Date);
    expect((await chunkRow(hash))!.verify_failed_digest).toBeNull();
    expect(await events('chunk.verify_failed')).toEqual([{ siteId: h.siteId, hash: missing, expectedDigest: missing, actualDigest: null }]);

    // Corrupt the stored bytes in Azurite.
    const bad = Buffer.concat([good.subarray(0, 1000), Buffer.from('corrupted'), good.subarray(1009)]);
    await h.deps.blob.put('chunks', chunkBlobName(h.siteId, hash), bad, 'application/octet-stream');
    await runSweep('chunkVerifySweepWorkflow', { batchSize: 4, maxBatches: 100 });
    const failed = await events('chunk.verify_failed');
    expect(failed).toHaveLength(2);
    expect(failed[1]).toEqual({ siteId: h.siteId, hash, expectedDigest: hash, actualDigest: sha256Hex(bad) });
    expect((await chunkRow(hash))!.verify_failed_digest).toBe(sha256Hex(bad));

    // The same bad bytes are never reported twice.
    const again = await runSweep<{ emitted: number; processed: number }>('chunkVerifySweepWorkflow', { batchSize: 4, maxBatches: 100 });
    expect(again.processed).toBeGreaterThanOrEqual(2);
    expect(again.emitted).toBe(0);
    expect(await events('chunk.verify_failed')).toHaveLength(2);

    // Repaired bytes clear the mark.
    await h.deps.blob.put('chunks', chunkBlobName(h.siteId, hash), good, 'application/octet-stream');
    await runSweep('chunkVerifySweepWorkflow', { batchSize: 4, maxBatches: 100 });
    expect((await chunkRow(hash))!.verify_failed_digest).toBeNull();
    expect(await events('chunk.verify_failed')).toHaveLength(2);
  });
});

describe('key expiry sweep', () => {
  it('records api_key.expired once per expired active key; auth still answers token_expired', async () => {
    const expiresAt = Date.now() - 60_000;
    const expired = await insertKey(h.deps.db, { uid: h.userId, scopes: [], expiresAt, primarySiteId: h.siteId, name: 'expired key' });
    await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [],
      expiresAt: Date.now() + 86_400_000,
      primarySiteId: h.siteId,
      name: 'live key',
    });
    await insertKey(h.deps.db, { uid: h.userId, scopes: [], expiresAt, primarySiteId: h.siteId, status: 'revoked', name: 'revoked key' });
    // No primary site: the sites its scopes name.
    const scoped = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
      expiresAt,
      name: 'scoped key',
    });
    const { rows } = await h.deps.db.query<{ key_id: string; key_prefix: string }>(
      'SELECT key_id, key_prefix FROM api_keys WHERE key_id = ANY($1)',
      [[expired.keyId, scoped.keyId]],
    );
    const prefix = new Map(rows.map((r) => [r.key_id, r.key_prefix]));

    const first = await runSweep<{ emitted: number }>('keyExpirySweepWorkflow', { batchSize: 1 }, 'key-expiry');
    expect(first.emitted).toBe(2);
    const ev = await events('api_key.expired');
    expect(ev).toHaveLength(2);
    expect(ev).toEqual(
      expect.arrayContaining([
        { keyId: expired.keyId, keyPrefix: prefix.get(expired.keyId), name: 'expired key', expiresAt },
        { keyId: scoped.keyId, keyPrefix: prefix.get(scoped.keyId), name: 'scoped key', expiresAt },
      ]),
    );

    expect((await runSweep<{ emitted: number }>('keyExpirySweepWorkflow')).emitted).toBe(0);
    expect(await events('api_key.expired')).toHaveLength(2);

    const res = await h.request({ method: 'GET', url: '/api/whoami', key: expired.raw });
    expect(res.statusCode).toBe(401);
    expect(res.json().code).toBe('token_expired');
  });
});

describe('ensureBackgroundWorkflows', () => {
  it('creates one schedule per sweep, idempotently', async () => {
    // A task queue no worker serves: a scheduled run that fires during the test just waits (and is terminated
    // below), as does any long-running workflow ensureBackgroundWorkflows starts.
    const taskQueue = `${h.deps.cfg.ROOST_TASK_QUEUE}-schedules`;
    const ids = sweepSchedules(h.deps.cfg).map((s) => sweepScheduleId(s.name, taskQueue));
    try {
      await ensureBackgroundWorkflows(client, h.deps.cfg, { taskQueue });
      await expect(ensureBackgroundWorkflows(client, h.deps.cfg, { taskQueue })).resolves.toBeUndefined();
      expect(new Set(ids).size).toBe(5);
      for (const [i, id] of ids.entries()) {
        const d = await client.schedule.getHandle(id).describe();
        expect(d.action).toMatchObject({ type: 'startWorkflow', workflowType: sweepSchedules(h.deps.cfg)[i].workflowType, taskQueue });
        expect(d.spec.intervals?.[0]?.every).toBe(sweepSchedules(h.deps.cfg)[i].everySeconds * 1000);
      }
      const listed: string[] = [];
      for await (const s of client.schedule.list()) if (s.scheduleId.endsWith(`-${taskQueue}`)) listed.push(s.scheduleId);
      // Listing is eventually consistent: every listed id is one of ours, never a duplicate.
      expect(new Set(listed).size).toBe(listed.length);
      for (const id of listed) expect(ids).toContain(id);
    } finally {
      for (const id of ids) {
        const handle = client.schedule.getHandle(id);
        const running = await handle.describe().then(
          (d) => d.info.runningActions,
          () => [],
        );
        await handle.delete().catch(() => undefined);
        for (const a of running)
          await client.workflow
            .getHandle(a.workflow.workflowId)
            .terminate('test cleanup')
            .catch(() => undefined);
      }
      // The long-running workflows ensureBackgroundWorkflows starts too (by id, then whatever visibility lists).
      await client.workflow
        .getHandle(eventRelayWorkflowId(taskQueue))
        .terminate('test cleanup')
        .catch(() => undefined);
      for await (const wf of client.workflow.list({ query: `TaskQueue = "${taskQueue}" AND ExecutionStatus = "Running"` })) {
        await client.workflow
          .getHandle(wf.workflowId, wf.runId)
          .terminate('test cleanup')
          .catch(() => undefined);
      }
    }
  });
});
