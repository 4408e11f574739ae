/**
 * The packaged agent (scripts/build-agent.ts, docs/decisions/agent-packaging.md): `npm run build:agent`
 * builds the single-file executables; the Linux one runs with no Node on its PATH, prints
 * `roost agent --version`, enrols and completes one sync of a real rollout; the Windows one is checked for
 * its structure (PE32+ x86-64, the SEA fuse flipped, the bundle inside) next to its service files, since
 * it cannot run here.
 */
import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createHarness, type Harness } from '../support/harness';
import { deployRoute, publishFiles, startTestWorker, terminateAll, type TestWorker } from '../integration/rollout-fixtures';
import { buildVersion, SEA_FUSE } from '../../scripts/build-agent';
import { version as packageVersion } from '../../package.json';

/** The version the build is made as (`--version`), not package.json's: the executable must report it. */
const BUILD_VERSION = '3.4.5';

const ROOT = path.resolve(__dirname, '..', '..');
const DIST = path.join(ROOT, 'dist', 'agent');
const LINUX = path.join(DIST, 'linux-x64', 'roost');
const WINDOWS = path.join(DIST, 'win-x64');

let h: Harness;
let worker: TestWorker;
let api: string;
let tmp: string;
const workflows: string[] = [];

/** Runs a program to its end (async: the API answering it lives in this process). */
function exec(file: string, args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { env, stdio: ['ignore', 'pipe', 'pipe'], cwd: ROOT });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** An environment without Node: PATH is an empty folder. */
function bare(): NodeJS.ProcessEnv {
  const empty = path.join(tmp, 'empty-path');
  fs.mkdirSync(empty, { recursive: true });
  return { PATH: empty, HOME: tmp, ROOST_CONFIG: path.join(tmp, 'cli.json') };
}

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-packaged-'));
  const built = await exec(
    process.execPath,
    [path.join(ROOT, 'node_modules', 'tsx', 'dist', 'cli.mjs'), 'scripts/build-agent.ts', '--version', BUILD_VERSION],
    process.env,
  );
  if (built.code !== 0) throw new Error(`build:agent failed: ${built.stderr}`);
  h = await createHarness();
  api = await h.listen();
  worker = await startTestWorker(h);
}, 900_000);

afterAll(async () => {
  await terminateAll(h, workflows);
  await worker?.stop();
  await h?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('the build version', () => {
  it('is --version X when given (semver only), else package.json version', () => {
    expect(buildVersion(['--linux-only', '--version', '1.4.0'])).toBe('1.4.0');
    expect(buildVersion(['--linux-only'])).toBe(packageVersion);
    for (const bad of [['--version'], ['--version', '1.4'], ['--version', 'v1.4.0'], ['--version', '1.4.0-rc1']]) {
      expect(() => buildVersion(bad)).toThrow(/semver X\.Y\.Z/);
    }
  });
});

describe('the packaged Linux executable', () => {
  it('runs without Node on the PATH: --version, enrol, and one sync of a real rollout', async () => {
    const v = await exec(LINUX, ['agent', '--version'], bare());
    expect({ code: v.code, out: v.stdout.trim() }).toEqual({ code: 0, out: BUILD_VERSION });

    const machineId = `pkg-${randomBytes(3).toString('hex')}`;
    const root = path.join(tmp, 'machine');
    const secret = await h.enrolmentSecret();
    const enrol = await exec(
      LINUX,
      ['agent', 'enrol', '--api', api, '--site', h.siteId, '--secret', secret, '--machine-id', machineId, '--root', root, '--json'],
      bare(),
    );
    expect(enrol.code).toBe(0);
    expect(JSON.parse(enrol.stdout)).toMatchObject({ machineId, siteId: h.siteId });

    const created = await h.request({
      method: 'POST',
      url: '/api/roosts',
      body: { siteId: h.siteId, name: 'packaged', targets: [machineId], extractPath: 'apps/pkg' },
    });
    const roostId = created.json().roostId as string;
    const files = { 'hello.txt': `hello ${randomBytes(4).toString('hex')}\n`, 'conf/app.json': '{"ok":true}\n' };
    await publishFiles(h, roostId, files);

    const child: ChildProcessWithoutNullStreams = spawn(
      LINUX,
      ['agent', 'run', '--root', root, '--heartbeat-seconds', '1', '--poll-wait-seconds', '1'],
      {
        env: bare(),
        stdio: ['pipe', 'pipe', 'pipe'],
      },
    );
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    const exited = new Promise<number | null>((r) => child.on('close', r));
    const waitLog = async (msg: string) => {
      const deadline = Date.now() + 60_000;
      while (!out.split('\n').some((l) => l.includes(`"msg":"${msg}"`))) {
        if (Date.now() > deadline) throw new Error(`no "${msg}" in: ${out}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    await waitLog('agent running');
    const rollout = await deployRoute(h, roostId);
    workflows.push(rollout.workflowId);
    await waitLog('command finished');
    for (const [p, content] of Object.entries(files))
      expect(fs.readFileSync(path.join(root, 'apps', 'pkg', ...p.split('/')), 'utf8')).toBe(content);
    const deployments = (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${machineId}/deployments` })).json()
      .deployments;
    expect(deployments).toEqual([expect.objectContaining({ roostId, status: 'committed', inSync: true })]);
    const machine = (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${machineId}` })).json();
    expect(machine.agent_version).toBe(BUILD_VERSION);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});

describe('the packaged Windows executable', () => {
  it('is a PE32+ x86-64 image with the SEA fuse flipped and the bundle inside, beside the WinSW service files', () => {
    const exe = fs.readFileSync(path.join(WINDOWS, 'roost.exe'));
    expect(exe.subarray(0, 2).toString('latin1')).toBe('MZ');
    const pe = exe.readUInt32LE(0x3c);
    expect(exe.subarray(pe, pe + 4)).toEqual(Buffer.from('PE\0\0', 'latin1'));
    expect(exe.readUInt16LE(pe + 4)).toBe(0x8664); // IMAGE_FILE_MACHINE_AMD64
    expect(exe.readUInt16LE(pe + 24)).toBe(0x20b); // PE32+ optional header
    expect(exe.includes(`${SEA_FUSE}:1`)).toBe(true);
    const bundle = fs.readFileSync(path.join(DIST, 'roost.cjs'));
    expect(exe.includes(bundle.subarray(0, 4096))).toBe(true);
    const wrapper = fs.readFileSync(path.join(WINDOWS, 'roost-agent-service.exe'));
    expect(wrapper.subarray(0, 2).toString('latin1')).toBe('MZ');
    const xml = fs.readFileSync(path.join(WINDOWS, 'roost-agent-service.xml'), 'utf8');
    expect(xml).toContain('<executable>%BASE%\\roost.exe</executable>');
    expect(xml).toContain('agent run --root');
    expect(fs.readFileSync(path.join(WINDOWS, 'install-service.ps1'), 'utf8')).toContain('agent enrol');
  });
});
