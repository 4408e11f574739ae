/**
 * The README's commands work wherever a person clones the repository: here the repository is cloned into
 * a 0700 folder (as `mktemp -d` makes them, and as /root is) under a path with a space, and the demo runs
 * there on a small tree. As root the embedded PostgreSQL runs as the `postgres` user, who cannot enter that
 * folder, so its cluster must live in that user's home (stack/postgres.ts) and go away with the data
 * folder. The clone has its own data folder and its own free ports: it never touches this run's services.
 *
 * The clone is the committed repository plus this work tree's uncommitted changes (so the code under test
 * is the code the rest of the suite runs); it borrows this tree's node_modules and Temporal CLI, since
 * installing them (scripts/ensure-deps.sh) is not what this test is about.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawn, spawnSync } from 'node:child_process';
import type { DemoReport } from '../../cli/demo';
import { externalClustersRoot, freePort, removeOrphanClusters, temporalBinary } from '../../stack/services';
import { testConfig } from '../support/env';

const ROOT = path.resolve(__dirname, '..', '..');
const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;

function git(args: string[], cwd = ROOT): string {
  const r = spawnSync('git', args, { cwd, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`git ${args.join(' ')} failed: ${r.stderr}`);
  return r.stdout;
}

/** Clones ROOT into `dest` and lays this work tree's uncommitted changes (modified, new, deleted files) over it. */
function cloneWorkTree(dest: string): void {
  git(['clone', '--quiet', ROOT, dest]);
  const list = (flags: string[]) =>
    git(['ls-files', '-z', ...flags])
      .split('\0')
      .filter(Boolean);
  for (const rel of list(['-m', '-o', '--exclude-standard'])) {
    const from = path.join(ROOT, rel);
    if (!fs.lstatSync(from, { throwIfNoEntry: false })?.isFile()) continue; // deleted, or a link such as a borrowed node_modules
    fs.mkdirSync(path.dirname(path.join(dest, rel)), { recursive: true });
    fs.copyFileSync(from, path.join(dest, rel));
  }
  for (const rel of list(['-d'])) fs.rmSync(path.join(dest, rel), { force: true });
}

function makeTree(dir: string): void {
  const put = (rel: string, data: Buffer | string) => {
    fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
    fs.writeFileSync(path.join(dir, rel), data);
  };
  put('bin/payload.bin', randomBytes(5 * 1024 * 1024)); // two chunks
  put('empty.txt', '');
  for (let i = 0; i < 12; i++) put(`docs/part-${i % 3}/note-${i}.txt`, `note ${i}\n`.repeat(20 + i));
}

/** Processes whose command line names `dir` (the clone's services, if any were left running). */
function processesNaming(dir: string): string[] {
  const out: string[] = [];
  for (const pid of fs.existsSync('/proc') ? fs.readdirSync('/proc') : []) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
      if (cmd.includes(dir)) out.push(`${pid}: ${cmd}`);
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

describe('a clone in a 0700 folder whose path has a space', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-clone-'));
  const clone = path.join(tmp, 'my roost');
  afterAll(async () => {
    fs.rmSync(tmp, { recursive: true, force: true });
    if (isRoot) await removeOrphanClusters();
  });

  it('runs the demo, keeps its cluster where the server can reach it, and removes it with the data folder', async () => {
    expect(fs.statSync(tmp).mode & 0o777).toBe(0o700);
    cloneWorkTree(clone);
    fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(clone, 'node_modules'), 'dir');
    const tree = path.join(tmp, 'tree');
    makeTree(tree);

    // The clone's own configuration: nothing of this run's (data folder, database, ports, containers).
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) {
      if (/^(ROOST_|TEMPORAL_|AZURE_STORAGE_|DATABASE_URL$)/.test(k) && !['ROOST_PG_BIN', 'ROOST_REDIS_BIN'].includes(k)) continue;
      env[k] = v;
    }
    const ports: number[] = [];
    while (ports.length < 4) {
      const p = await freePort();
      if (!ports.includes(p)) ports.push(p);
    }
    Object.assign(env, {
      TEMPORAL_BIN: temporalBinary(testConfig()),
      ROOST_PG_PORT: String(ports[0]),
      ROOST_AZURITE_PORT: String(ports[1]),
      ROOST_TEMPORAL_PORT: String(ports[2]),
      ROOST_TEMPORAL_UI_PORT: String(ports[3]),
      ROOST_API_PORT: '0',
      ROOST_LOG_LEVEL: 'silent',
      ROOST_BACKGROUND_WORKFLOWS: 'false',
      ROOST_ROLLOUT_POLL_MS: '500',
    });

    const child = spawn(process.execPath, ['bin/roost.js', 'demo', '--dir', tree, '--machines', '2', '--json'], {
      cwd: clone,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const killer = setTimeout(() => child.kill('SIGTERM'), 150_000);
    const code = await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
    clearTimeout(killer);
    if (code !== 0) throw new Error(`roost demo in ${clone} exited ${code}:\n${stderr.slice(-4000)}`);
    const report = JSON.parse(stdout) as DemoReport;
    expect(report.ok).toBe(true);
    expect(report.source.files).toBe(14);
    for (const v of report.verification) expect(v.identical).toBe(2);

    const data = path.join(clone, '.data');
    const pg = path.join(data, 'pg');
    if (isRoot) {
      // The postgres user cannot enter the clone: the cluster lives in its home, named after the clone.
      expect(fs.lstatSync(pg).isSymbolicLink()).toBe(true);
      const folder = path.dirname(fs.readlinkSync(pg));
      expect(path.dirname(folder)).toBe(externalClustersRoot());
      expect(path.basename(folder)).toContain('my-roost-data');
      expect(fs.existsSync(path.join(folder, 'cluster', 'PG_VERSION'))).toBe(true);
      expect(fs.existsSync(path.join(folder, 'cluster', 'postmaster.pid'))).toBe(false); // the demo stopped it

      // Deleting the data folder deletes the cluster: the next start as root collects it (as may a start by
      // another test running now; this call does it otherwise).
      fs.rmSync(data, { recursive: true, force: true });
      await removeOrphanClusters();
      expect(fs.existsSync(folder)).toBe(false);
    } else {
      expect(fs.existsSync(path.join(pg, 'PG_VERSION'))).toBe(true);
    }
    // Every service the demo started in the clone has stopped with it.
    expect(processesNaming(clone)).toEqual([]);
  }, 180_000);
});
