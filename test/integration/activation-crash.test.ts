/**
 * Crash-safe activation (agent/assembly.ts switchStagedTree, docs/decisions/crash-safe-activation.md): a real
 * agent process is killed (SIGKILL, agent/faults.ts crashActivationAfterFiles) in the middle of a roost_activate,
 * after some staged files were switched in and before the rest. Right after the crash the tree is mixed; an agent
 * restarted on the same machine root replays the activation journal before it takes commands, so the tree is
 * wholly the new version, the manifest says so, and the command is reported completed.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Agent } from '../../agent/agent';
import { sealStagedTree } from '../../agent/assembly';
import { MachineRoot, type StagedManifest } from '../../agent/machine-root';
import { newId } from '../../domain/hex';
import { createHarness, type Harness } from '../support/harness';

const ROOT = path.join(__dirname, '..', '..');
let h: Harness;
let base: string;
let secret: string;
let tmp: string;
let child: ChildProcess | undefined;
let restarted: Agent | undefined;

beforeAll(async () => {
  h = await createHarness();
  base = await h.listen();
  secret = await h.enrolmentSecret();
  tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-activation-crash-'));
});
afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  await restarted?.stop();
  h?.app.server.closeAllConnections();
  await h?.close();
  await fs.rm(tmp, { recursive: true, force: true });
});

/** Every file under `dir` (relative path → content), folders left out. */
async function treeOf(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const e of await fs.readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!e.isFile()) continue;
    const full = path.join(e.parentPath, e.name);
    out[path.relative(dir, full).split(path.sep).join('/')] = await fs.readFile(full, 'utf8');
  }
  return out;
}

const OLD: Record<string, string> = {};
const NEW: Record<string, string> = {};
for (let i = 0; i < 24; i++) OLD[`bin/file-${String(i).padStart(2, '0')}.dll`] = `old ${i}`;
for (let i = 3; i < 30; i++) NEW[`bin/file-${String(i).padStart(2, '0')}.dll`] = `new ${i}`;
NEW['conf/app.json'] = '{"v":2}';

const manifestFiles = (tree: Record<string, string>) =>
  Object.entries(tree).map(([p, c]) => ({ path: p, size: Buffer.byteLength(c), chunks: [] }));

test('an agent killed mid-activation leaves a tree that its restart makes wholly new', async () => {
  const machineId = `crash-${Date.now()}`;
  const rootDir = path.join(tmp, machineId);
  const root = new MachineRoot(rootDir);
  const roostId = newId('roost');
  const oldVersion = 'a'.repeat(64);
  const newVersion = 'b'.repeat(64);
  const live = path.join(rootDir, 'app');

  // The live tree of the old version with its manifest, and a complete staged tree of the new one.
  for (const [p, c] of Object.entries(OLD)) {
    await fs.mkdir(path.dirname(path.join(live, p)), { recursive: true });
    await fs.writeFile(path.join(live, p), c);
  }
  await fs.mkdir(root.stateDir, { recursive: true });
  await root.writeManifest({
    roostId,
    versionId: oldVersion,
    extractDir: 'app',
    committedAt: new Date().toISOString(),
    files: manifestFiles(OLD),
  });
  const stageDir = root.stagingDir(roostId, newVersion);
  for (const [p, c] of Object.entries(NEW)) {
    await fs.mkdir(path.dirname(path.join(stageDir, p)), { recursive: true });
    await fs.writeFile(path.join(stageDir, p), c);
  }
  const counters = {
    chunks_fetched: 0,
    chunks_total: 0,
    chunks_dedup: 0,
    files_total: 28,
    files_assembled: 28,
    files_skipped: 0,
    bytes_fetched: 0,
  };
  const staged: StagedManifest = {
    roostId,
    versionId: newVersion,
    extractDir: 'app',
    committedAt: new Date().toISOString(),
    stagedAt: new Date().toISOString(),
    baseVersionId: oldVersion,
    counters,
    files: manifestFiles(NEW),
  };
  await sealStagedTree(root, staged);

  // A real agent process that dies after switching in 10 of the 28 files.
  const opts = { baseUrl: base, siteId: h.siteId, enrolmentSecret: secret, machineId, rootDir, pollWaitSeconds: 1, heartbeatMs: 0 };
  child = spawn(process.execPath, ['-r', 'tsx/cjs', path.join(ROOT, 'test', 'support', 'agent-child.ts')], {
    cwd: ROOT,
    env: { ...process.env, ROOST_AGENT_OPTIONS: JSON.stringify({ ...opts, crashActivationAfterFiles: 10 }) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child!.once('exit', (_code, signal) => resolve(signal)));
  await new Promise<void>((resolve, reject) => {
    child!.stdout!.on('data', (d: Buffer) => d.includes('ready') && resolve());
    void exited.then(() => reject(new Error(`agent exited before it was ready: ${stderr}`)));
  });
  const commandId = newId('cmd');
  await h.deps.db.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, expires_at)
     VALUES ($1, $2, $3, 'roost_activate', 'pending', $4, now() + INTERVAL '10 minutes')`,
    [h.siteId, machineId, commandId, JSON.stringify({ roostId, versionId: newVersion, extractRoot: 'app' })],
  );
  expect(await exited).toBe('SIGKILL');

  // Mixed right after the crash: some files new, some old, the manifest still the old version's.
  const mid = await treeOf(live);
  expect(Object.values(mid).filter((c) => c.startsWith('new')).length).toBe(10);
  expect(Object.values(mid).some((c) => c.startsWith('old'))).toBe(true);
  expect((await root.readManifest(roostId))?.versionId).toBe(oldVersion);

  // Restarted on the same machine root (its saved token): wholly the new version.
  restarted = new Agent({ ...opts, heartbeatMs: 0 });
  await restarted.start();
  expect(await treeOf(live)).toEqual(NEW);
  expect((await root.readManifest(roostId))?.versionId).toBe(newVersion);
  await expect(fs.access(root.activationJournalPath(roostId))).rejects.toThrow();
  await expect(fs.access(root.stagingArea(roostId))).rejects.toThrow();
  let status = '';
  for (let i = 0; i < 100 && status !== 'completed'; i++) {
    const { rows } = await h.deps.db.query(`SELECT status FROM commands WHERE site_id = $1 AND machine_id = $2 AND command_id = $3`, [
      h.siteId,
      machineId,
      commandId,
    ]);
    status = rows[0].status;
    if (status !== 'completed') await new Promise((r) => setTimeout(r, 50));
  }
  expect(status).toBe('completed');
});
