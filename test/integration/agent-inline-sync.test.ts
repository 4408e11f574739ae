/**
 * The compact sync protocol (docs/agent-protocol.md "Inline sync"): `GET /api/agent/commands?inline=sync`
 * hands out each sync_pull with its version answer, small body and chunk URLs; `POST
 * /api/agent/commands/{commandId}` stores a `targetState` with the report in one transaction; the
 * reference agent syncs a 4-file version in one poll, two reports and one GET per chunk, while an agent
 * that does not opt in (inlineSync: false, like agents already deployed) still syncs through the separate
 * routes. Real API over HTTP, PostgreSQL and Azurite; requests are counted by the agents' own dispatchers.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { Agent as UndiciAgent, type Dispatcher } from 'undici';
import { createHarness, type Harness } from '../support/harness';
import { newId, sha256Hex } from '../../domain/hex';
import { CHUNK_SIZE, computeVersionId, type VersionBody, VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName } from '../../storage/blob';
import { Agent } from '../../agent/agent';
import { requestCounters } from '../../agent/http';
import { verifyTree } from '../../agent/fleet';

/** An undici Agent that records `METHOD path` of every request it dispatches. */
class CountingDispatcher extends UndiciAgent {
  readonly calls: string[] = [];
  override dispatch(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandlers): boolean {
    this.calls.push(`${opts.method} ${opts.path}`);
    return super.dispatch(opts, handler);
  }
}

/** A CountingDispatcher that holds every command report `delayMs` before sending it (an API answering slowly). */
class SlowReportsDispatcher extends CountingDispatcher {
  constructor(private readonly delayMs: number) {
    super();
  }
  override dispatch(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandlers): boolean {
    if (opts.method === 'POST' && opts.path.startsWith('/api/agent/commands/')) {
      this.calls.push(`${opts.method} ${opts.path}`);
      setTimeout(() => UndiciAgent.prototype.dispatch.call(this, opts, handler), this.delayMs);
      return true;
    }
    return super.dispatch(opts, handler);
  }
}

/** A CountingDispatcher that holds every heartbeat `delayMs` before sending it (an API answering slowly). */
class SlowHeartbeatsDispatcher extends CountingDispatcher {
  constructor(private readonly delayMs: number) {
    super();
  }
  override dispatch(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandlers): boolean {
    if (opts.method === 'POST' && opts.path === '/api/agent/heartbeat') {
      this.calls.push(`${opts.method} ${opts.path}`);
      setTimeout(() => UndiciAgent.prototype.dispatch.call(this, opts, handler), this.delayMs);
      return true;
    }
    return super.dispatch(opts, handler);
  }
}

let h: Harness;
let baseUrl: string;
let secret: string;
let tmpRoot: string;
let roostId: string;
let v1: string;
const EXTRACT = 'apps/inline';
const files = {
  'app.exe': randomBytes(40_000),
  'lib/core.dll': randomBytes(9_000),
  'data/config.json': Buffer.from('{"mode":"inline"}'),
  'readme.txt': Buffer.from('compact sync'),
};
const agents: Agent[] = [];

beforeAll(async () => {
  h = await createHarness();
  baseUrl = await h.listen();
  secret = await h.enrolmentSecret();
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-inline-sync-'));
  await writeTree(path.join(tmpRoot, 'src'), files);
  const res = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: h.siteId, name: 'inline sync', extractPath: EXTRACT },
  });
  expect(res.statusCode).toBe(201);
  roostId = res.json().roostId;
  v1 = await publish(files);
});
afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop()));
  await h.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

async function writeTree(dir: string, tree: Record<string, Buffer>): Promise<void> {
  for (const [p, data] of Object.entries(tree)) {
    await fs.mkdir(path.dirname(path.join(dir, p)), { recursive: true });
    await fs.writeFile(path.join(dir, p), data);
  }
}

/** Publishes `tree` through the API (chunks put in blob storage first); returns the version id. */
async function publish(tree: Record<string, Buffer>): Promise<string> {
  const entries: VersionBody['files'] = [];
  for (const [p, data] of Object.entries(tree)) {
    const chunks = [];
    for (let off = 0; off < data.length; off += CHUNK_SIZE) {
      const part = Buffer.from(data.subarray(off, Math.min(data.length, off + CHUNK_SIZE)));
      chunks.push({ hash: sha256Hex(part), size: part.length });
      await h.deps.blob.put('chunks', chunkBlobName(h.siteId, sha256Hex(part)), part, 'application/octet-stream');
    }
    entries.push({ path: p, size: data.length, chunks });
  }
  const version: VersionBody = { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'inline.test' }, files: entries };
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    idempotencyKey: true,
    body: { siteId: h.siteId, version },
  });
  expect([200, 201]).toContain(res.statusCode);
  return res.json().versionId;
}

async function insertSyncPull(machineId: string, versionId: string): Promise<string> {
  const commandId = newId('cmd');
  const params = { roostId, versionId, versionNumber: 1, rolloutId: 'rol_inline_test', extractRoot: EXTRACT, attempt: 1 };
  await h.deps.db.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, expires_at)
     VALUES ($1, $2, $3, 'sync_pull', 'pending', $4, now() + INTERVAL '10 minutes')`,
    [h.siteId, machineId, commandId, JSON.stringify(params)],
  );
  return commandId;
}

async function enrol(machineId: string): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: '/api/agent/enrol',
    key: null,
    body: { siteId: h.siteId, enrolmentSecret: secret, machineId, hostname: machineId, agentVersion: '1.0.0' },
  });
  expect(res.statusCode).toBe(201);
  return res.json().agentToken;
}

async function targetState(machineId: string): Promise<Record<string, unknown> | undefined> {
  const { rows } = await h.deps.db.query('SELECT * FROM roost_target_states WHERE site_id = $1 AND machine_id = $2 AND roost_id = $3', [
    h.siteId,
    machineId,
    roostId,
  ]);
  return rows[0];
}

async function commandRow(machineId: string, commandId: string): Promise<Record<string, unknown>> {
  const { rows } = await h.deps.db.query('SELECT * FROM commands WHERE site_id = $1 AND machine_id = $2 AND command_id = $3', [
    h.siteId,
    machineId,
    commandId,
  ]);
  return rows[0];
}

/** Starts a reference agent with counting dispatchers (no heartbeats; progress interval long, so phases are short). */
async function startAgent(
  machineId: string,
  inlineSync: boolean,
  opts: { api?: CountingDispatcher; progressIntervalMs?: number; heartbeatMs?: number; syncDelayMs?: number } = {},
): Promise<{ agent: Agent; api: CountingDispatcher; poll: CountingDispatcher }> {
  const api = opts.api ?? new CountingDispatcher();
  const poll = new CountingDispatcher();
  const agent = new Agent({
    baseUrl,
    siteId: h.siteId,
    enrolmentSecret: secret,
    machineId,
    rootDir: path.join(tmpRoot, 'machines', machineId),
    heartbeatMs: opts.heartbeatMs ?? 0,
    pollWaitSeconds: 5,
    progressIntervalMs: opts.progressIntervalMs ?? 60_000,
    ...(opts.syncDelayMs ? { syncDelayMs: opts.syncDelayMs } : {}),
    fsyncFiles: false,
    inlineSync,
    dispatchers: { api, poll },
  });
  agents.push(agent);
  await agent.start();
  return { agent, api, poll };
}

/** The API calls since `from`, without the managed-process config reads an agent makes at start (agent/processes.ts). */
function syncCalls(d: CountingDispatcher, from: number): string[] {
  return d.calls.slice(from).filter((c) => c !== 'GET /api/agent/processes');
}

const COUNTERS = { chunks_fetched: 4, chunks_total: 4, chunks_dedup: 0, files_total: 4, files_assembled: 4, files_skipped: 0 };

describe('compact sync protocol, end to end', () => {
  it('a compact agent syncs a 4-file version in one poll, two reports and one GET per chunk', async () => {
    const machineId = 'inl-compact';
    const { agent, api, poll } = await startAgent(machineId, true);
    const apiBefore = api.calls.length;
    const blobBefore = requestCounters.blob;
    const commandId = await insertSyncPull(machineId, v1);
    const outcome = await agent.waitForCommand(commandId, 60_000);
    expect(outcome).toMatchObject({ status: 'completed', result: 'success', counters: { ...COUNTERS } });
    // Only this agent fetches blobs in this file meanwhile: one GET per chunk, no body GET.
    expect(requestCounters.blob - blobBefore).toBe(4);
    const reports = syncCalls(api, apiBefore);
    expect(reports).toEqual([`POST /api/agent/commands/${commandId}`, `POST /api/agent/commands/${commandId}`]);
    expect(poll.calls.every((c) => c.startsWith('GET /api/agent/commands?') && c.includes('inline=sync'))).toBe(true);
    expect(await verifyTree(path.join(tmpRoot, 'src'), path.join(agent.rootDir, ...EXTRACT.split('/')))).toEqual([]);
    expect(await targetState(machineId)).toMatchObject({ status: 'committed', reported_version_id: v1, ...COUNTERS });
    expect(await commandRow(machineId, commandId)).toMatchObject({ status: 'completed', result: 'success' });
  });

  it('against an API that answers slowly, a compact agent spaces its reports by ten round trips instead of its interval', async () => {
    const machineId = 'inl-slow';
    // Progress every 20 ms would send a report per chunk and one for `assembling`; each report takes 400 ms,
    // so the gap becomes 4 s (agent/sync.ts REPORT_BACKOFF) and the sync sends its first and last only.
    const { agent, api } = await startAgent(machineId, true, { api: new SlowReportsDispatcher(400), progressIntervalMs: 20 });
    const apiBefore = api.calls.length;
    const commandId = await insertSyncPull(machineId, v1);
    const outcome = await agent.waitForCommand(commandId, 60_000);
    expect(outcome).toMatchObject({ status: 'completed', result: 'success', counters: { ...COUNTERS } });
    expect(syncCalls(api, apiBefore)).toEqual([`POST /api/agent/commands/${commandId}`, `POST /api/agent/commands/${commandId}`]);
    expect(await targetState(machineId)).toMatchObject({ status: 'committed', reported_version_id: v1, ...COUNTERS });
  });

  it("a sync starts its report gap from the agent's last round trip: slow heartbeats mean no early progress report", async () => {
    const machineId = 'inl-slow-beat';
    // Heartbeats take 400 ms (reports are quick), so the agent's last round trip before the sync is ~400 ms
    // and the sync's gap starts at 4 s instead of 20 ms: the 300 ms sync (syncDelayMs) sends its first
    // report and its last, not the `assembling` change it would send 20 ms after the first.
    const { agent, api } = await startAgent(machineId, true, {
      api: new SlowHeartbeatsDispatcher(400),
      progressIntervalMs: 20,
      heartbeatMs: 150,
      syncDelayMs: 300,
    });
    await new Promise((r) => setTimeout(r, 1500)); // a few slow heartbeats answered
    const apiBefore = api.calls.length;
    const commandId = await insertSyncPull(machineId, v1);
    expect(await agent.waitForCommand(commandId, 60_000)).toMatchObject({
      status: 'completed',
      result: 'success',
      counters: { ...COUNTERS },
    });
    const reports = syncCalls(api, apiBefore).filter((c) => c !== 'POST /api/agent/heartbeat');
    expect(reports).toEqual([`POST /api/agent/commands/${commandId}`, `POST /api/agent/commands/${commandId}`]);
  });

  it("while many of the site's commands are in flight, an agent keeps the longer progress gap the poll answer asks for", async () => {
    // A 4 s sync with a 20 ms gap sends its `assembling` change between its first and last report (the
    // agent's gap is at least 10 round trips, so the sync outlasts it unless one takes over 400 ms: with
    // 1.5 s, a machine loaded by other work made it 150 ms and this control failed)…
    const control = await startAgent('inl-budget-control', true, { progressIntervalMs: 20, syncDelayMs: 4000 });
    let before = control.api.calls.length;
    const first = await insertSyncPull('inl-budget-control', v1);
    expect(await control.agent.waitForCommand(first, 60_000)).toMatchObject({ status: 'completed', result: 'success' });
    expect(syncCalls(control.api, before).length).toBeGreaterThan(2);
    // …but with 100 commands of the site in flight the poll answer asks for 4 s (services/agent.ts
    // progressIntervalFor), and the same sync sends its first and last report only.
    const fillers = Array.from({ length: 100 }, (_, i) => `inl-budget-busy-${i}`);
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, delivered_at)
       SELECT $1, m, 'cmd_budget_' || m, 'reboot_machine', 'downloading', now() FROM UNNEST($2::text[]) AS t (m)`,
      [h.siteId, fillers],
    );
    try {
      const { agent, api } = await startAgent('inl-budget', true, { progressIntervalMs: 20, syncDelayMs: 1500 });
      before = api.calls.length;
      const commandId = await insertSyncPull('inl-budget', v1);
      expect(await agent.waitForCommand(commandId, 60_000)).toMatchObject({
        status: 'completed',
        result: 'success',
        counters: { ...COUNTERS },
      });
      expect(syncCalls(api, before)).toEqual([`POST /api/agent/commands/${commandId}`, `POST /api/agent/commands/${commandId}`]);
    } finally {
      await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1 AND command_id LIKE 'cmd_budget_%'`, [h.siteId]);
    }
  });

  it('an agent that does not opt in (like agents already deployed) syncs through the separate routes', async () => {
    const machineId = 'inl-classic';
    const { agent, api, poll } = await startAgent(machineId, false);
    const apiBefore = api.calls.length;
    const blobBefore = requestCounters.blob;
    const commandId = await insertSyncPull(machineId, v1);
    const outcome = await agent.waitForCommand(commandId, 60_000);
    expect(outcome).toMatchObject({ status: 'completed', result: 'success', counters: { ...COUNTERS } });
    expect(requestCounters.blob - blobBefore).toBe(5); // the body, then 4 chunks
    const calls = syncCalls(api, apiBefore).map((c) => c.replace(commandId, '{c}').replace(roostId, '{r}').replace(v1, '{v}'));
    expect(calls).toEqual([
      'POST /api/agent/commands/{c}',
      'PUT /api/agent/roosts/{r}/state',
      'GET /api/agent/roosts/{r}/versions/{v}',
      'PUT /api/agent/roosts/{r}/state',
      'POST /api/chunks/download-urls',
      'POST /api/agent/commands/{c}',
      'PUT /api/agent/roosts/{r}/state',
      'PUT /api/agent/roosts/{r}/state',
      'POST /api/agent/commands/{c}',
    ]);
    expect(poll.calls.some((c) => c.includes('inline='))).toBe(false);
    expect(await verifyTree(path.join(tmpRoot, 'src'), path.join(agent.rootDir, ...EXTRACT.split('/')))).toEqual([]);
    expect(await targetState(machineId)).toMatchObject({ status: 'committed', reported_version_id: v1, ...COUNTERS });
  });
});

describe('GET /api/agent/commands?inline=sync and POST /api/agent/commands/{commandId} with targetState', () => {
  let token: string;
  const machineId = 'inl-raw';
  const req = (method: string, url: string, body?: unknown, key = token) => h.request({ method, url, key, body });

  beforeAll(async () => {
    token = await enrol(machineId);
  });

  it('a sync_pull carries its version answer, its body (hashing to the version id) and the URLs of its chunks', async () => {
    const commandId = await insertSyncPull(machineId, v1);
    const other = newId('cmd');
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, expires_at)
       VALUES ($1, $2, $3, 'capture_screenshot', 'pending', '{}', now() + INTERVAL '10 minutes')`,
      [h.siteId, machineId, other],
    );
    const res = await req('GET', '/api/agent/commands?wait=0&inline=sync');
    expect(res.statusCode).toBe(200);
    const cmds = res.json().commands as Array<Record<string, any>>;
    const sync = cmds.find((c) => c.commandId === commandId)!.sync;
    expect(cmds.find((c) => c.commandId === other)!.sync).toBeUndefined();
    expect(sync.version).toMatchObject({ roostId, versionId: v1, versionNumber: 1, extractPath: EXTRACT });
    expect(typeof sync.version.signature).toBe('string');
    expect(computeVersionId(sync.body)).toBe(v1);
    const hashes = (sync.body as VersionBody).files.flatMap((f) => f.chunks.map((c) => c.hash));
    expect(Object.keys(sync.chunkUrls.urls).sort()).toEqual([...new Set(hashes)].sort());
    expect(sync.chunkUrls.missing).toEqual([]);
    const bytes = Buffer.from(await (await fetch(sync.chunkUrls.urls[hashes[0]])).arrayBuffer());
    expect(sha256Hex(bytes)).toBe(hashes[0]);
    // Closed, so the next tests start from an empty queue.
    for (const c of [commandId, other])
      expect((await req('POST', `/api/agent/commands/${c}`, { status: 'completed' })).statusCode).toBe(200);
  });

  it('without inline=sync the answer is as before; a bad inline value is 400 validation_failed', async () => {
    const commandId = await insertSyncPull(machineId, v1);
    const bad = await req('GET', '/api/agent/commands?wait=0&inline=yes');
    expect(bad.statusCode).toBe(400);
    expect(bad.json().code).toBe('validation_failed');
    expect((await commandRow(machineId, commandId)).delivered_at).toBeNull();
    const res = await req('GET', '/api/agent/commands?wait=0');
    const cmd = res.json().commands.find((c: { commandId: string }) => c.commandId === commandId);
    expect(cmd).toBeDefined();
    expect('sync' in cmd).toBe(false);
    expect((await req('POST', `/api/agent/commands/${commandId}`, { status: 'completed' })).statusCode).toBe(200);
  });

  it('a version over the inline bound carries its version answer only', async () => {
    const many: Record<string, Buffer> = {};
    for (let i = 0; i < 257; i++) many[`f/${i}.txt`] = Buffer.from(`file ${i} ${randomBytes(4).toString('hex')}`);
    const big = await publish(many);
    const commandId = await insertSyncPull(machineId, big);
    const res = await req('GET', '/api/agent/commands?wait=0&inline=sync');
    const sync = res.json().commands.find((c: { commandId: string }) => c.commandId === commandId).sync;
    expect(sync.version.versionId).toBe(big);
    expect(sync.body).toBeUndefined();
    expect(sync.chunkUrls).toBeUndefined();
    expect((await req('POST', `/api/agent/commands/${commandId}`, { status: 'completed' })).statusCode).toBe(200);
  });

  it('a report with targetState stores both; bad targets change nothing', async () => {
    const commandId = await insertSyncPull(machineId, v1);
    const state = (over: Record<string, unknown> = {}) => ({ roostId, reportedVersionId: v1, status: 'downloading', ...COUNTERS, ...over });
    const before = await targetState(machineId);

    const unknownRoost = await req('POST', `/api/agent/commands/${commandId}`, {
      status: 'downloading',
      targetState: state({ roostId: 'rst_nothere' }),
    });
    expect(unknownRoost.statusCode).toBe(404);
    expect(unknownRoost.json()).toMatchObject({ code: 'not_found', param: 'targetState.roostId' });
    const wrongVersion = await req('POST', `/api/agent/commands/${commandId}`, {
      status: 'downloading',
      targetState: state({ reportedVersionId: 'c'.repeat(64) }),
    });
    expect(wrongVersion.statusCode).toBe(404);
    expect(wrongVersion.json()).toMatchObject({ code: 'version_not_found', param: 'targetState.reportedVersionId' });
    const extra = await req('POST', `/api/agent/commands/${commandId}`, {
      status: 'downloading',
      targetState: { ...state(), surprise: 1 },
    });
    expect(extra.statusCode).toBe(400);
    const badStatus = await req('POST', `/api/agent/commands/${commandId}`, {
      status: 'downloading',
      targetState: state({ status: 'sideways' }),
    });
    expect(badStatus.statusCode).toBe(400);
    const missingRoost = await req('POST', `/api/agent/commands/${commandId}`, {
      status: 'downloading',
      targetState: { ...state(), roostId: undefined },
    });
    expect(missingRoost.statusCode).toBe(400);
    // Another machine's command: 404, and this machine's target state is not touched either.
    const strangerToken = await enrol('inl-stranger');
    const stranger = await req(
      'POST',
      `/api/agent/commands/${commandId}`,
      { status: 'downloading', targetState: state({ status: 'failed' }) },
      strangerToken,
    );
    expect(stranger.statusCode).toBe(404);
    expect(await targetState('inl-stranger')).toBeUndefined();
    expect(await commandRow(machineId, commandId)).toMatchObject({ status: 'pending', delivered_at: null });
    expect(await targetState(machineId)).toEqual(before);

    const ok = await req('POST', `/api/agent/commands/${commandId}`, {
      status: 'completed',
      result: 'success',
      progress: 100,
      targetState: state({ status: 'committed', bytes_fetched: 49_029 }),
    });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toMatchObject({
      commandId,
      status: 'completed',
      applied: true,
      targetState: { machineId, roostId, reportedVersionId: v1, status: 'committed', bytes_fetched: 49_029, ...COUNTERS },
    });
    expect(await targetState(machineId)).toMatchObject({ status: 'committed', bytes_fetched: 49_029 });

    // On a closed command the report is a no-op, the target state (what the disk holds) is still stored.
    const late = await req('POST', `/api/agent/commands/${commandId}`, {
      status: 'failed',
      error: 'late',
      targetState: state({ status: 'failed', error: 'disk full' }),
    });
    expect(late.statusCode).toBe(200);
    expect(late.json()).toMatchObject({ status: 'completed', applied: false, targetState: { status: 'failed', error: 'disk full' } });
    expect(await commandRow(machineId, commandId)).toMatchObject({ status: 'completed', result: 'success' });
  });
});
