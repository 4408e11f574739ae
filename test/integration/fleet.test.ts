/**
 * Fleet simulator (agent/fleet.ts): a thousand reference agents in one process against the real API,
 * a roost synced to a fleet with faults injected, and verifyTree.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { createHarness, type Harness } from '../support/harness';
import { newId, sha256Hex } from '../../domain/hex';
import { canonicalJson, CHUNK_SIZE, computeVersionId, summarize, type VersionBody, VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName, versionBlobName } from '../../storage/blob';
import { fleetMachineIds, startFleet, verifyTree, type Fleet } from '../../agent/fleet';
import type { CommandOutcome } from '../../agent/agent';

let h: Harness;
let baseUrl: string;
let secret: string;
let tmpRoot: string;
/** Generous caps for the thousand-agent steps on a busy 2-core machine (they wait for conditions, never assert durations). */
const SLOW = 300_000;

beforeAll(async () => {
  h = await createHarness();
  baseUrl = await h.listen();
  secret = await h.enrolmentSecret();
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-fleet-test-'));
});
afterAll(async () => {
  await h.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

/** Publishes `files` as the next version of a roost the way publish stores it (chunks, body blob, rows, pointer). */
async function publish(roostId: string, files: Record<string, Buffer>, targets: string[] = []): Promise<string> {
  await h.deps.db.query(
    `INSERT INTO roosts (site_id, roost_id, name, targets, extract_path, created_by) VALUES ($1, $2, $3, $4, 'D:\\Apps\\kiosk', $5)
     ON CONFLICT (site_id, roost_id) DO NOTHING`,
    [h.siteId, roostId, roostId, JSON.stringify(targets), h.userId],
  );
  const entries: VersionBody['files'] = [];
  for (const [p, data] of Object.entries(files)) {
    const chunks = [];
    for (let off = 0; off < data.length; off += CHUNK_SIZE) {
      const part = Buffer.from(data.subarray(off, Math.min(data.length, off + CHUNK_SIZE)));
      const hash = sha256Hex(part);
      chunks.push({ hash, size: part.length });
      await h.deps.blob.put('chunks', chunkBlobName(h.siteId, hash), part, 'application/octet-stream');
      await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, $3) ON CONFLICT (site_id, hash) DO NOTHING', [
        h.siteId,
        hash,
        part.length,
      ]);
    }
    entries.push({ path: p, size: data.length, chunks });
  }
  const body: VersionBody = { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'fleet.test' }, files: entries };
  const versionId = computeVersionId(body);
  const blobName = versionBlobName(h.siteId, roostId, versionId);
  await h.deps.blob.put('versions', blobName, Buffer.from(canonicalJson(body)), 'application/json');
  const { totalSize, totalFiles } = summarize(body);
  const { rows } = await h.deps.db.query<{ version_counter: number; current_version_id: string | null }>(
    'UPDATE roosts SET version_counter = version_counter + 1 WHERE site_id = $1 AND roost_id = $2 RETURNING version_counter, current_version_id',
    [h.siteId, roostId],
  );
  await h.deps.db.query(
    `INSERT INTO roost_versions (site_id, roost_id, version_id, version_number, blob_name, total_size, total_files, parent_version_id, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
    [h.siteId, roostId, versionId, rows[0].version_counter, blobName, totalSize, totalFiles, rows[0].current_version_id, h.userId],
  );
  await h.deps.db.query('UPDATE roosts SET current_version_id = $3 WHERE site_id = $1 AND roost_id = $2', [h.siteId, roostId, versionId]);
  return versionId;
}

/** Queues one command per machine in one statement; returns machineId → commandId. */
async function queueAll(machineIds: string[], type: string, params: Record<string, unknown>): Promise<Map<string, string>> {
  const ids = machineIds.map(() => newId('cmd'));
  await h.deps.db.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, expires_at)
     SELECT $1, m, c, $4, 'pending', $5, now() + INTERVAL '10 minutes' FROM UNNEST($2::TEXT[], $3::TEXT[]) AS t(m, c)`,
    [h.siteId, machineIds, ids, type, JSON.stringify(params)],
  );
  return new Map(machineIds.map((m, i) => [m, ids[i]]));
}

/**
 * Waits for every listed command (machineId → commandId) for up to `timeoutMs`; when some are still out then,
 * fails with what explains them: their rows' statuses, target states, the agents' state and recent warnings.
 */
async function waitOrExplain(fleet: Fleet, cmds: Map<string, string>, timeoutMs: number): Promise<CommandOutcome[]> {
  const entries = [...cmds];
  const settled = await Promise.allSettled(entries.map(([m, c]) => fleet.agent(m)!.waitForCommand(c, timeoutMs)));
  const late = entries.filter((_, i) => settled[i].status === 'rejected');
  if (late.length === 0) return settled.map((s) => (s as PromiseFulfilledResult<CommandOutcome>).value);
  const lateIds = late.map(([m]) => m);
  const commands = await h.deps.db.query(
    `SELECT status, count(*)::INT AS n, min(machine_id) AS example FROM commands WHERE site_id = $1 AND command_id = ANY($2) GROUP BY status`,
    [h.siteId, late.map(([, c]) => c)],
  );
  const targets = await h.deps.db.query(
    `SELECT status, count(*)::INT AS n FROM roost_target_states WHERE site_id = $1 AND machine_id = ANY($2) GROUP BY status`,
    [h.siteId, lateIds],
  );
  const agents = lateIds.slice(0, 5).map((m) => ({ machineId: m, running: fleet.agent(m)!.running, stats: fleet.agent(m)!.stats }));
  const warnings = fleet.warnings.filter((w) => lateIds.some((m) => w.startsWith(`${m}:`))).slice(-20);
  throw new Error(
    `${late.length} of ${entries.length} commands not handled within ${timeoutMs} ms: ${JSON.stringify(
      { commands: commands.rows, targets: targets.rows, agents, warnings, recentWarnings: fleet.warnings.slice(-10), stats: fleet.stats() },
      null,
      1,
    )}`,
  );
}

async function writeTree(dir: string, files: Record<string, Buffer>): Promise<void> {
  for (const [p, data] of Object.entries(files)) {
    await fs.mkdir(path.dirname(path.join(dir, p)), { recursive: true });
    await fs.writeFile(path.join(dir, p), data);
  }
}

describe('startFleet', () => {
  let fleet: Fleet;
  const COUNT = 1000;
  const files: Record<string, Buffer> = {
    'kiosk.exe': randomBytes(64 * 1024),
    'config/settings.json': Buffer.from(JSON.stringify({ mode: 'fleet' })),
    'assets/logo.png': randomBytes(8 * 1024),
  };
  const src = () => path.join(tmpRoot, 'src');

  beforeAll(async () => {
    await writeTree(src(), files);
    fleet = await startFleet({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      count: COUNT,
      rootDir: path.join(tmpRoot, 'fleet'),
      // A thousand agents at rest cost the API about 1000/60 heartbeats plus 1000/30 polls a second; the API
      // and the agents share this Jest worker's event loop, beside the other test files on two cores.
      heartbeatMs: 60_000,
      pollWaitSeconds: 30,
      downloadConcurrency: 32,
      signal: AbortSignal.timeout(SLOW - 30_000),
    });
  }, SLOW);
  afterAll(async () => fleet?.stop());

  it(
    'holds a thousand enrolled, heartbeating, long-polling agents in one process',
    async () => {
      expect(fleet.machineIds).toEqual(fleetMachineIds(COUNT));
      expect(fleet.agents.every((a) => a.running)).toBe(true);
      const { rows } = await h.deps.db.query(
        `SELECT count(*)::INT AS n FROM machines WHERE site_id = $1 AND online AND last_heartbeat > now() - INTERVAL '5 minutes'`,
        [h.siteId],
      );
      expect(rows[0].n).toBe(COUNT);
      // Every agent receives and acknowledges a command through its long-poll.
      const cmds = await queueAll(fleet.machineIds, 'reboot_machine', { delaySeconds: 0 });
      const outcomes = await waitOrExplain(fleet, cmds, SLOW - 30_000);
      expect(outcomes.every((o) => o.status === 'completed')).toBe(true);
      const done = await h.deps.db.query(
        `SELECT count(*)::INT AS n FROM commands WHERE site_id = $1 AND type = 'reboot_machine' AND status = 'completed'`,
        [h.siteId],
      );
      expect(done.rows[0].n).toBe(COUNT);
    },
    SLOW,
  );

  it(
    'syncs a roost to a fifth of the fleet while the rest keeps polling',
    async () => {
      // A fifth keeps the suite fast; bench/ measures full-fleet syncs.
      const targets = fleet.machineIds.filter((_, i) => i % 5 === 0);
      const versionId = await publish('fleet-roost', files, targets);
      const cmds = await queueAll(targets, 'sync_pull', {
        roostId: 'fleet-roost',
        versionId,
        versionNumber: 1,
        rolloutId: null,
        extractRoot: 'D:\\Apps\\kiosk',
        attempt: 1,
      });
      const outcomes = await waitOrExplain(fleet, cmds, SLOW - 30_000);
      expect(outcomes.filter((o) => o.status !== 'completed')).toEqual([]);
      const { rows } = await h.deps.db.query(
        `SELECT status, count(*)::INT AS n FROM roost_target_states WHERE site_id = $1 AND roost_id = 'fleet-roost' AND reported_version_id = $2 GROUP BY status`,
        [h.siteId, versionId],
      );
      expect(rows).toEqual([{ status: 'committed', n: targets.length }]);
      for (const id of [targets[0], targets[targets.length >> 1], targets[targets.length - 1]]) {
        expect(await verifyTree(src(), path.join(tmpRoot, 'fleet', id, 'Apps', 'kiosk'))).toEqual([]);
      }
      expect(fleet.stats()).toMatchObject({ syncsCommitted: targets.length, syncsFailed: 0, chunksFetched: 3 * targets.length });
      expect(fleet.agents.every((a) => a.running)).toBe(true);
    },
    SLOW,
  );

  it(
    'heartbeats from every agent (first beat jittered over the interval)',
    async () => {
      const withMetrics = async () =>
        (
          await h.deps.db.query(
            `SELECT count(*)::INT AS n FROM machines WHERE site_id = $1 AND machine_id LIKE 'sim-%' AND metrics IS NOT NULL`,
            [h.siteId],
          )
        ).rows[0].n;
      for (let i = 0; i < 240 && (await withMetrics()) < COUNT; i++) await new Promise((r) => setTimeout(r, 500));
      expect(await withMetrics()).toBe(COUNT);
    },
    SLOW,
  );
});

describe('fleet faults', () => {
  it('fails the listed machines and refetches corrupted chunks on the others', async () => {
    let seed = 42;
    const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const fleet = await startFleet({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      count: 12,
      rootDir: path.join(tmpRoot, 'faulty'),
      machinePrefix: 'faulty-',
      heartbeatMs: 0,
      pollWaitSeconds: 5,
      failMachines: ['faulty-0003', 'faulty-0007'],
      corruptFirstDownloadRate: 0.5,
      syncDelayMs: 10,
      random,
    });
    try {
      const files = { 'big.bin': randomBytes(CHUNK_SIZE * 2 + 1000), 'small.txt': Buffer.from('small') };
      const src = path.join(tmpRoot, 'faulty-src');
      await writeTree(src, files);
      const versionId = await publish('faulty-roost', files);
      const cmds = await queueAll(fleet.machineIds, 'sync_pull', { roostId: 'faulty-roost', versionId, extractRoot: 'faulty' });
      const outcomes = await fleet.waitForCommands(cmds);
      const failed = outcomes.filter((o) => o.status === 'failed').map((o) => [...cmds].find(([, c]) => c === o.commandId)![0]);
      expect(failed.sort()).toEqual(['faulty-0003', 'faulty-0007']);
      const refetched = outcomes.reduce((a, o) => a + (o.refetched ?? 0), 0);
      expect(refetched).toBeGreaterThan(0);
      expect(fleet.stats().chunksRefetched).toBe(refetched);
      for (const id of fleet.machineIds.filter((m) => !failed.includes(m))) {
        expect(await verifyTree(src, path.join(tmpRoot, 'faulty', id, 'faulty'))).toEqual([]);
      }
      const { rows } = await h.deps.db.query(
        `SELECT machine_id, status FROM roost_target_states WHERE site_id = $1 AND roost_id = 'faulty-roost' AND status <> 'committed' ORDER BY machine_id`,
        [h.siteId],
      );
      expect(rows).toEqual([
        { machine_id: 'faulty-0003', status: 'failed' },
        { machine_id: 'faulty-0007', status: 'failed' },
      ]);
    } finally {
      await fleet.stop();
    }
  });
});

describe('verifyTree', () => {
  it('finds missing, extra, size, content and type differences', async () => {
    const a = path.join(tmpRoot, 'tree-a');
    const b = path.join(tmpRoot, 'tree-b');
    await writeTree(a, {
      'same.txt': Buffer.from('x'),
      'only-a.txt': Buffer.from('a'),
      'size.txt': Buffer.from('12'),
      'content.txt': Buffer.from('ab'),
      'kind/x': Buffer.from('1'),
    });
    await writeTree(b, {
      'same.txt': Buffer.from('x'),
      'only-b.txt': Buffer.from('b'),
      'size.txt': Buffer.from('123'),
      'content.txt': Buffer.from('ba'),
      kind: Buffer.from('1'),
    });
    expect(await verifyTree(a, b)).toEqual([
      { path: 'content.txt', kind: 'content' },
      { path: 'kind', kind: 'type' },
      { path: 'kind/x', kind: 'missing' },
      { path: 'only-a.txt', kind: 'missing' },
      { path: 'only-b.txt', kind: 'extra' },
      { path: 'size.txt', kind: 'size' },
    ]);
    expect(await verifyTree(a, a)).toEqual([]);
    expect(await verifyTree(a, path.join(tmpRoot, 'does-not-exist'))).toHaveLength(6);
  });
});
