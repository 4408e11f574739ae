/**
 * End to end: the walk-through of `npm run demo` (cli/demo.ts) on a smaller generated tree with a
 * 3-chunk file and a zero-byte file, against the real services: push, canary-then-fleet rollout to
 * simulated machines, byte-for-byte verification, a second push that uploads only new chunks,
 * rollback and diff. It runs the real command (`roost demo --json` in a child process), so it also
 * proves the command exits by itself once the walk-through is done: the rollout limit is an hour, so a
 * limit timer left pending would hold the process past the test timeout.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import type { DemoReport } from '../../cli/demo';
import { CHUNK_SIZE } from '../../domain/version';

function makeTree(root: string): void {
  const put = (rel: string, data: Buffer | string) => {
    const p = path.join(root, rel);
    fs.mkdirSync(path.dirname(p), { recursive: true });
    fs.writeFileSync(p, data);
  };
  put('big/payload.bin', randomBytes(2 * CHUNK_SIZE + 12345)); // 3 chunks, over 8 MiB
  put('empty.txt', '');
  for (let i = 0; i < 40; i++) put(`src/module-${i % 5}/file-${i}.txt`, `file ${i}\n`.repeat(50 + i));
  put('README.md', '# generated tree\n');
}

describe('the demo walk-through', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-e2e-'));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  it('pushes, rolls out canary then fleet, verifies, dedups, rolls back and diffs', async () => {
    const dir = path.join(tmp, 'tree');
    makeTree(dir);
    const env = {
      ...process.env,
      ROOST_PG_DATABASE: process.env.ROOST_TEST_DATABASE ?? 'roost_test',
      ROOST_TASK_QUEUE: `roost-e2e-${randomBytes(4).toString('hex')}`,
      ROOST_API_PORT: '0',
      ROOST_LOG_LEVEL: 'silent',
      // A task queue of its own: no relay or sweep schedules to leave behind (test/e2e/cli-operator covers them).
      ROOST_BACKGROUND_WORKFLOWS: 'false',
    };
    const cli = path.join(__dirname, '..', '..', 'bin', 'roost.js');
    const child = spawn(process.execPath, [cli, 'demo', '--dir', dir, '--machines', '4', '--timeout', '3600', '--json'], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const exitCode = await new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    if (exitCode !== 0) throw new Error(`roost demo exited ${exitCode}:\n${stderr.slice(-4000)}`);
    const report = JSON.parse(stdout) as DemoReport;
    expect(report.ok).toBe(true);
    expect(report.source.files).toBe(43);
    expect(report.source.zeroByteFiles).toBe(1);
    expect(report.source.largestFile).toBeGreaterThan(8 * 1024 * 1024);

    const [first, second] = report.pushes;
    expect(first.chunksUploaded).toBe(first.chunksTotal);
    expect(second.versionNumber).toBe(first.versionNumber + 1);
    // Only the changed files' chunks were new.
    expect(second.chunksSkipped).toBeGreaterThan(0);
    expect(second.chunksUploaded).toBeLessThanOrEqual(5);
    expect(second.chunksUploaded + second.chunksSkipped).toBe(second.chunksTotal);

    expect(report.rollouts).toHaveLength(3);
    for (const r of report.rollouts) {
      expect(r.canary.length).toBeGreaterThanOrEqual(1);
      expect(r.canary.length + r.fleet).toBe(4);
      expect(r.machinesCommitted).toBe(4);
      expect(r.workflowUrl).toContain(encodeURIComponent(r.workflowId));
    }
    // The second rollout skipped the unchanged files on every machine.
    expect(report.rollouts[1].filesSkipped).toBeGreaterThanOrEqual(4 * 38);
    // Redeploying v1 reuses the chunks every machine already holds.
    expect(report.rollouts[2].chunksDedup).toBeGreaterThan(0);
    for (const v of report.verification) {
      expect(v.identical).toBe(4);
      expect(v.reportedEqualsIntended).toBe(4);
    }
    expect(report.rollback.currentVersionId).toBe(first.versionId);
    expect(report.diff.added).toEqual(['ROOST-DEMO-NOTES.txt']);
    expect(report.diff.summary.hasChanges).toBe(true);
    expect((report.diff.summary.changed as number) + (report.diff.summary.removed as number)).toBeGreaterThanOrEqual(3);
  });
});
