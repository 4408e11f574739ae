/**
 * Managed processes and machine commands with real reference agents (api/routes/processes.ts,
 * services/processes.ts, agent/processes.ts, agent/power.ts, agent/screenshot.ts): every route and error of
 * the processes table, race-safe creates, and the agent running real child processes (started, crashed and
 * relaunched, stopped gracefully, killed, scheduled, held stopped by a classic install's suppress_projects),
 * re-reading configs only when the heartbeat's processConfigStamp changes, rebooting with its delay (offline, then back), and
 * uploading a real PNG screenshot.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { PNG } from 'pngjs';
import { Agent, type CommandOutcome } from '../../agent/agent';
import { startFleet, type Fleet } from '../../agent/fleet';
import type { ClassicCommandParams } from '../../domain/classic';
import { createHarness, type Harness } from '../support/harness';
import { type InstallerServer, startInstallerServer } from '../support/installers';
import { scopedKey } from './rollout-fixtures';
import { startTcpProxy } from '../support/tcp-proxy';
import { waitFor } from '../support/wait';
import { closeWorkerConnections } from '../../worker/worker';

let h: Harness;
let fleet: Fleet;
let tmpRoot: string;
let M: string;
let M2: string;
let installers: InstallerServer;
let apiUrl: string;
let secret: string;

beforeAll(async () => {
  h = await createHarness({ ROOST_HEARTBEAT_STALE_SECONDS: '5' });
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-processes-test-'));
  installers = await startInstallerServer();
  apiUrl = await h.listen();
  secret = await h.enrolmentSecret();
  fleet = await startFleet({
    baseUrl: apiUrl,
    siteId: h.siteId,
    enrolmentSecret: secret,
    count: 2,
    machinePrefix: 'proc-',
    rootDir: tmpRoot,
    pollWaitSeconds: 1,
    heartbeatMs: 300,
    perAgent: () => ({ processSyncMs: 200, processTickMs: 50, stopGraceMs: 700, rebootDowntimeMs: 6500, installerCa: installers.ca }),
  });
  [M, M2] = fleet.machineIds;
});
afterAll(async () => {
  await fleet?.stop();
  await installers?.close();
  await closeWorkerConnections();
  h?.app.server.closeAllConnections();
  await h?.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

const base = (m = M) => `/api/sites/${h.siteId}/machines/${m}/processes`;
const post = (url: string, body?: unknown, key?: string) => h.request({ method: 'POST', url, body, key, idempotencyKey: true });

async function live(processId: string, m = M) {
  const res = await h.request({ method: 'GET', url: `${base(m)}/${processId}` });
  expect(res.statusCode).toBe(200);
  return res.json().live as { pid: number | null; status: string; responsive: boolean | null; restarts: number } | null;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

async function commandDone(commandId: string, m = M) {
  return waitFor('the command finished', async () => {
    const c = (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${m}/commands/${commandId}` })).json();
    return ['completed', 'failed', 'cancelled'].includes(c.status) ? c : undefined;
  });
}

describe('process config routes', () => {
  it('creates with defaults, race-safely: two concurrent creates of one name give one 201 and one 409', async () => {
    const body = { name: 'kiosk', exe_path: 'C:\\Apps\\kiosk.exe' };
    const [a, b] = await Promise.all([post(base(M2), body), post(base(M2), body)]);
    expect([a.statusCode, b.statusCode].sort()).toEqual([201, 409]);
    const created = (a.statusCode === 201 ? a : b).json();
    const refused = (a.statusCode === 201 ? b : a).json();
    expect(refused.code).toBe('duplicate_process_name');
    expect(created).toMatchObject({
      name: 'kiosk',
      exe_path: 'C:\\Apps\\kiosk.exe',
      priority: 'normal',
      visibility: 'visible',
      launch_mode: 'off',
      autolaunch: false,
      relaunch_attempts: 3,
      schedules: [],
      live: null,
    });
    expect(created.id).toBe(created.processId);
    const list = (await h.request({ method: 'GET', url: base(M2) })).json();
    expect(list.processes.map((p: { name: string }) => p.name)).toEqual(['kiosk']);
    expect(list).not.toHaveProperty('next_page_token');
  });

  it.each([
    ['missing exe_path', { name: 'x' }, 'validation_failed'],
    ['relative exe_path', { name: 'x', exe_path: 'kiosk.exe' }, 'validation_failed'],
    ['relative cwd', { name: 'x', exe_path: '/bin/true', cwd: 'apps' }, 'validation_failed'],
    ['bad priority', { name: 'x', exe_path: '/bin/true', priority: 'urgent' }, 'validation_failed'],
    ['bad visibility', { name: 'x', exe_path: '/bin/true', visibility: 'transparent' }, 'validation_failed'],
    ['bad launch_mode', { name: 'x', exe_path: '/bin/true', launch_mode: 'autolaunch' }, 'validation_failed'],
    ['negative time_delay', { name: 'x', exe_path: '/bin/true', time_delay: -1 }, 'validation_failed'],
    ['scheduled without blocks', { name: 'x', exe_path: '/bin/true', launch_mode: 'scheduled' }, 'validation_failed'],
    ['bad day', { name: 'x', exe_path: '/bin/true', schedules: [{ days: ['monday'], start: '08:00', end: '17:00' }] }, 'validation_failed'],
    ['bad time', { name: 'x', exe_path: '/bin/true', schedules: [{ days: ['mon'], start: '8:00', end: '24:00' }] }, 'validation_failed'],
    [
      'empty block',
      { name: 'x', exe_path: '/bin/true', schedules: [{ days: ['mon'], start: '08:00', end: '08:00' }] },
      'validation_failed',
    ],
    ['processId sent', { name: 'x', exe_path: '/bin/true', processId: 'prc_x' }, 'forbidden_field'],
    ['id sent', { name: 'x', exe_path: '/bin/true', id: 'prc_x' }, 'forbidden_field'],
  ])('refuses %s', async (_what, body, code) => {
    const res = await post(base(M2), body);
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe(code);
  });

  it('patches, schedules, deletes idempotently, and answers process_not_found for unknown processes', async () => {
    const p = (await post(base(M2), { name: 'patchme', exe_path: '/bin/true' })).json();
    const url = `${base(M2)}/${p.processId}`;
    const patch = (body: unknown) => h.request({ method: 'PATCH', url, body, idempotencyKey: true });
    const ok = await patch({ priority: 'high', time_to_init: 2, schedulePresetId: 'preset-1' });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toMatchObject({ priority: 'high', time_to_init: 2, schedulePresetId: 'preset-1', name: 'patchme' });
    expect((await patch({})).json().code).toBe('validation_failed');
    expect((await patch({ processId: 'prc_other' })).json().code).toBe('forbidden_field');
    expect((await patch({ name: 'kiosk' })).json().code).toBe('duplicate_process_name');
    expect((await patch({ launch_mode: 'scheduled' })).json().code).toBe('validation_failed');

    const sched = await post(`${url}/schedule`, { mode: 'scheduled', blocks: [{ days: ['fri', 'sat'], start: '22:00', end: '02:00' }] });
    expect(sched.statusCode).toBe(200);
    expect(sched.json()).toMatchObject({
      launch_mode: 'scheduled',
      autolaunch: true,
      schedules: [{ days: ['fri', 'sat'], start: '22:00', end: '02:00' }],
    });
    expect((await post(`${url}/schedule`, { mode: 'scheduled', blocks: [] })).statusCode).toBe(400);
    expect((await post(`${url}/schedule`, { mode: 'sometimes' })).statusCode).toBe(400);
    expect((await post(`${url}/schedule`, { mode: 'off' })).json()).toMatchObject({ launch_mode: 'off', autolaunch: false });

    const del1 = await h.request({ method: 'DELETE', url, idempotencyKey: true });
    expect(del1.json()).toEqual({ processId: p.processId, deleted: true, alreadyDeleted: false });
    const del2 = await h.request({ method: 'DELETE', url, idempotencyKey: true });
    expect(del2.json()).toEqual({ processId: p.processId, deleted: true, alreadyDeleted: true });
    const gone = await h.request({ method: 'GET', url });
    expect(gone.statusCode).toBe(404);
    expect(gone.json().code).toBe('process_not_found');
    for (const a of ['kill', 'restart', 'start', 'stop']) expect((await post(`${url}/${a}`)).json().code).toBe('process_not_found');
    expect((await h.request({ method: 'DELETE', url: `${base(M2)}/prc_000000000000000000000000`, idempotencyKey: true })).json().code).toBe(
      'process_not_found',
    );
    expect((await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/nope/processes` })).statusCode).toBe(404);
    expect((await h.request({ method: 'GET', url: `${base(M2)}/bad%20id` })).statusCode).toBe(400);
  });

  it('checks launch_mode against schedules as one step: of two concurrent changes that are each valid, the second is refused and nothing is lost', async () => {
    const block = { days: ['mon'], start: '08:00', end: '09:00' };
    const p = (await post(base(M2), { name: 'raced', exe_path: '/bin/true', schedules: [block] })).json();
    const url = `${base(M2)}/${p.processId}`;
    const patch = (body: unknown) => h.request({ method: 'PATCH', url, body, idempotencyKey: true });
    const stored = async () => (await h.request({ method: 'GET', url })).json();
    // Each round from launch_mode off with one block: emptying the blocks and switching to scheduled are each
    // valid alone and invalid together, in either order. Both by PATCH, then by POST …/schedule beside PATCH.
    const races: [string, () => ReturnType<typeof patch>][] = [
      ['PATCH launch_mode', () => patch({ launch_mode: 'scheduled' })],
      ['POST schedule', () => post(`${url}/schedule`, { mode: 'scheduled' })],
    ];
    for (const [label, toScheduled] of races) {
      for (let round = 0; round < 5; round++) {
        expect((await patch({ launch_mode: 'off', schedules: [block] })).statusCode).toBe(200);
        const [emptied, scheduled] = await Promise.all([patch({ schedules: [] }), toScheduled()]);
        const codes = [emptied, scheduled].map((r) => r.statusCode);
        expect([label, codes.sort()]).toEqual([label, [200, 400]]);
        const refused = emptied.statusCode === 400 ? emptied : scheduled;
        expect(refused.json()).toMatchObject({ code: 'validation_failed' });
        // The stored config is the one the accepted change answered with.
        const after = await stored();
        const accepted = emptied.statusCode === 200 ? emptied : scheduled;
        expect([label, after.launch_mode, after.schedules]).toEqual([label, accepted.json().launch_mode, accepted.json().schedules]);
        expect(after.launch_mode === 'scheduled' && after.schedules.length === 0).toBe(false);
      }
    }
    await h.request({ method: 'DELETE', url, idempotencyKey: true });
  });

  it('needs machine or site write for mutations and hides other sites', async () => {
    const readOnly = await scopedKey(h, [{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const r = await post(base(M2), { name: 'ro', exe_path: '/bin/true' }, readOnly);
    expect(r.statusCode).toBe(403);
    expect(r.json().code).toBe('scope_insufficient');
    const machineWrite = await scopedKey(h, [{ resource: 'machine', id: M2, permissions: ['write'] }]);
    expect((await post(base(M2), { name: 'mw', exe_path: '/bin/true' }, machineWrite)).statusCode).toBe(201);
    const other = await h.other();
    expect((await h.request({ method: 'GET', url: base(M2), key: other.apiKey })).statusCode).toBe(404);
    expect((await h.request({ method: 'POST', url: base(M2), body: { name: 'n', exe_path: '/bin/true' } })).json().code).toBe(
      'idempotency_key_required',
    );
  });
});

describe('the agent runs managed processes for real', () => {
  it('starts an always process, relaunches it after a crash, stops it gracefully, starts and kills it', async () => {
    const p = (
      await post(base(), { name: 'sleeper', exe_path: '/bin/sh', file_path: '-c "sleep 60"', launch_mode: 'always', relaunch_attempts: 2 })
    ).json();
    const first = await waitFor('the process running', async () => {
      const l = await live(p.processId);
      return l && l.status === 'running' && l.pid ? l : undefined;
    });
    expect(alive(first.pid!)).toBe(true);
    expect(first.responsive).toBe(true);

    // Crash: the process dies without the agent asking; the agent relaunches it.
    process.kill(first.pid!, 'SIGKILL');
    const second = await waitFor('the process relaunched', async () => {
      const l = await live(p.processId);
      return l && l.status === 'running' && l.pid && l.pid !== first.pid ? l : undefined;
    });
    expect(second.restarts).toBe(1);

    // Stop: graceful, the process ends and stays stopped.
    const stop = await post(`${base()}/${p.processId}/stop`);
    expect(stop.statusCode).toBe(202);
    expect(stop.json()).toMatchObject({ status: 'pending', type: 'stop_process', processId: p.processId });
    expect((await commandDone(stop.json().commandId)).status).toBe('completed');
    await waitFor('the process stopped', async () => (await live(p.processId))?.status === 'stopped');
    expect(alive(second.pid!)).toBe(false);

    // Start, then kill.
    const start = await post(`${base()}/${p.processId}/start`);
    expect((await commandDone(start.json().commandId)).status).toBe('completed');
    const third = await waitFor('the process running again', async () => {
      const l = await live(p.processId);
      return l && l.status === 'running' && l.pid ? l : undefined;
    });
    const kill = await post(`${base()}/${p.processId}/kill`);
    expect((await commandDone(kill.json().commandId)).status).toBe('completed');
    await waitFor('the process stopped after kill', async () => (await live(p.processId))?.status === 'stopped');
    expect(alive(third.pid!)).toBe(false);
    await h.request({ method: 'DELETE', url: `${base()}/${p.processId}`, idempotencyKey: true });
  });

  it('kills a process that ignores the graceful stop after the grace time, and gives up after relaunch_attempts crashes', async () => {
    const stubborn = (
      await post(base(), {
        name: 'stubborn',
        exe_path: '/bin/sh',
        file_path: `-c "trap '' TERM; while true; do sleep 0.1; done"`,
        launch_mode: 'always',
      })
    ).json();
    const l = await waitFor('the stubborn process running', async () => {
      const x = await live(stubborn.processId);
      return x && x.status === 'running' && x.pid ? x : undefined;
    });
    const restart = await post(`${base()}/${stubborn.processId}/restart`);
    expect((await commandDone(restart.json().commandId)).status).toBe('completed');
    expect(alive(l.pid!)).toBe(false); // SIGTERM ignored: killed after the grace time
    const after = await waitFor('the stubborn process relaunched', async () => {
      const x = await live(stubborn.processId);
      return x && x.status === 'running' && x.pid && x.pid !== l.pid ? x : undefined;
    });
    expect(alive(after.pid!)).toBe(true);
    await h.request({ method: 'DELETE', url: `${base()}/${stubborn.processId}`, idempotencyKey: true });
    await waitFor('the relaunched process gone', async () => !alive(after.pid!));

    const crasher = (
      await post(base(), { name: 'crasher', exe_path: '/bin/sh', file_path: '-c "exit 7"', launch_mode: 'always', relaunch_attempts: 2 })
    ).json();
    const failed = await waitFor('the crasher failed', async () => {
      const x = await live(crasher.processId);
      return x && x.status === 'failed' ? x : undefined;
    });
    expect(failed.restarts).toBe(2);
    await h.request({ method: 'DELETE', url: `${base()}/${crasher.processId}`, idempotencyKey: true });
  });

  it('runs a scheduled process only inside its block, in the site time zone', async () => {
    const now = new Date();
    const day = ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'][now.getUTCDay()];
    const hhmm = (d: Date) => `${String(d.getUTCHours()).padStart(2, '0')}:${String(d.getUTCMinutes()).padStart(2, '0')}`;
    const later = new Date(now.getTime() + 3 * 3600_000);
    const p = (
      await post(base(), {
        name: 'scheduled',
        exe_path: '/bin/sh',
        file_path: '-c "sleep 60"',
        launch_mode: 'scheduled',
        schedules: [{ days: [day], start: hhmm(later), end: hhmm(new Date(later.getTime() + 3600_000)) }],
      })
    ).json();
    await new Promise((r) => setTimeout(r, 600));
    expect((await live(p.processId))?.status ?? 'stopped').toBe('stopped');
    // A block open now (it spans the current minute): the agent starts it on its next config read.
    const open = {
      days: ['mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun'],
      start: hhmm(new Date(now.getTime() - 3600_000)),
      end: hhmm(later),
    };
    expect((await post(`${base()}/${p.processId}/schedule`, { mode: 'scheduled', blocks: [open] })).statusCode).toBe(200);
    const running = await waitFor('the process running', async () => {
      const x = await live(p.processId);
      return x && x.status === 'running' && x.pid ? x : undefined;
    });
    expect((await post(`${base()}/${p.processId}/schedule`, { mode: 'off' })).statusCode).toBe(200);
    await waitFor('the process stopped', async () => (await live(p.processId))?.status === 'stopped');
    expect(alive(running.pid!)).toBe(false);
    await h.request({ method: 'DELETE', url: `${base()}/${p.processId}`, idempotencyKey: true });
  });
});

describe('classic installs suppress projects', () => {
  it('keeps a managed process named in suppress_projects stopped, not relaunched, while the install runs, then runs it again', async () => {
    const log = path.join(tmpRoot, 'suppress.log');
    const p = (
      await post(base(M2), {
        name: 'suppressed-app',
        exe_path: '/bin/sh',
        file_path: `-c "echo start >> ${log}; exec sleep 60"`,
        launch_mode: 'always',
      })
    ).json();
    const before = await waitFor('the process running on M2', async () => {
      const x = await live(p.processId, M2);
      return x && x.status === 'running' && x.pid ? x : undefined;
    });
    // The installer logs around a 1 s run; the supervisor (tick 50 ms) would relaunch the process within it.
    const inst = installers.add('suppress.sh', `#!/bin/sh\necho install-begin >> ${log}\nsleep 1\necho install-end >> ${log}\n`);
    const commandId = `cmd_suppress_${Date.now()}`;
    const params: ClassicCommandParams = {
      deploymentId: 'dep_suppress',
      installer_url: inst.url,
      installer_name: 'suppress.sh',
      silent_flags: '',
      verify_path: null,
      sha256: inst.sha256,
      close_processes: [],
      suppress_projects: ['Suppressed-App'],
      timeout_seconds: 60,
      attempt: 1,
    };
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, created_by, expires_at)
       VALUES ($1, $2, $3, 'classic_install', 'pending', $4, 'test', now() + INTERVAL '10 minutes')`,
      [h.siteId, M2, commandId, JSON.stringify(params)],
    );
    expect((await commandDone(commandId, M2)).status).toBe('completed');
    const after = await waitFor('the process running with a new pid', async () => {
      const x = await live(p.processId, M2);
      return x && x.status === 'running' && x.pid && x.pid !== before.pid ? x : undefined;
    });
    expect(alive(before.pid!)).toBe(false);
    expect(alive(after.pid!)).toBe(true);
    // Stopped before the installer began, not launched while it ran, launched again after it ended.
    const lines = (await fs.readFile(log, 'utf8')).trim().split('\n');
    expect(lines).toEqual(['start', 'install-begin', 'install-end', 'start']);
    expect(after.restarts).toBe(0);
    await h.request({ method: 'DELETE', url: `${base(M2)}/${p.processId}`, idempotencyKey: true });
  });
});

describe('config reads', () => {
  it('re-reads GET /api/agent/processes only when the heartbeat answers a new processConfigStamp', async () => {
    const agent = fleet.agent(M2)!;
    const stamps: string[] = [];
    const onBeat = (r: { processConfigStamp?: string }) => stamps.push(r.processConfigStamp ?? '');
    agent.on('heartbeat', onBeat);
    const beats = (n: number) =>
      new Promise<void>((resolve) => {
        let left = n;
        const f = () => {
          if (--left === 0) {
            agent.off('heartbeat', f);
            resolve();
          }
        };
        agent.on('heartbeat', f);
      });
    try {
      // Nothing changes: several heartbeats (each 300 ms; processSyncMs is 200 ms) and no read. A read the
      // previous tests' changes still owed may land first, so wait for a quiet window.
      let reads: number;
      do {
        reads = agent.stats.processConfigReads;
        stamps.length = 0;
        await beats(4);
      } while (agent.stats.processConfigReads !== reads);
      expect(new Set(stamps).size).toBe(1);

      // A new config: the stamp changes and the agent reads once, then knows the process (and reports it).
      const res = await post(base(M2), { name: 'stamp-probe', exe_path: '/bin/true' });
      expect(res.statusCode).toBe(201);
      const { processId } = res.json();
      await waitFor('a live report on M2', async () => (await live(processId, M2)) ?? undefined);
      expect(agent.stats.processConfigReads).toBeGreaterThan(reads);
      expect(new Set(stamps).size).toBeGreaterThan(1);
      await h.request({ method: 'DELETE', url: `${base(M2)}/${processId}`, idempotencyKey: true });
    } finally {
      agent.off('heartbeat', onBeat);
    }
  });
});

describe('machine commands on the reference agent', () => {
  it('uploads a real PNG rendered from the machine state for capture_screenshot', async () => {
    const res = await post(`/api/sites/${h.siteId}/machines/${M2}/commands`, { type: 'capture_screenshot' });
    expect(res.statusCode).toBe(202);
    const done = await commandDone(res.json().commandId, M2);
    expect(done.status).toBe('completed');
    const png = Buffer.from(await (await fetch(done.screenshotUrl)).arrayBuffer());
    const img = PNG.sync.read(png);
    expect([img.width, img.height]).toEqual([320, 200]);
  });

  it('reboots after its delay and shuts down: flags shown, offline during the downtime, back with managed processes relaunched', async () => {
    const p = (await post(base(M2), { name: 'survivor', exe_path: '/bin/sh', file_path: '-c "sleep 60"', launch_mode: 'always' })).json();
    const before = await waitFor('the process running on M2', async () => {
      const x = await live(p.processId, M2);
      return x && x.status === 'running' && x.pid ? x : undefined;
    });
    const machine = async () => (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${M2}` })).json();
    const queued = Date.now();
    const res = await post(`/api/sites/${h.siteId}/machines/${M2}/commands`, { type: 'reboot_machine', params: { delaySeconds: 1 } });
    expect(res.statusCode).toBe(202);
    // Meanwhile the other machine shuts down (no delay) and comes back the same way.
    const shut = await post(`/api/sites/${h.siteId}/machines/${M}/commands`, { type: 'shutdown_machine' });
    expect(shut.statusCode).toBe(202);
    const other = async () => (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${M}` })).json();
    await waitFor('the other machine shutting down', async () => (await other()).shuttingDown === true);
    await waitFor('the machine rebooting', async () => (await machine()).rebooting === true);
    const done = await commandDone(res.json().commandId, M2);
    expect(done.status).toBe('completed');
    expect(new Date(done.completedAt).getTime() - queued).toBeGreaterThanOrEqual(1000); // the delay was honoured
    await waitFor('the process ended by the reboot', async () => !alive(before.pid!)); // processes end with the "reboot"
    // Offline during the downtime: the heartbeat that brings it back finds it stale and records machine.online
    // (db/machines.ts recordHeartbeat), which a machine seen live throughout never gets. (Polling for
    // online === false instead races the short offline window on a loaded machine.)
    await waitFor('machine.online after the reboot', async () => {
      const { rows } = await h.deps.db.query(
        `SELECT 1 FROM events WHERE site_id = $1 AND type = 'machine.online' AND data->>'machineId' = $2 AND occurred_at > $3`,
        [h.siteId, M2, new Date(queued)],
      );
      return rows.length > 0;
    });
    const back = await waitFor('the machine back online', async () => {
      const m = await machine();
      return m.online && !m.rebooting ? m : undefined;
    });
    expect(back.rebooting).toBe(false);
    const after = await waitFor('the process relaunched after the reboot', async () => {
      const x = await live(p.processId, M2);
      return x && x.status === 'running' && x.pid && x.pid !== before.pid ? x : undefined;
    });
    expect(alive(after.pid!)).toBe(true);
    expect((await commandDone(shut.json().commandId, M)).status).toBe('completed');
    await waitFor('the other machine back online', async () => {
      const m = await other();
      return m.online && !m.shuttingDown;
    });
    await h.request({ method: 'DELETE', url: `${base(M2)}/${p.processId}`, idempotencyKey: true });
  });

  it('comes back from a reboot when the API is unreachable at the moment of the restart: it waits the outage out and heartbeats again', async () => {
    // The agent reaches the API through a proxy, cut after the reboot was reported and before the restart's
    // first heartbeat, and restored well after the few tries a plain start() makes (agent/agent.ts boot).
    const proxy = await startTcpProxy(Number(new URL(apiUrl).port));
    const machineId = 'proc-outage';
    const agent = new Agent({
      baseUrl: `http://127.0.0.1:${proxy.port}`,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId,
      rootDir: path.join(tmpRoot, machineId),
      heartbeatMs: 300,
      pollWaitSeconds: 1,
      processSyncMs: 200,
      processTickMs: 50,
      rebootDowntimeMs: 500,
    });
    const outcomes: CommandOutcome[] = [];
    const warnings: string[] = [];
    let restarts = 0;
    let beatsAfterOutage = 0;
    let outage = false;
    agent.on('command', (o: CommandOutcome) => {
      outcomes.push(o);
      // Reported completed: the agent is now offline for its downtime; the API goes away before it restarts.
      if (o.type === 'reboot_machine') {
        outage = true;
        void proxy.down();
      }
    });
    agent.on('warn', (m: string) => warnings.push(m));
    agent.on('restarted', () => restarts++);
    agent.on('heartbeat', () => {
      if (outage && restarts > 0) beatsAfterOutage++;
    });
    try {
      await agent.start();
      const res = await post(`/api/sites/${h.siteId}/machines/${machineId}/commands`, {
        type: 'reboot_machine',
        params: { delaySeconds: 0 },
      });
      expect(res.statusCode).toBe(202);
      const commandId = res.json().commandId;
      await waitFor('the restart', () => restarts > 0, 10_000);
      // Longer than the few tries a plain start() makes (~3 s): the restart must not give up meanwhile.
      await new Promise((r) => setTimeout(r, 5000));
      expect(warnings.filter((w) => w.startsWith('reboot restart failed'))).toEqual([]);
      expect(warnings.some((w) => w.startsWith('heartbeat after restart failed, retrying'))).toBe(true);
      expect(beatsAfterOutage).toBe(0);
      await proxy.up();
      await waitFor('heartbeats after the outage', () => beatsAfterOutage >= 2, 20_000);
      expect(agent.running).toBe(true);
      const m = (await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${machineId}` })).json();
      expect(m).toMatchObject({ online: true, rebooting: false });
      // The reboot was reported completed once, and is not run again after the restart.
      expect((await commandDone(commandId, machineId)).status).toBe('completed');
      expect(outcomes.filter((o) => o.commandId === commandId)).toEqual([expect.objectContaining({ status: 'completed' })]);
      expect(restarts).toBe(1);
    } finally {
      await agent.stop();
      await proxy.close();
    }
  });

  it('does not wait out a refusal at the restart: a token revoked during the downtime ends the restart at once, with the 401', async () => {
    const machineId = 'proc-revoked';
    const rootDir = path.join(tmpRoot, machineId);
    const opts = { baseUrl: apiUrl, siteId: h.siteId, machineId, rootDir, heartbeatMs: 300, pollWaitSeconds: 1, rebootDowntimeMs: 2000 };
    const enrolled = new Agent({ ...opts, enrolmentSecret: secret });
    await enrolled.start();
    await enrolled.stop();
    // As the installed service runs it (agent/service.ts): the saved token and no secret, so a refused token is final.
    const agent = new Agent({ ...opts, enrolmentSecret: '' });
    const refusals: Array<{ message: string; err: unknown }> = [];
    agent.on('warn', (message: string, err?: unknown) => {
      if (message.startsWith('reboot restart failed')) refusals.push({ message, err });
    });
    agent.on('command', (o: CommandOutcome) => {
      // Enrolling the machine again during the downtime revokes the agent's token.
      if (o.type === 'reboot_machine')
        void h.request({
          method: 'POST',
          url: '/api/agent/enrol',
          key: null,
          body: { siteId: h.siteId, enrolmentSecret: secret, machineId, hostname: machineId, agentVersion: '1.0.0' },
        });
    });
    try {
      await agent.start();
      const res = await post(`/api/sites/${h.siteId}/machines/${machineId}/commands`, {
        type: 'reboot_machine',
        params: { delaySeconds: 0 },
      });
      expect(res.statusCode).toBe(202);
      const [refused] = await waitFor('the refused restart', () => (refusals.length > 0 ? refusals : undefined), 10_000);
      expect(refused.err).toMatchObject({ status: 401 });
      expect(agent.running).toBe(false);
    } finally {
      await agent.stop();
    }
  });
});
