/**
 * Classic installer deployments end to end (api/routes/classic-deployments.ts, services/classic-deployments.ts,
 * workflows/classic-deployment.ts, agent/installer.ts): real reference agents (agent/fleet.ts) download real
 * installers (shell scripts) from an HTTPS server, verify them, run them and report; the workflow fans out,
 * retries, cancels and uninstalls. Also every error of the routes: quota, unknown and foreign machines,
 * scopes, in-flight delete, idempotent create. Set ROOST_RECORD_HISTORIES=1 to refresh the replay histories.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { startFleet, type Fleet } from '../../agent/fleet';
import { runClassicCommand } from '../../agent/installer';
import { PosixOs } from '../../agent/os';
import type { AgentTransport } from '../../agent/transport';
import { CLASSIC_INSTALL, classicDeploymentWorkflowId } from '../../domain/classic';
import { recordHistory } from '../../scripts/record-history';
import { CONTROL_UPDATE_WAIT_MS, controlClassicDeployment } from '../../workflows/client';
import { closeRolloutSuite, openRolloutSuite, scopedKey, enrolMachineRows, startTestWorker, type TestWorker } from './rollout-fixtures';
import { type Harness, idemKey } from '../support/harness';
import { type InstallerServer, installerScript, startInstallerServer } from '../support/installers';
import { killHard } from '../support/api-child';
import { startWorkerChild } from '../support/worker-child';
import { waitFor, waitUntil } from '../support/wait';

const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories', 'classic');

let h: Harness;
let w: TestWorker;
let tmpRoot: string;
let server: InstallerServer;
let fleet: Fleet;
const workflows: string[] = [];

beforeAll(async () => {
  process.env.ROOST_CLASSIC_POLL_MS = '100';
  ({ h, w, tmpRoot } = await openRolloutSuite('classic'));
  server = await startInstallerServer();
  const baseUrl = await h.listen();
  fleet = await startFleet({
    baseUrl,
    siteId: h.siteId,
    enrolmentSecret: await h.enrolmentSecret(),
    count: 10,
    machinePrefix: 'cls-',
    rootDir: path.join(tmpRoot, 'fleet'),
    pollWaitSeconds: 2,
    heartbeatMs: 0,
    progressIntervalMs: 50,
    perAgent: () => ({ installerCa: server.ca, closeGraceMs: 500 }),
  });
});
afterAll(async () => {
  await fleet?.stop();
  await server?.close();
  await closeRolloutSuite({ h, w, tmpRoot }, workflows);
});

const base = () => `/api/sites/${h.siteId}/deployments`;

async function create(body: Record<string, unknown>, opts: { key?: string; idem?: string } = {}) {
  return h.request({ method: 'POST', url: base(), body, key: opts.key, idempotencyKey: opts.idem ?? true });
}

async function finished(deploymentId: string) {
  const workflowId = classicDeploymentWorkflowId(h.siteId, deploymentId);
  if (!workflows.includes(workflowId)) workflows.push(workflowId);
  return h.deps.temporal.workflow.getHandle(workflowId).result();
}

async function detail(deploymentId: string) {
  const res = await h.request({ method: 'GET', url: `${base()}/${deploymentId}` });
  expect(res.statusCode).toBe(200);
  return res.json();
}

/** The pid an installer's child wrote (installerScript `childPidFile`). */
async function childPid(file: string): Promise<number> {
  return waitFor(`the installer child's pid in ${file}`, async () => Number(await fs.readFile(file, 'utf8').catch(() => '')), 10_000);
}

/**
 * Asserts that the process `pid` ended within a short grace (a zombie counts as ended: nobody may reap it
 * here); one left running is killed so the suite leaks nothing.
 */
async function expectTreeEnded(pid: number): Promise<void> {
  const posix = new PosixOs();
  const ended = await waitUntil(async () => (await posix.processIdentity(pid)) === null, 2000);
  if (!ended) process.kill(pid, 'SIGKILL');
  expect({ pid, running: !ended }).toEqual({ pid, running: false });
}

async function lines(file: string): Promise<string[]> {
  return (await fs.readFile(file, 'utf8').catch(() => '')).split('\n').filter(Boolean);
}

describe('classic deployment fan-out to reference agents', () => {
  it('installs in parallel on 10 machines, one failing (partial), then retry completes it; uninstall removes every install', async () => {
    const marker = path.join(tmpRoot, 'runs-1.log');
    const installs = path.join(tmpRoot, 'installs-1');
    const inst = server.add('setup-1.sh', installerScript({ marker, installs, failOn: ['cls-0003'] }));
    const res = await create({
      name: 'kiosk 1.2',
      installer_url: inst.url,
      installer_name: 'setup.sh',
      silent_flags: '/S /v"/qn REBOOT=ReallySuppress"',
      machines: fleet.machineIds,
      sha256: inst.sha256.toUpperCase(),
      parallel_install: true,
      timeout_seconds: 60,
    });
    expect(res.statusCode).toBe(201);
    const created = res.json();
    expect(created).toMatchObject({
      name: 'kiosk 1.2',
      status: 'pending',
      parallel_install: true,
      sha256: inst.sha256,
      counts: expect.objectContaining({ pending: 10 }),
    });
    expect(created.targets.map((t: { machineId: string }) => t.machineId)).toEqual(fleet.machineIds);
    expect(res.headers['x-roost-workflow-url']).toContain(encodeURIComponent(classicDeploymentWorkflowId(h.siteId, created.deploymentId)));

    const out = await finished(created.deploymentId);
    expect(out).toMatchObject({ status: 'partial', counts: expect.objectContaining({ completed: 9, failed: 1 }) });
    const d = await detail(created.deploymentId);
    expect(d.status).toBe('partial');
    const failed = d.targets.filter((t: { status: string }) => t.status === 'failed');
    expect(failed).toEqual([
      expect.objectContaining({ machineId: 'cls-0003', result: 'failed', error: 'installer exited with code 3', attempts: 1 }),
    ]);
    expect(d.targets.filter((t: { result: string }) => t.result === 'success')).toHaveLength(9);
    // Flags reached the installer split like a command line (an InstallShield /v"…" keeps its quotes).
    expect((await lines(marker)).some((l) => l.endsWith(' /S /v"/qn REBOOT=ReallySuppress"'))).toBe(true);
    expect((await fs.readdir(installs)).sort()).toEqual(fleet.machineIds.filter((m) => m !== 'cls-0003'));
    if (RECORD)
      await recordHistory(
        h.deps.temporal,
        classicDeploymentWorkflowId(h.siteId, created.deploymentId),
        path.join(HISTORIES, 'classic-partial.json'),
      );

    // Uninstall needs site admin: a write-only key is refused and nothing changes.
    const writeOnly = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read', 'write'] }]);
    const refused = await h.request({
      method: 'POST',
      url: `${base()}/${created.deploymentId}/uninstall`,
      key: writeOnly,
      idempotencyKey: true,
    });
    expect(refused.statusCode).toBe(403);
    expect(refused.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: h.siteId, permission: 'admin' } });

    // Retry: only the failed target runs again (attempt 2), on a new run of the same workflow id.
    const before = (await lines(marker)).length;
    const retry = await h.request({ method: 'POST', url: `${base()}/${created.deploymentId}/retry`, idempotencyKey: true });
    expect(retry.statusCode).toBe(200);
    expect(retry.json()).toMatchObject({ deploymentId: created.deploymentId, action: 'retry', affected: 1 });
    const again = await finished(created.deploymentId);
    expect(again).toMatchObject({ status: 'completed', counts: expect.objectContaining({ completed: 10 }) });
    const after = await lines(marker);
    expect(after.slice(before).map((l) => l.split(' ')[0])).toEqual(['cls-0003']);
    expect((await detail(created.deploymentId)).targets.find((t: { machineId: string }) => t.machineId === 'cls-0003')).toMatchObject({
      status: 'completed',
      attempts: 2,
    });
    // A second retry has nothing to requeue.
    const noop = await h.request({ method: 'POST', url: `${base()}/${created.deploymentId}/retry`, idempotencyKey: true });
    expect(noop.statusCode).toBe(409);
    expect(noop.json().code).toBe('conflict');
    if (RECORD)
      await recordHistory(
        h.deps.temporal,
        classicDeploymentWorkflowId(h.siteId, created.deploymentId),
        path.join(HISTORIES, 'classic-retry.json'),
      );

    // Uninstall with the admin key: every target runs the installer with --uninstall. Two uninstalls sent at
    // once: one queues it, the other finds the deployment in flight (checked under the deployment's row lock)
    // and changes nothing, so one audit record below.
    const both = await Promise.all(
      [1, 2].map(() => h.request({ method: 'POST', url: `${base()}/${created.deploymentId}/uninstall`, idempotencyKey: true })),
    );
    expect(both.map((r) => r.statusCode).sort()).toEqual([200, 409]);
    const un = both.find((r) => r.statusCode === 200)!;
    expect(un.json()).toMatchObject({ affected: 10 });
    expect(both.find((r) => r.statusCode === 409)!.json()).toMatchObject({ code: 'deployment_in_flight' });
    expect(await finished(created.deploymentId)).toMatchObject({
      status: 'uninstalled',
      counts: expect.objectContaining({ uninstalled: 10 }),
    });
    expect(await fs.readdir(installs)).toEqual([]);
    if (RECORD)
      await recordHistory(
        h.deps.temporal,
        classicDeploymentWorkflowId(h.siteId, created.deploymentId),
        path.join(HISTORIES, 'classic-uninstall.json'),
      );
    const final = await detail(created.deploymentId);
    expect(
      final.targets.every(
        (t: { status: string; action: string; result: string }) =>
          t.status === 'uninstalled' && t.action === 'uninstall' && t.result === 'success',
      ),
    ).toBe(true);

    // Audit records of every mutation, with the deployment id.
    const { rows } = await h.deps.db.query(
      `SELECT kind FROM audit_records WHERE site_id = $1
         AND (attributes->'params'->>'deploymentId' = $2 OR attributes->'result'->>'deploymentId' = $2) ORDER BY seq`,
      [h.siteId, created.deploymentId],
    );
    expect(rows.map((r) => r.kind)).toEqual(['classic_deployment_created', 'classic_deployment_retried', 'classic_deployment_uninstalled']);
  });

  it('runs serially by default; cancel pulls pending targets while the in-flight install finishes', async () => {
    const marker = path.join(tmpRoot, 'runs-2.log');
    const inst = server.add('slow.sh', installerScript({ marker, installs: path.join(tmpRoot, 'installs-2'), sleepSeconds: 1 }));
    const res = await create({
      name: 'serial',
      installer_url: inst.url,
      installer_name: 'slow.sh',
      silent_flags: '',
      machines: fleet.machineIds.slice(0, 5),
    });
    expect(res.statusCode).toBe(201);
    const id = res.json().deploymentId;
    // Serial: one target in flight at a time.
    await waitFor('a target installing', async () => (await detail(id)).targets.some((t: { status: string }) => t.status === 'installing'));
    const mid = await detail(id);
    expect(mid.status).toBe('in_progress');
    expect(
      mid.targets.filter((t: { commandId: string | null; status: string }) => t.commandId !== null && t.status !== 'completed'),
    ).toHaveLength(1);
    // Delete refused while in flight.
    const del = await h.request({ method: 'DELETE', url: `${base()}/${id}`, idempotencyKey: true });
    expect(del.statusCode).toBe(409);
    expect(del.json().code).toBe('deployment_in_flight');

    const cancel = await h.request({ method: 'POST', url: `${base()}/${id}/cancel`, idempotencyKey: true });
    expect(cancel.statusCode).toBe(200);
    const cancelled = cancel.json().affected;
    expect(cancelled).toBeGreaterThanOrEqual(3);
    const out = await finished(id);
    expect(out.status).toBe('cancelled');
    const d = await detail(id);
    const completed = d.targets.filter((t: { status: string }) => t.status === 'completed').length;
    expect(completed).toBe(5 - cancelled); // the in-flight install(s) finished, nothing else ran
    expect((await lines(marker)).length).toBe(completed);
    expect(d.targets.filter((t: { result: string }) => t.result === 'cancelled')).toHaveLength(cancelled);
    if (RECORD)
      await recordHistory(h.deps.temporal, classicDeploymentWorkflowId(h.siteId, id), path.join(HISTORIES, 'classic-cancel.json'));

    // Terminal now: delete removes the record.
    const gone = await h.request({ method: 'DELETE', url: `${base()}/${id}`, idempotencyKey: true });
    expect(gone.statusCode).toBe(200);
    expect(gone.json()).toEqual({ deploymentId: id, deleted: true });
    expect((await h.request({ method: 'GET', url: `${base()}/${id}` })).statusCode).toBe(404);
  });

  it('fails a target whose installer does not match sha256 without running it; a hanging installer fails at its timeout; verify_path is checked', async () => {
    const marker = path.join(tmpRoot, 'runs-3.log');
    const installs = path.join(tmpRoot, 'installs-3');
    const inst = server.add('evil.sh', installerScript({ marker, installs }));
    const mismatch = await create({
      name: 'tampered',
      installer_url: inst.url,
      installer_name: 'evil.sh',
      silent_flags: '',
      machines: [fleet.machineIds[0]],
      sha256: 'f'.repeat(64),
    });
    expect(mismatch.statusCode).toBe(201);
    expect(await finished(mismatch.json().deploymentId)).toMatchObject({ status: 'failed' });
    const t = (await detail(mismatch.json().deploymentId)).targets[0];
    expect(t.error).toMatch(/^sha256_mismatch: expected f{64}, got [0-9a-f]{64}; nothing was run$/);
    expect(await lines(marker)).toEqual([]);

    // The hanging installer's work is a child process (as setup.exe runs msiexec): the timeout ends it too.
    const hangChild = path.join(tmpRoot, 'hang-child.pid');
    const hang = server.add('hang.sh', installerScript({ marker, installs, sleepSeconds: 30, childPidFile: hangChild }));
    const verify = server.add('noverify.sh', installerScript({ marker: path.join(tmpRoot, 'runs-4.log'), installs }));
    const [a, b] = await Promise.all([
      create({
        name: 'hangs',
        installer_url: hang.url,
        installer_name: 'hang.sh',
        silent_flags: '',
        machines: [fleet.machineIds[1]],
        timeout_seconds: 1,
      }),
      create({
        name: 'verify',
        installer_url: verify.url,
        installer_name: 'noverify.sh',
        silent_flags: '',
        machines: [fleet.machineIds[2]],
        verify_path: path.join(tmpRoot, 'never-there'),
      }),
    ]);
    expect(await finished(a.json().deploymentId)).toMatchObject({ status: 'failed' });
    expect((await detail(a.json().deploymentId)).targets[0].error).toBe('installer timed out after 1 s and was killed');
    await expectTreeEnded(await childPid(hangChild));
    expect(await finished(b.json().deploymentId)).toMatchObject({ status: 'failed' });
    expect((await detail(b.json().deploymentId)).targets[0].error).toBe(
      `verify_path ${path.join(tmpRoot, 'never-there')} does not exist after the install`,
    );
  });
});

describe('installer process trees', () => {
  // agent/installer.ts through a recording transport: what the agent does to the installer's processes when
  // it stops mid-install (the command is abandoned) or the time limit passes, without a deployment around it.
  it.each([
    ['the agent stops mid-install', 60, 'abandoned', 'agent stopped'],
    ['the time limit passes', 1, 'failed', 'installer timed out after 1 s and was killed'],
  ])('kills every process the installer started when %s', async (_when, timeoutSeconds, status, error) => {
    const name = `tree-${timeoutSeconds}`;
    const pidFile = path.join(tmpRoot, `${name}.pid`);
    const inst = server.add(
      `${name}.sh`,
      installerScript({
        marker: path.join(tmpRoot, `${name}.log`),
        installs: path.join(tmpRoot, name),
        sleepSeconds: 30,
        childPidFile: pidFile,
      }),
    );
    const reports: string[] = [];
    const transport = {
      reportCommand: async (_id: string, body: { status: string }) => {
        reports.push(body.status);
        return { status: body.status, applied: true };
      },
    } as unknown as AgentTransport;
    const stop = new AbortController();
    const run = runClassicCommand(
      {
        transport,
        os: new PosixOs(),
        downloadDir: path.join(tmpRoot, `${name}-downloads`),
        ca: server.ca,
        progressIntervalMs: 50,
        closeGraceMs: 500,
        signal: stop.signal,
        warn: () => undefined,
      },
      {
        commandId: `cmd-${name}`,
        type: CLASSIC_INSTALL,
        createdAt: new Date().toISOString(),
        expiresAt: null,
        params: {
          deploymentId: `dep-${name}`,
          installer_url: inst.url,
          installer_name: `${name}.sh`,
          silent_flags: '',
          verify_path: null,
          sha256: inst.sha256,
          close_processes: [],
          suppress_projects: [],
          timeout_seconds: timeoutSeconds,
          attempt: 1,
        },
      },
    );
    const pid = await childPid(pidFile);
    if (status === 'abandoned') stop.abort();
    expect(await run).toMatchObject({ status, error });
    expect(reports).toContain('installing');
    await expectTreeEnded(pid);
  });
});

describe('durability', () => {
  it('completes a fan-out after its only worker is shut down mid-deployment and a new worker starts', async () => {
    const marker = path.join(tmpRoot, 'runs-restart.log');
    const inst = server.add('restart.sh', installerScript({ marker, installs: path.join(tmpRoot, 'installs-restart'), sleepSeconds: 1 }));
    const res = await create({
      name: 'restart',
      installer_url: inst.url,
      installer_name: 'restart.sh',
      silent_flags: '',
      machines: fleet.machineIds.slice(0, 4),
    });
    expect(res.statusCode).toBe(201);
    const id = res.json().deploymentId;
    // Wait until the serial fan-out is under way (one target done or running), then take the worker away.
    let inFlight: { commandId: string } | undefined;
    await waitFor('a target installing', async () => {
      inFlight = (await detail(id)).targets.find((t: { status: string }) => t.status === 'installing');
      return inFlight !== undefined;
    });
    await w.stop();
    // The in-flight install finishes and its report lands while no worker runs.
    await waitFor('the in-flight install completed', async () => {
      const { rows } = await h.deps.db.query<{ status: string }>('SELECT status FROM commands WHERE site_id = $1 AND command_id = $2', [
        h.siteId,
        inFlight!.commandId,
      ]);
      return rows[0]?.status === 'completed';
    });
    w = await startTestWorker(h, 'classic-after-restart');
    expect(await finished(id)).toMatchObject({ status: 'completed', counts: expect.objectContaining({ completed: 4 }) });
    // Every machine counted once: each target completed on its first attempt, and its installer ran exactly once.
    const d = await detail(id);
    expect(d.targets.map((t: { status: string; attempts: number }) => [t.status, t.attempts])).toEqual(Array(4).fill(['completed', 1]));
    expect((await lines(marker)).map((l) => l.split(' ')[0]).sort()).toEqual(fleet.machineIds.slice(0, 4));
  });
  it('completes a fan-out after its worker process is SIGKILLed mid-install and another worker process takes over', async () => {
    // The production worker (worker/main.ts) as a process on this file's task queue, in place of the in-process one.
    await w.stop();
    const env = { ROOST_TASK_QUEUE: h.deps.cfg.ROOST_TASK_QUEUE };
    let child = await startWorkerChild(env);
    try {
      const marker = path.join(tmpRoot, 'runs-kill.log');
      const inst = server.add('kill.sh', installerScript({ marker, installs: path.join(tmpRoot, 'installs-kill'), sleepSeconds: 1 }));
      const machines = fleet.machineIds.slice(4, 7);
      const res = await create({ name: 'kill', installer_url: inst.url, installer_name: 'kill.sh', silent_flags: '', machines });
      expect(res.statusCode).toBe(201);
      const id = res.json().deploymentId;
      await waitFor('a target installing', async () =>
        (await detail(id)).targets.some((t: { status: string }) => t.status === 'installing'),
      );
      await killHard(child);
      child = await startWorkerChild(env);
      expect(await finished(id)).toMatchObject({ status: 'completed', counts: expect.objectContaining({ completed: 3 }) });
      // No target dispatched twice: one attempt each, and each machine ran the installer once.
      const d = await detail(id);
      expect(d.targets.map((t: { status: string; attempts: number }) => [t.status, t.attempts])).toEqual(Array(3).fill(['completed', 1]));
      expect((await lines(marker)).map((l) => l.split(' ')[0]).sort()).toEqual([...machines].sort());
    } finally {
      await killHard(child);
      w = await startTestWorker(h, 'classic-after-kill');
    }
  });
});

describe('classic deployment requests', () => {
  const valid = () => ({
    name: 'x',
    installer_url: 'https://downloads.example.test/setup.msi',
    installer_name: 'setup.msi',
    silent_flags: '/qn',
    machines: [fleet.machineIds[0]],
  });

  it('gives 413 over_quota above the site deployQuota (default 100) and changes nothing', async () => {
    const machines = Array.from({ length: 101 }, (_, i) => `q-${i}`);
    const res = await create({ ...valid(), machines });
    expect(res.statusCode).toBe(413);
    expect(res.json()).toMatchObject({ code: 'over_quota', quota: { max_targets: 100, requested: 101 } });
    // However long the list: 20,000 distinct ids (past the largest quota a site may have) are over_quota too.
    const many = await create({ ...valid(), machines: Array.from({ length: 20_000 }, (_, i) => `q-${i}`) });
    expect([many.statusCode, many.json().code, many.json().quota]).toEqual([413, 'over_quota', { max_targets: 100, requested: 20_000 }]);
    await h.deps.db.query('UPDATE sites SET deploy_quota = 3 WHERE site_id = $1', [h.siteId]);
    try {
      const small = await create({ ...valid(), machines: fleet.machineIds.slice(0, 4) });
      expect(small.statusCode).toBe(413);
      expect(small.json().quota).toEqual({ max_targets: 3, requested: 4 });
    } finally {
      await h.deps.db.query('UPDATE sites SET deploy_quota = 100 WHERE site_id = $1', [h.siteId]);
    }
    const { rows } = await h.deps.db.query(`SELECT count(*)::INT AS n FROM classic_deployments WHERE site_id = $1 AND name = 'x'`, [
      h.siteId,
    ]);
    expect(rows[0].n).toBe(0);
  });

  it('names unknown and foreign machines in validation_failed', async () => {
    const other = await h.other();
    await enrolMachineRows(h, ['foreign-1'], other.siteId);
    const res = await create({ ...valid(), machines: [fleet.machineIds[0], 'nope-1', 'foreign-1'] });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: 'validation_failed', param: 'machines', unknownMachines: ['nope-1', 'foreign-1'] });
    expect(res.json().errors.machines[0]).toContain('nope-1');
  });

  it.each([
    ['http URL', { installer_url: 'http://downloads.example.test/setup.msi' }, 'installer_url'],
    ['bad sha256', { sha256: 'abc' }, 'sha256'],
    ['path as installer name', { installer_name: '..\\setup.msi' }, 'installer_name'],
    ['relative verify_path', { verify_path: 'app\\app.exe' }, 'verify_path'],
    ['empty machines', { machines: [] }, 'machines'],
    ['malformed machine', { machines: ['bad id'] }, 'machines.0'],
    ['duplicate machines', { machines: ['cls-0000', 'cls-0000'] }, 'machines'],
    ['unknown field', { deploymentId: 'dep_x' }, 'deploymentId'],
  ])('refuses %s with validation_failed', async (_what, patch, field) => {
    const res = await create({ ...valid(), ...patch });
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe('validation_failed');
    expect(Object.keys(res.json().errors ?? {}).concat(res.json().param ?? [])).toContain(field);
  });

  it('requires Idempotency-Key and replays a repeated create without a second deployment or workflow', async () => {
    const noKey = await h.request({ method: 'POST', url: base(), body: valid() });
    expect(noKey.statusCode).toBe(400);
    expect(noKey.json().code).toBe('idempotency_key_required');
    const inst = server.add(
      'idem.sh',
      installerScript({ marker: path.join(tmpRoot, 'runs-5.log'), installs: path.join(tmpRoot, 'installs-5') }),
    );
    const body = { ...valid(), name: 'idem', installer_url: inst.url, installer_name: 'idem.sh' };
    const key = idemKey();
    const [a, b] = [await create(body, { idem: key }), await create(body, { idem: key })];
    expect(a.statusCode).toBe(201);
    expect(b.statusCode).toBe(201);
    expect(b.headers['idempotent-replayed']).toBe('true');
    expect(b.json().deploymentId).toBe(a.json().deploymentId);
    const { rows } = await h.deps.db.query(`SELECT count(*)::INT AS n FROM classic_deployments WHERE site_id = $1 AND name = 'idem'`, [
      h.siteId,
    ]);
    expect(rows[0].n).toBe(1);
    await finished(a.json().deploymentId);
  });

  it('lists newest first with cursor paging, filters by status, and hides other sites', async () => {
    const page1 = await h.request({ method: 'GET', url: `${base()}?page_size=2` });
    expect(page1.statusCode).toBe(200);
    const p1 = page1.json();
    expect(p1.deployments).toHaveLength(2);
    expect(p1.next_page_token).not.toBe('');
    expect(p1.nextPageToken).toBe(p1.next_page_token);
    const page2 = await h.request({ method: 'GET', url: `${base()}?page_size=2&page_token=${p1.next_page_token}` });
    const p2 = page2.json();
    const all = [...p1.deployments, ...p2.deployments];
    const times = all.map((d: { createdAt: string }) => d.createdAt);
    expect([...times].sort().reverse()).toEqual(times);
    expect(new Set(all.map((d: { deploymentId: string }) => d.deploymentId)).size).toBe(all.length);
    expect((await h.request({ method: 'GET', url: `${base()}?page_size=101` })).json().code).toBe('validation_failed');
    expect((await h.request({ method: 'GET', url: `${base()}?page_token=garbage` })).statusCode).toBe(400);
    const failedOnly = (await h.request({ method: 'GET', url: `${base()}?status=failed&page_size=100` })).json();
    expect(failedOnly.deployments.length).toBeGreaterThan(0);
    expect(failedOnly.deployments.every((d: { status: string }) => d.status === 'failed')).toBe(true);

    const other = await h.other();
    const foreign = await h.request({ method: 'GET', url: `${base()}/${p1.deployments[0].deploymentId}`, key: other.apiKey });
    expect(foreign.statusCode).toBe(404);
    expect((await h.request({ method: 'GET', url: `${base()}/dep%20bad` })).statusCode).toBe(400);
    expect((await h.request({ method: 'GET', url: `${base()}/dep_000000000000000000000000` })).statusCode).toBe(404);
    const readOnly = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const denied = await create(valid(), { key: readOnly });
    expect(denied.statusCode).toBe(403);
    expect(denied.json().code).toBe('scope_insufficient');
  });
});

describe('installer templates', () => {
  it('creates, lists, updates and deletes templates; a deployment takes template fields as defaults and explicit fields win', async () => {
    const t = `/api/sites/${h.siteId}/installer-templates`;
    const inst = server.add(
      'tpl.sh',
      installerScript({ marker: path.join(tmpRoot, 'runs-6.log'), installs: path.join(tmpRoot, 'installs-6') }),
    );
    const created = await h.request({
      method: 'POST',
      url: t,
      idempotencyKey: true,
      body: {
        name: 'Kiosk',
        installer_name: 'tpl.sh',
        installer_url: inst.url,
        silent_flags: '--quiet',
        close_processes: ['kiosk.exe'],
        timeout_seconds: 120,
      },
    });
    expect(created.statusCode).toBe(201);
    const tpl = created.json();
    expect(tpl).toMatchObject({ name: 'Kiosk', verify_path: null, close_processes: ['kiosk.exe'], timeout_seconds: 120 });
    const dup = await h.request({
      method: 'POST',
      url: t,
      idempotencyKey: true,
      body: { name: 'Kiosk', installer_name: 'a.msi', installer_url: inst.url },
    });
    expect(dup.statusCode).toBe(409);
    const patched = await h.request({
      method: 'PATCH',
      url: `${t}/${tpl.templateId}`,
      idempotencyKey: true,
      body: { silent_flags: '--very-quiet' },
    });
    expect(patched.statusCode).toBe(200);
    expect(patched.json().silent_flags).toBe('--very-quiet');
    expect((await h.request({ method: 'PATCH', url: `${t}/${tpl.templateId}`, idempotencyKey: true, body: {} })).statusCode).toBe(400);
    expect(
      (await h.request({ method: 'PATCH', url: `${t}/${tpl.templateId}`, idempotencyKey: true, body: { installer_url: 'ftp://x' } }))
        .statusCode,
    ).toBe(400);
    const list = (await h.request({ method: 'GET', url: t })).json();
    expect(list.templates.map((x: { templateId: string }) => x.templateId)).toContain(tpl.templateId);

    const dep = await create({
      template_id: tpl.templateId,
      machines: [fleet.machineIds[4]],
      name: 'from template',
      silent_flags: '--explicit',
    });
    expect(dep.statusCode).toBe(201);
    expect(dep.json()).toMatchObject({
      name: 'from template',
      installer_url: inst.url,
      installer_name: 'tpl.sh',
      silent_flags: '--explicit',
      close_processes: ['kiosk.exe'],
      timeout_seconds: 120,
      template_id: tpl.templateId,
    });
    expect(await finished(dep.json().deploymentId)).toMatchObject({ status: 'completed' });
    expect((await create({ template_id: 'itp_000000000000000000000000', machines: [fleet.machineIds[4]] })).statusCode).toBe(404);

    expect((await h.request({ method: 'DELETE', url: `${t}/${tpl.templateId}`, idempotencyKey: true })).statusCode).toBe(200);
    expect((await h.request({ method: 'GET', url: `${t}/${tpl.templateId}` })).statusCode).toBe(404);
    expect((await h.request({ method: 'DELETE', url: `${t}/${tpl.templateId}`, idempotencyKey: true })).statusCode).toBe(404);
  });
});

describe('control while no worker runs', () => {
  it('sends nothing and answers at once when no worker polls the task queue: no workflow is started', async () => {
    const r = { siteId: h.siteId, deploymentId: `dep_${'0'.repeat(24)}` };
    const started = Date.now();
    await expect(
      controlClassicDeployment(h.deps.temporal, { ROOST_TASK_QUEUE: `nobody-polls-${idemKey()}` }, r, 'cancel', { by: h.userId }),
    ).rejects.toMatchObject({ name: 'NoWorker', reason: 'none' });
    expect(Date.now() - started).toBeLessThan(5_000);
    await expect(
      h.deps.temporal.workflow.getHandle(classicDeploymentWorkflowId(r.siteId, r.deploymentId)).describe(),
    ).rejects.toMatchObject({
      name: 'WorkflowNotFoundError',
    });
  });

  it('answers 503 after the bounded wait when the worker is lost; the cancel applies when a worker is back, and a retry with the same Idempotency-Key gets its outcome', async () => {
    const marker = path.join(tmpRoot, 'runs-lost-worker.log');
    const inst = server.add('lost.sh', installerScript({ marker, installs: path.join(tmpRoot, 'installs-lost'), sleepSeconds: 2 }));
    const res = await create({
      name: 'lost worker',
      installer_url: inst.url,
      installer_name: 'lost.sh',
      silent_flags: '',
      machines: fleet.machineIds.slice(0, 5),
    });
    expect(res.statusCode).toBe(201);
    const id = res.json().deploymentId;
    await waitFor('a target installing', async () => (await detail(id)).targets.some((t: { status: string }) => t.status === 'installing'));
    // The worker goes away (it polled a moment ago, so the update is sent and waits for one to accept it).
    await w.stop();
    const idem = idemKey();
    const send = () => h.request({ method: 'POST', url: `${base()}/${id}/cancel`, idempotencyKey: idem });
    const started = Date.now();
    const refused = await send();
    expect([refused.statusCode, refused.json().code]).toEqual([503, 'service_unavailable']);
    expect(refused.json().detail).toMatch(/no worker took cancel within 15 s; it is applied when a worker takes it/);
    expect(refused.json().retryAfter).toBe(Number(refused.headers['retry-after']));
    expect(Date.now() - started).toBeLessThan(CONTROL_UPDATE_WAIT_MS + 10_000);

    // A worker again: the cancel that was handed over is applied, once, and the deployment ends.
    w = await startTestWorker(h, 'classic-worker-back');
    expect(await finished(id)).toMatchObject({ status: 'cancelled' });
    const cancelled = (await detail(id)).targets.filter((t: { result: string }) => t.result === 'cancelled').length;
    expect(cancelled).toBeGreaterThanOrEqual(1);
    // The retry with the same key is that update's outcome (200), though nothing is left to cancel now;
    // a new key is refused as before.
    const retried = await send();
    expect([retried.statusCode, retried.json()]).toEqual([
      200,
      { deploymentId: id, action: 'cancel', affected: cancelled, status: expect.any(String) },
    ]);
    const fresh = await h.request({ method: 'POST', url: `${base()}/${id}/cancel`, idempotencyKey: true });
    expect([fresh.statusCode, fresh.json().code]).toEqual([409, 'conflict']);
    const completed = (await detail(id)).targets.filter((t: { status: string }) => t.status === 'completed').length;
    expect(completed + cancelled).toBe(5);
    expect((await lines(marker)).length).toBe(completed);
  });
});
