/**
 * The agent as an installed service, exercised as its own OS process through the real `roost` binary
 * (agent/service.ts, cli/commands/agent.ts) against a real API and worker: `roost agent enrol` keeps the
 * token owner-only, `roost agent run` receives a real rollout, is killed with SIGKILL in the middle of the
 * sync and restarted (the journaled sync finishes from the chunks already fetched, the tree is right,
 * the command is completed and reported committed once), rides out an API outage (its connection goes
 * through a TCP proxy that is cut), is stopped with SIGTERM mid-download (the sync is abandoned, stays
 * journaled and finishes after the next start), and `roost agent status` shows what it knows.
 */
import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { cliRunner, ROOST_BIN } from '../support/cli';
import { createHarness, type Harness } from '../support/harness';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy';
import { deployRoute, publishFiles, startTestWorker, terminateAll, type TestWorker } from '../integration/rollout-fixtures';
import { teeToTestLog } from '../support/test-log';
import { waitFor } from '../support/wait';

const BIN = ROOST_BIN;

let h: Harness;
let worker: TestWorker;
let proxy: TcpProxy;
let viaProxy: string;
let tmp: string;
let root: string;
const machineId = `svc-${randomBytes(3).toString('hex')}`;
const workflows: string[] = [];

function env(): NodeJS.ProcessEnv {
  return { ...process.env, ROOST_CONFIG: path.join(tmp, 'cli.json'), ROOST_API_KEY: '', ROOST_SITE_ID: '', ROOST_API_URL: '' };
}

/** Runs `roost …` to its end. */
const { roost } = cliRunner(() => ({ ROOST_CONFIG: path.join(tmp, 'cli.json'), ROOST_API_KEY: '', ROOST_SITE_ID: '', ROOST_API_URL: '' }));

/** A running `roost agent run` and its JSON log lines. */
class AgentProcess {
  readonly child: ChildProcessWithoutNullStreams;
  readonly logs: Array<Record<string, any>> = [];
  readonly exited: Promise<number | null>;
  private buf = '';
  stderr = '';

  constructor(extra: string[] = []) {
    this.child = spawn(
      process.execPath,
      [
        BIN,
        'agent',
        'run',
        '--root',
        root,
        '--heartbeat-seconds',
        '1',
        '--poll-wait-seconds',
        '1',
        '--download-concurrency',
        '1',
        ...extra,
      ],
      { env: env(), stdio: ['pipe', 'pipe', 'pipe'] },
    );
    this.child.stdout.on('data', (d: Buffer) => {
      this.buf += d.toString();
      const lines = this.buf.split('\n');
      this.buf = lines.pop() ?? '';
      for (const l of lines) if (l.trim()) this.logs.push(JSON.parse(l));
    });
    this.child.stderr.on('data', (d) => (this.stderr += d));
    // The agent's JSON lines are part of the suite's logs, grepped for secrets (test/support/test-log.ts).
    teeToTestLog(this.child.stdout);
    teeToTestLog(this.child.stderr);
    this.exited = new Promise((resolve) => this.child.on('close', (code) => resolve(code)));
  }

  /** Resolves with the first log line matching `pred` (already logged or to come). */
  async waitFor(what: string, pred: (l: Record<string, any>) => boolean, ms = 60_000): Promise<Record<string, any>> {
    return until(`${what} (logs: ${this.logs.map((l) => l.msg).join(' | ')} ${this.stderr})`, () => this.logs.find(pred), ms);
  }
}

const until = <T>(what: string, fn: () => T | Promise<T>, ms = 60_000) => waitFor(what, fn, ms, 10);

/** `count` files of 4 KiB random text: one chunk each. */
function randomFiles(count: number, prefix: string): Record<string, string> {
  const files: Record<string, string> = {};
  for (let i = 0; i < count; i++) files[`${prefix}/f${String(i).padStart(4, '0')}.txt`] = randomBytes(2048).toString('hex');
  return files;
}

function chunkCount(): number {
  try {
    return fs.readdirSync(path.join(root, 'chunks')).filter((n) => !n.startsWith('.')).length;
  } catch {
    return 0;
  }
}

/** The files under the roost's extract dir (relative path → content). */
function tree(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string, rel: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(path.join(d, e.name), r);
      else out[r] = fs.readFileSync(path.join(d, e.name), 'utf8');
    }
  };
  walk(dir, '');
  return out;
}

async function deployment(roostId: string): Promise<Record<string, any> | undefined> {
  const res = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${machineId}/deployments` });
  return (res.json().deployments as Array<Record<string, any>>).find((d) => d.roostId === roostId);
}

async function command(commandId: string): Promise<Record<string, any>> {
  return (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${machineId}/commands/${commandId}` })).json();
}

const finishedSyncs = (logs: Array<Record<string, any>>, commandId: string) =>
  logs.filter((l) => l.msg === 'command finished' && l.commandId === commandId && l.status === 'completed');

beforeAll(async () => {
  h = await createHarness();
  const api = await h.listen();
  worker = await startTestWorker(h);
  proxy = await startTcpProxy(Number(new URL(api).port));
  viaProxy = `http://127.0.0.1:${proxy.port}`;
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-agent-'));
  root = path.join(tmp, 'machine');
});

afterAll(async () => {
  await terminateAll(h, workflows);
  await proxy?.close();
  await worker?.stop();
  await h?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('roost agent as a process', () => {
  let roostId: string;
  let files1: Record<string, string>;

  it('enrols: the token and pinned keys are kept owner-only; a wrong secret exits 5', async () => {
    const bad = await roost([
      'agent',
      'enrol',
      '--api',
      viaProxy,
      '--site',
      h.siteId,
      '--secret',
      'ses_wrong',
      '--machine-id',
      machineId,
      '--root',
      root,
      '--json',
    ]);
    expect(bad.code).toBe(5);
    expect(JSON.parse(bad.stdout).error.code).toBe('unauthorized');

    const secret = await h.enrolmentSecret();
    const r = await roost([
      'agent',
      'enrol',
      '--api',
      viaProxy,
      '--site',
      h.siteId,
      '--secret',
      secret,
      '--machine-id',
      machineId,
      '--root',
      root,
      '--json',
    ]);
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(out).toMatchObject({ api: viaProxy, siteId: h.siteId, machineId, root });
    expect(out.pinnedKeys.length).toBeGreaterThan(0);
    const state = path.join(root, 'state');
    expect(fs.statSync(state).mode & 0o777).toBe(0o700);
    for (const f of ['agent.json', 'service.json']) expect(fs.statSync(path.join(state, f)).mode & 0o777).toBe(0o600);
    const saved = JSON.parse(fs.readFileSync(path.join(state, 'agent.json'), 'utf8'));
    expect(saved.agentToken).toMatch(/^sat_/);
    expect(JSON.stringify(saved)).not.toContain(secret);
    expect(fs.readFileSync(path.join(state, 'service.json'), 'utf8')).not.toContain(secret);

    const status = JSON.parse((await roost(['agent', 'status', '--root', root, '--json'])).stdout);
    expect(status).toMatchObject({
      enrolled: true,
      running: false,
      roosts: [],
      pendingWork: [],
      identity: { machineId, siteId: h.siteId },
    });
  });

  it('survives SIGKILL in the middle of a sync: after a restart the sync finishes from its journal, committed once', async () => {
    files1 = randomFiles(400, 'v1');
    const created = await h.request({
      method: 'POST',
      url: '/api/roosts',
      body: { siteId: h.siteId, name: 'service test', targets: [machineId], extractPath: 'apps/svc' },
    });
    roostId = created.json().roostId;
    await publishFiles(h, roostId, files1);

    const first = new AgentProcess();
    await first.waitFor('running', (l) => l.msg === 'agent running');
    const rollout = await deployRoute(h, roostId);
    workflows.push(rollout.workflowId);
    const started = await first.waitFor('the sync to start', (l) => l.msg === 'command started' && l.type === 'sync_pull');
    await until('chunks to arrive', () => chunkCount() >= 40);
    first.child.kill('SIGKILL');
    await first.exited;
    const fetchedBeforeKill = chunkCount();
    expect(fetchedBeforeKill).toBeLessThan(400);
    expect(finishedSyncs(first.logs, started.commandId)).toHaveLength(0);

    // Killed: status shows the journaled sync and no running process.
    const dead = JSON.parse((await roost(['agent', 'status', '--root', root, '--json'])).stdout);
    expect(dead.running).toBe(false);
    expect(dead.pendingWork).toEqual([expect.objectContaining({ commandId: started.commandId, type: 'sync_pull', roostId })]);
    expect((await command(started.commandId)).status).toBe('downloading');

    const second = new AgentProcess(['--stop-grace-seconds', '0']);
    const starting = await second.waitFor('start', (l) => l.msg === 'agent starting');
    expect(starting.resuming).toEqual([expect.objectContaining({ commandId: started.commandId })]);
    const done = await second.waitFor('the resumed sync to finish', (l) => finishedSyncs([l], started.commandId).length === 1);
    expect(done.counters.chunks_dedup).toBeGreaterThanOrEqual(fetchedBeforeKill - 1);
    expect(done.counters.chunks_fetched + done.counters.chunks_dedup).toBe(400);
    expect(tree(path.join(root, 'apps', 'svc'))).toEqual(Object.fromEntries(Object.entries(files1).map(([p, c]) => [p, c])));
    expect(await deployment(roostId)).toMatchObject({ status: 'committed', inSync: true });
    expect(await command(started.commandId)).toMatchObject({ status: 'completed', result: 'success' });
    expect(finishedSyncs([...first.logs, ...second.logs], started.commandId)).toHaveLength(1);

    const status = JSON.parse((await roost(['agent', 'status', '--root', root, '--json'])).stdout);
    expect(status).toMatchObject({ running: true, pendingWork: [], status: { connected: true, pid: second.child.pid } });
    expect(status.status.lastHeartbeatAt).not.toBeNull();
    expect(status.roosts).toEqual([expect.objectContaining({ roostId, versionId: rollout.versionId, files: 400 })]);
    const human = await roost(['agent', 'status', '--root', root]);
    expect(human.stdout).toContain(`${roostId}  ${rollout.versionId.slice(0, 16)}…  400 files in apps/svc`);

    // An API outage: the agent keeps trying and picks up the next rollout once the API is back.
    await proxy.down();
    await second.waitFor('the outage to be noticed', (l) => l.level === 40 && /failed/.test(l.msg));
    await proxy.up();
    // The recovery is logged as the failure was.
    await second.waitFor(
      'the recovery to be logged',
      (l) => l.level === 30 && l.msg === 'API reachable again' && typeof l.lastError === 'string',
    );
    const files2 = { ...randomFiles(400, 'v2'), 'v1/f0000.txt': 'changed\n' };
    await publishFiles(h, roostId, files2);
    const rollout2 = await deployRoute(h, roostId);
    workflows.push(rollout2.workflowId);
    const started2 = await second.waitFor(
      'the second sync',
      (l) => l.msg === 'command started' && l.type === 'sync_pull' && l.versionId === rollout2.versionId,
    );
    await until('new chunks', () => chunkCount() >= 400 + 40);

    // SIGTERM mid-download with no grace: the sync is abandoned (journaled), the process exits 0.
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
    expect(second.logs.map((l) => l.msg)).toEqual(
      expect.arrayContaining(['stop requested', 'command abandoned (runs again at the next start)']),
    );
    const stopped = JSON.parse((await roost(['agent', 'status', '--root', root, '--json'])).stdout);
    expect(stopped.running).toBe(false);
    expect(stopped.status.stoppedAt).not.toBeNull();
    expect(stopped.pendingWork).toEqual([expect.objectContaining({ commandId: started2.commandId })]);

    const third = new AgentProcess(['--stop-grace-seconds', '30']);
    await third.waitFor('the resumed second sync', (l) => finishedSyncs([l], started2.commandId).length === 1);
    expect(tree(path.join(root, 'apps', 'svc'))).toEqual(files2);
    expect(await deployment(roostId)).toMatchObject({ status: 'committed', inSync: true, reportedVersionId: rollout2.versionId });
    third.child.kill('SIGINT');
    expect(await third.exited).toBe(0);
    expect(third.logs.at(-1)).toMatchObject({ msg: 'agent stopped', finished: true });
  });
});
