/**
 * Agent protocol routes (docs/agent-protocol.md) and the reference agent end to end against the real API
 * (no rollout workflow: sync_pull command rows are inserted directly, roost versions are seeded in SQL
 * and blob storage the way publish stores them).
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { newId, randomToken, sha256Hex } from '../../domain/hex';
import { canonicalJson, CHUNK_SIZE, computeVersionId, summarize, type VersionBody, VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName, versionBlobName } from '../../storage/blob';
import type { Scope } from '../../domain/scopes';
import { Agent } from '../../agent/agent';
import { verifyTree } from '../../agent/fleet';
import { CommandWaiters, ID_LIST_MAX, pollAgentCommands, progressIntervalFor } from '../../services/agent';
import { claimCommands, deliverableMachinesPage, machinesWithDeliverable } from '../../db/machines';
import { scopedKey as scopedKeyOf } from '../support/identity';
import { waitUntil } from '../support/wait';

let h: Harness;
let baseUrl: string;
let secret: string;
let tmpRoot: string;

beforeAll(async () => {
  h = await createHarness();
  baseUrl = await h.listen();
  const res = await h.request({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret`, idempotencyKey: true });
  secret = res.json().enrolmentSecret;
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-agent-test-'));
});
afterAll(async () => {
  await h.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

// ------------------------------------------------------------------------------------------- helpers

/** Inserts an API key of the harness user with exactly `scopes`; returns the raw key. */
const scopedKey = (scopes: Scope[]) => scopedKeyOf(h, scopes);

async function enrol(machineId: string, opts: { siteId?: string; secret?: string } = {}): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: '/api/agent/enrol',
    key: null,
    body: {
      siteId: opts.siteId ?? h.siteId,
      enrolmentSecret: opts.secret ?? secret,
      machineId,
      hostname: `${machineId}.local`,
      agentVersion: '1.2.3',
    },
  });
  expect(res.statusCode).toBe(201);
  expect(res.headers['cache-control']).toBe('no-store');
  return res.json().agentToken;
}

function agentReq(token: string, method: string, url: string, body?: unknown) {
  return h.request({ method, url, key: token, body });
}

/** Queues a command row for a machine directly (what a rollout does for sync_pull). */
async function insertCommand(
  machineId: string,
  type: string,
  params: Record<string, unknown>,
  opts: { siteId?: string; expiresInMs?: number } = {},
): Promise<string> {
  const commandId = newId('cmd');
  await h.deps.db.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, expires_at)
     VALUES ($1, $2, $3, $4, 'pending', $5, now() + ($6::INT * INTERVAL '1 millisecond'))`,
    [opts.siteId ?? h.siteId, machineId, commandId, type, JSON.stringify(params), opts.expiresInMs ?? 600_000],
  );
  return commandId;
}

async function ensureRoost(roostId: string, extractPath = 'C:\\Roost\\app', siteId = h.siteId): Promise<void> {
  await h.deps.db.query(
    `INSERT INTO roosts (site_id, roost_id, name, targets, extract_path, created_by) VALUES ($1, $2, $3, '[]', $4, $5)
     ON CONFLICT (site_id, roost_id) DO NOTHING`,
    [siteId, roostId, `roost ${roostId}`, extractPath, h.userId],
  );
}

/**
 * Publishes `files` (path → bytes) as the next version of a roost the way publish stores it: chunks
 * (4 MiB) in blob storage and the chunks table, the body blob, the version row, the current pointer.
 * `bodyText` overrides the stored body bytes (to test tampering).
 */
async function publish(
  roostId: string,
  files: Record<string, Buffer>,
  opts: { siteId?: string; bodyText?: string } = {},
): Promise<{ versionId: string; body: VersionBody }> {
  const siteId = opts.siteId ?? h.siteId;
  await ensureRoost(roostId, undefined, siteId);
  const entries: VersionBody['files'] = [];
  for (const [p, data] of Object.entries(files)) {
    const chunks = [];
    for (let off = 0; off < data.length; off += CHUNK_SIZE) {
      const part = data.subarray(off, Math.min(data.length, off + CHUNK_SIZE));
      const hash = sha256Hex(part);
      chunks.push({ hash, size: part.length });
      await h.deps.blob.put('chunks', chunkBlobName(siteId, hash), Buffer.from(part), 'application/octet-stream');
      await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, $3) ON CONFLICT (site_id, hash) DO NOTHING', [
        siteId,
        hash,
        part.length,
      ]);
    }
    entries.push({ path: p, size: data.length, chunks });
  }
  const body: VersionBody = { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'agent.test' }, files: entries };
  const versionId = computeVersionId(body);
  const blobName = versionBlobName(siteId, roostId, versionId);
  await h.deps.blob.put('versions', blobName, Buffer.from(opts.bodyText ?? canonicalJson(body)), 'application/json');
  const { totalSize, totalFiles } = summarize(body);
  const { rows } = await h.deps.db.query<{ version_counter: number; current_version_id: string | null }>(
    'UPDATE roosts SET version_counter = version_counter + 1 WHERE site_id = $1 AND roost_id = $2 RETURNING version_counter, current_version_id',
    [siteId, roostId],
  );
  await h.deps.db.query(
    `INSERT INTO roost_versions (site_id, roost_id, version_id, version_number, blob_name, total_size, total_files, parent_version_id, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
    [siteId, roostId, versionId, rows[0].version_counter, blobName, totalSize, totalFiles, rows[0].current_version_id, h.userId],
  );
  await h.deps.db.query(
    'UPDATE roosts SET current_version_id = $3, previous_version_id = current_version_id WHERE site_id = $1 AND roost_id = $2',
    [siteId, roostId, versionId],
  );
  return { versionId, body };
}

async function writeTree(dir: string, files: Record<string, Buffer>): Promise<void> {
  await fs.rm(dir, { recursive: true, force: true });
  await fs.mkdir(dir, { recursive: true });
  for (const [p, data] of Object.entries(files)) {
    await fs.mkdir(path.dirname(path.join(dir, p)), { recursive: true });
    await fs.writeFile(path.join(dir, p), data);
  }
}

async function targetState(machineId: string, roostId: string) {
  const { rows } = await h.deps.db.query('SELECT * FROM roost_target_states WHERE site_id = $1 AND machine_id = $2 AND roost_id = $3', [
    h.siteId,
    machineId,
    roostId,
  ]);
  return rows[0];
}

async function commandRow(machineId: string, commandId: string) {
  const { rows } = await h.deps.db.query('SELECT * FROM commands WHERE site_id = $1 AND machine_id = $2 AND command_id = $3', [
    h.siteId,
    machineId,
    commandId,
  ]);
  return rows[0];
}

const COUNTERS = { chunks_fetched: 0, chunks_total: 0, chunks_dedup: 0, files_total: 0, files_assembled: 0, files_skipped: 0 };

// ------------------------------------------------------------------------------------------- enrolment

describe('POST /api/sites/{siteId}/enrolment-secret', () => {
  it('creates a secret shown once (no-store, also on replay) and stores only its digest', async () => {
    const idem = `enrol-secret-${Date.now()}`;
    const res = await h.request({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret`, idempotencyKey: idem });
    expect(res.statusCode).toBe(201);
    expect(res.headers['cache-control']).toBe('no-store');
    const replay = await h.request({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret`, idempotencyKey: idem });
    expect([replay.statusCode, replay.headers['cache-control'], replay.json().enrolmentSecret]).toEqual([
      201,
      'no-store',
      res.json().enrolmentSecret,
    ]);
    const body = res.json();
    expect(body.siteId).toBe(h.siteId);
    expect(body.enrolmentSecret).toMatch(/^ses_[A-Za-z0-9_-]{43}$/);
    const { rows } = await h.deps.db.query('SELECT enrolment_secret_hash FROM sites WHERE site_id = $1', [h.siteId]);
    expect(rows[0].enrolment_secret_hash).toBe(sha256Hex(body.enrolmentSecret));
    // Rotation: the previous secret stops working.
    const old = await h.request({
      method: 'POST',
      url: '/api/agent/enrol',
      key: null,
      body: { siteId: h.siteId, enrolmentSecret: secret, machineId: 'rot-1', hostname: 'h', agentVersion: '1' },
    });
    expect(old.statusCode).toBe(401);
    secret = body.enrolmentSecret;
    await enrol('rot-1');
  });

  it('needs site admin: a write-only key gets 403 scope_insufficient with required', async () => {
    const key = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read', 'write'] }]);
    const res = await h.request({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret`, key, idempotencyKey: true });
    expect(res.statusCode).toBe(403);
    expect(res.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: h.siteId, permission: 'admin' } });
  });

  it('hides another site (404), rejects a malformed site id (400) and a missing credential (401)', async () => {
    const other = await h.other();
    const res = await h.request({
      method: 'POST',
      url: `/api/sites/${h.siteId}/enrolment-secret`,
      key: other.apiKey,
      idempotencyKey: true,
    });
    expect(res.statusCode).toBe(404);
    expect(res.json().code).toBe('not_found');
    const bad = await h.request({ method: 'POST', url: '/api/sites/bad%20site!/enrolment-secret' });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().code).toBe('validation_failed');
    const anon = await h.request({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret`, key: null, idempotencyKey: true });
    expect(anon.statusCode).toBe(401);
  });
});

describe('POST /api/agent/enrol', () => {
  it('issues a sat_ token bound to site and machine, stores its digest, marks the machine online', async () => {
    const token = await enrol('enrol-1');
    expect(token).toMatch(/^sat_[A-Za-z0-9_-]{43}$/);
    const { rows } = await h.deps.db.query(
      'SELECT agent_token_hash, online, hostname, agent_version FROM machines WHERE site_id = $1 AND machine_id = $2',
      [h.siteId, 'enrol-1'],
    );
    expect(rows[0]).toMatchObject({ agent_token_hash: sha256Hex(token), online: true, hostname: 'enrol-1.local', agent_version: '1.2.3' });
    const ev = await h.deps.db.query(
      `SELECT data FROM events WHERE site_id = $1 AND type = 'machine.online' AND data->>'machineId' = 'enrol-1'`,
      [h.siteId],
    );
    expect(ev.rows).toHaveLength(1);
    expect(ev.rows[0].data.siteId).toBe(h.siteId);
  });

  it('re-enrolling rotates the token: the old one is refused', async () => {
    const first = await enrol('enrol-2');
    const second = await enrol('enrol-2');
    expect(second).not.toBe(first);
    expect((await agentReq(first, 'POST', '/api/agent/heartbeat', {})).statusCode).toBe(401);
    expect((await agentReq(second, 'POST', '/api/agent/heartbeat', {})).statusCode).toBe(200);
  });

  it('enrols a fleet at once without serialization retries; machine.online once per new machine, again only after going stale', async () => {
    const ids = Array.from({ length: 40 }, (_, i) => `burst-${String(i).padStart(3, '0')}`);
    let retries = 0;
    const onRetry = () => retries++;
    // db/pool.ts withTx emits txRetry on the pool before each retry.
    const pool = h.deps.db as unknown as NodeJS.EventEmitter;
    pool.on('txRetry', onRetry);
    try {
      await Promise.all(ids.map((id) => enrol(id)));
    } finally {
      pool.off('txRetry', onRetry);
    }
    // Neighbouring new machine ids used to conflict on the index page their absent rows were read from.
    expect(retries).toBe(0);
    const online = async (id: string) =>
      (
        await h.deps.db.query(`SELECT 1 FROM events WHERE site_id = $1 AND type = 'machine.online' AND data->>'machineId' = $2`, [
          h.siteId,
          id,
        ])
      ).rows.length;
    expect(await Promise.all(ids.map(online))).toEqual(ids.map(() => 1));
    // Re-enrolling a live machine: new token, same row, no second machine.online.
    await enrol(ids[0]);
    expect(await online(ids[0])).toBe(1);
    // Re-enrolling a stale one: online again, recorded.
    await h.deps.db.query(`UPDATE machines SET last_heartbeat = now() - INTERVAL '1 hour' WHERE site_id = $1 AND machine_id = $2`, [
      h.siteId,
      ids[1],
    ]);
    await enrol(ids[1]);
    expect(await online(ids[1])).toBe(2);
    const { rows } = await h.deps.db.query(`SELECT count(*)::int AS n FROM machines WHERE site_id = $1 AND machine_id LIKE 'burst-%'`, [
      h.siteId,
    ]);
    expect(rows[0].n).toBe(40);
  });

  it('refuses a wrong secret or unknown site with 401 and no hint', async () => {
    for (const body of [
      { siteId: h.siteId, enrolmentSecret: `ses_${randomToken()}` },
      { siteId: h.siteId, enrolmentSecret: 'nope' },
      { siteId: 'site_doesnotexist', enrolmentSecret: secret },
    ]) {
      const res = await h.request({
        method: 'POST',
        url: '/api/agent/enrol',
        key: null,
        body: { ...body, machineId: 'x-1', hostname: 'h', agentVersion: '1' },
      });
      expect(res.statusCode).toBe(401);
      expect(res.json()).toMatchObject({ code: 'unauthorized', detail: 'unknown site or wrong enrolment secret' });
    }
    const { rows } = await h.deps.db.query(`SELECT 1 FROM machines WHERE machine_id = 'x-1'`);
    expect(rows).toHaveLength(0);
  });

  it('validates machineId and required fields', async () => {
    const res = await h.request({
      method: 'POST',
      url: '/api/agent/enrol',
      key: null,
      body: { siteId: h.siteId, enrolmentSecret: secret, machineId: 'bad id/..', agentVersion: '1' },
    });
    expect(res.statusCode).toBe(400);
    const body = res.json();
    expect(body.code).toBe('validation_failed');
    expect(Object.keys(body.errors)).toEqual(expect.arrayContaining(['machineId', 'hostname']));
    const long = await h.request({
      method: 'POST',
      url: '/api/agent/enrol',
      key: null,
      body: { siteId: h.siteId, enrolmentSecret: secret, machineId: 'm'.repeat(65), hostname: 'h', agentVersion: '1' },
    });
    expect(long.statusCode).toBe(400);
  });

  it('refuses ids made only of dots (400 naming machineId, nothing stored) and enrols ids with dots among other characters', async () => {
    for (const machineId of ['.', '..', '...', '.'.repeat(64)]) {
      const res = await h.request({
        method: 'POST',
        url: '/api/agent/enrol',
        key: null,
        body: { siteId: h.siteId, enrolmentSecret: secret, machineId, hostname: 'h', agentVersion: '1' },
      });
      expect([machineId, res.statusCode]).toEqual([machineId, 400]);
      expect(res.json()).toMatchObject({ code: 'validation_failed', param: 'machineId' });
      expect(Object.keys(res.json().errors)).toEqual(['machineId']);
    }
    const { rows } = await h.deps.db.query(`SELECT machine_id FROM machines WHERE site_id = $1 AND machine_id ~ '^[.]+$'`, [h.siteId]);
    expect(rows).toEqual([]);
    for (const machineId of ['a.b', '.a', 'a.']) {
      const token = await enrol(machineId);
      const hb = await agentReq(token, 'POST', '/api/agent/heartbeat', { agentVersion: '1' });
      expect([machineId, hb.statusCode]).toEqual([machineId, 200]);
      const shown = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${encodeURIComponent(machineId)}` });
      expect([machineId, shown.statusCode, shown.json().machineId]).toEqual([machineId, 200, machineId]);
    }
  });

  it('migration 028_machine_id_not_dots.sql drops all-dots roost targets and keeps the order of the rest', async () => {
    await ensureRoost('roost-dots');
    await h.deps.db.query(`UPDATE roosts SET targets = $3 WHERE site_id = $1 AND roost_id = $2`, [
      h.siteId,
      'roost-dots',
      JSON.stringify(['m-2', '..', 'a.', '.', 'm-1', '...', '.a']),
    ]);
    await ensureRoost('roost-dots-only');
    await h.deps.db.query(`UPDATE roosts SET targets = $3 WHERE site_id = $1 AND roost_id = $2`, [h.siteId, 'roost-dots-only', '[".."]']);
    await h.deps.db.query(await fs.readFile(path.join(__dirname, '..', '..', 'db', 'migrations', '028_machine_id_not_dots.sql'), 'utf8'));
    const { rows } = await h.deps.db.query(
      `SELECT roost_id, targets FROM roosts WHERE site_id = $1 AND roost_id LIKE 'roost-dots%' ORDER BY 1`,
      [h.siteId],
    );
    expect(rows).toEqual([
      { roost_id: 'roost-dots', targets: ['m-2', 'a.', 'm-1', '.a'] },
      { roost_id: 'roost-dots-only', targets: [] },
    ]);
  });
});

// ------------------------------------------------------------------------------------------- heartbeat

describe('POST /api/agent/heartbeat', () => {
  it('records liveness and the snapshot, and reports pending commands', async () => {
    const token = await enrol('hb-1');
    await insertCommand('hb-1', 'reboot_machine', { delaySeconds: 0 });
    const res = await agentReq(token, 'POST', '/api/agent/heartbeat', {
      agentVersion: '2.0.0',
      metrics: { schemaVersion: 2, cpus: [1, 2] },
      processes: [{ name: 'app.exe', pid: 42 }],
      info: { os: 'Windows 11' },
      timezone: 'W. Europe Standard Time',
      timezoneIana: 'Europe/Berlin',
      cortexEnabled: false,
      rebooting: true,
      futureField: 'ignored',
    });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toMatchObject({ ok: true, pendingCommands: 1 });
    expect(Date.parse(body.serverTime)).not.toBeNaN();
    const { rows } = await h.deps.db.query('SELECT * FROM machines WHERE site_id = $1 AND machine_id = $2', [h.siteId, 'hb-1']);
    expect(rows[0]).toMatchObject({
      agent_version: '2.0.0',
      metrics: { schemaVersion: 2, cpus: [1, 2] },
      processes: [{ name: 'app.exe', pid: 42 }],
      info: { os: 'Windows 11' },
      machine_timezone: 'W. Europe Standard Time',
      machine_timezone_iana: 'Europe/Berlin',
      cortex_enabled: false,
      rebooting: true,
      online: true,
    });
    // Fields left out keep their value; a heartbeat may have no body at all.
    expect((await agentReq(token, 'POST', '/api/agent/heartbeat', {})).statusCode).toBe(200);
    expect(
      (await h.app.inject({ method: 'POST', url: '/api/agent/heartbeat', headers: { authorization: `Bearer ${token}` } })).statusCode,
    ).toBe(200);
    const again = await h.deps.db.query('SELECT agent_version, metrics FROM machines WHERE site_id = $1 AND machine_id = $2', [
      h.siteId,
      'hb-1',
    ]);
    expect(again.rows[0]).toMatchObject({ agent_version: '2.0.0', metrics: { schemaVersion: 2, cpus: [1, 2] } });
  });

  it('records machine.online when heartbeats resume after going stale', async () => {
    const token = await enrol('hb-2');
    await h.deps.db.query(`UPDATE machines SET last_heartbeat = now() - INTERVAL '1 hour' WHERE site_id = $1 AND machine_id = 'hb-2'`, [
      h.siteId,
    ]);
    expect((await agentReq(token, 'POST', '/api/agent/heartbeat', {})).statusCode).toBe(200);
    expect((await agentReq(token, 'POST', '/api/agent/heartbeat', {})).statusCode).toBe(200);
    const ev = await h.deps.db.query(
      `SELECT 1 FROM events WHERE site_id = $1 AND type = 'machine.online' AND data->>'machineId' = 'hb-2'`,
      [h.siteId],
    );
    expect(ev.rows).toHaveLength(2); // enrol + resume, not one per heartbeat
  });

  it('takes a fleet beating at once without serialization retries, and answers each machine its own pending count', async () => {
    const ids = Array.from({ length: 40 }, (_, i) => `beat-${String(i).padStart(3, '0')}`);
    const tokens = await Promise.all(ids.map((id) => enrol(id)));
    // Two deliverable commands for the first machine, one already expired for the second (not counted).
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, expires_at)
       VALUES ($1, $2, 'cmd_beat_a', 'reboot_machine', NULL), ($1, $2, 'cmd_beat_b', 'reboot_machine', now() + INTERVAL '1 hour'),
              ($1, $3, 'cmd_beat_c', 'reboot_machine', now() - INTERVAL '1 minute')`,
      [h.siteId, ids[0], ids[1]],
    );
    let retries = 0;
    const onRetry = () => retries++;
    const pool = h.deps.db as unknown as NodeJS.EventEmitter;
    pool.on('txRetry', onRetry);
    let answers: { statusCode: number; json: () => { pendingCommands: number; processConfigStamp: string } }[];
    try {
      // Three rounds of every machine at once: neighbouring machines share a primary-key index page, which
      // made a read-then-write heartbeat transaction a serialization cycle.
      for (let round = 0; round < 3; round++) {
        answers = await Promise.all(tokens.map((t) => agentReq(t, 'POST', '/api/agent/heartbeat', { agentVersion: `3.0.${round}` })));
        expect(answers.map((a) => a.statusCode)).toEqual(ids.map(() => 200));
      }
    } finally {
      pool.off('txRetry', onRetry);
    }
    expect(retries).toBe(0);
    expect(answers!.map((a) => a.json().pendingCommands)).toEqual(ids.map((_, i) => (i === 0 ? 2 : 0)));
    expect(new Set(answers!.map((a) => a.json().processConfigStamp)).size).toBe(1);
    const { rows } = await h.deps.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM machines WHERE site_id = $1 AND machine_id LIKE 'beat-%' AND agent_version = '3.0.2'`,
      [h.siteId],
    );
    expect(rows[0].n).toBe(40);
    // Still one machine.online per machine (its enrolment): live machines beating record none.
    const ev = await h.deps.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM events WHERE site_id = $1 AND type = 'machine.online' AND data->>'machineId' LIKE 'beat-%'`,
      [h.siteId],
    );
    expect(ev.rows[0].n).toBe(40);
  });

  it('rejects bad credentials and bad bodies', async () => {
    const token = await enrol('hb-3');
    for (const key of [null, `sat_${randomToken()}`, 'sat_short', h.apiKey]) {
      const res = await h.request({ method: 'POST', url: '/api/agent/heartbeat', key, body: {} });
      expect(res.statusCode).toBe(401);
      expect(res.json().code).toBe('unauthorized');
    }
    const bad = await agentReq(token, 'POST', '/api/agent/heartbeat', { metrics: 'high', processes: {} });
    expect(bad.statusCode).toBe(400);
    expect(Object.keys(bad.json().errors)).toEqual(expect.arrayContaining(['metrics', 'processes']));
  });
});

// ------------------------------------------------------------------------------------------- commands

describe('GET /api/agent/commands and POST /api/agent/commands/{id}', () => {
  it('hands out pending commands oldest first, marks them delivered, and redelivers stale deliveries', async () => {
    const token = await enrol('cmd-1');
    const c1 = await insertCommand('cmd-1', 'reboot_machine', { delaySeconds: 5 });
    await h.deps.db.query(`UPDATE commands SET created_at = now() - INTERVAL '1 minute' WHERE command_id = $1`, [c1]);
    const c2 = await insertCommand('cmd-1', 'capture_screenshot', { monitor: 0 });
    await insertCommand('other-machine', 'reboot_machine', {});
    const res = await agentReq(token, 'GET', '/api/agent/commands?wait=0');
    expect(res.statusCode).toBe(200);
    const cmds = res.json().commands;
    expect(cmds.map((c: { commandId: string }) => c.commandId)).toEqual([c1, c2]);
    expect(cmds[0]).toMatchObject({ type: 'reboot_machine', params: { delaySeconds: 5 } });
    expect(Date.parse(cmds[0].expiresAt)).toBeGreaterThan(Date.now());
    expect((await commandRow('cmd-1', c1)).delivered_at).not.toBeNull();
    // Delivered recently: not handed out again…
    expect((await agentReq(token, 'GET', '/api/agent/commands?wait=0')).json().commands).toEqual([]);
    // …until the redelivery window passed with the command still pending.
    await h.deps.db.query(`UPDATE commands SET delivered_at = now() - INTERVAL '2 minutes' WHERE command_id = $1`, [c2]);
    expect(
      (await agentReq(token, 'GET', '/api/agent/commands?wait=0')).json().commands.map((c: { commandId: string }) => c.commandId),
    ).toEqual([c2]);
  });

  it('long-polls: a command queued while the agent waits is returned', async () => {
    const token = await enrol('cmd-2');
    const poll = agentReq(token, 'GET', '/api/agent/commands?wait=20');
    await new Promise((r) => setTimeout(r, 600));
    const created = await h.request({
      method: 'POST',
      url: `/api/sites/${h.siteId}/machines/cmd-2/commands`,
      idempotencyKey: true,
      body: { type: 'reboot_machine' },
    });
    expect(created.statusCode).toBe(202);
    const res = await poll;
    expect(res.statusCode).toBe(200);
    expect(res.json().commands).toEqual([
      expect.objectContaining({ commandId: created.json().commandId, type: 'reboot_machine', params: { delaySeconds: 0 } }),
    ]);
  });

  it('returns an empty list when nothing arrives within wait, and validates wait', async () => {
    const token = await enrol('cmd-3');
    const res = await agentReq(token, 'GET', '/api/agent/commands?wait=1');
    expect(res.statusCode).toBe(200);
    // progressIntervalMs follows the site's commands in flight (earlier tests here leave some; its value is
    // tested with the window below).
    expect(res.json()).toEqual({ commands: [], progressIntervalMs: expect.any(Number) });
    expect(res.json().progressIntervalMs).toBeGreaterThanOrEqual(0);
    for (const w of ['-1', 'abc', '1.5']) {
      const bad = await agentReq(token, 'GET', `/api/agent/commands?wait=${w}`);
      expect(bad.statusCode).toBe(400);
      expect(bad.json().code).toBe('validation_failed');
    }
  });

  it('expires pending commands past expiresAt instead of delivering them', async () => {
    const token = await enrol('cmd-4');
    const c = await insertCommand('cmd-4', 'reboot_machine', {}, { expiresInMs: -1000 });
    expect((await agentReq(token, 'GET', '/api/agent/commands?wait=0')).json().commands).toEqual([]);
    const row = await commandRow('cmd-4', c);
    expect(row).toMatchObject({ status: 'failed', error: 'expired' });
    expect(row.completed_at).not.toBeNull();
  });

  it('keeps a command open on intermediate statuses and closes it on a terminal one; later reports are no-ops', async () => {
    const token = await enrol('cmd-5');
    const c = await insertCommand('cmd-5', 'sync_pull', { roostId: 'r', versionId: 'a'.repeat(64) });
    const r1 = await agentReq(token, 'POST', `/api/agent/commands/${c}`, { status: 'downloading', progress: 12.5 });
    expect(r1.statusCode).toBe(200);
    expect(r1.json()).toMatchObject({ commandId: c, status: 'downloading', progress: 12.5, completedAt: null, applied: true });
    const r2 = await agentReq(token, 'POST', `/api/agent/commands/${c}`, { status: 'completed' });
    expect(r2.json()).toMatchObject({ status: 'completed', result: 'success', error: null, applied: true });
    expect(r2.json().completedAt).not.toBeNull();
    const r3 = await agentReq(token, 'POST', `/api/agent/commands/${c}`, { status: 'failed', error: 'late' });
    expect(r3.statusCode).toBe(200);
    expect(r3.json()).toMatchObject({ status: 'completed', result: 'success', error: null, applied: false });
    // failed keeps the error; cancelled gets result cancelled.
    const f = await insertCommand('cmd-5', 'reboot_machine', {});
    expect((await agentReq(token, 'POST', `/api/agent/commands/${f}`, { status: 'failed', error: 'disk full' })).json()).toMatchObject({
      status: 'failed',
      error: 'disk full',
      result: null,
    });
    const k = await insertCommand('cmd-5', 'reboot_machine', {});
    expect((await agentReq(token, 'POST', `/api/agent/commands/${k}`, { status: 'cancelled' })).json()).toMatchObject({
      status: 'cancelled',
      result: 'cancelled',
    });
  });

  it('rejects bad statuses and values, and commands of other machines or sites', async () => {
    const token = await enrol('cmd-6');
    const c = await insertCommand('cmd-6', 'reboot_machine', {});
    for (const body of [
      { status: 'pending' },
      { status: 'Bad Status' },
      { status: 'completed', progress: 101 },
      { status: 'completed', result: 'yes' },
      {},
      { status: 'completed', extra: 1 },
    ]) {
      const res = await agentReq(token, 'POST', `/api/agent/commands/${c}`, body);
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('validation_failed');
    }
    expect((await commandRow('cmd-6', c)).status).toBe('pending');
    const mine = await insertCommand('cmd-6b', 'reboot_machine', {});
    expect((await agentReq(token, 'POST', `/api/agent/commands/${mine}`, { status: 'completed' })).statusCode).toBe(404);
    expect((await agentReq(token, 'POST', '/api/agent/commands/cmd_unknown', { status: 'completed' })).statusCode).toBe(404);
    // An agent of another site cannot see this site's command, even for the same machine id.
    const other = await h.other();
    const otherSecret = (
      await h.request({ method: 'POST', url: `/api/sites/${other.siteId}/enrolment-secret`, key: other.apiKey, idempotencyKey: true })
    ).json().enrolmentSecret;
    const otherToken = await enrol('cmd-6', { siteId: other.siteId, secret: otherSecret });
    expect((await agentReq(otherToken, 'POST', `/api/agent/commands/${c}`, { status: 'completed' })).statusCode).toBe(404);
    expect((await agentReq(otherToken, 'GET', '/api/agent/commands?wait=0')).json().commands).toEqual([]);
    expect((await commandRow('cmd-6', c)).status).toBe('pending');
  });
});

// ------------------------------------------------------------------------------------------- roost sync routes

describe('GET /api/agent/roosts/{roostId}/versions/{versionId}', () => {
  it('returns a signed URL of the exact stored body', async () => {
    const token = await enrol('ver-1');
    const { versionId, body } = await publish('roost-ver', { 'a.txt': Buffer.from('hello') });
    const res = await agentReq(token, 'GET', `/api/agent/roosts/roost-ver/versions/${versionId}`);
    expect(res.statusCode).toBe(200);
    const info = res.json();
    expect(info).toMatchObject({ roostId: 'roost-ver', versionId, versionNumber: 1, extractPath: 'C:\\Roost\\app' });
    expect(Date.parse(info.expiresAt) - Date.now()).toBeLessThanOrEqual(15 * 60 * 1000);
    const fetched = await fetch(info.versionUrl);
    expect(fetched.status).toBe(200);
    expect(computeVersionId(await fetched.json())).toBe(versionId);
    expect(body.files).toHaveLength(1);
  });

  it('404s unknown roosts, versions and other sites; 400s malformed ids', async () => {
    const token = await enrol('ver-2');
    const { versionId } = await publish('roost-ver2', { 'a.txt': Buffer.from('x') });
    const nf = await agentReq(token, 'GET', `/api/agent/roosts/nope/versions/${versionId}`);
    expect(nf.statusCode).toBe(404);
    expect(nf.json().code).toBe('not_found');
    const vnf = await agentReq(token, 'GET', `/api/agent/roosts/roost-ver2/versions/${'b'.repeat(64)}`);
    expect(vnf.statusCode).toBe(404);
    expect(vnf.json().code).toBe('version_not_found');
    expect((await agentReq(token, 'GET', '/api/agent/roosts/roost-ver2/versions/current')).statusCode).toBe(400);
    const other = await h.other();
    const otherSecret = (
      await h.request({ method: 'POST', url: `/api/sites/${other.siteId}/enrolment-secret`, key: other.apiKey, idempotencyKey: true })
    ).json().enrolmentSecret;
    const otherToken = await enrol('ver-2', { siteId: other.siteId, secret: otherSecret });
    expect((await agentReq(otherToken, 'GET', `/api/agent/roosts/roost-ver2/versions/${versionId}`)).statusCode).toBe(404);
    expect((await h.request({ method: 'GET', url: `/api/agent/roosts/roost-ver2/versions/${versionId}` })).statusCode).toBe(401); // API key, not agent
  });
});

describe('PUT /api/agent/roosts/{roostId}/state', () => {
  it('upserts the target state', async () => {
    const token = await enrol('st-1');
    const { versionId } = await publish('roost-st', { 'a.txt': Buffer.from('state') });
    const url = '/api/agent/roosts/roost-st/state';
    const r1 = await agentReq(token, 'PUT', url, {
      reportedVersionId: versionId,
      status: 'downloading',
      ...COUNTERS,
      chunks_total: 3,
      chunks_fetched: 1,
      bytes_fetched: 100,
    });
    expect(r1.statusCode).toBe(200);
    expect(r1.json()).toMatchObject({
      roostId: 'roost-st',
      machineId: 'st-1',
      status: 'downloading',
      chunks_total: 3,
      chunks_fetched: 1,
      bytes_fetched: 100,
      error: null,
    });
    const r2 = await agentReq(token, 'PUT', url, { reportedVersionId: versionId, status: 'failed', error: 'x'.repeat(5000), ...COUNTERS });
    expect(r2.statusCode).toBe(200);
    expect(r2.json().error.length).toBeLessThanOrEqual(2000);
    const r3 = await agentReq(token, 'PUT', url, {
      reportedVersionId: versionId,
      status: 'committed',
      error: 'ignored',
      ...COUNTERS,
      files_total: 1,
      files_assembled: 1,
    });
    expect(r3.json()).toMatchObject({ status: 'committed', error: null, files_total: 1, bytes_fetched: 0 });
    const { rows } = await h.deps.db.query('SELECT count(*)::INT AS n FROM roost_target_states WHERE site_id = $1 AND machine_id = $2', [
      h.siteId,
      'st-1',
    ]);
    expect(rows[0].n).toBe(1);
  });

  it('validates status, counters and ids', async () => {
    const token = await enrol('st-2');
    const { versionId } = await publish('roost-st2', { 'a.txt': Buffer.from('state2') });
    const url = '/api/agent/roosts/roost-st2/state';
    const cases: [Record<string, unknown>, string][] = [
      [{ reportedVersionId: versionId, status: 'done', ...COUNTERS }, 'status'],
      [{ reportedVersionId: versionId, status: 'committed', ...COUNTERS, chunks_fetched: -1 }, 'chunks_fetched'],
      [{ reportedVersionId: versionId, status: 'committed', ...COUNTERS, files_total: 1.5 }, 'files_total'],
      [{ reportedVersionId: versionId, status: 'committed', ...COUNTERS, files_skipped: undefined }, 'files_skipped'],
      [{ reportedVersionId: 'v1', status: 'committed', ...COUNTERS }, 'reportedVersionId'],
      [{ reportedVersionId: versionId, status: 'committed', ...COUNTERS, surprise: true }, 'surprise'],
      // Beyond what a JSON number carries exactly (the BIGINT column's range starts at 2^63: that was a 500).
      [{ reportedVersionId: versionId, status: 'committed', ...COUNTERS, bytes_fetched: 1e19 }, 'bytes_fetched'],
      [{ reportedVersionId: versionId, status: 'committed', ...COUNTERS, bytes_fetched: 2 ** 63 }, 'bytes_fetched'],
      [{ reportedVersionId: versionId, status: 'committed', ...COUNTERS, bytes_fetched: Number.MAX_SAFE_INTEGER + 1 }, 'bytes_fetched'],
    ];
    for (const [body, field] of cases) {
      const res = await agentReq(token, 'PUT', url, body);
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('validation_failed');
      expect(Object.keys(res.json().errors)).toContain(field);
    }
    const nf = await agentReq(token, 'PUT', '/api/agent/roosts/unknown-roost/state', {
      reportedVersionId: versionId,
      status: 'pending',
      ...COUNTERS,
    });
    expect(nf.statusCode).toBe(404);
    expect(nf.json().code).toBe('not_found');
    const vnf = await agentReq(token, 'PUT', url, { reportedVersionId: 'c'.repeat(64), status: 'pending', ...COUNTERS });
    expect(vnf.statusCode).toBe(404);
    expect(vnf.json().code).toBe('version_not_found');
    expect(await targetState('st-2', 'roost-st2')).toBeUndefined();
  });
});

describe('PUT /api/agent/commands/{id}/screenshot', () => {
  it('stores the PNG of a capture_screenshot command and the command state signs a URL for it', async () => {
    const token = await enrol('shot-1');
    const c = await insertCommand('shot-1', 'capture_screenshot', { monitor: 'all' });
    const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), randomBytes(32)]);
    const notPng = await h.app.inject({
      method: 'PUT',
      url: `/api/agent/commands/${c}/screenshot`,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'image/png' },
      payload: Buffer.from('GIF89a....'),
    });
    expect(notPng.statusCode).toBe(400);
    const up = await h.app.inject({
      method: 'PUT',
      url: `/api/agent/commands/${c}/screenshot`,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'image/png' },
      payload: png,
    });
    expect(up.statusCode).toBe(200);
    expect(up.json()).toEqual({ commandId: c, bytes: png.length });
    await agentReq(token, 'POST', `/api/agent/commands/${c}`, { status: 'completed' });
    const state = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/shot-1/commands/${c}` });
    expect(state.statusCode).toBe(200);
    const got = await fetch(state.json().screenshotUrl);
    expect(Buffer.from(await got.arrayBuffer()).equals(png)).toBe(true);
    // Closed command or a command of another type: refused.
    const late = await h.app.inject({
      method: 'PUT',
      url: `/api/agent/commands/${c}/screenshot`,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'image/png' },
      payload: png,
    });
    expect(late.statusCode).toBe(409);
    const reboot = await insertCommand('shot-1', 'reboot_machine', {});
    const wrong = await h.app.inject({
      method: 'PUT',
      url: `/api/agent/commands/${reboot}/screenshot`,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'image/png' },
      payload: png,
    });
    expect(wrong.statusCode).toBe(404);
  });

  const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  const artifact = async (commandId: string) =>
    (await h.deps.db.query('SELECT artifact_blob FROM commands WHERE command_id = $1', [commandId])).rows[0].artifact_blob;

  it('takes image/png over a real connection; every other Content-Type, JSON included, is 415 naming image/png', async () => {
    const token = await enrol('shot-2');
    const c = await insertCommand('shot-2', 'capture_screenshot', { monitor: 0 });
    const png = Buffer.concat([PNG_SIGNATURE, randomBytes(4096)]);
    const put = (body: Buffer | string, contentType?: string) =>
      fetch(`${baseUrl}/api/agent/commands/${c}/screenshot`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${token}`, ...(contentType ? { 'content-type': contentType } : {}) },
        body,
      });
    for (const [body, type] of [
      [png, 'application/json'],
      [JSON.stringify({ png: png.toString('base64') }), 'application/json'],
      [png, 'application/octet-stream'],
      [png, 'image/jpeg'],
      ['not a png', 'text/plain'],
      [png, 'multipart/form-data; boundary=x'],
      [png, undefined],
    ] as const) {
      const res = await put(body, type);
      const problem = (await res.json()) as { detail: string };
      expect([type, res.status, res.headers.get('content-type')]).toEqual([type, 415, 'application/problem+json; charset=utf-8']);
      expect(problem).toMatchObject({ code: 'unsupported_media_type', param: 'Content-Type' });
      expect(problem.detail).toContain('image/png');
    }
    expect(await artifact(c)).toBeNull();
    // Parameters and case of the media type do not matter.
    for (const type of ['image/png', 'image/PNG', 'image/png; charset=binary']) {
      const ok = await put(png, type);
      expect([type, ok.status, await ok.json()]).toEqual([type, 200, { commandId: c, bytes: png.length }]);
    }
    // Stored where the command state's signed URL reads it (docs/agent-protocol.md "Screenshots").
    expect(await artifact(c)).toBe(`sites/${h.siteId}/machines/shot-2/screenshots/${c}.png`);
    const state = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/shot-2/commands/${c}` });
    const stored = await fetch(state.json().screenshotUrl);
    expect(stored.headers.get('content-type')).toBe('image/png');
    expect(Buffer.from(await stored.arrayBuffer()).equals(png)).toBe(true);
  });

  it('refuses bytes that are not a PNG with 400, and a PNG over 10 MiB with 413, storing nothing', async () => {
    const token = await enrol('shot-3');
    const c = await insertCommand('shot-3', 'capture_screenshot', { monitor: 0 });
    const put = (payload: Buffer, contentType = 'image/png') =>
      h.app.inject({
        method: 'PUT',
        url: `/api/agent/commands/${c}/screenshot`,
        headers: { authorization: `Bearer ${token}`, 'content-type': contentType },
        payload,
      });
    for (const bytes of [
      Buffer.alloc(0),
      PNG_SIGNATURE.subarray(0, 7),
      Buffer.from('GIF89a'),
      Buffer.concat([Buffer.from('x'), PNG_SIGNATURE]),
    ]) {
      const res = await put(bytes);
      expect([bytes.length, res.statusCode]).toEqual([bytes.length, 400]);
      expect(res.json()).toMatchObject({ code: 'validation_failed', param: 'body' });
      expect(res.json().detail).toContain('image/png');
    }
    const max = 10 * 1024 * 1024;
    const over = Buffer.concat([PNG_SIGNATURE, Buffer.alloc(max + 1 - PNG_SIGNATURE.length)]);
    const tooLarge = await put(over);
    expect(tooLarge.statusCode).toBe(413);
    expect(tooLarge.json().code).toBe('payload_too_large');
    expect(await artifact(c)).toBeNull();
    // Exactly the limit is taken.
    const atLimit = await put(over.subarray(0, max));
    expect([atLimit.statusCode, atLimit.json()]).toEqual([200, { commandId: c, bytes: max }]);
    // A JSON body past the JSON limit is still 415 here: the type is refused before any byte is read.
    expect((await put(over, 'application/json')).statusCode).toBe(415);
  });
});

// ------------------------------------------------------------------------------------------- reference agent

describe('reference agent end to end', () => {
  const ROOST = 'roost-e2e';
  const big = randomBytes(CHUNK_SIZE + 300_000); // two chunks
  const v1: Record<string, Buffer> = {
    'a.txt': Buffer.from('alpha\n'),
    'dir/b.bin': big,
    'dir/sub/c.txt': Buffer.from('charlie '.repeat(1000)),
    'empty.txt': Buffer.alloc(0),
    'z/d.bin': randomBytes(100_000),
  };
  const bigChanged = Buffer.concat([big.subarray(0, CHUNK_SIZE), randomBytes(200_000)]); // first chunk shared
  const v2: Record<string, Buffer> = {
    'a.txt': v1['a.txt'],
    'dir/b.bin': bigChanged,
    'dir/sub/c.txt': v1['dir/sub/c.txt'],
    'empty.txt': v1['empty.txt'],
    'copy-of-c.txt': v1['dir/sub/c.txt'], // same bytes, same chunk: dedup
    'new/e.txt': Buffer.from('echo'),
  };
  let agent: Agent;
  let rootDir: string;
  let ver1: string;
  let ver2: string;
  const src1 = () => path.join(tmpRoot, 'src1');
  const src2 = () => path.join(tmpRoot, 'src2');

  beforeAll(async () => {
    await writeTree(src1(), v1);
    await writeTree(src2(), v2);
    ver1 = (await publish(ROOST, v1)).versionId;
    ver2 = (await publish(ROOST, v2)).versionId;
    rootDir = path.join(tmpRoot, 'machine-e2e');
    agent = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'e2e-1',
      rootDir,
      heartbeatMs: 0,
      pollWaitSeconds: 5,
      progressIntervalMs: 1000,
    });
    await agent.start();
  });
  afterAll(async () => agent.stop());

  const syncParams = (versionId: string, versionNumber: number) => ({
    roostId: ROOST,
    versionId,
    versionNumber,
    rolloutId: null,
    extractRoot: 'C:\\Roost\\app',
    attempt: 1,
  });

  it('commits the exact tree of a version', async () => {
    const c = await insertCommand('e2e-1', 'sync_pull', syncParams(ver1, 1));
    const outcome = await agent.waitForCommand(c);
    expect(outcome).toMatchObject({ status: 'completed' });
    expect(await verifyTree(src1(), path.join(rootDir, 'Roost', 'app'))).toEqual([]);
    const st = await targetState('e2e-1', ROOST);
    expect(st).toMatchObject({
      reported_version_id: ver1,
      status: 'committed',
      files_total: 5,
      files_assembled: 4 + 1, // empty.txt is assembled as an empty file
      files_skipped: 0,
      chunks_total: 5,
      chunks_fetched: 5,
      chunks_dedup: 0,
      error: null,
    });
    expect(Number(st.bytes_fetched)).toBe(Object.values(v1).reduce((a, b) => a + b.length, 0));
    expect(await commandRow('e2e-1', c)).toMatchObject({ status: 'completed', result: 'success', progress: 100 });
    const manifest = await agent.readManifest(ROOST);
    expect(manifest).toMatchObject({ versionId: ver1, extractDir: 'Roost/app' });
    // The machines routes show it.
    const deps = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/e2e-1/deployments` });
    expect(deps.json().deployments).toEqual([
      expect.objectContaining({ roostId: ROOST, currentVersionId: ver2, reportedVersionId: ver1, status: 'committed', inSync: false }),
    ]);
  });

  it('syncs the next version reusing local chunks, skipping unchanged files and removing deleted ones', async () => {
    const c = await insertCommand('e2e-1', 'sync_pull', syncParams(ver2, 2));
    const outcome = await agent.waitForCommand(c);
    expect(outcome.status).toBe('completed');
    expect(await verifyTree(src2(), path.join(rootDir, 'Roost', 'app'))).toEqual([]);
    const st = await targetState('e2e-1', ROOST);
    expect(st).toMatchObject({
      reported_version_id: ver2,
      status: 'committed',
      files_total: 6,
      files_skipped: 3, // a.txt, dir/sub/c.txt, empty.txt
      files_assembled: 3, // dir/b.bin, copy-of-c.txt, new/e.txt
      chunks_total: 4, // b.bin ×2, c's chunk, e.txt
      chunks_dedup: 2, // b.bin's first chunk and c's chunk were in the store
      chunks_fetched: 2,
    });
    const deps = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/e2e-1/deployments` });
    expect(deps.json().deployments[0]).toMatchObject({
      reportedVersionId: ver2,
      currentVersionId: ver2,
      inSync: true,
      reportedVersionNumber: 2,
    });
  });

  it('refetches chunks whose first download is corrupted', async () => {
    const a2 = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'e2e-2',
      rootDir: path.join(tmpRoot, 'machine-e2e-2'),
      heartbeatMs: 0,
      pollWaitSeconds: 5,
      corruptFirstDownloadRate: 1,
    });
    await a2.start();
    try {
      const c = await insertCommand('e2e-2', 'sync_pull', syncParams(ver2, 2));
      const outcome = await a2.waitForCommand(c);
      expect(outcome.status).toBe('completed');
      expect(outcome.refetched).toBe(outcome.counters!.chunks_fetched);
      expect(outcome.refetched).toBeGreaterThan(0);
      expect(await verifyTree(src2(), path.join(tmpRoot, 'machine-e2e-2', 'Roost', 'app'))).toEqual([]);
      const st = await targetState('e2e-2', ROOST);
      expect(st.status).toBe('committed');
      expect(Number(st.bytes_fetched)).toBeGreaterThan(Object.values(v2).reduce((a, b) => a + b.length, 0)); // every chunk came twice
    } finally {
      await a2.stop();
    }
  });

  it('refuses a version body that does not hash to its id, and extract roots that escape', async () => {
    const tampered = await publish(
      'roost-tamper',
      { 'x.txt': Buffer.from('real') },
      {
        bodyText: JSON.stringify({
          schemaVersion: 2,
          mediaType: VERSION_MEDIA_TYPE,
          config: {},
          files: [{ path: 'x.txt', size: 4, chunks: [] }],
        }),
      },
    );
    const c1 = await insertCommand('e2e-1', 'sync_pull', { roostId: 'roost-tamper', versionId: tampered.versionId, extractRoot: 'tamper' });
    const o1 = await agent.waitForCommand(c1);
    expect(o1.status).toBe('failed');
    expect(o1.error).toMatch(/does not hash to the versionId/);
    expect(await targetState('e2e-1', 'roost-tamper')).toMatchObject({ status: 'failed', error: expect.stringMatching(/does not hash/) });
    expect(await commandRow('e2e-1', c1)).toMatchObject({ status: 'failed', error: expect.stringMatching(/does not hash/) });

    const c2 = await insertCommand('e2e-1', 'sync_pull', { roostId: ROOST, versionId: ver2, extractRoot: '../../escape' });
    const o2 = await agent.waitForCommand(c2);
    expect(o2.status).toBe('failed');
    expect(o2.error).toMatch(/\.\./);
    await expect(fs.stat(path.join(tmpRoot, '..', 'escape'))).rejects.toThrow();
  });

  it('fails on purpose for failMachines and reports failed', async () => {
    const a3 = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'e2e-3',
      rootDir: path.join(tmpRoot, 'machine-e2e-3'),
      heartbeatMs: 0,
      pollWaitSeconds: 5,
      failMachines: ['e2e-3'],
    });
    await a3.start();
    try {
      const c = await insertCommand('e2e-3', 'sync_pull', syncParams(ver1, 1));
      expect((await a3.waitForCommand(c)).status).toBe('failed');
      expect(await targetState('e2e-3', ROOST)).toMatchObject({ status: 'failed', error: expect.stringMatching(/injected/) });
      expect(await commandRow('e2e-3', c)).toMatchObject({ status: 'failed' });
    } finally {
      await a3.stop();
    }
  });

  it('stops a sync when the server cancelled its command meanwhile and reports cancelled', async () => {
    const a4 = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'e2e-4',
      rootDir: path.join(tmpRoot, 'machine-e2e-4'),
      heartbeatMs: 0,
      pollWaitSeconds: 5,
      // The sync (1.5 s) outlasts the progress interval, so its `assembling` report goes out and learns of it.
      progressIntervalMs: 1000,
      syncDelayMs: 1500,
    });
    await a4.start();
    try {
      const c = await insertCommand('e2e-4', 'sync_pull', syncParams(ver1, 1));
      const done = a4.waitForCommand(c);
      // Wait until the agent took it (intermediate status), then cancel it server-side.
      for (let i = 0; i < 200 && (await commandRow('e2e-4', c)).status !== 'downloading'; i++) await new Promise((r) => setTimeout(r, 50));
      await h.deps.db.query(
        `UPDATE commands SET status = 'cancelled', result = 'cancelled', completed_at = now() WHERE site_id = $1 AND machine_id = 'e2e-4' AND command_id = $2`,
        [h.siteId, c],
      );
      const o = await done;
      expect(o.status).toBe('cancelled');
      expect(await targetState('e2e-4', ROOST)).toMatchObject({ status: 'cancelled', reported_version_id: ver1 });
      expect(await commandRow('e2e-4', c)).toMatchObject({ status: 'cancelled', result: 'cancelled' });
      expect(await agent.readManifest(ROOST)).not.toBeNull(); // the other machine is untouched
      expect(await a4.readManifest(ROOST)).toBeNull();
    } finally {
      await a4.stop();
    }
  });

  // reboot_machine and shutdown_machine really take the agent offline and back (agent/power.ts): they are
  // tested in test/integration/processes.test.ts, away from the agents the tests here share.
  it('uploads a screenshot for capture_screenshot queued through the API', async () => {
    const ids: string[] = [];
    for (const body of [{ type: 'capture_screenshot', params: { monitor: 'primary' } }]) {
      const res = await h.request({
        method: 'POST',
        url: `/api/sites/${h.siteId}/machines/e2e-1/commands`,
        idempotencyKey: idemKey(),
        body,
      });
      expect(res.statusCode).toBe(202);
      ids.push(res.json().commandId);
    }
    for (const id of ids) expect((await agent.waitForCommand(id)).status).toBe('completed');
    for (const id of ids) {
      const st = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/e2e-1/commands/${id}` });
      expect(st.json()).toMatchObject({ status: 'completed', result: 'success' });
    }
    const shot = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/e2e-1/commands/${ids[0]}` });
    const png = await fetch(shot.json().screenshotUrl);
    expect(png.status).toBe(200);
    // The agent's own upload (agent/transport.ts uploadScreenshot: Content-Type image/png) stored a whole PNG.
    const bytes = Buffer.from(await png.arrayBuffer());
    expect(bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))).toBe(true);
    expect(bytes.subarray(bytes.length - 8, bytes.length - 4).toString()).toBe('IEND');
  });

  it('reuses its persisted token on restart and re-enrols when it was rotated', async () => {
    const dir = path.join(tmpRoot, 'machine-e2e-5');
    const a = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'e2e-5',
      rootDir: dir,
      heartbeatMs: 0,
      pollWaitSeconds: 1,
    });
    await a.start();
    const first = a.token;
    await a.stop();
    const b = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'e2e-5',
      rootDir: dir,
      heartbeatMs: 0,
      pollWaitSeconds: 1,
    });
    await b.start();
    expect(b.token).toBe(first);
    await b.stop();
    await enrol('e2e-5'); // someone else rotated the token
    const c = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'e2e-5',
      rootDir: dir,
      heartbeatMs: 0,
      pollWaitSeconds: 1,
    });
    await c.start();
    expect(c.token).not.toBe(first);
    const { rows } = await h.deps.db.query('SELECT agent_token_hash FROM machines WHERE site_id = $1 AND machine_id = $2', [
      h.siteId,
      'e2e-5',
    ]);
    expect(rows[0].agent_token_hash).toBe(sha256Hex(c.token!));
    await c.stop();
  });
});

// ------------------------------------------------------------------------------------ long-poll wake-ups

describe('CommandWaiters (services/agent.ts)', () => {
  /** One pending reboot_machine per machine, command id `cmd_<tag>_<machine>`, in `siteId` (default the harness's). */
  const insertFor = (ids: string[], tag: string, siteId = h.siteId) =>
    h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type) SELECT $1, m, 'cmd_${tag}_' || m, 'reboot_machine' FROM UNNEST($2::text[]) AS t (m)`,
      [siteId, ids],
    );
  const removeTagged = (tag: string) =>
    h.deps.db.query(`DELETE FROM commands WHERE site_id = $1 AND command_id LIKE 'cmd_${tag}_%'`, [h.siteId]);

  it('wakes ready polls only while a delivery slot is free, and the next one as soon as a slot is released', async () => {
    const ids = Array.from({ length: 10 }, (_, i) => `slot-${i}`);
    await insertFor(ids, 'slot');
    // Four slots: the first check wakes four, and every wake-up after it needs a slot given back (a later
    // check, 200 ms on, finds none free).
    const waiters = new CommandWaiters({ db: h.deps.db }, { warn: () => undefined }, 200, 4);
    const woken: string[] = [];
    const idle = async () => {
      for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
    };
    try {
      const waits = ids.map((id) => waiters.wait(h.siteId, id, Date.now() + 60_000).promise.then((slot) => slot && woken.push(id)));
      await Promise.race(waits);
      await idle();
      expect(woken).toHaveLength(4);
      expect(waiters.delivering).toBe(4);
      expect(waiters.tryAcquire()).toBe(false);
      waiters.release();
      await idle();
      expect(woken).toHaveLength(5);
      expect(waiters.delivering).toBe(4);
      for (let i = 0; i < 5; i++) waiters.release();
      await Promise.all(waits);
      expect(new Set(woken)).toEqual(new Set(ids));
      for (let i = 0; i < 4; i++) waiters.release();
      expect(waiters.delivering).toBe(0);
      expect(waiters.size).toBe(0);
    } finally {
      waiters.close();
      await removeTagged('slot');
    }
  });

  it('leaves a machine without a deliverable command waiting, however many slots are free', async () => {
    await insertFor(['slot-busy'], 'free');
    const waiters = new CommandWaiters({ db: h.deps.db }, { warn: () => undefined }, 50, 4);
    try {
      const idleWait = waiters.wait(h.siteId, 'slot-idle', Date.now() + 400);
      const busyWait = waiters.wait(h.siteId, 'slot-busy', Date.now() + 5_000);
      expect(await busyWait.promise).toBe(true);
      expect(await idleWait.promise).toBe(false);
      expect(waiters.delivering).toBe(1);
      waiters.release();
    } finally {
      waiters.close();
      await removeTagged('free');
    }
  });

  it('a long-poll claims nothing while every slot is taken, and gets its command once one is released', async () => {
    const waiters = new CommandWaiters({ db: h.deps.db }, { warn: () => undefined }, 50, 2);
    const ctl = new AbortController();
    try {
      await insertFor(['slot-full'], 'full');
      expect(waiters.tryAcquire()).toBe(true);
      expect(waiters.tryAcquire()).toBe(true);
      const poll = pollAgentCommands(h.deps, waiters, {
        siteId: h.siteId,
        machineId: 'slot-full',
        waitSeconds: 10,
        gone: ctl.signal,
        inlineSync: true,
      });
      await new Promise((r) => setTimeout(r, 300)); // several checks
      const before = await h.deps.db.query('SELECT delivered_at FROM commands WHERE site_id = $1 AND command_id = $2', [
        h.siteId,
        'cmd_full_slot-full',
      ]);
      expect(before.rows[0].delivered_at).toBeNull();
      waiters.release();
      const rows = await poll;
      expect(rows.map((r) => r.command_id)).toEqual(['cmd_full_slot-full']);
      // The poll gave its slot back; the one still held by the test is the only one taken.
      expect(waiters.delivering).toBe(1);
      waiters.release();
    } finally {
      ctl.abort();
      waiters.close();
      await removeTagged('full');
    }
  });

  it("hands out no more of a site's commands while earlier ones are in flight (handed out, not finished)", async () => {
    // A site of its own: the window counts the whole site's outstanding deliveries, and other tests here
    // leave some in the main site.
    const { siteId } = await h.other();
    const ids = Array.from({ length: 6 }, (_, i) => `win-${i}`);
    await insertFor(ids, 'win', siteId);
    const waiters = new CommandWaiters({ db: h.deps.db }, { warn: () => undefined }, 50, 8, 3);
    const ctl = new AbortController();
    const delivered = async () =>
      (
        await h.deps.db.query<{ command_id: string; status: string }>(
          `SELECT command_id, status FROM commands WHERE site_id = $1 AND command_id LIKE 'cmd_win_%' AND delivered_at IS NOT NULL`,
          [siteId],
        )
      ).rows;
    try {
      const got: string[] = [];
      const polls = ids.map((machineId) =>
        pollAgentCommands(h.deps, waiters, { siteId: siteId, machineId, waitSeconds: 20, gone: ctl.signal, inlineSync: false }).then(
          (rows) => got.push(...rows.map((r) => r.command_id)),
        ),
      );
      // The window's three come within a few checks (however slow the machine); a dozen more wake none.
      await waitUntil(() => got.length >= 3);
      await new Promise((r) => setTimeout(r, 600));
      expect(got).toHaveLength(3);
      expect(await delivered()).toHaveLength(3);
      // The agents report an intermediate status: still in flight, the window stays shut.
      await h.deps.db.query(`UPDATE commands SET status = 'downloading' WHERE site_id = $1 AND command_id = ANY($2::text[])`, [
        siteId,
        got,
      ]);
      await new Promise((r) => setTimeout(r, 400));
      expect(got).toHaveLength(3);
      // They finish: the window opens again.
      await h.deps.db.query(
        `UPDATE commands SET status = 'completed', result = 'success', completed_at = now() WHERE site_id = $1 AND command_id = ANY($2::text[])`,
        [siteId, [...got]],
      );
      await Promise.all(polls);
      expect(new Set(got)).toEqual(new Set(ids.map((m) => `cmd_win_${m}`)));
    } finally {
      ctl.abort();
      waiters.close();
      await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
    }
  });

  it("closes a waiting machine's expired pending commands within a few checks, without waking its poll", async () => {
    const { siteId } = await h.other();
    const warnings: unknown[] = [];
    const waiters = new CommandWaiters({ db: h.deps.db }, { warn: (o) => warnings.push(o) }, 50);
    try {
      // The checks are under way (another machine waits) when the command, already past its expiry, comes.
      const other = waiters.wait(siteId, 'exp-0', Date.now() + 3000);
      await new Promise((r) => setTimeout(r, 200));
      await h.deps.db.query(
        `INSERT INTO commands (site_id, machine_id, command_id, type, expires_at) VALUES ($1, 'exp-1', 'cmd_exp_1', 'reboot_machine', now() - INTERVAL '1 second')`,
        [siteId],
      );
      const w = waiters.wait(siteId, 'exp-1', Date.now() + 2500);
      let row: { status: string; error: string | null } | undefined;
      for (let i = 0; i < 40; i++) {
        await new Promise((r) => setTimeout(r, 50));
        row = (await h.deps.db.query(`SELECT status, error FROM commands WHERE site_id = $1 AND command_id = 'cmd_exp_1'`, [siteId]))
          .rows[0];
        if (row?.status !== 'pending') break;
      }
      expect(warnings).toEqual([]);
      expect(row).toEqual({ status: 'failed', error: 'expired' });
      // Never deliverable: neither poll is woken; both run to their deadline.
      expect(await w.promise).toBe(false);
      expect(await other.promise).toBe(false);
    } finally {
      waiters.close();
      await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
    }
  });

  it('one claim hands out the deliverable commands and closes the expired ones of the machine, in a single UPDATE', async () => {
    const { siteId } = await h.other();
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, expires_at) VALUES
         ($1, 'clm-1', 'cmd_clm_old', 'reboot_machine', now() - INTERVAL '1 minute'),
         ($1, 'clm-1', 'cmd_clm_new', 'reboot_machine', now() + INTERVAL '1 hour'),
         ($1, 'clm-1', 'cmd_clm_open', 'reboot_machine', NULL),
         ($1, 'clm-2', 'cmd_clm_other', 'reboot_machine', now() - INTERVAL '1 minute')`,
      [siteId],
    );
    const rows = await claimCommands(h.deps.db, siteId, 'clm-1');
    expect(rows.map((r) => r.command_id).sort()).toEqual(['cmd_clm_new', 'cmd_clm_open']);
    expect(rows.every((r) => r.status === 'pending' && r.delivered_at !== null && !('claim_expired' in r))).toBe(true);
    const after = await h.deps.db.query<{ command_id: string; status: string; error: string | null; delivered_at: Date | null }>(
      `SELECT command_id, status, error, delivered_at FROM commands WHERE site_id = $1 ORDER BY command_id`,
      [siteId],
    );
    expect(after.rows).toEqual([
      { command_id: 'cmd_clm_new', status: 'pending', error: null, delivered_at: expect.any(Date) },
      { command_id: 'cmd_clm_old', status: 'failed', error: 'expired', delivered_at: null },
      { command_id: 'cmd_clm_open', status: 'pending', error: null, delivered_at: expect.any(Date) },
      // Another machine's expired command is not this claim's business.
      { command_id: 'cmd_clm_other', status: 'pending', error: null, delivered_at: null },
    ]);
    await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
  });

  it('takes the ready machines in id order from a pivot, wrapping around, so a limit does not always favour the lowest ids', async () => {
    const { siteId } = await h.other();
    const ids = Array.from({ length: 10 }, (_, i) => `piv-${i}`);
    await insertFor(ids, 'piv', siteId);
    expect((await machinesWithDeliverable(h.deps.db, siteId, ids, 3, 'piv-5')).ready).toEqual(['piv-5', 'piv-6', 'piv-7']);
    expect((await machinesWithDeliverable(h.deps.db, siteId, ids, 3, 'piv-8')).ready).toEqual(['piv-8', 'piv-9', 'piv-0']);
    expect((await machinesWithDeliverable(h.deps.db, siteId, ids, 20, 'piv-3')).ready).toHaveLength(10);
    // Handed out and not finished: counted as in flight, and no longer ready.
    await h.deps.db.query(`UPDATE commands SET delivered_at = now() WHERE site_id = $1 AND machine_id IN ('piv-0', 'piv-1', 'piv-2')`, [
      siteId,
    ]);
    expect(await machinesWithDeliverable(h.deps.db, siteId, ids, 3, 'piv-9')).toEqual({ ready: ['piv-9', 'piv-3', 'piv-4'], inFlight: 3 });
    // Reported on (taken out of pending) but not finished: still in flight; the second slice of a check skips the count.
    await h.deps.db.query(`UPDATE commands SET status = 'downloading' WHERE site_id = $1 AND machine_id = 'piv-2'`, [siteId]);
    expect((await machinesWithDeliverable(h.deps.db, siteId, ids, 3, 'piv-9')).inFlight).toBe(3);
    expect((await machinesWithDeliverable(h.deps.db, siteId, ids, 3, 'piv-9', false)).inFlight).toBe(0);
    // Finished, or silent since longer than the redelivery bound: no longer counted.
    await h.deps.db.query(`UPDATE commands SET status = 'completed', completed_at = now() WHERE site_id = $1 AND machine_id = 'piv-2'`, [
      siteId,
    ]);
    await h.deps.db.query(
      `UPDATE commands SET delivered_at = now() - INTERVAL '2 minutes', updated_at = now() - INTERVAL '2 minutes' WHERE site_id = $1 AND machine_id = 'piv-1'`,
      [siteId],
    );
    expect((await machinesWithDeliverable(h.deps.db, siteId, ids, 3, 'piv-9')).inFlight).toBe(1);
    await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
  });

  it('reads pages of the whole site by id range: after (exclusive), upTo (inclusive), a limit, the in-flight count on request', async () => {
    const { siteId } = await h.other();
    const ids = Array.from({ length: 10 }, (_, i) => `pg-${i}`);
    await insertFor(ids, 'pg', siteId);
    // Two commands on one machine: listed once.
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type) VALUES ($1, 'pg-4', 'cmd_pg_second', 'reboot_machine')`,
      [siteId],
    );
    expect(await deliverableMachinesPage(h.deps.db, siteId, 'pg-2', null, 3)).toEqual({
      machineIds: ['pg-3', 'pg-4', 'pg-5'],
      inFlight: 0,
    });
    expect((await deliverableMachinesPage(h.deps.db, siteId, 'pg-7', null, 10)).machineIds).toEqual(['pg-8', 'pg-9']);
    expect((await deliverableMachinesPage(h.deps.db, siteId, '', 'pg-2', 10)).machineIds).toEqual(['pg-0', 'pg-1', 'pg-2']);
    expect((await deliverableMachinesPage(h.deps.db, siteId, 'pg-9', null, 10)).machineIds).toEqual([]);
    // Handed out recently, or expired: not deliverable; handed out and unfinished: in flight (counted on request only).
    await h.deps.db.query(`UPDATE commands SET delivered_at = now() WHERE site_id = $1 AND machine_id IN ('pg-0', 'pg-1')`, [siteId]);
    await h.deps.db.query(`UPDATE commands SET expires_at = now() - INTERVAL '1 second' WHERE site_id = $1 AND machine_id = 'pg-2'`, [
      siteId,
    ]);
    expect(await deliverableMachinesPage(h.deps.db, siteId, '', 'pg-3', 10, true)).toEqual({ machineIds: ['pg-3'], inFlight: 2 });
    expect((await deliverableMachinesPage(h.deps.db, siteId, '', 'pg-3', 10, false)).inFlight).toBe(0);
    // Another site's pending commands are not this site's.
    expect((await deliverableMachinesPage(h.deps.db, h.siteId, 'pg-', 'pg-9', 10)).machineIds).toEqual([]);
    await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
  });

  it(`with more than ${ID_LIST_MAX} polls waiting, wakes exactly the waiting machines that have a command, up to the window, never a machine that is not waiting`, async () => {
    const { siteId } = await h.other();
    const pad = (i: number) => String(i).padStart(4, '0');
    // 700 polls wait; 300 of them have a command. 1,500 machines that are not waiting have one too, their
    // ids spread among the waiting ones' (the pages must skip them).
    const waiting = Array.from({ length: 700 }, (_, i) => `scn-${pad(i * 3)}`);
    const withCommand = waiting.filter((_, i) => i % 7 < 3);
    const absent = Array.from({ length: 1500 }, (_, i) => `scn-${pad(i * 3 + 1)}`);
    await insertFor([...withCommand, ...absent], 'scn', siteId);
    // Window of 120 in flight, with none finishing: the first checks wake 120 and then no more.
    const waiters = new CommandWaiters({ db: h.deps.db }, { warn: () => undefined }, 30, 10_000, 120);
    const woken: string[] = [];
    const handles = waiting.map((id) => {
      const w = waiters.wait(siteId, id, Date.now() + 60_000);
      void w.promise.then(async (slot) => {
        if (!slot) return;
        woken.push(id);
        // What a delivery does: the claim marks the command handed out (in flight); then the slot goes back.
        await claimCommands(h.deps.db, siteId, id);
        waiters.release();
      });
      return w;
    });
    try {
      await waitUntil(() => woken.length >= 120);
      await new Promise((r) => setTimeout(r, 400)); // more checks: the window is full
      expect(woken).toHaveLength(120);
      expect(new Set(woken).size).toBe(120);
      expect(woken.every((id) => withCommand.includes(id))).toBe(true);
      // Those finish: the rest of the waiting machines with a command are woken, and no other.
      await h.deps.db.query(
        `UPDATE commands SET status = 'completed', completed_at = now() WHERE site_id = $1 AND machine_id = ANY($2::text[])`,
        [siteId, woken],
      );
      await waitUntil(() => woken.length >= 240);
      await new Promise((r) => setTimeout(r, 300));
      expect(woken).toHaveLength(240);
      expect(new Set(woken).size).toBe(240);
      expect(woken.every((id) => withCommand.includes(id))).toBe(true);
      const handed = await h.deps.db.query<{ n: number }>(
        `SELECT count(*)::INT AS n FROM commands WHERE site_id = $1 AND machine_id = ANY($2::text[]) AND delivered_at IS NOT NULL`,
        [siteId, absent],
      );
      expect(handed.rows[0].n).toBe(0);
    } finally {
      for (const w of handles) w.cancel();
      waiters.close();
      await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
    }
  });

  it.each([
    ['few polls wait (one statement with their ids)', 0],
    [`more than ${ID_LIST_MAX} polls wait (pages of the site)`, ID_LIST_MAX + 20],
  ])(
    'does not wake past the window when a delivery finishes while a check reads (its claim after the snapshot, its slot back before the answer): %s',
    async (_, idle) => {
      const { siteId } = await h.other();
      const ids = ['rc-a', 'rc-b', 'rc-c', 'rc-d', 'rc-e'];
      await insertFor(ids, 'rc', siteId);
      // Polls of machines with nothing pending wait beside them (enough of them switch the check to pages).
      const idle_ = Array.from({ length: idle }, (_, i) => `rc-idle-${String(i).padStart(4, '0')}`);
      // The real pool, with one hook: once armed, right after a check's statement has read (its snapshot
      // taken), one woken delivery claims its command and gives its slot back, before the check sees the answer.
      let during: (() => Promise<void>) | undefined;
      const real = h.deps.db;
      const db = Object.create(real) as typeof real;
      db.query = (async (text: string, values?: unknown[]) => {
        const result = await real.query(text, values);
        const hook = during;
        if (hook && text.includes('AS in_flight')) {
          during = undefined;
          await hook();
        }
        return result;
      }) as typeof real.query;
      const waiters = new CommandWaiters({ db }, { warn: () => undefined }, 30, 10_000, 3);
      const woken: string[] = [];
      const handles = [...ids, ...idle_].map((id) => {
        const w = waiters.wait(siteId, id, Date.now() + 60_000);
        void w.promise.then((slot) => {
          if (slot) woken.push(id);
        });
        return w;
      });
      try {
        // The first check wakes three (the window); they hold their slots, nothing claimed yet.
        await waitUntil(() => woken.length >= 3, 5_000, 10);
        expect(woken).toHaveLength(3);
        const first = woken[0];
        let fired = false;
        during = async () => {
          await claimCommands(real, siteId, first);
          waiters.release();
          fired = true;
        };
        await waitUntil(() => fired, 5_000, 10);
        expect(fired).toBe(true);
        // Later checks: one claimed (in flight) and two slots held fill the window of three.
        await new Promise((r) => setTimeout(r, 300));
        expect(woken).toHaveLength(3);
        // The two give their slots back unclaimed (nothing delivered): the window has room for two more.
        waiters.release();
        waiters.release();
        await waitUntil(() => woken.length >= 5, 5_000, 10);
        expect(new Set(woken)).toEqual(new Set(ids));
      } finally {
        for (const w of handles) w.cancel();
        waiters.close();
        await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
      }
    },
  );

  it("counts the site's commands in flight at each check, and the poll answer asks for a progress gap that spreads the report budget over them", async () => {
    const { siteId } = await h.other();
    // 300 commands in flight (handed out, reported on, not finished), and one pending for the polling machine.
    const busy = Array.from({ length: 300 }, (_, i) => `bud-${String(i).padStart(3, '0')}`);
    await insertFor([...busy, 'bud-poll'], 'bud', siteId);
    await h.deps.db.query(
      `UPDATE commands SET status = 'downloading', delivered_at = now(), updated_at = now() WHERE site_id = $1 AND machine_id = ANY($2::text[])`,
      [siteId, busy],
    );
    const waiters = new CommandWaiters({ db: h.deps.db }, { warn: () => undefined }, 50);
    const ctl = new AbortController();
    try {
      expect(waiters.inFlightOf(siteId)).toBe(0);
      const rows = await pollAgentCommands(h.deps, waiters, {
        siteId,
        machineId: 'bud-poll',
        waitSeconds: 5,
        gone: ctl.signal,
        inlineSync: false,
      });
      expect(rows.map((r) => r.command_id)).toEqual(['cmd_bud_bud-poll']);
      // The 300 in flight and the delivery the check woke.
      expect(waiters.inFlightOf(siteId)).toBe(301);
      expect(progressIntervalFor(waiters.inFlightOf(siteId))).toBe(12_040);
    } finally {
      ctl.abort();
      waiters.close();
      await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
    }
  });

  it('reads the pending commands of a site with a command history through the partial index commands_pending', async () => {
    // A site as the check meets it: each machine has a history of closed commands and one pending.
    const { siteId } = await h.other();
    const ids = Array.from({ length: 40 }, (_, i) => `plan-${String(i).padStart(2, '0')}`);
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, completed_at)
       SELECT $1, m, 'cmd_plan_' || m || '_' || n, 'reboot_machine', 'completed', now()
         FROM UNNEST($2::text[]) AS t (m), generate_series(1, 150) AS n`,
      [siteId, ids],
    );
    await insertFor(ids, 'plan', siteId);
    await h.deps.db.query('ANALYZE commands');
    const client = await h.deps.db.connect();
    let plan: string;
    try {
      // The planner may still prefer a sequential scan of a table this small; among the indexes, the partial one.
      await client.query('BEGIN');
      await client.query('SET LOCAL enable_seqscan = off');
      const { rows } = await client.query<{ 'QUERY PLAN': string }>(
        `EXPLAIN SELECT DISTINCT machine_id FROM commands WHERE site_id = $1 AND machine_id = ANY($2::TEXT[]) AND machine_id >= $3
           AND status = 'pending' AND (expires_at IS NULL OR expires_at > now()) ORDER BY machine_id LIMIT 10`,
        [siteId, ids, 'plan-10'],
      );
      plan = rows.map((r) => r['QUERY PLAN']).join('\n');
    } finally {
      await client.query('ROLLBACK');
      client.release();
      await h.deps.db.query(`DELETE FROM commands WHERE site_id = $1`, [siteId]);
    }
    expect(plan).toMatch(/commands_pending/);
  });
});
