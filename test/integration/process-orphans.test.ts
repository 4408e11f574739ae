/**
 * Managed processes across an agent that is killed (SIGKILL, as a crash or a service wrapper's hard kill
 * leaves them): the agent records each launch in its state folder (agent/process-records.ts) and its
 * restart adopts the recorded processes still alive instead of launching a second copy (agent/processes.ts;
 * docs/decisions/managed-processes.md "Agent restarts"). Real agent processes (test/support/agent-child.ts),
 * real managed processes, counted in /proc.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PROCESS_RECORD_DIR } from '../../agent/process-records';
import { PosixOs } from '../../agent/os';
import { createHarness, type Harness } from '../support/harness';
import { waitFor } from '../support/wait';

const ROOT = path.join(__dirname, '..', '..');
let h: Harness;
let base: string;
let secret: string;
let tmp: string;
const agents: ChildProcess[] = [];
/** Command-line markers of the managed processes this file starts (leftovers are killed after the tests). */
const markers: string[] = [];

beforeAll(async () => {
  h = await createHarness();
  base = await h.listen();
  secret = await h.enrolmentSecret();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-process-orphans-'));
});
afterAll(async () => {
  for (const a of agents) if (a.exitCode === null && a.signalCode === null) a.kill('SIGKILL');
  for (const m of markers) for (const pid of copies(m)) process.kill(pid, 'SIGKILL');
  h?.app.server.closeAllConnections();
  await h?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

/**
 * Live (not zombie) processes of the host whose command line holds `marker`. A shell's fork that has not
 * exec'd its command yet carries the shell's command line for a moment: a match whose parent matches too
 * is such a fork, not a copy.
 */
function copies(marker: string): number[] {
  const found = new Map<number, number>();
  for (const e of fs.readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(e)) continue;
    try {
      const cmd = fs.readFileSync(`/proc/${e}/cmdline`, 'utf8').split('\0');
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8');
      const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (cmd.includes(marker) && state !== 'Z' && state !== 'X') found.set(Number(e), Number(ppid));
    } catch {
      // ended meanwhile
    }
  }
  return [...found].filter(([, ppid]) => !found.has(ppid)).map(([pid]) => pid);
}

/** Starts a real agent process on `rootDir` (journaled, as `roost agent run` is) and waits until it runs. */
async function startAgent(machineId: string, rootDir: string, stopGraceMs: number): Promise<ChildProcess> {
  const opts = {
    baseUrl: base,
    siteId: h.siteId,
    enrolmentSecret: secret,
    machineId,
    rootDir,
    pollWaitSeconds: 1,
    heartbeatMs: 200,
    processSyncMs: 200,
    processTickMs: 50,
    stopGraceMs,
  };
  const child = spawn(process.execPath, ['-r', 'tsx/cjs', path.join(ROOT, 'test', 'support', 'agent-child.ts')], {
    cwd: ROOT,
    env: { ...process.env, ROOST_AGENT_OPTIONS: JSON.stringify(opts), ROOST_AGENT_JOURNAL: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  agents.push(child);
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => d.includes('ready') && resolve());
    child.once('exit', () => reject(new Error(`agent exited before it was ready: ${stderr}`)));
  });
  return child;
}

async function sigkill(child: ChildProcess): Promise<void> {
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

const processes = (m: string) => `/api/sites/${h.siteId}/machines/${m}/processes`;
const post = (url: string, body?: unknown) => h.request({ method: 'POST', url, body, idempotencyKey: true });

interface Live {
  pid: number | null;
  status: string;
  restarts: number;
  updatedAt: string;
}
async function live(m: string, processId: string): Promise<Live | null> {
  return (await h.request({ method: 'GET', url: `${processes(m)}/${processId}` })).json().live;
}

async function commandDone(m: string, commandId: string): Promise<Record<string, unknown>> {
  return waitFor('the command finished', async () => {
    const c = (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${m}/commands/${commandId}` })).json();
    return ['completed', 'failed', 'cancelled'].includes(c.status) ? c : undefined;
  });
}

const recordFile = (rootDir: string, processId: string) => path.join(rootDir, 'state', PROCESS_RECORD_DIR, `${processId}.json`);

describe('managed processes outlive a killed agent', () => {
  it('adopts an always process after SIGKILL and a restart: one copy, its pid reported, and stop leaves none', async () => {
    const machineId = `orphan-${randomBytes(3).toString('hex')}`;
    const rootDir = path.join(tmp, machineId);
    const first = await startAgent(machineId, rootDir, 2000);
    const secs = `4000.${randomBytes(3).readUIntBE(0, 3)}`;
    markers.push(secs);
    const p = (await post(processes(machineId), { name: 'dup', exe_path: '/bin/sleep', file_path: secs, launch_mode: 'always' })).json();
    const before = await waitFor('the process running', async () => {
      const l = await live(machineId, p.processId);
      return l?.status === 'running' && l.pid ? l : undefined;
    });
    expect(copies(secs)).toEqual([before.pid]);

    await sigkill(first);
    expect(copies(secs)).toEqual([before.pid]); // orphaned, still running

    const restartedAt = Date.now();
    const second = await startAgent(machineId, rootDir, 2000);
    // The restarted agent's own report (its updatedAt is the adoption): the same pid, running.
    const after = await waitFor('the restarted agent reporting the process', async () => {
      const l = await live(machineId, p.processId);
      return l && Date.parse(l.updatedAt) >= restartedAt ? l : undefined;
    });
    expect(after).toMatchObject({ status: 'running', pid: before.pid, restarts: 0 });
    // Several ticks later there is still exactly one copy (before, the restart launched a second one here).
    await new Promise((r) => setTimeout(r, 500));
    expect(copies(secs)).toEqual([before.pid]);
    expect(JSON.parse(fs.readFileSync(recordFile(rootDir, p.processId), 'utf8'))).toMatchObject({
      processId: p.processId,
      pid: before.pid,
    });

    const stop = await post(`${processes(machineId)}/${p.processId}/stop`);
    expect(await commandDone(machineId, stop.json().commandId)).toMatchObject({ status: 'completed', result: 'success' });
    await waitFor('the stop reported', async () => (await live(machineId, p.processId))?.status === 'stopped');
    expect(copies(secs)).toEqual([]);
    await waitFor('the record removed', () => !fs.existsSync(recordFile(rootDir, p.processId)));
    await sigkill(second);
  });

  it('a stop in flight when the agent is killed ends the original process after the restart, and nothing relaunches', async () => {
    const machineId = `orphan-${randomBytes(3).toString('hex')}`;
    const rootDir = path.join(tmp, machineId);
    // A long grace time: the first agent is still waiting for the graceful stop when it is killed.
    const first = await startAgent(machineId, rootDir, 60_000);
    const marker = `roost-stubborn-${randomBytes(4).toString('hex')}`;
    markers.push(marker);
    const p = (
      await post(processes(machineId), {
        name: 'stubborn',
        exe_path: '/bin/sh',
        file_path: `-c "trap '' TERM; while true; do sleep 0.1; done" ${marker}`,
        launch_mode: 'always',
      })
    ).json();
    const before = await waitFor('the process running', async () => {
      const l = await live(machineId, p.processId);
      return l?.status === 'running' && l.pid ? l : undefined;
    });
    const stop = await post(`${processes(machineId)}/${p.processId}/stop`);
    await waitFor('the stop under way', async () => (await live(machineId, p.processId))?.status === 'stopping');
    await sigkill(first);
    expect(copies(marker)).toEqual([before.pid]); // SIGTERM ignored, the kill never came

    let most = 1;
    const watch = setInterval(() => (most = Math.max(most, copies(marker).length)), 20);
    const second = await startAgent(machineId, rootDir, 300);
    try {
      expect(await commandDone(machineId, stop.json().commandId)).toMatchObject({ status: 'completed', result: 'success' });
      await waitFor('no copy left', () => copies(marker).length === 0, 10_000);
      await waitFor('the stop reported', async () => (await live(machineId, p.processId))?.status === 'stopped');
      // The stop override holds: nothing is relaunched afterwards.
      await new Promise((r) => setTimeout(r, 500));
      expect(copies(marker)).toEqual([]);
      expect(most).toBe(1);
    } finally {
      clearInterval(watch);
    }
    await sigkill(second);
  });

  it('a process a stop command took down stays down after the agent is killed and restarted; a start brings it back', async () => {
    const machineId = `orphan-${randomBytes(3).toString('hex')}`;
    const rootDir = path.join(tmp, machineId);
    const first = await startAgent(machineId, rootDir, 2000);
    const secs = `4300.${randomBytes(3).readUIntBE(0, 3)}`;
    markers.push(secs);
    const p = (await post(processes(machineId), { name: 'held', exe_path: '/bin/sleep', file_path: secs, launch_mode: 'always' })).json();
    await waitFor('the process running', async () => (await live(machineId, p.processId))?.status === 'running');
    const stop = await post(`${processes(machineId)}/${p.processId}/stop`);
    expect(await commandDone(machineId, stop.json().commandId)).toMatchObject({ status: 'completed', result: 'success' });
    expect(copies(secs)).toEqual([]);
    await sigkill(first);

    const restartedAt = Date.now();
    const second = await startAgent(machineId, rootDir, 2000);
    try {
      // The restarted agent reports it stopped, and never launches it (before, `always` won over the lost override).
      await waitFor('the restarted agent reporting the process', async () => {
        const l = await live(machineId, p.processId);
        return l && Date.parse(l.updatedAt) >= restartedAt && l.status === 'stopped';
      });
      await new Promise((r) => setTimeout(r, 500));
      expect(copies(secs)).toEqual([]);
      const start = await post(`${processes(machineId)}/${p.processId}/start`);
      expect(await commandDone(machineId, start.json().commandId)).toMatchObject({ status: 'completed', result: 'success' });
      await waitFor('the process running again', async () => (await live(machineId, p.processId))?.status === 'running');
      expect(copies(secs)).toHaveLength(1);
    } finally {
      await sigkill(second);
    }
  });

  it('never signals a recorded pid whose start time differs (pid reuse): the record is dropped and the process launched', async () => {
    const machineId = `orphan-${randomBytes(3).toString('hex')}`;
    const rootDir = path.join(tmp, machineId);
    const first = await startAgent(machineId, rootDir, 2000);
    const secs = `4100.${randomBytes(3).readUIntBE(0, 3)}`;
    markers.push(secs);
    const p = (await post(processes(machineId), { name: 'reused', exe_path: '/bin/sleep', file_path: secs, launch_mode: 'always' })).json();
    const launched = await waitFor('the process running', async () => {
      const l = await live(machineId, p.processId);
      return l?.status === 'running' && l.pid ? l : undefined;
    });
    await sigkill(first);
    process.kill(launched.pid!, 'SIGKILL');
    await waitFor('the managed process gone', () => copies(secs).length === 0, 10_000);

    // An unrelated process now holds the recorded pid's place: the record names its pid, with another start time.
    const bystander = spawn('/bin/sleep', ['4200'], { stdio: 'ignore' });
    let second: ChildProcess | undefined;
    try {
      const identity = await new PosixOs().processIdentity(bystander.pid!);
      expect(identity).not.toBeNull();
      const file = recordFile(rootDir, p.processId);
      const rec = JSON.parse(fs.readFileSync(file, 'utf8'));
      const forged = { ...rec, pid: bystander.pid, identity: { ...identity, startTime: String(Number(identity!.startTime) - 1) } };
      fs.writeFileSync(file, JSON.stringify(forged));

      const restartedAt = Date.now();
      second = await startAgent(machineId, rootDir, 2000);
      const after = await waitFor('the restarted agent reporting its own launch', async () => {
        const l = await live(machineId, p.processId);
        return l && Date.parse(l.updatedAt) >= restartedAt && l.status === 'running' ? l : undefined;
      });
      expect(after.pid).not.toBe(bystander.pid);
      expect(copies(secs)).toEqual([after.pid]);
      expect(bystander.exitCode).toBeNull();
      expect(bystander.signalCode).toBeNull();
      await expect(new PosixOs().processIdentity(bystander.pid!)).resolves.toEqual(identity);
      // The record is the new launch's.
      await waitFor('the new launch recorded', () => JSON.parse(fs.readFileSync(file, 'utf8')).pid === after.pid, 5000);
    } finally {
      bystander.kill('SIGKILL');
      if (second) await sigkill(second);
    }
  });
});
