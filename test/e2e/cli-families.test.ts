/**
 * The `roost` CLI for the whole API, run as a person runs it: the real binary (bin/roost.js) as a child
 * process against a real API on a port (PostgreSQL, Azurite, Temporal behind it). For each family
 * (machines, keys with login, webhooks, audit, events, quota, whoami, config): the happy path with
 * `--json` parsed, and a refused request showing its problem code, request id and exit code
 * (cli/context.ts EXIT: 2 usage, 3 conflict, 4 not found, 5 auth).
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { cliRunner, ROOST_BIN } from '../support/cli';
import { createHarness, type Harness } from '../support/harness';
import { idTokenFor, scopedKey } from '../support/identity';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy';
import { publishFiles, seedRoost } from '../integration/rollout-fixtures';
import { Agent } from '../../agent/agent';

let h: Harness;
let api: string;
let tmp: string;
let configFile: string;
let owner: { uid: string; email: string };

/** `roost …` with the site's key and site (unless overridden) and a private config file. */
const { roost, json, refused } = cliRunner(() => ({
  ROOST_API_URL: api,
  ROOST_API_KEY: h.apiKey,
  ROOST_SITE_ID: h.siteId,
  ROOST_CONFIG: configFile,
  ROOST_ID_TOKEN: undefined,
}));

beforeAll(async () => {
  h = await createHarness({ ROOST_WEBHOOK_ALLOW_PRIVATE: 'true', ROOST_STREAM_KEEPALIVE_MS: '300', ROOST_STREAM_POLL_MS: '40' });
  api = await h.listen();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-cli-'));
  configFile = path.join(tmp, 'config', 'config.json');
  const row = await h.deps.db.query<{ email: string }>('SELECT email FROM users WHERE uid = $1', [h.userId]);
  owner = { uid: h.userId, email: row.rows[0].email };
});

afterAll(async () => {
  await h.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('roost machines', () => {
  let agent: Agent;
  const machineId = `cli-m-${Date.now().toString(36)}`;

  afterAll(async () => agent?.stop());

  it('rotates the enrolment secret, lists, shows and commands an enrolled machine, and saves a screenshot to a file', async () => {
    const secret = await json<{ enrolmentSecret: string }>(['machines', 'enrolment-secret']);
    expect(secret.enrolmentSecret).toMatch(/^ses_/);
    agent = new Agent({
      baseUrl: api,
      siteId: h.siteId,
      enrolmentSecret: secret.enrolmentSecret,
      machineId,
      rootDir: path.join(tmp, 'machine'),
      heartbeatMs: 0,
      pollWaitSeconds: 1,
    });
    await agent.start();

    const list = await json<{ machines: Array<{ machineId: string; online: boolean }> }>(['machines', 'list', '--all']);
    expect(list.machines).toContainEqual(expect.objectContaining({ machineId, online: true }));
    const human = await roost(['machines', 'list']);
    expect(human.stdout).toMatch(new RegExp(`^MACHINE\\s+HOSTNAME.*\\n${machineId}\\s`, 'm'));
    expect((await json(['machines', 'show', machineId])).machineId).toBe(machineId);
    expect((await json(['machines', 'deployments', machineId])).deployments).toEqual([]);

    const out = path.join(tmp, 'shot.png');
    const shot = await json(['machines', 'command', machineId, 'screenshot', '--out', out, '--timeout', '60']);
    expect(shot).toMatchObject({ type: 'capture_screenshot', status: 'completed', savedTo: out });
    expect(fs.readFileSync(out).subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));

    const reboot = await json(['machines', 'command', machineId, 'reboot', '--delay', '5', '--wait']);
    expect(reboot).toMatchObject({ type: 'reboot_machine', status: 'completed', params: { delaySeconds: 5 } });
    const status = await json(['machines', 'command-status', machineId, reboot.commandId]);
    expect(status).toMatchObject({ commandId: reboot.commandId, status: 'completed' });
  });

  it('exits 4 for an unknown machine, 2 for an unknown command, 5 for a key without machine access', async () => {
    const p = await refused(['machines', 'show', 'no-such-machine'], 4, 'not_found');
    expect(p.status).toBe(404);
    await refused(['machines', 'command', machineId, 'explode'], 2, 'usage_error');
    const readonly = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['read'] }]);
    const denied = await refused(['machines', 'command', machineId, 'reboot'], 5, 'scope_insufficient', { ROOST_API_KEY: readonly });
    expect(denied.required).toMatchObject({ resource: 'machine' });
    await refused(['machines', 'list'], 5, 'no_credentials', { ROOST_API_KEY: '' });
  });
});

describe('roost login and roost keys', () => {
  it('signs in with an ID token (session kept owner-only in the config file), then creates, lists, rotates and revokes a key', async () => {
    const idToken = await idTokenFor(h, owner);
    await refused(['login', '--with-token'], 2, 'usage_error'); // nothing on stdin
    const r = await roost(['login', '--with-token', '--json'], {}, `${idToken}\n`);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ email: owner.email, api, configPath: configFile });
    expect(fs.statSync(configFile).mode & 0o777).toBe(0o600);
    expect(JSON.parse(fs.readFileSync(configFile, 'utf8')).session.token).toMatch(/^sst_/);

    const created = await json([
      'keys',
      'create',
      '--name',
      'cli test key',
      '--scope',
      `site=${h.siteId}:read`,
      '--scope',
      'roost=*:read,write',
    ]);
    expect(created.key).toMatch(/^svk_live_/);
    expect(created.scopes).toEqual([
      { resource: 'site', id: h.siteId, permissions: ['read'] },
      { resource: 'roost', id: '*', permissions: ['read', 'write'] },
    ]);
    // The new key works as the CLI's key.
    expect((await json(['quota'], { ROOST_API_KEY: created.key })).siteId).toBe(h.siteId);

    const listed = await json(['keys', 'list', '--all']);
    expect(listed.keys.map((k: { keyId: string }) => k.keyId)).toContain(created.keyId);
    expect(JSON.stringify(listed)).not.toContain(created.key);

    const rotated = await json(['keys', 'rotate', created.keyId]);
    expect(rotated.previous).toMatchObject({ keyId: created.keyId, status: 'rotated' });
    const revoked = await json(['keys', 'revoke', rotated.keyId]);
    expect(revoked).toMatchObject({ keyId: rotated.keyId, status: 'revoked', alreadyRevoked: false });
    await refused(['quota'], 5, 'unauthorized', { ROOST_API_KEY: rotated.key });
  });

  it('takes --id-token instead of a session; refuses bad scopes (2), an unknown key (4), and keys as credentials (5)', async () => {
    const idToken = await idTokenFor(h, owner);
    const direct = await json(['keys', 'create', '--name', 'direct', '--preset', 'readonly', '--id-token', idToken]);
    expect(direct.key).toMatch(/^svk_live_/);
    await refused(['keys', 'create', '--name', 'x', '--scope', 'site=*:fly'], 2, 'usage_error');
    await refused(['keys', 'revoke', 'key_doesnotexist'], 4, 'not_found');
    await refused(['keys', 'list', '--id-token', h.apiKey], 5, 'forbidden');

    const out = await json(['logout']);
    expect(out).toMatchObject({ signedOut: true, email: owner.email, serverSessionEnded: true });
    expect(JSON.parse(fs.readFileSync(configFile, 'utf8')).session).toBeUndefined();
    await refused(['keys', 'list'], 5, 'no_credentials');
  });
});

describe('roost webhooks', () => {
  let receiver: http.Server;
  let receiverUrl: string;
  const got: string[] = [];

  beforeAll(async () => {
    receiver = http.createServer((req, res) => {
      got.push(String(req.headers['roost-event']));
      req.resume();
      req.on('end', () => res.writeHead(204).end());
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', () => r()));
    receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
  });
  afterAll(async () => new Promise<void>((r) => receiver.close(() => r())));

  it('creates, lists, shows, pauses, rotates, lists deliveries, probes and deletes a subscription', async () => {
    const w = await json(['webhooks', 'create', receiverUrl, '--name', 'cli hook', '--events', 'version.published,machine.online']);
    expect(w).toMatchObject({ url: receiverUrl, events: ['version.published', 'machine.online'], enabled: true });
    expect(w.signingSecret).toMatch(/^whsec_/);
    expect((await json(['webhooks', 'list'])).webhooks.map((x: { webhookId: string }) => x.webhookId)).toContain(w.webhookId);
    expect((await json(['webhooks', 'show', w.webhookId])).name).toBe('cli hook');
    expect(await json(['webhooks', 'update', w.webhookId, '--pause', '--name', 'renamed'])).toMatchObject({
      paused: true,
      name: 'renamed',
    });
    const rotated = await json(['webhooks', 'rotate-secret', w.webhookId, '--grace-hours', '0']);
    expect(rotated.signingSecret).toMatch(/^whsec_/);
    expect(rotated.signingSecret).not.toBe(w.signingSecret);
    expect((await json(['webhooks', 'deliveries', w.webhookId])).deliveries).toEqual([]);
    const probe = await json(['webhooks', 'probe', receiverUrl, '--event', 'version.published', '--payload', '{"hello":1}']);
    expect(probe).toMatchObject({ ok: true, statusCode: 204 });
    expect(got).toContain('version.published');
    expect(await json(['webhooks', 'delete', w.webhookId])).toMatchObject({ webhookId: w.webhookId });
    await refused(['webhooks', 'show', w.webhookId], 4, 'not_found');
  });

  it('refuses an unknown event (1, validation_failed with the field), a missing delivery (4) and nothing to change (2)', async () => {
    const bad = await refused(['webhooks', 'create', receiverUrl, '--name', 'x', '--events', 'no.such_event'], 1, 'validation_failed');
    expect(bad.status).toBe(400);
    const w = await json(['webhooks', 'create', receiverUrl, '--name', 'y', '--events', 'version.published']);
    await refused(['webhooks', 'retry', w.webhookId, `dlv_${'0'.repeat(24)}`], 4, 'not_found');
    await refused(['webhooks', 'update', w.webhookId], 2, 'usage_error');
  });
});

describe('roost audit, quota and whoami', () => {
  it('lists records, shows one verified, verifies the whole chain here, and refuses a malformed hash', async () => {
    const list = await json(['audit', 'list', '--page-size', '5']);
    expect(list.records.length).toBeGreaterThan(0);
    expect(list.next_page_token).not.toBe('');
    const head = list.records[0];
    const shown = await json(['audit', 'show', head.hash]);
    expect(shown.verification.ok).toBe(true);
    const chain = await json(['audit', 'verify']);
    expect(chain).toMatchObject({ siteId: h.siteId, ok: true, failure: null });
    expect(chain.checked).toBeGreaterThanOrEqual(list.records.length);
    expect((await json(['audit', 'verify', head.hash])).ok).toBe(true);
    await refused(['audit', 'show', 'not-a-hash'], 1, 'validation_failed');
    await refused(['audit', 'show', 'a'.repeat(64)], 4, 'not_found');
  });

  it('prints the quota and who the key acts as; a site the key cannot see is not found (4)', async () => {
    const q = await json(['quota']);
    expect(q).toMatchObject({ siteId: h.siteId, usedBytes: expect.any(Number), limitBytes: expect.any(Number) });
    expect(await json(['whoami'])).toMatchObject({ userId: h.userId, email: owner.email });
    const other = await h.other();
    await refused(['quota'], 4, 'not_found', { ROOST_API_KEY: other.apiKey }); // another site's data is hidden
  });
});

describe('roost config', () => {
  it('stores defaults used when flags and environment leave them open', async () => {
    expect(await json(['config', 'set', 'site', h.siteId])).toMatchObject({ site: h.siteId });
    await json(['config', 'set', 'key', h.apiKey]);
    await json(['config', 'set', 'api', api]);
    const env = { ROOST_SITE_ID: undefined, ROOST_API_KEY: undefined, ROOST_API_URL: undefined };
    expect((await json(['quota'], env)).siteId).toBe(h.siteId);
    expect((await json(['config', 'get'], env)).key).toBe(`${h.apiKey.slice(0, 12)}…`);
    await refused(['config', 'set', 'colour', 'blue'], 2, 'usage_error');
    for (const k of ['site', 'key', 'api']) await json(['config', 'unset', k]);
  });
});

describe('usage errors', () => {
  it("reports the argument parser's refusals as the --json error document, exit 2", async () => {
    const missing = await refused(['deployments', 'create', 'x'], 2, 'usage_error');
    expect(missing.detail).toBe("required option '--machines <ids>' not specified");
    expect((await refused(['machines', 'list', '--bogus'], 2, 'usage_error')).detail).toBe("unknown option '--bogus'");
    // Without --json, commander's own text and the command's help, as before.
    const plain = await roost(['machines', 'list', '--bogus']);
    expect([plain.code, plain.stdout]).toEqual([2, '']);
    expect(plain.stderr).toMatch(/^error: unknown option '--bogus'\n\nUsage: roost machines list/);
  });

  it('refuses a flag value the CLI can check before any request (exit 2), naming what it accepts', async () => {
    const cases: [string[], RegExp][] = [
      [
        ['deployments', 'list', '--status', 'bogus'],
        /option '--status <status>' argument 'bogus' is invalid\. Allowed choices are pending, in_progress, completed, failed, partial, cancelled, uninstalled\./,
      ],
      [
        ['processes', 'create', 'm1', 'kiosk', '--exe', '/bin/true', '--launch', 'sometimes'],
        /option '--launch <mode>' argument 'sometimes' is invalid\. Allowed choices are off, always, scheduled\./,
      ],
      [
        ['processes', 'create', 'm1', 'kiosk', '--exe', '/bin/true', '--priority', 'urgent'],
        /option '--priority <p>' argument 'urgent' is invalid\. Allowed choices are idle, below, normal, above, high, realtime\./,
      ],
      [['audit', 'list', '--since', 'yesterday'], /--since must be an ISO 8601 date or time/],
      [['events', 'tail', '--events', 'deployment.started,bogus'], /--events: unknown "bogus"; known: /],
      [['sites', 'update', '--timezone', 'Mars/Olympus'], /--timezone Mars\/Olympus is not an IANA time zone/],
    ];
    for (const [args, detail] of cases)
      expect([args.join(' '), (await refused(args, 2, 'usage_error')).detail]).toEqual([args.join(' '), expect.stringMatching(detail)]);
  });
});

describe('an API that is not there', () => {
  it('refuses a malformed --api at once (2); an API that never answered gets 6 attempts, not the outage window (1)', async () => {
    await refused(['whoami'], 2, 'usage_error', { ROOST_API_URL: 'notaurl' });
    const t0 = Date.now();
    const err = await refused(['whoami'], 1, 'network_error', { ROOST_API_URL: 'http://127.0.0.1:1' });
    expect(err.detail).toContain('ECONNREFUSED');
    // Five backoffs of at most 0.5, 1, 2, 4 and 8 s: well under the 5-minute outage window.
    expect(Date.now() - t0).toBeLessThan(60_000);
  });
});

describe('roost events tail', () => {
  let proxy: TcpProxy;
  beforeAll(async () => {
    proxy = await startTcpProxy(Number(new URL(api).port));
  });
  afterAll(async () => proxy.close());

  it('follows the stream, resumes after a cut connection with Last-Event-ID (the missed event once), and stops after --count', async () => {
    const seeded = await seedRoost(h, { files: { 'a.txt': 'a\n' } });
    const child = spawn(process.execPath, [ROOST_BIN, 'events', 'tail', '--events', 'version.published', '--count', '2', '--json'], {
      env: {
        ...process.env,
        ROOST_API_URL: `http://127.0.0.1:${proxy.port}`,
        ROOST_API_KEY: h.apiKey,
        ROOST_SITE_ID: h.siteId,
        ROOST_CONFIG: configFile,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const exited = new Promise<number | null>((r) => child.on('close', r));
    const until = async (what: string, fn: () => boolean) => {
      const deadline = Date.now() + 30_000;
      while (!fn()) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${stderr}`);
        await new Promise((r) => setTimeout(r, 25));
      }
    };
    await until('connected', () => stderr.includes('connected'));
    const v2 = await publishFiles(h, seeded.roostId, { 'b.txt': 'b\n' });
    await until('the first event', () => stdout.includes(v2.versionId));
    await proxy.down();
    const v3 = await publishFiles(h, seeded.roostId, { 'c.txt': 'c\n' });
    await until('the client to notice the cut', () => stderr.includes('interrupted'));
    await proxy.up();
    expect({ code: await exited, stderr }).toEqual({ code: 0, stderr: expect.any(String) });
    if (stdout.trim().split('\n').length !== 2) throw new Error(`stdout: ${stdout}\nstderr: ${stderr}`);
    const events = stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(events.map((e) => [e.event, e.data.versionId])).toEqual([
      ['version.published', v2.versionId],
      ['version.published', v3.versionId],
    ]);
    expect(Number(events[1].id)).toBeGreaterThan(Number(events[0].id));
    expect(stderr).toMatch(/reconnected/);
  });

  it('exits on an unknown event name before connecting (2) and with the refusal of a key without site read (5)', async () => {
    await refused(['events', 'tail', '--events', 'nope'], 2, 'usage_error');
    const roostOnly = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['read'] }]);
    await refused(['events', 'tail'], 5, 'scope_insufficient', { ROOST_API_KEY: roostOnly });
  });

  it('rides out 503 service_unavailable answers to its connection (the outage window), then follows the stream', async () => {
    // A front that answers the first two stream requests as an API whose database is down, then passes
    // every request through to the real API.
    const target = new URL(api);
    let refusedSoFar = 0;
    const front = http.createServer((req, res) => {
      if (req.url?.startsWith('/api/events/stream') && refusedSoFar < 2) {
        refusedSoFar++;
        res.writeHead(503, { 'content-type': 'application/problem+json', 'retry-after': '1' });
        res.end(
          JSON.stringify({
            type: 'about:blank',
            title: 'Service Unavailable',
            status: 503,
            code: 'service_unavailable',
            detail: 'the database is unavailable',
            retryAfter: 1,
          }),
        );
        return;
      }
      const up = http.request(
        { host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers },
        (r) => {
          res.writeHead(r.statusCode ?? 502, r.headers);
          r.pipe(res);
        },
      );
      req.pipe(up);
    });
    await new Promise<void>((r) => front.listen(0, '127.0.0.1', r));
    try {
      const seeded = await seedRoost(h, { files: { 'x.txt': 'x\n' } });
      const child = spawn(process.execPath, [ROOST_BIN, 'events', 'tail', '--events', 'version.published', '--count', '1', '--json'], {
        env: {
          ...process.env,
          ROOST_API_URL: `http://127.0.0.1:${(front.address() as AddressInfo).port}`,
          ROOST_API_KEY: h.apiKey,
          ROOST_SITE_ID: h.siteId,
          ROOST_CONFIG: configFile,
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      const exited = new Promise<number | null>((r) => child.on('close', r));
      const deadline = Date.now() + 30_000;
      while (!stderr.includes('connected to')) {
        if (Date.now() > deadline) throw new Error(`never connected: ${stderr}`);
        await new Promise((r) => setTimeout(r, 25));
      }
      const v = await publishFiles(h, seeded.roostId, { 'y.txt': 'y\n' });
      expect({ code: await exited, refusedSoFar }).toEqual({ code: 0, refusedSoFar: 2 });
      expect(JSON.parse(stdout.trim())).toMatchObject({ event: 'version.published', data: { versionId: v.versionId } });
      expect(stderr.match(/stream interrupted \(HTTP 503 service_unavailable\); reconnecting/g)).toHaveLength(2);
    } finally {
      await new Promise((r) => front.close(r));
    }
  });
});
