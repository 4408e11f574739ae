/** Machines routes (api/routes/machines.ts: list, detail, deployments, commands; docs/decisions/machine-commands.md). */
import http from 'node:http';
import { createHarness, type Harness, idemKey } from '../support/harness';
import type { Scope } from '../../domain/scopes';
import { scopedKey as scopedKeyOf } from '../support/identity';

let h: Harness;
let secret: string;

beforeAll(async () => {
  h = await createHarness();
  secret = await h.enrolmentSecret();
});
afterAll(async () => h.close());

const scopedKey = (scopes: Scope[]) => scopedKeyOf(h, scopes);

/** GET of `path` exactly as given (node:http does not normalise dot segments), with an API key; the JSON answer. */
function rawGet(base: string, path: string, key: string): Promise<{ status: number; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${base}/`, { method: 'GET', path, headers: { authorization: `Bearer ${key}` } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function enrol(machineId: string, extra: Record<string, unknown> = {}): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: '/api/agent/enrol',
    key: null,
    body: { siteId: h.siteId, enrolmentSecret: secret, machineId, hostname: `${machineId}.local`, agentVersion: '3.1.0', ...extra },
  });
  expect(res.statusCode).toBe(201);
  return res.json().agentToken;
}

async function goStale(machineId: string): Promise<void> {
  await h.deps.db.query(`UPDATE machines SET last_heartbeat = now() - INTERVAL '1 day' WHERE site_id = $1 AND machine_id = $2`, [
    h.siteId,
    machineId,
  ]);
}

const base = () => `/api/sites/${h.siteId}/machines`;

describe('GET /api/sites/{siteId}/machines', () => {
  beforeAll(async () => {
    for (const id of ['list-a', 'list-b', 'list-c', 'list-d', 'list-e'])
      await enrol(id, { timezone: 'UTC label', timezoneIana: 'Europe/Paris', capabilities: { sync_pull: true } });
    await goStale('list-b');
    await h.deps.db.query(`UPDATE machines SET online = false WHERE site_id = $1 AND machine_id = 'list-c'`, [h.siteId]);
  });

  it('lists machines with their liveness and agent fields', async () => {
    const res = await h.request({ method: 'GET', url: `${base()}?page_size=200` });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    const byId = Object.fromEntries(body.machines.map((m: { machineId: string }) => [m.machineId, m]));
    expect(byId['list-a']).toMatchObject({
      machineId: 'list-a',
      siteId: h.siteId,
      hostname: 'list-a.local',
      online: true,
      agent_version: '3.1.0',
      machine_timezone: 'UTC label',
      machine_timezone_iana: 'Europe/Paris',
      cortexEnabled: true,
      rebooting: false,
      shuttingDown: false,
      capabilities: { sync_pull: true },
    });
    expect(Date.parse(byId['list-a'].lastHeartbeat)).not.toBeNaN();
    expect(byId['list-b'].online).toBe(false); // heartbeat stale
    expect(byId['list-c'].online).toBe(false); // agent-reported offline
    expect(body.next_page_token).toBe('');
    expect(body.nextPageToken).toBe('');
  });

  it('pages with page_size / page_token and the legacy aliases', async () => {
    const seen: string[] = [];
    let token = '';
    let pages = 0;
    do {
      const res = await h.request({ method: 'GET', url: `${base()}?page_size=2${token ? `&page_token=${token}` : ''}` });
      expect(res.statusCode).toBe(200);
      const body = res.json();
      expect(body.machines.length).toBeLessThanOrEqual(2);
      seen.push(...body.machines.map((m: { machineId: string }) => m.machineId));
      expect(body.nextPageToken).toBe(body.next_page_token);
      token = body.next_page_token;
      pages++;
    } while (token && pages < 20);
    expect(seen).toEqual([...seen].sort());
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen).toEqual(expect.arrayContaining(['list-a', 'list-b', 'list-c', 'list-d', 'list-e']));
    const alias = await h.request({ method: 'GET', url: `${base()}?limit=1` });
    expect(alias.json().machines).toHaveLength(1);
    const next = await h.request({ method: 'GET', url: `${base()}?limit=1&cursor=${alias.json().next_page_token}` });
    expect(next.json().machines[0].machineId > alias.json().machines[0].machineId).toBe(true);
  });

  it('rejects bad paging', async () => {
    for (const q of ['page_size=0', 'page_size=201', 'page_size=abc', 'page_token=%%%garbage']) {
      const res = await h.request({ method: 'GET', url: `${base()}?${q}` });
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('validation_failed');
    }
  });

  it('checks site and scopes', async () => {
    const other = await h.other();
    const hidden = await h.request({ method: 'GET', url: base(), key: other.apiKey });
    expect(hidden.statusCode).toBe(404);
    expect(hidden.json().code).toBe('not_found');
    const machineRead = await scopedKey([{ resource: 'machine', id: '*', permissions: ['read'] }]);
    expect((await h.request({ method: 'GET', url: base(), key: machineRead })).statusCode).toBe(200);
    const roostOnly = await scopedKey([{ resource: 'roost', id: '*', permissions: ['read', 'write'] }]);
    const denied = await h.request({ method: 'GET', url: base(), key: roostOnly });
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: h.siteId, permission: 'read' } });
    const writeOnly = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    expect((await h.request({ method: 'GET', url: base(), key: writeOnly })).statusCode).toBe(403); // write does not imply read
    const malformed = await h.request({ method: 'GET', url: '/api/sites/bad%20id/machines' });
    expect(malformed.statusCode).toBe(400);
  });
});

describe('GET /api/sites/{siteId}/machines/{machineId}', () => {
  it('returns host info, metrics snapshot and live processes with the machine fields', async () => {
    const token = await enrol('detail-1');
    await h.request({
      method: 'POST',
      url: '/api/agent/heartbeat',
      key: token,
      body: {
        metrics: { schemaVersion: 2, cpus: [{ load: 0.5 }] },
        processes: [{ name: 'kiosk.exe', pid: 7, status: 'running' }],
        info: { os: 'Windows 11', ram: 16 },
        shuttingDown: true,
      },
    });
    const res = await h.request({ method: 'GET', url: `${base()}/detail-1` });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({
      machineId: 'detail-1',
      online: true,
      shuttingDown: true,
      info: { os: 'Windows 11', ram: 16 },
      metrics: { schemaVersion: 2, cpus: [{ load: 0.5 }] },
      processes: [{ name: 'kiosk.exe', pid: 7, status: 'running' }],
    });
  });

  it('404s unknown machines and other sites, 400s malformed ids, honours machine scopes', async () => {
    await enrol('detail-2');
    expect((await h.request({ method: 'GET', url: `${base()}/nope` })).statusCode).toBe(404);
    expect((await h.request({ method: 'GET', url: `${base()}/bad%20id` })).statusCode).toBe(400);
    // Ids made only of dots are refused as path parameters too, however they are spelled. Sent over a socket as
    // they are: URL parsers (fetch, app.inject) would normalise `..`, `.` and `%2E` segments away first.
    const url = await h.listen();
    for (const id of ['.', '..', '...', '%2E', '%2E%2E', '%2e%2e%2e', '.%2E']) {
      for (const p of [`${base()}/${id}`, `${base()}/${id}/deployments`, `${base()}/${id}/processes`]) {
        const res = await rawGet(url, p, h.apiKey);
        expect([p, res.status, res.body.code, res.body.param]).toEqual([p, 400, 'validation_failed', 'params.machineId']);
      }
    }
    const dots = await h.request({
      method: 'POST',
      url: '/api/roosts',
      idempotencyKey: true,
      body: { siteId: h.siteId, name: 'dots', targets: ['m-1', '..'] },
    });
    expect(dots.statusCode).toBe(400);
    expect(Object.keys(dots.json().errors)).toEqual(['targets.1']);
    const other = await h.other();
    expect((await h.request({ method: 'GET', url: `${base()}/detail-2`, key: other.apiKey })).statusCode).toBe(404);
    const mine = await scopedKey([{ resource: 'machine', id: 'detail-2', permissions: ['read'] }]);
    expect((await h.request({ method: 'GET', url: `${base()}/detail-2`, key: mine })).statusCode).toBe(200);
    const denied = await h.request({ method: 'GET', url: `${base()}/detail-1`, key: mine });
    expect(denied.statusCode).toBe(403);
    expect(denied.json().required).toEqual({ resource: 'machine', id: 'detail-1', permission: 'read' });
  });
});

describe('GET /api/sites/{siteId}/machines/{machineId}/deployments', () => {
  it('lists roosts that target the machine or that it reported, with intended and reported versions', async () => {
    const token = await enrol('dep-1');
    const v1 = 'a'.repeat(64);
    const v2 = 'b'.repeat(64);
    const roost = async (roostId: string, targets: string[], current: string | null, deleted = false) => {
      await h.deps.db.query(
        `INSERT INTO roosts (site_id, roost_id, name, targets, extract_path, created_by, current_version_id, deleted_at)
         VALUES ($1, $2, $3, $4, 'C:\\app', $5, NULL, ${deleted ? 'now()' : 'NULL'})`,
        [h.siteId, roostId, `Roost ${roostId}`, JSON.stringify(targets), h.userId],
      );
      for (const [n, v] of [v1, v2].entries()) {
        await h.deps.db.query(
          `INSERT INTO roost_versions (site_id, roost_id, version_id, version_number, blob_name, total_size, total_files, created_by)
           VALUES ($1, $2, $3, $4, 'x', 1, 1, $5)`,
          [h.siteId, roostId, v, n + 1, h.userId],
        );
      }
      await h.deps.db.query('UPDATE roosts SET current_version_id = $3 WHERE site_id = $1 AND roost_id = $2', [h.siteId, roostId, current]);
    };
    await roost('dep-targeted', ['dep-1', 'other'], v2);
    await roost('dep-reported', [], v2);
    await roost('dep-unrelated', ['someone-else'], v1);
    await roost('dep-deleted', ['dep-1'], v1, true);
    const put = await h.request({
      method: 'PUT',
      url: '/api/agent/roosts/dep-reported/state',
      key: token,
      body: {
        reportedVersionId: v2,
        status: 'committed',
        chunks_fetched: 2,
        chunks_total: 3,
        chunks_dedup: 1,
        files_total: 4,
        files_assembled: 3,
        files_skipped: 1,
        bytes_fetched: 99,
      },
    });
    expect(put.statusCode).toBe(200);
    const res = await h.request({ method: 'GET', url: `${base()}/dep-1/deployments` });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.deployments.map((d: { roostId: string }) => d.roostId)).toEqual(['dep-reported', 'dep-targeted']);
    expect(body.deployments[0]).toMatchObject({
      roostId: 'dep-reported',
      name: 'Roost dep-reported',
      currentVersionId: v2,
      currentVersionNumber: 2,
      reportedVersionId: v2,
      reportedVersionNumber: 2,
      status: 'committed',
      inSync: true,
      chunks_fetched: 2,
      chunks_total: 3,
      chunks_dedup: 1,
      files_total: 4,
      files_assembled: 3,
      files_skipped: 1,
      bytes_fetched: 99,
    });
    expect(Date.parse(body.deployments[0].updatedAt)).not.toBeNaN();
    expect(body.deployments[1]).toMatchObject({
      roostId: 'dep-targeted',
      currentVersionId: v2,
      reportedVersionId: null,
      status: null,
      inSync: false,
      updatedAt: null,
      chunks_total: 0,
    });
  });

  it('404s unknown machines and other sites', async () => {
    expect((await h.request({ method: 'GET', url: `${base()}/ghost/deployments` })).statusCode).toBe(404);
    const other = await h.other();
    expect((await h.request({ method: 'GET', url: `${base()}/dep-1/deployments`, key: other.apiKey })).statusCode).toBe(404);
  });
});

describe('POST /api/sites/{siteId}/machines/{machineId}/commands', () => {
  beforeAll(async () => {
    await enrol('cmd-on');
    await enrol('cmd-off');
    await goStale('cmd-off');
  });
  const post = (machineId: string, body: unknown, opts: { key?: string; idem?: string | null } = {}) =>
    h.request({
      method: 'POST',
      url: `${base()}/${machineId}/commands`,
      body,
      key: opts.key,
      idempotencyKey: opts.idem === null ? undefined : (opts.idem ?? idemKey()),
    });

  it('queues reboot, shutdown and screenshot commands with normalised params', async () => {
    const cases: [unknown, Record<string, unknown>][] = [
      [{ type: 'reboot_machine' }, { delaySeconds: 0 }],
      [{ type: 'shutdown_machine', params: { delaySeconds: 30 } }, { delaySeconds: 30 }],
      [{ type: 'capture_screenshot' }, { monitor: 0 }],
      [{ type: 'capture_screenshot', params: { monitor: 'all' } }, { monitor: 'all' }],
      [{ type: 'capture_screenshot', params: { monitor: 'primary' } }, { monitor: 'primary' }],
      [{ type: 'capture_screenshot', params: { monitor: 2 } }, { monitor: 2 }],
    ];
    for (const [body, params] of cases) {
      const res = await post('cmd-on', body);
      expect(res.statusCode).toBe(202);
      const r = res.json();
      expect(r).toMatchObject({ status: 'pending', type: (body as { type: string }).type, params, machineId: 'cmd-on', siteId: h.siteId });
      expect(r.commandId).toMatch(/^cmd_/);
      expect(Date.parse(r.expiresAt) - Date.parse(r.createdAt)).toBe(900_000);
    }
    const timed = await post('cmd-on', { type: 'reboot_machine', timeout_seconds: 60, auditCorrelationId: 'corr-1' });
    expect(Date.parse(timed.json().expiresAt) - Date.parse(timed.json().createdAt)).toBe(60_000);
    const { rows } = await h.deps.db.query('SELECT created_by, audit_correlation_id FROM commands WHERE site_id = $1 AND command_id = $2', [
      h.siteId,
      timed.json().commandId,
    ]);
    expect(rows[0]).toEqual({ created_by: h.userId, audit_correlation_id: 'corr-1' });
  });

  it('rejects unknown types with unsupported_command_type and bad params with validation_failed', async () => {
    for (const type of ['format_disk', 'sync_pull', 'restart_process']) {
      const res = await post('cmd-on', { type });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ code: 'unsupported_command_type', param: 'type' });
    }
    const bad: [unknown, string][] = [
      [{ type: 'reboot_machine', params: { delaySeconds: -1 } }, 'params.delaySeconds'],
      [{ type: 'reboot_machine', params: { delaySeconds: 1.5 } }, 'params.delaySeconds'],
      [{ type: 'shutdown_machine', params: { delaySeconds: '10' } }, 'params.delaySeconds'],
      [{ type: 'reboot_machine', params: { force: true } }, 'params.force'],
      [{ type: 'capture_screenshot', params: { monitor: 'left' } }, 'params.monitor'],
      [{ type: 'capture_screenshot', params: { monitor: -1 } }, 'params.monitor'],
      [{ type: 'reboot_machine', timeout_seconds: 0 }, 'timeout_seconds'],
      [{ type: 'reboot_machine', timeout_seconds: 10 ** 6 }, 'timeout_seconds'],
      [{ type: 'reboot_machine', delay: 5 }, 'delay'],
      [{}, 'type'],
    ];
    for (const [body, field] of bad) {
      const res = await post('cmd-on', body);
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('validation_failed');
      expect(Object.keys(res.json().errors)).toContain(field);
    }
  });

  it('refuses offline and unknown machines', async () => {
    const off = await post('cmd-off', { type: 'reboot_machine' });
    expect(off.statusCode).toBe(409);
    expect(off.json()).toMatchObject({ code: 'machine_offline', machineId: 'cmd-off' });
    const unknown = await post('ghost', { type: 'reboot_machine' });
    expect(unknown.statusCode).toBe(404);
    expect(unknown.json().code).toBe('not_found');
    const { rows } = await h.deps.db.query(
      `SELECT count(*)::INT AS n FROM commands WHERE site_id = $1 AND machine_id IN ('cmd-off', 'ghost')`,
      [h.siteId],
    );
    expect(rows[0].n).toBe(0);
  });

  it('requires an Idempotency-Key and replays the first response for the same key and body', async () => {
    const missing = await post('cmd-on', { type: 'reboot_machine' }, { idem: null });
    expect(missing.statusCode).toBe(400);
    expect(missing.json().code).toBe('idempotency_key_required');
    const tooLong = await post('cmd-on', { type: 'reboot_machine' }, { idem: 'k'.repeat(256) });
    expect(tooLong.json().code).toBe('idempotency_key_invalid');
    const key = idemKey();
    const first = await post('cmd-on', { type: 'reboot_machine', params: { delaySeconds: 5 } }, { idem: key });
    const again = await post('cmd-on', { type: 'reboot_machine', params: { delaySeconds: 5 } }, { idem: key });
    expect(again.statusCode).toBe(202);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json().commandId).toBe(first.json().commandId);
    const { rows } = await h.deps.db.query(`SELECT count(*)::INT AS n FROM commands WHERE site_id = $1 AND params->>'delaySeconds' = '5'`, [
      h.siteId,
    ]);
    expect(rows[0].n).toBe(1);
    const mismatch = await post('cmd-on', { type: 'reboot_machine', params: { delaySeconds: 6 } }, { idem: key });
    expect(mismatch.statusCode).toBe(422);
    expect(mismatch.json().code).toBe('idempotency_key_mismatch');
  });

  it('needs machine write or site write', async () => {
    const machineWrite = await scopedKey([{ resource: 'machine', id: 'cmd-on', permissions: ['write'] }]);
    expect((await post('cmd-on', { type: 'reboot_machine' }, { key: machineWrite })).statusCode).toBe(202);
    const siteWrite = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    expect((await post('cmd-on', { type: 'reboot_machine' }, { key: siteWrite })).statusCode).toBe(202);
    const readOnly = await scopedKey([
      { resource: 'machine', id: '*', permissions: ['read'] },
      { resource: 'site', id: h.siteId, permissions: ['read'] },
    ]);
    const denied = await post('cmd-on', { type: 'reboot_machine' }, { key: readOnly });
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({
      code: 'scope_insufficient',
      required: { resource: 'machine', id: 'cmd-on', permission: 'write' },
    });
    const other = await h.other();
    expect((await post('cmd-on', { type: 'reboot_machine' }, { key: other.apiKey })).statusCode).toBe(404);
  });
});

describe('GET /api/sites/{siteId}/machines/{machineId}/commands/{commandId}', () => {
  it('shows the command state through its lifecycle', async () => {
    const token = await enrol('state-1');
    const created = await h.request({
      method: 'POST',
      url: `${base()}/state-1/commands`,
      idempotencyKey: true,
      body: { type: 'capture_screenshot', params: { monitor: 1 } },
    });
    const id = created.json().commandId;
    const url = `${base()}/state-1/commands/${id}`;
    const s1 = await h.request({ method: 'GET', url });
    expect(s1.statusCode).toBe(200);
    expect(s1.json()).toMatchObject({
      commandId: id,
      status: 'pending',
      type: 'capture_screenshot',
      params: { monitor: 1 },
      result: null,
      error: null,
      progress: null,
      completedAt: null,
      deliveredAt: null,
    });
    expect(s1.json().screenshotUrl).toBeUndefined();
    await h.request({ method: 'GET', url: '/api/agent/commands?wait=0', key: token });
    await h.request({ method: 'POST', url: `/api/agent/commands/${id}`, key: token, body: { status: 'uploading', progress: 40 } });
    const s2 = (await h.request({ method: 'GET', url })).json();
    expect(s2).toMatchObject({ status: 'uploading', progress: 40, completedAt: null });
    expect(s2.deliveredAt).not.toBeNull();
    await h.request({ method: 'POST', url: `/api/agent/commands/${id}`, key: token, body: { status: 'failed', error: 'no display' } });
    const s3 = (await h.request({ method: 'GET', url })).json();
    expect(s3).toMatchObject({ status: 'failed', error: 'no display', result: null });
    expect(Date.parse(s3.completedAt)).toBeGreaterThanOrEqual(Date.parse(s3.createdAt));
  });

  it('reports an expired command as failed/expired', async () => {
    await enrol('state-2');
    const created = await h.request({
      method: 'POST',
      url: `${base()}/state-2/commands`,
      idempotencyKey: true,
      body: { type: 'reboot_machine' },
    });
    const id = created.json().commandId;
    await h.deps.db.query(`UPDATE commands SET expires_at = now() - INTERVAL '1 second' WHERE site_id = $1 AND command_id = $2`, [
      h.siteId,
      id,
    ]);
    const s = (await h.request({ method: 'GET', url: `${base()}/state-2/commands/${id}` })).json();
    expect(s).toMatchObject({ status: 'failed', error: 'expired' });
  });

  it('404s unknown commands, wrong machines and other sites; checks scopes', async () => {
    await enrol('state-3');
    const created = await h.request({
      method: 'POST',
      url: `${base()}/state-3/commands`,
      idempotencyKey: true,
      body: { type: 'reboot_machine' },
    });
    const id = created.json().commandId;
    expect((await h.request({ method: 'GET', url: `${base()}/state-3/commands/cmd_nope` })).statusCode).toBe(404);
    expect((await h.request({ method: 'GET', url: `${base()}/state-1/commands/${id}` })).statusCode).toBe(404);
    const other = await h.other();
    expect((await h.request({ method: 'GET', url: `${base()}/state-3/commands/${id}`, key: other.apiKey })).statusCode).toBe(404);
    const writeOnly = await scopedKey([{ resource: 'machine', id: '*', permissions: ['write'] }]);
    const denied = await h.request({ method: 'GET', url: `${base()}/state-3/commands/${id}`, key: writeOnly });
    expect(denied.statusCode).toBe(403);
    expect(denied.json().required).toEqual({ resource: 'machine', id: 'state-3', permission: 'read' });
    const reader = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    expect((await h.request({ method: 'GET', url: `${base()}/state-3/commands/${id}`, key: reader })).statusCode).toBe(200);
  });
});
