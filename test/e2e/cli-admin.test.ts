/**
 * The `roost` CLI for the families cli-families.test.ts leaves out (sites, users, conversations, installer
 * templates, classic deployments, managed processes), run as a person runs it: the real binary
 * (bin/roost.js) as a child process against a real API on a port (PostgreSQL, Azurite, Temporal, a worker for
 * the user-delete cascade and classic deployments, and two reference agents that really run installers from
 * an HTTPS server and managed processes as child processes). For each family: the
 * happy path with `--json` parsed, human output, and refused requests showing their problem code, request
 * id and exit code (cli/context.ts EXIT: 1 failure, 2 usage, 3 conflict, 4 not found, 5 auth).
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { cliRunner, ROOST_BIN } from '../support/cli';
import { createHarness, type Harness } from '../support/harness';
import { makeUser, scopedKey } from '../support/identity';
import { type InstallerServer, installerScript, startInstallerServer } from '../support/installers';
import { startTestWorker, type TestWorker } from '../integration/rollout-fixtures';
import { closeWorkerConnections } from '../../worker/worker';
import { startFleet, type Fleet } from '../../agent/fleet';
import { MockLanguageModelV3 } from 'ai/test';
import type { LanguageModelV3StreamPart } from '@ai-sdk/provider';

// About 100 CLI processes (each starts Node and tsx) and a real install and process run: on a loaded CI
// machine one test takes well over a minute, so this file allows 5 minutes per test and hook.
jest.setTimeout(300_000);

let h: Harness;
let w: TestWorker;
let api: string;
let tmp: string;
let member: { siteId: string; userId: string; apiKey: string };

/** `roost …` with the site's (superadmin) key and site unless overridden, and a private config file. */
const { roost, json, human, refused } = cliRunner(() => ({
  ROOST_API_URL: api,
  ROOST_API_KEY: h.apiKey,
  ROOST_SITE_ID: h.siteId,
  ROOST_CONFIG: path.join(tmp, 'config.json'),
  ROOST_ID_TOKEN: undefined,
}));

const tag = () => randomBytes(4).toString('hex');

beforeAll(async () => {
  h = await createHarness({ ROOST_CLASSIC_POLL_MS: '100' });
  w = await startTestWorker(h, 'cli-admin-test-worker');
  api = await h.listen();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-cli-admin-'));
  member = await h.other(); // a plain member of its own site
});

afterAll(async () => {
  await w?.stop();
  await closeWorkerConnections();
  await h?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('roost sites', () => {
  it('creates, shows, updates and lists a site and its members', async () => {
    const name = `cli-site-${tag()}`;
    const created = await json(['sites', 'create', name, '--timezone', 'Europe/Berlin', '--deploy-quota', '7']);
    expect(created).toMatchObject({ name, owner: h.userId, timezone: 'Europe/Berlin', deployQuota: 7, roostEnabled: true });
    expect(await json(['sites', 'show', created.siteId])).toEqual(created);
    const updated = await json(['sites', 'update', created.siteId, '--roost-enabled', 'false', '--timezone', 'UTC']);
    expect(updated).toMatchObject({ siteId: created.siteId, roostEnabled: false, timezone: 'UTC', deployQuota: 7 });
    // Without an argument show and members act on --site.
    expect((await json(['sites', 'show'])).siteId).toBe(h.siteId);
    const members = await json(['sites', 'members']);
    expect(members.members).toContainEqual(expect.objectContaining({ uid: h.userId, isOwner: true }));
    const list = await json(['sites', 'list', '--all']);
    expect(list.sites.map((s: { siteId: string }) => s.siteId)).toEqual(expect.arrayContaining([h.siteId, created.siteId]));
    expect(list.next_page_token).toBe('');
    expect(await human(['sites', 'show', created.siteId])).toMatch(
      new RegExp(`^${created.siteId} ${name}\\n[\\s\\S]*roostEnabled\\s+false`),
    );
    expect(await human(['sites', 'members'])).toMatch(/^UID\s+EMAIL\s+ROLE\s+OWNER/);
  });

  it('refuses a bad time zone (2, before any request), a taken name (3), an unknown site (4), a member creating one (5) and nothing to change (2)', async () => {
    const tz = await refused(['sites', 'create', `cli-tz-${tag()}`, '--timezone', 'Mars/Olympus'], 2, 'usage_error');
    expect(tz.detail).toMatch(/--timezone Mars\/Olympus is not an IANA time zone/);
    const name = `cli-dup-${tag()}`;
    await json(['sites', 'create', name]);
    await refused(['sites', 'create', name], 3, 'conflict');
    await refused(['sites', 'show', `site_${'0'.repeat(24)}`], 4, 'not_found');
    await refused(['sites', 'create', `cli-m-${tag()}`], 5, 'forbidden', { ROOST_API_KEY: member.apiKey });
    await refused(['sites', 'update', h.siteId], 2, 'usage_error');
  });
});

describe('roost users', () => {
  it('lists, shows, promotes, demotes, assigns and removes sites, and deletes a user with a successor, waiting for the cascade', async () => {
    const u = await makeUser(h.deps.db);
    const shown = await json(['users', 'show', u.uid]);
    expect(shown).toMatchObject({ uid: u.uid, email: u.email, role: 'member', siteIds: [], deleted: false, deletion: null });

    expect(await json(['users', 'promote', u.uid, 'admin'])).toMatchObject({ previousRole: 'member', role: 'admin', changed: true });
    expect(await json(['users', 'promote', u.uid, 'admin'])).toMatchObject({ role: 'admin', changed: false });
    const owned = await json(['sites', 'create', `cli-owned-${tag()}`, '--owner', u.uid]);

    const assigned = await json(['users', 'assign-sites', u.uid, h.siteId]);
    expect(assigned.addedSiteIds).toEqual([h.siteId]);
    const listed = await json(['users', 'list', '--member-of', h.siteId, '--role', 'admin', '--all']);
    expect(listed.users.map((x: { uid: string }) => x.uid)).toContain(u.uid);
    expect(await human(['users', 'list', '--member-of', owned.siteId])).toMatch(
      new RegExp(`^UID\\s+EMAIL[^\\n]*\\n${u.uid}\\s+${u.email}\\s+admin`),
    );
    expect(await json(['users', 'remove-sites', u.uid, h.siteId])).toMatchObject({ removedSiteIds: [h.siteId], cancelledCommandCount: 0 });
    // An owner must stay an admin or a superadmin: demoting one is a conflict (3) naming the site.
    const owner = await refused(['users', 'demote', u.uid], 3, 'conflict');
    expect(owner.ownedSiteIds).toEqual([owned.siteId]);

    // Owning a site without a successor is refused (3); with one the cascade moves the site.
    await refused(['users', 'delete', u.uid], 3, 'orphan_sites');
    const deleted = await json(['users', 'delete', u.uid, '--successor', h.userId, '--wait', '--timeout', '120']);
    expect(deleted).toMatchObject({
      uid: u.uid,
      deleted: true,
      alreadyDeleted: false,
      deletion: { status: 'completed', successorUid: h.userId },
    });
    expect(deleted.deletion.sitesTransferred).toEqual([owned.siteId]);
    expect((await json(['sites', 'show', owned.siteId])).owner).toBe(h.userId);
    expect((await json(['users', 'delete', u.uid])).alreadyDeleted).toBe(true);
    const gone = await json(['users', 'list', '--member-of', owned.siteId, '--include-deleted', '--all']);
    expect(gone.users).toContainEqual(expect.objectContaining({ uid: u.uid, deleted: true }));
  });

  it('refuses an unknown site (1, unknown_site), an unknown user (4), a bad role (2), a member (5) and a key without user scope (5)', async () => {
    const u = await makeUser(h.deps.db);
    const unknown = `site_${'f'.repeat(24)}`;
    const p = await refused(['users', 'assign-sites', u.uid, `${h.siteId},${unknown}`], 1, 'unknown_site');
    expect(JSON.stringify(p)).toContain(unknown);
    expect((await json(['users', 'show', u.uid])).siteIds).toEqual([]); // all or nothing
    await refused(['users', 'show', `usr_${'0'.repeat(24)}`], 4, 'not_found');
    await refused(['users', 'promote', u.uid, 'member'], 2, 'usage_error');
    await refused(['users', 'list', '--role', 'owner'], 2, 'usage_error');
    await refused(['users', 'list'], 5, 'forbidden', { ROOST_API_KEY: member.apiKey });
    const siteOnly = await scopedKey(h, [{ resource: 'site', id: '*', permissions: ['read', 'write', 'admin'] }]);
    const denied = await refused(['users', 'demote', u.uid], 5, 'scope_insufficient', { ROOST_API_KEY: siteOnly });
    expect(denied.required).toMatchObject({ resource: 'user', permission: 'admin' });
  });
});

describe('roost conversations', () => {
  it('creates a conversation, streams a reply to stdout, shows it, renames, deletes and restores it', async () => {
    const c = await json(['conversations', 'create', '--title', 'fleet check']);
    expect(c).toMatchObject({ siteId: h.siteId, machineId: null, title: 'fleet check', messageCount: 0 });

    const streamed = await roost(['conversations', 'send', c.conversationId, 'Which machines are offline?']);
    expect({ code: streamed.code, stderr: streamed.stderr }).toEqual({ code: 0, stderr: '' });
    expect(streamed.stdout.trim().length).toBeGreaterThan(0);
    const viaStdin = await json(['conversations', 'send', c.conversationId, '-'], {}, 'List the machines\n');
    expect(viaStdin).toMatchObject({ conversationId: c.conversationId, messageId: expect.any(String), content: expect.any(String) });
    expect(viaStdin.content.length).toBeGreaterThan(0);

    const shown = await json(['conversations', 'show', c.conversationId]);
    expect(shown.messageCount).toBe(4);
    expect(shown.messages.map((m: { role: string }) => m.role)).toEqual(['user', 'assistant', 'user', 'assistant']);
    // What the CLI printed as it streamed is the stored reply, frame for frame.
    const reply = shown.messages[1];
    expect(reply.status).toBe('complete');
    expect(streamed.stdout).toBe(reply.content.endsWith('\n') ? reply.content : `${reply.content}\n`);
    expect(shown.messages[3]).toMatchObject({ messageId: viaStdin.messageId, content: viaStdin.content, status: 'complete' });
    // The piped message is stored without the line ending that ended it.
    expect(shown.messages[2].content).toBe('List the machines');
    expect(await human(['conversations', 'show', c.conversationId])).toContain('Which machines are offline?');

    expect((await json(['conversations', 'rename', c.conversationId, 'renamed'])).title).toBe('renamed');
    const listed = await json(['conversations', 'list', '--all']);
    expect(listed.conversations).toContainEqual(expect.objectContaining({ conversationId: c.conversationId, title: 'renamed' }));
    const del = await json(['conversations', 'delete', c.conversationId]);
    expect(del).toMatchObject({ deleted: true, alreadyDeleted: false, recoverableUntil: expect.any(String) });
    expect((await json(['conversations', 'list', '--all'])).conversations.map((x: any) => x.conversationId)).not.toContain(
      c.conversationId,
    );
    const withDeleted = await json(['conversations', 'list', '--include-deleted', '--all']);
    expect(withDeleted.conversations).toContainEqual(
      expect.objectContaining({ conversationId: c.conversationId, deletedAt: del.deletedAt }),
    );
    expect(await json(['conversations', 'restore', c.conversationId])).toMatchObject({ restored: true, deletedAt: null });
  });

  it('prints each delta the moment it arrives, and exits 1 with reply_failed and the text so far on an error frame', async () => {
    // A scripted model (the API's deps.cortexModel) that holds its stream open after the first delta until the
    // CLI has printed it: a CLI that buffered the reply would never see the release.
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let fail = false;
    const finish: LanguageModelV3StreamPart = {
      type: 'finish',
      finishReason: { unified: 'stop', raw: 'stop' },
      usage: {
        inputTokens: { total: 3, noCache: 3, cacheRead: undefined, cacheWrite: undefined },
        outputTokens: { total: 2, text: 2, reasoning: undefined },
      },
    };
    h.deps.cortexModel = new MockLanguageModelV3({
      doStream: async () => ({
        stream: new ReadableStream<LanguageModelV3StreamPart>({
          async start(c) {
            c.enqueue({ type: 'stream-start', warnings: [] });
            c.enqueue({ type: 'text-start', id: 't' });
            c.enqueue({ type: 'text-delta', id: 't', delta: 'first part, ' });
            if (fail) {
              c.enqueue({ type: 'error', error: new Error('model server exploded') });
              return c.close();
            }
            await released;
            c.enqueue({ type: 'text-delta', id: 't', delta: 'second part' });
            c.enqueue({ type: 'text-end', id: 't' });
            c.enqueue(finish);
            c.close();
          },
        }),
      }),
    });
    try {
      const c = await json(['conversations', 'create']);
      const child = spawn(process.execPath, [ROOST_BIN, 'conversations', 'send', c.conversationId, 'hello'], {
        env: {
          ...process.env,
          ROOST_API_URL: api,
          ROOST_API_KEY: h.apiKey,
          ROOST_SITE_ID: h.siteId,
          ROOST_CONFIG: path.join(tmp, 'config.json'),
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
      for (const deadline = Date.now() + 60_000; !stdout.includes('first part, ');) {
        if (Date.now() > deadline) throw new Error(`the first delta never reached stdout: ${stderr}`);
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect(stdout).toBe('first part, ');
      release();
      expect({ code: await exited, stdout, stderr }).toEqual({ code: 0, stdout: 'first part, second part\n', stderr: '' });

      fail = true;
      const broken = await roost(['conversations', 'send', c.conversationId, 'again']);
      expect(broken).toMatchObject({ code: 1, stdout: 'first part, \n' });
      expect(broken.stderr).toContain('error: reply_failed: ');
      const p = await refused(['conversations', 'send', c.conversationId, 'and again'], 1, 'reply_failed');
      expect(p).toMatchObject({ conversationId: c.conversationId, messageId: expect.any(String), content: 'first part, ' });
    } finally {
      h.deps.cortexModel = undefined;
    }
  });

  it('refuses an unknown conversation (4), a malformed id (1), an empty message (2) and a key without chat write (5)', async () => {
    await refused(['conversations', 'show', `cnv_${'0'.repeat(24)}`], 4, 'not_found');
    await refused(['conversations', 'send', `cnv_${'0'.repeat(24)}`, 'hello'], 4, 'not_found');
    await refused(['conversations', 'show', 'not-a-conversation'], 1, 'validation_failed');
    const c = await json(['conversations', 'create']);
    await refused(['conversations', 'send', c.conversationId, '-'], 2, 'usage_error');
    const reader = await scopedKey(h, [
      { resource: 'site', id: '*', permissions: ['read'] },
      { resource: 'chat', id: '*', permissions: ['read'] },
    ]);
    expect((await json(['conversations', 'list'], { ROOST_API_KEY: reader })).siteId).toBe(h.siteId);
    const denied = await refused(['conversations', 'send', c.conversationId, 'hello'], 5, 'scope_insufficient', { ROOST_API_KEY: reader });
    expect(denied.required).toMatchObject({ resource: 'chat', permission: 'write' });
  });
});

describe('roost templates', () => {
  it('creates, shows, updates (clearing nullable fields), lists and deletes an installer template', async () => {
    const t = await json([
      'templates',
      'create',
      'kiosk',
      '--url',
      'https://files.example.com/kiosk.msi',
      '--installer',
      'kiosk.msi',
      '--flags',
      '/qn',
      '--verify-path',
      'C:\\Apps\\kiosk.exe',
      '--close',
      'kiosk.exe,helper.exe',
      '--timeout',
      '600',
    ]);
    expect(t).toMatchObject({
      name: 'kiosk',
      verify_path: 'C:\\Apps\\kiosk.exe',
      close_processes: ['kiosk.exe', 'helper.exe'],
      timeout_seconds: 600,
    });
    expect(await json(['templates', 'show', t.templateId])).toEqual(t);
    const updated = await json(['templates', 'update', t.templateId, '--name', 'kiosk 2', '--no-timeout', '--no-verify-path']);
    expect(updated).toMatchObject({ name: 'kiosk 2', timeout_seconds: null, verify_path: null, silent_flags: '/qn' });
    expect(await human(['templates', 'show', t.templateId])).toMatch(/^itp_\S+ kiosk 2\n[\s\S]*time limit\s+-/);
    const second = await json(['templates', 'create', 'other', '--url', 'https://files.example.com/o.exe', '--installer', 'o.exe']);
    const firstPage = await json(['templates', 'list', '--page-size', '1']);
    expect(firstPage.templates.map((x: { templateId: string }) => x.templateId)).toEqual([second.templateId]);
    expect(firstPage.next_page_token).not.toBe('');
    const all = await json(['templates', 'list', '--page-size', '1', '--all']);
    expect(all.templates.map((x: { templateId: string }) => x.templateId)).toEqual(
      expect.arrayContaining([t.templateId, second.templateId]),
    );
    expect(await json(['templates', 'delete', t.templateId])).toMatchObject({ templateId: t.templateId, deleted: true });
    await refused(['templates', 'show', t.templateId], 4, 'not_found');
    await refused(['templates', 'update', second.templateId], 2, 'usage_error');
    await refused(['templates', 'update', second.templateId, '--url', 'ftp://x'], 1, 'validation_failed');
  });
});

describe('roost deployments and roost processes, with real agents', () => {
  let server: InstallerServer;
  let fleet: Fleet;
  let m1: string;
  let m2: string;

  beforeAll(async () => {
    server = await startInstallerServer();
    fleet = await startFleet({
      baseUrl: api,
      siteId: h.siteId,
      enrolmentSecret: await h.enrolmentSecret(),
      count: 2,
      machinePrefix: `cli-${tag()}-`,
      rootDir: path.join(tmp, 'fleet'),
      pollWaitSeconds: 1,
      heartbeatMs: 300,
      progressIntervalMs: 50,
      perAgent: () => ({ installerCa: server.ca, closeGraceMs: 500, processSyncMs: 200, processTickMs: 50, stopGraceMs: 700 }),
    });
    [m1, m2] = fleet.machineIds;
  });
  afterAll(async () => {
    await fleet?.stop();
    await server?.close();
  });

  it('installs from a template on two machines (--wait), lists and shows it, uninstalls it (--wait) and deletes the record', async () => {
    const installs = path.join(tmp, 'installs');
    const inst = server.add('cli-setup.sh', installerScript({ marker: path.join(tmp, 'runs.log'), installs }));
    const t = await json([
      'templates',
      'create',
      `cli-deploy-${tag()}`,
      '--url',
      inst.url,
      '--installer',
      'setup.sh',
      '--flags',
      '/S',
      '--timeout',
      '60',
    ]);

    const r = await roost([
      'deployments',
      'create',
      'kiosk 1',
      '--template',
      t.templateId,
      '--machines',
      `${m1},${m2}`,
      '--sha256',
      inst.sha256,
      '--parallel',
      '--wait',
      '--json',
    ]);
    if (r.code !== 0) throw new Error(`deployments create exited ${r.code}: ${r.stderr}`);
    const d = JSON.parse(r.stdout);
    expect(d).toMatchObject({
      name: 'kiosk 1',
      status: 'completed',
      parallel_install: true,
      counts: expect.objectContaining({ completed: 2 }),
    });
    expect(r.stderr).toContain(`created classic deployment ${d.deploymentId}`); // progress on stderr, not in the JSON
    expect(fs.readdirSync(installs).sort()).toEqual([m1, m2].sort());

    const listed = await json(['deployments', 'list', '--status', 'completed', '--all']);
    expect(listed.deployments.map((x: { deploymentId: string }) => x.deploymentId)).toContain(d.deploymentId);
    expect(await human(['deployments', 'show', d.deploymentId])).toMatch(
      new RegExp(`^${d.deploymentId}\\s+kiosk 1\\s+completed[\\s\\S]*${m1}\\s+completed`),
    );
    await refused(['deployments', 'retry', d.deploymentId], 3, 'conflict'); // nothing failed

    const un = await json(['deployments', 'uninstall', d.deploymentId, '--wait']);
    expect(un.deployment.status).toBe('uninstalled');
    expect(fs.readdirSync(installs)).toEqual([]);
    expect(await json(['deployments', 'delete', d.deploymentId])).toMatchObject({ deploymentId: d.deploymentId });
    await refused(['deployments', 'show', d.deploymentId], 4, 'not_found');
  });

  it('refuses a deployment without an installer (2), over http (1), to a machine of no site (1)', async () => {
    await refused(['deployments', 'create', 'x', '--machines', m1], 2, 'usage_error');
    const http = await refused(
      ['deployments', 'create', 'x', '--machines', m1, '--url', 'http://files.example.com/a.exe', '--installer', 'a.exe', '--flags', ''],
      1,
      'validation_failed',
    );
    expect(http.status).toBe(400);
    const stranger = await refused(
      [
        'deployments',
        'create',
        'x',
        '--machines',
        'nobody-here',
        '--url',
        'https://files.example.com/a.exe',
        '--installer',
        'a.exe',
        '--flags',
        '',
      ],
      1,
      'validation_failed',
    );
    expect(stranger.detail).toContain('nobody-here');
  });

  it('exits 1 when what --wait followed failed: a deployment whose installer is missing, a process that cannot start', async () => {
    const missing = `${server.add(`cli-present-${tag()}.sh`, '#!/bin/sh\n').url}-absent`;
    const r = await roost([
      'deployments',
      'create',
      `doomed ${tag()}`,
      '--machines',
      m1,
      '--url',
      missing,
      '--installer',
      'setup.sh',
      '--flags',
      '',
      '--wait',
      '--json',
    ]);
    expect(r.code).toBe(1);
    const d = JSON.parse(r.stdout);
    expect(d.status).toBe('failed');
    const shown = await roost(['deployments', 'show', d.deploymentId, '--wait', '--json']);
    expect([shown.code, JSON.parse(shown.stdout).status]).toEqual([1, 'failed']);
    expect((await roost(['deployments', 'show', d.deploymentId, '--json'])).code).toBe(0); // not followed: a plain read

    const p = await json(['processes', 'create', m2, `ghost-${tag()}`, '--exe', '/nonexistent/bin']);
    const started = await roost(['processes', 'start', m2, p.processId, '--wait', '--timeout', '60', '--json']);
    expect(started.code).toBe(1);
    expect(JSON.parse(started.stdout)).toMatchObject({ type: 'start_process', status: 'failed' });
    expect((await roost(['processes', 'delete', m2, p.processId, '--json'])).code).toBe(0);
  });

  it('creates a managed process, starts it on the agent (--wait), stops it, updates, schedules and deletes it', async () => {
    const p = await json(['processes', 'create', m2, 'sleeper', '--exe', '/bin/sh', '--args', '-c "sleep 60"']);
    expect(p).toMatchObject({ name: 'sleeper', exe_path: '/bin/sh', file_path: '-c "sleep 60"' });
    const started = await json(['processes', 'start', m2, p.processId, '--wait', '--timeout', '60']);
    expect(started).toMatchObject({ type: 'start_process', status: 'completed' });
    // The agent reports the live state on its next process sync (ROOST processSyncMs 200 ms).
    const base = `/api/sites/${h.siteId}/machines/${m2}/processes/${p.processId}`;
    for (const deadline = Date.now() + 60_000; ;) {
      const live = (await h.request({ method: 'GET', url: base })).json().live;
      if (live?.status === 'running' && live.pid) break;
      if (Date.now() > deadline) throw new Error(`process never reported running: ${JSON.stringify(live)}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const shown = await json(['processes', 'show', m2, p.processId]);
    expect(shown.live).toMatchObject({ status: 'running', pid: expect.any(Number) });
    expect(await human(['processes', 'list', m2])).toMatch(
      new RegExp(`^PROCESS\\s+NAME[^\\n]*\\n${p.processId}\\s+sleeper\\s+\\S+\\s+running`),
    );
    expect(await json(['processes', 'stop', m2, p.processId, '--wait', '--timeout', '60'])).toMatchObject({
      type: 'stop_process',
      status: 'completed',
    });

    expect(await json(['processes', 'update', m2, p.processId, '--priority', 'high', '--delay', '3'])).toMatchObject({
      priority: 'high',
      time_delay: 3,
    });
    const scheduled = await json([
      'processes',
      'schedule',
      m2,
      p.processId,
      'scheduled',
      '--block',
      'mon,tue@08:00-17:00',
      '--block',
      'sat@22:00-02:00',
    ]);
    expect(scheduled.launch_mode).toBe('scheduled');
    expect(await json(['processes', 'delete', m2, p.processId])).toMatchObject({ alreadyDeleted: false });
    expect(await json(['processes', 'delete', m2, p.processId])).toMatchObject({ alreadyDeleted: true });
    await refused(['processes', 'show', m2, p.processId], 4, 'process_not_found');
  });

  it('refuses a process without --exe (2), a relative exe (1), a bad schedule block (2) and a read-only key (5)', async () => {
    await refused(['processes', 'create', m1, 'x'], 2, 'usage_error');
    await refused(['processes', 'create', m1, 'x', '--exe', 'kiosk.exe'], 1, 'validation_failed');
    await refused(['processes', 'schedule', m1, 'prc_x', 'scheduled', '--block', 'someday'], 2, 'usage_error');
    const readOnly = await scopedKey(h, [
      { resource: 'site', id: '*', permissions: ['read'] },
      { resource: 'machine', id: '*', permissions: ['read'] },
      { resource: 'process', id: '*', permissions: ['read'] },
    ]);
    const denied = await refused(['processes', 'create', m1, 'x', '--exe', '/bin/true'], 5, 'scope_insufficient', {
      ROOST_API_KEY: readOnly,
    });
    expect(denied.required).toMatchObject({ permission: 'write' });
  });
});
