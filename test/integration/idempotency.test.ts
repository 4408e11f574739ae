/**
 * Idempotency-Key as one mechanism (docs/contract.md Conventions; api/plugins/idempotency.ts), data-driven over
 * the server's route table: every keyed route (required or optional) gets the same battery — missing
 * and blank keys, the 255-character limit, replay with `Idempotent-Replayed: true`, 422 on a different
 * body, errors not cached, and concurrent requests running the mutation once (rows counted). Then the
 * routes that ignore the header, the scope of a key, expiry after 24 h, abandoned reservations, and
 * the purge of expired rows.
 *
 * The rollout control and webhook fixtures run for real: an in-process worker on the harness's task
 * queue, `dbFleet` answering sync_pull commands (a manual promotion gate keeps a rollout waiting), and a
 * local HTTP receiver for probes and delivery runs (ROOST_WEBHOOK_ALLOW_PRIVATE).
 */
import fs from 'node:fs';
import path from 'node:path';
import { fullAccessScopes } from '../../db/bootstrap';
import { sha256Hex } from '../../domain/hex';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { rollbackWorkflowId, rolloutWorkflowId, userDeleteWorkflowId } from '../../workflows/client';
import { deliveryWorkflowId } from '../../domain/webhooks';
import { webhookAad } from '../../db/webhooks';
import { openSealed } from '../../domain/seal';
import { newId } from '../../domain/hex';
import { secretKey } from '../../config/secrets';
import { closeWorkerConnections } from '../../worker/worker';
import { idempotencyScopeHash, purgeExpiredIdempotencyKeys } from '../../services/idempotency';
import type { RouteEntry } from '../../api/openapi';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { lockCatalog } from '../support/catalog-lock';
import { randomInt } from 'node:crypto';
import { addMember, insertKey, makeUser } from '../support/identity';
import { classicDeploymentWorkflowId } from '../../domain/classic';
import { waitFor } from '../support/wait';
import { type TestWorker, dbFleet, deployRoute, enrolMachineRows, startTestWorker, terminateAll } from './rollout-fixtures';

let h: Harness;
/** The API key every keyed request of this file uses (its scopes are switched off to provoke errors). */
let actor: { raw: string; keyId: string };
let machineId: string;
/** The enrolled machine's agent token (its heartbeats keep it online for the process commands). */
let agentToken: string;
const workflows = new Set<string>();
let worker: TestWorker;
let fleet: { stop(): Promise<void> };
/** Machines of the rollout control fixtures (dbFleet commits everything sent to them). */
const controlMachines = ['idem-c1', 'idem-c2'];
/** Local webhook receiver: answers 200 to everything and counts requests per path. */
let receiver: http.Server;
let receiverBase: string;
const received = new Map<string, number>();

interface Req {
  method: string;
  url: string;
  body?: unknown;
}

interface Res {
  status: number;
  body: string;
  json: any;
  replayed: boolean;
  headers: Record<string, unknown>;
}

async function send(req: Req, key?: string, opts: { apiKey?: string; headers?: Record<string, string> } = {}): Promise<Res> {
  const headers: Record<string, string> = { ...(opts.headers ?? {}) };
  if (key !== undefined) headers['idempotency-key'] = key;
  const res = await h.request({ method: req.method, url: req.url, body: req.body, key: opts.apiKey ?? actor.raw, headers });
  let json: any;
  try {
    json = res.json();
  } catch {
    json = undefined;
  }
  return { status: res.statusCode, body: res.body, json, replayed: res.headers['idempotent-replayed'] === 'true', headers: res.headers };
}

async function setActorScopes(scopes: unknown[]): Promise<void> {
  await h.deps.db.query('UPDATE api_keys SET scopes = $2 WHERE key_id = $1', [actor.keyId, JSON.stringify(scopes)]);
}

async function count(sql: string, params: unknown[]): Promise<number> {
  const { rows } = await h.deps.db.query<{ n: string }>(sql, params);
  return Number(rows[0].n);
}

function versionBody(name: string) {
  return {
    schemaVersion: 2,
    mediaType: VERSION_MEDIA_TYPE,
    config: { producer: 'idempotency-test' },
    files: [{ path: `${name}.txt`, size: 0, chunks: [] }],
  };
}

async function newRoost(extra: Record<string, unknown> = {}): Promise<string> {
  const res = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'idem', ...extra } });
  expect(res.statusCode).toBe(201);
  return res.json().roostId;
}

async function publish(roostId: string, name: string): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    idempotencyKey: true,
    body: { siteId: h.siteId, version: versionBody(name) },
  });
  expect(res.statusCode).toBe(201);
  return res.json().versionId;
}

/** A keyed route: how to make a fresh request for it, a different body on the same path, and what it writes. */
interface KeyedFixture {
  route: string;
  /**
   * A request that performs one new mutation when sent with Idempotency-Key `key` (given when the test
   * knows it before preparing; the installer finalise must carry the key of its upload reservation).
   */
  prepare: (seed: string, key?: string) => Promise<Req>;
  /** Same method and path, different body or query. */
  variant: (req: Req) => Req;
  /** Rows the mutation adds (checked to grow by exactly one per execution). */
  count?: () => Promise<number>;
  /** Extra check that the state matches the one executed response. */
  verify?: (executed: any) => Promise<void>;
  /**
   * false: the response is never stored (a stream), and the route itself refuses a repeat of the key with
   * 422 idempotency_key_mismatch where other routes replay (docs/decisions/cortex.md, conversation send).
   */
  replays?: boolean;
}

const rolloutRow = async (rolloutId: string) =>
  (
    await h.deps.db.query<{ state: string; active: boolean }>('SELECT state, active FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
      h.siteId,
      rolloutId,
    ])
  ).rows[0];

const controlUrl = (roostId: string, rolloutId: string, action: string) => `/api/roosts/${roostId}/rollouts/${rolloutId}/${action}`;

/** Runs a control action through the API (its own key); throws unless 200. */
async function control(roostId: string, rolloutId: string, action: string): Promise<void> {
  const res = await h.request({
    method: 'POST',
    url: controlUrl(roostId, rolloutId, action),
    body: { siteId: h.siteId },
    idempotencyKey: true,
  });
  if (res.statusCode !== 200) throw new Error(`${action} failed: ${res.statusCode} ${res.body}`);
}

/**
 * A rollout of a fresh roost to the control machines, waiting at its manual promotion gate after the
 * canary (dbFleet committed it): active until promoted or aborted. `previous`: the machines report an
 * earlier version committed first, so an aborted rollout has switched machines to roll back.
 */
async function gatedRollout(seed: string, opts: { previous?: boolean } = {}): Promise<{ roostId: string; rolloutId: string }> {
  const roostId = await newRoost({ targets: controlMachines });
  if (opts.previous) {
    const v1 = await publish(roostId, `${seed}-v1`);
    await h.deps.db.query(
      `INSERT INTO roost_target_states (site_id, machine_id, roost_id, reported_version_id, status, updated_at)
       SELECT $1, m, $2, $3, 'committed', now() FROM UNNEST($4::text[]) AS t (m)`,
      [h.siteId, roostId, v1, controlMachines],
    );
  }
  await publish(roostId, seed);
  const r = await deployRoute(h, roostId, { policy: { canary: { count: 1 }, requirePromotion: 'canary', retryBackoffSeconds: 0.1 } });
  workflows.add(r.workflowId);
  await waitFor('the rollout awaiting promotion', async () => (await rolloutRow(r.rolloutId)).state === 'awaiting_promotion');
  return { roostId, rolloutId: r.rolloutId };
}

/** History entries with `action` over the site's rollouts (each control action executed appends one). */
const historyCount = (action: string) => () =>
  count(
    `SELECT count(*) AS n FROM rollouts AS r CROSS JOIN LATERAL jsonb_array_elements(r.history) AS e (entry)
      WHERE r.site_id = $1 AND e.entry->>'action' = $2`,
    [h.siteId, action],
  );

const controlBody = () => ({ siteId: h.siteId });
const otherReason = (req: Req): Req => ({ ...req, body: { siteId: h.siteId, reason: 'a different body' } });

const hooks = () => `/api/sites/${h.siteId}/webhooks`;

/** A subscription (through the API) delivering to the local receiver at `path`. */
async function newHook(seed: string, path = '/hooks'): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: hooks(),
    body: { url: `${receiverBase}${path}`, name: `idem ${seed}`, events: ['machine.offline'] },
    idempotencyKey: true,
  });
  expect(res.statusCode).toBe(201);
  return res.json().webhookId;
}

const webhookRow = async (webhookId: string) =>
  (
    await h.deps.db.query<{ name: string; updated_at: Date; secret_sealed: string }>(
      'SELECT name, updated_at, secret_sealed FROM webhooks WHERE site_id = $1 AND webhook_id = $2',
      [h.siteId, webhookId],
    )
  ).rows[0];

/**
 * Attempts of the site's webhook deliveries once no delivery is pending: a retry reopens a delivery
 * (pending) and its run makes one attempt, which the receiver answers 200.
 */
async function settledAttempts(): Promise<number> {
  await waitFor(
    'no webhook delivery pending',
    async () => (await count(`SELECT count(*) AS n FROM webhook_deliveries WHERE site_id = $1 AND status = 'pending'`, [h.siteId])) === 0,
  );
  return count('SELECT count(*) AS n FROM webhook_attempts WHERE site_id = $1', [h.siteId]);
}

const siteCount = (table: string) => () => count(`SELECT count(*) AS n FROM ${table} WHERE site_id = $1`, [h.siteId]);

const deployments = () => `/api/sites/${h.siteId}/deployments`;
/** Machines only classic deployment fixtures target (rows as enrolment writes them; no agent answers them). */
const classicMachines = ['idem-k1', 'idem-k2'];

/**
 * A classic deployment row and its targets as the deployment workflow leaves them (no run of its workflow
 * yet: a control action starts one, which the file terminates at the end).
 */
async function classicDeployment(seed: string, status: string, targetStatus: string): Promise<string> {
  const deploymentId = newId('dep');
  const workflowId = classicDeploymentWorkflowId(h.siteId, deploymentId);
  workflows.add(workflowId);
  await h.deps.db.query(
    `INSERT INTO classic_deployments (site_id, deployment_id, name, installer_url, installer_name, silent_flags, status, workflow_id, created_by, completed_at)
     VALUES ($1, $2, $3, 'https://downloads.example.test/setup.msi', 'setup.msi', '/qn', $4, $5, $6, now())`,
    [h.siteId, deploymentId, `idem ${seed}`, status, workflowId, h.userId],
  );
  await h.deps.db.query(
    `INSERT INTO classic_deployment_targets (site_id, deployment_id, machine_id, position, status, attempts, finished_at)
     SELECT $1, $2, u.m, u.i::INT - 1, $4, 1, now() FROM UNNEST($3::text[]) WITH ORDINALITY AS u (m, i)`,
    [h.siteId, deploymentId, classicMachines, targetStatus],
  );
  return deploymentId;
}

const classicBody = (seed: string) => ({
  name: `idem ${seed}`,
  installer_url: 'https://downloads.example.test/setup.msi',
  installer_name: 'setup.msi',
  silent_flags: '/qn',
  machines: classicMachines,
});

const processes = () => `/api/sites/${h.siteId}/machines/${machineId}/processes`;

/** A managed process on the enrolled machine (through the API). */
async function newProcess(seed: string): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: processes(),
    idempotencyKey: true,
    body: { name: `proc ${seed}`, exe_path: 'C:\\Kiosk\\kiosk.exe' },
  });
  expect(res.statusCode).toBe(201);
  return res.json().processId;
}

/** Commands of one type queued for the enrolled machine. */
const machineCommands = (type: string) => () =>
  count('SELECT count(*) AS n FROM commands WHERE site_id = $1 AND machine_id = $2 AND type = $3', [h.siteId, machineId, type]);

/** One fixture per process control action (each queues one command of its type). */
const processCommandFixtures: KeyedFixture[] = (['kill', 'restart', 'start', 'stop'] as const).map((action) => ({
  route: `POST /api/sites/:siteId/machines/:machineId/processes/:processId/${action}`,
  prepare: async (seed: string) => {
    // A process command needs the machine online: a heartbeat now, however long the file has run (a loaded machine).
    const beat = await h.request({ method: 'POST', url: '/api/agent/heartbeat', key: agentToken, body: {} });
    expect(beat.statusCode).toBe(200);
    return { method: 'POST', url: `${processes()}/${await newProcess(seed)}/${action}` };
  },
  variant: (req: Req) => ({ ...req, url: `${req.url}?variant=1` }),
  count: machineCommands(`${action}_process`),
}));

const templates = () => `/api/sites/${h.siteId}/installer-templates`;

async function newTemplate(seed: string): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: templates(),
    idempotencyKey: true,
    body: { name: `tpl ${seed}`, installer_name: 'setup.msi', installer_url: 'https://downloads.example.test/setup.msi' },
  });
  expect(res.statusCode).toBe(201);
  return res.json().templateId;
}

async function newSite(seed: string): Promise<string> {
  const res = await h.request({ method: 'POST', url: '/api/sites', idempotencyKey: true, body: { name: `idem site ${seed}` } });
  expect(res.statusCode).toBe(201);
  return res.json().siteId;
}

const CONVERSATIONS = '/api/cortex/conversations';

async function newConversation(seed: string): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: CONVERSATIONS,
    idempotencyKey: true,
    body: { siteId: h.siteId, title: `idem ${seed}` },
  });
  expect(res.statusCode).toBe(201);
  return res.json().conversationId;
}

/** The conversation fixtures, written against the canonical base (the /api/chat alias reuses them). */
const conversationFixtures: KeyedFixture[] = [
  {
    route: `POST ${CONVERSATIONS}`,
    prepare: async (seed) => ({ method: 'POST', url: CONVERSATIONS, body: { siteId: h.siteId, title: `idem ${seed}` } }),
    variant: (req) => ({ ...req, body: { siteId: h.siteId, title: 'another title' } }),
    count: siteCount('conversations'),
  },
  {
    route: `POST ${CONVERSATIONS}/:conversationId`,
    prepare: async (seed) => ({
      method: 'POST',
      url: `${CONVERSATIONS}/${await newConversation(seed)}`,
      body: { message: `hello ${seed}` },
    }),
    variant: (req) => ({ ...req, body: { message: 'another message' } }),
    count: () => count(`SELECT count(*) AS n FROM conversation_messages WHERE site_id = $1 AND role = 'user'`, [h.siteId]),
    // docs/decisions/cortex.md: streams are never stored; the message records the key, so a repeat is refused.
    replays: false,
  },
  {
    route: `PATCH ${CONVERSATIONS}/:conversationId`,
    prepare: async (seed) => ({
      method: 'PATCH',
      url: `${CONVERSATIONS}/${await newConversation(seed)}`,
      body: { title: `renamed ${seed}` },
    }),
    variant: (req) => ({ ...req, body: { title: 'another title' } }),
  },
  {
    route: `DELETE ${CONVERSATIONS}/:conversationId`,
    prepare: async (seed) => ({ method: 'DELETE', url: `${CONVERSATIONS}/${await newConversation(seed)}` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    verify: async (executed) => expect(executed.alreadyDeleted).toBe(false),
  },
  {
    route: `POST ${CONVERSATIONS}/:conversationId/restore`,
    prepare: async (seed) => {
      const url = `${CONVERSATIONS}/${await newConversation(seed)}`;
      expect((await h.request({ method: 'DELETE', url })).statusCode).toBe(200);
      return { method: 'POST', url: `${url}/restore` };
    },
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    verify: async (executed) => expect(executed.restored).toBe(true),
  },
];

/** The same fixtures through the deprecated `/api/chat` alias. */
const toAlias = (url: string) => url.replace(CONVERSATIONS, '/api/chat');
const aliasFixtures = conversationFixtures.map((f): KeyedFixture => ({
  ...f,
  route: toAlias(f.route),
  prepare: async (seed) => {
    const req = await f.prepare(seed);
    return { ...req, url: toAlias(req.url) };
  },
}));

// ---- the agent-installer catalog (api/routes/installer.ts). It is platform-wide: each test that prepares
// one of these holds the catalog lock until it ends (test/support/catalog-lock.ts), so files asserting on
// latest never see these changes; versions here use a major number of their own.
let releaseCatalog: (() => Promise<void>) | undefined;
const installerMajor = randomInt(100_000, 900_000);
let installerSeq = 0;
const installerBytes = (version: string) => Buffer.from(`idempotency installer ${version}`);
const installerCount = (state: string) => () =>
  count(`SELECT count(*) AS n FROM installer_versions WHERE major = $1 AND state = $2`, [installerMajor, state]);

/** Takes the catalog lock for the running test (released by the top-level afterEach). */
async function catalogLocked(): Promise<void> {
  releaseCatalog ??= await lockCatalog(h);
}

/** Step 1 of a new version's upload with Idempotency-Key `key`, and step 2 (the bytes) unless `bytes` is false. */
async function reservedInstaller(key: string, bytes = true): Promise<string> {
  await catalogLocked();
  const version = `${installerMajor}.${++installerSeq}.0`;
  const res = await h.request({
    method: 'POST',
    url: '/api/installer/upload',
    body: { version, sha256: sha256Hex(installerBytes(version)) },
    idempotencyKey: key,
  });
  expect(res.statusCode).toBe(201);
  if (bytes) {
    const put = await fetch(res.json().uploadUrl, {
      method: 'PUT',
      body: installerBytes(version),
      headers: { 'x-ms-blob-type': 'BlockBlob' },
    });
    expect(put.status).toBe(201);
  }
  return version;
}

/** A finalised version that is not latest. */
async function activeInstaller(): Promise<string> {
  const key = idemKey();
  const version = await reservedInstaller(key);
  const fin = await h.request({ method: 'PUT', url: '/api/installer/upload', body: { version, setAsLatest: false }, idempotencyKey: key });
  expect(fin.statusCode).toBe(200);
  return version;
}

function installerFixtures(): KeyedFixture[] {
  return [
    {
      route: 'POST /api/installer/upload',
      prepare: async () => {
        await catalogLocked();
        const version = `${installerMajor}.${++installerSeq}.0`;
        return { method: 'POST', url: '/api/installer/upload', body: { version, sha256: sha256Hex(installerBytes(version)) } };
      },
      variant: (req) => ({ ...req, body: { ...(req.body as object), releaseNotes: 'other' } }),
      count: installerCount('uploading'),
    },
    {
      route: 'PUT /api/installer/upload',
      prepare: async (_seed, key) => {
        const version = await reservedInstaller(key ?? idemKey());
        return { method: 'PUT', url: '/api/installer/upload', body: { version, setAsLatest: false } };
      },
      variant: (req) => ({ ...req, body: { ...(req.body as object), setAsLatest: true } }),
      count: installerCount('active'),
    },
    {
      route: 'POST /api/installer/:version/set-latest',
      prepare: async () => ({ method: 'POST', url: `/api/installer/${await activeInstaller()}/set-latest` }),
      variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
      verify: async (executed) => expect(executed.changed).toBe(true),
    },
    {
      route: 'DELETE /api/installer/:version',
      prepare: async () => {
        // Two more active versions, so the delete never meets the minimum of two.
        const version = await activeInstaller();
        await activeInstaller();
        await activeInstaller();
        return { method: 'DELETE', url: `/api/installer/${version}` };
      },
      variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
      count: installerCount('deleted'),
      verify: async (executed) => expect([executed.deleted, executed.alreadyDeleted]).toEqual([true, false]),
    },
  ];
}

const KEYED: KeyedFixture[] = [
  {
    route: 'POST /api/roosts/:roostId/versions',
    prepare: async (seed) => ({
      method: 'POST',
      url: `/api/roosts/${await newRoost()}/versions`,
      body: { siteId: h.siteId, version: versionBody(seed) },
    }),
    variant: (req) => ({ ...req, body: { ...(req.body as object), description: 'a different body' } }),
    count: siteCount('roost_versions'),
  },
  {
    route: 'POST /api/roosts/:roostId/rollback',
    prepare: async (seed) => {
      const roostId = await newRoost();
      await publish(roostId, `${seed}-1`);
      await publish(roostId, `${seed}-2`);
      return { method: 'POST', url: `/api/roosts/${roostId}/rollback`, body: { siteId: h.siteId } };
    },
    variant: (req) => ({ ...req, body: { siteId: h.siteId, targetVersion: 'first' } }),
    count: () => count(`SELECT count(*) AS n FROM events WHERE site_id = $1 AND type = 'version.rolled_back'`, [h.siteId]),
  },
  {
    route: 'POST /api/roosts/:roostId/deploy',
    prepare: async (seed) => {
      const roostId = await newRoost({ targets: [machineId] });
      const versionId = await publish(roostId, seed);
      workflows.add(rolloutWorkflowId(h.siteId, roostId, versionId));
      return { method: 'POST', url: `/api/roosts/${roostId}/deploy`, body: { siteId: h.siteId } };
    },
    variant: (req) => ({ ...req, body: { siteId: h.siteId, dryRun: true } }),
    count: siteCount('rollouts'),
    verify: async (executed) => expect(executed.alreadyRunning).toBe(false),
  },
  {
    route: 'POST /api/sites/:siteId/machines/:machineId/commands',
    prepare: async (seed) => ({
      method: 'POST',
      url: `/api/sites/${h.siteId}/machines/${machineId}/commands`,
      body: { type: 'capture_screenshot', auditCorrelationId: seed },
    }),
    variant: (req) => ({ ...req, body: { type: 'reboot_machine', auditCorrelationId: 'other' } }),
    // Not sync_pull: the worker's rollouts dispatch those in the background.
    count: () => count(`SELECT count(*) AS n FROM commands WHERE site_id = $1 AND type <> 'sync_pull'`, [h.siteId]),
  },
  {
    route: 'POST /api/sites/:siteId/enrolment-secret',
    prepare: async () => ({ method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    // Each execution rotates the secret: the stored digest is the one of the executed response.
    verify: async (executed) => {
      const { rows } = await h.deps.db.query<{ enrolment_secret_hash: string }>(
        'SELECT enrolment_secret_hash FROM sites WHERE site_id = $1',
        [h.siteId],
      );
      expect(rows[0].enrolment_secret_hash).toBe(sha256Hex(executed.enrolmentSecret));
    },
  },
  {
    route: 'PATCH /api/roosts/:roostId',
    prepare: async (seed) => ({
      method: 'PATCH',
      url: `/api/roosts/${await newRoost()}`,
      body: { siteId: h.siteId, name: `renamed ${seed}` },
    }),
    variant: (req) => ({ ...req, body: { siteId: h.siteId, name: 'another name' } }),
  },
  {
    route: 'DELETE /api/roosts/:roostId',
    prepare: async () => ({ method: 'DELETE', url: `/api/roosts/${await newRoost()}?siteId=${h.siteId}` }),
    variant: (req) => ({ ...req, url: `${req.url}&variant=1` }),
    verify: async (executed) => expect(executed.alreadyDeleted).toBe(false),
  },
  {
    route: 'PATCH /api/roosts/:roostId/versions/:versionRef',
    prepare: async (seed) => {
      const roostId = await newRoost();
      const versionId = await publish(roostId, seed);
      return {
        method: 'PATCH',
        url: `/api/roosts/${roostId}/versions/${versionId}`,
        body: { siteId: h.siteId, description: `described ${seed}` },
      };
    },
    variant: (req) => ({ ...req, body: { siteId: h.siteId, description: 'another description' } }),
  },
  {
    route: 'POST /api/chunks/:digest/mount',
    prepare: async (seed) => {
      const digest = sha256Hex(`mount-${seed}`);
      await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, 1) ON CONFLICT DO NOTHING', [h.siteId, digest]);
      return {
        method: 'POST',
        url: `/api/chunks/${digest}/mount`,
        body: { siteId: h.siteId, from: await newRoost(), to: await newRoost() },
      };
    },
    variant: (req) => {
      const b = req.body as { siteId: string; from: string; to: string };
      return { ...req, body: { ...b, from: b.to, to: b.from } };
    },
    count: () => count('SELECT count(*) AS n FROM chunk_referrers WHERE site_id = $1', [h.siteId]),
  },
  ...(['pause', 'resume', 'promote', 'abort'] as const).map((action): KeyedFixture => ({
    route: `POST /api/roosts/:roostId/rollouts/:rolloutId/${action}`,
    prepare: async (seed) => {
      const r = await gatedRollout(seed);
      if (action === 'resume') await control(r.roostId, r.rolloutId, 'pause');
      return { method: 'POST', url: controlUrl(r.roostId, r.rolloutId, action), body: controlBody() };
    },
    variant: otherReason,
    count: historyCount(action),
    // The answer shows the state the action led to (promote and abort may already have moved on).
    verify: async (executed) => {
      const states = { pause: ['paused'], resume: ['awaiting_promotion'], promote: ['running', 'completed'], abort: ['aborted', 'failed'] }[
        action
      ];
      expect(states).toContain(executed.state);
    },
  })),
  {
    route: 'POST /api/roosts/:roostId/rollouts/:rolloutId/rollback',
    prepare: async (seed) => {
      const r = await gatedRollout(seed, { previous: true });
      await control(r.roostId, r.rolloutId, 'abort');
      await waitFor('the rollout to end', async () => !(await rolloutRow(r.rolloutId)).active);
      workflows.add(rollbackWorkflowId(h.siteId, r.rolloutId));
      return { method: 'POST', url: controlUrl(r.roostId, r.rolloutId, 'rollback'), body: controlBody() };
    },
    variant: otherReason,
    count: siteCount('rollouts'),
    verify: async (executed) => {
      const original = executed.rollbackOf as string;
      const { rows } = await h.deps.db.query('SELECT rolled_back_by FROM rollouts WHERE site_id = $1 AND rollout_id = $2', [
        h.siteId,
        original,
      ]);
      expect(rows[0].rolled_back_by).toBe(executed.rolloutId);
    },
  },
  {
    route: 'POST /api/sites/:siteId/webhooks',
    prepare: async (seed) => ({
      method: 'POST',
      url: hooks(),
      body: { url: `${receiverBase}/created`, name: `created ${seed}`, events: ['machine.offline'] },
    }),
    variant: (req) => ({ ...req, body: { ...(req.body as object), name: 'another name' } }),
    count: siteCount('webhooks'),
  },
  {
    route: 'PATCH /api/sites/:siteId/webhooks/:webhookId',
    prepare: async (seed) => ({ method: 'PATCH', url: `${hooks()}/${await newHook(seed)}`, body: { name: `renamed ${seed}` } }),
    variant: (req) => ({ ...req, body: { name: 'another name' } }),
    // A second execution would write a later updated_at.
    verify: async (executed) => {
      const row = await webhookRow(executed.webhookId);
      expect([row.name, row.updated_at.toISOString()]).toEqual([executed.name, executed.updatedAt]);
    },
  },
  {
    route: 'DELETE /api/sites/:siteId/webhooks/:webhookId',
    prepare: async (seed) => ({ method: 'DELETE', url: `${hooks()}/${await newHook(seed)}` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    // A second execution would answer 404 (the subscription is gone).
    verify: async (executed) => {
      expect(executed.deleted).toBe(true);
      expect(await webhookRow(executed.webhookId)).toBeUndefined();
    },
  },
  {
    route: 'POST /api/sites/:siteId/webhooks/:webhookId/rotate-secret',
    prepare: async (seed) => ({ method: 'POST', url: `${hooks()}/${await newHook(seed)}/rotate-secret`, body: { graceHours: 1 } }),
    variant: (req) => ({ ...req, body: { graceHours: 2 } }),
    // Each execution makes a new secret: the stored one is the one of the executed response.
    verify: async (executed) => {
      const row = await webhookRow(executed.webhookId);
      const stored = openSealed(secretKey(h.deps.cfg), row.secret_sealed, webhookAad(h.siteId, executed.webhookId)).toString('utf8');
      expect(stored).toBe(executed.signingSecret);
    },
  },
  {
    route: 'POST /api/sites/:siteId/webhooks/:webhookId/deliveries/:deliveryId/retry',
    prepare: async (seed) => {
      const webhookId = await newHook(seed, '/retried');
      const deliveryId = newId('dlv');
      const envelope = { event: 'machine.offline', siteId: h.siteId, occurredAt: new Date().toISOString(), data: { machineId: seed } };
      // A delivery that failed once (one attempt, 500): the retry runs it again and the receiver answers 200.
      await h.deps.db.query(
        `INSERT INTO webhook_deliveries (site_id, delivery_id, webhook_id, event_id, event_type, payload, status, attempts, last_error, dispatched_at, completed_at)
         VALUES ($1, $2, $3, $4, 'machine.offline', $5, 'failed', 1, 'HTTP 500', now(), now())`,
        [h.siteId, deliveryId, webhookId, newId('evt'), JSON.stringify(envelope)],
      );
      await h.deps.db.query(
        `INSERT INTO webhook_attempts (site_id, delivery_id, attempt_no, started_at, latency_ms, response_code) VALUES ($1, $2, 1, now(), 5, 500)`,
        [h.siteId, deliveryId],
      );
      workflows.add(deliveryWorkflowId(deliveryId));
      return { method: 'POST', url: `${hooks()}/${webhookId}/deliveries/${deliveryId}/retry` };
    },
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    count: settledAttempts,
  },
  {
    route: 'POST /api/webhooks/probe',
    prepare: async (seed) => ({
      method: 'POST',
      url: `/api/webhooks/probe?siteId=${h.siteId}`,
      body: { url: `${receiverBase}/probe`, event: 'version.published', payload: { seed } },
    }),
    variant: (req) => ({ ...req, body: { ...(req.body as object), payload: { other: true } } }),
    // One execution is one request to the receiver (the probe is synchronous).
    count: async () => received.get('/probe') ?? 0,
  },
  {
    route: 'POST /api/sites/:siteId/deployments',
    prepare: async (seed) => ({ method: 'POST', url: deployments(), body: classicBody(seed) }),
    variant: (req) => ({ ...req, body: { ...(req.body as object), name: 'another name' } }),
    count: siteCount('classic_deployments'),
  },
  {
    route: 'POST /api/sites/:siteId/deployments/:deploymentId/retry',
    prepare: async (seed) => ({ method: 'POST', url: `${deployments()}/${await classicDeployment(seed, 'failed', 'failed')}/retry` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    verify: async (executed) => expect([executed.action, executed.affected]).toEqual(['retry', classicMachines.length]),
  },
  {
    route: 'POST /api/sites/:siteId/deployments/:deploymentId/cancel',
    prepare: async (seed) => ({ method: 'POST', url: `${deployments()}/${await classicDeployment(seed, 'pending', 'pending')}/cancel` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    verify: async (executed) => expect(executed.action).toBe('cancel'),
  },
  {
    route: 'POST /api/sites/:siteId/deployments/:deploymentId/uninstall',
    prepare: async (seed) => ({
      method: 'POST',
      url: `${deployments()}/${await classicDeployment(seed, 'completed', 'completed')}/uninstall`,
    }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    verify: async (executed) => expect(executed.action).toBe('uninstall'),
  },
  {
    route: 'DELETE /api/sites/:siteId/deployments/:deploymentId',
    prepare: async (seed) => ({ method: 'DELETE', url: `${deployments()}/${await classicDeployment(seed, 'failed', 'failed')}` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    // A second execution would answer 404 (the record is gone).
    verify: async (executed) => expect(executed.deleted).toBe(true),
  },
  {
    route: 'POST /api/sites/:siteId/installer-templates',
    prepare: async (seed) => ({
      method: 'POST',
      url: templates(),
      body: { name: `tpl ${seed}`, installer_name: 'setup.msi', installer_url: 'https://downloads.example.test/setup.msi' },
    }),
    variant: (req) => ({ ...req, body: { ...(req.body as object), silent_flags: '/other' } }),
    count: siteCount('installer_templates'),
  },
  {
    route: 'PATCH /api/sites/:siteId/installer-templates/:templateId',
    prepare: async (seed) => ({ method: 'PATCH', url: `${templates()}/${await newTemplate(seed)}`, body: { silent_flags: `/q ${seed}` } }),
    variant: (req) => ({ ...req, body: { silent_flags: '/other' } }),
  },
  {
    route: 'DELETE /api/sites/:siteId/installer-templates/:templateId',
    prepare: async (seed) => ({ method: 'DELETE', url: `${templates()}/${await newTemplate(seed)}` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
  },
  {
    route: 'POST /api/users/:uid/promote',
    prepare: async () => ({ method: 'POST', url: `/api/users/${(await makeUser(h.deps.db)).uid}/promote`, body: { role: 'admin' } }),
    variant: (req) => ({ ...req, body: { role: 'superadmin' } }),
    verify: async (executed) => expect([executed.role, executed.changed]).toEqual(['admin', true]),
  },
  {
    route: 'POST /api/users/:uid/demote',
    prepare: async () => ({ method: 'POST', url: `/api/users/${(await makeUser(h.deps.db, { role: 'admin' })).uid}/demote` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    verify: async (executed) => expect([executed.role, executed.changed]).toEqual(['member', true]),
  },
  {
    route: 'POST /api/users/:uid/assign-sites',
    prepare: async () => ({
      method: 'POST',
      url: `/api/users/${(await makeUser(h.deps.db)).uid}/assign-sites`,
      body: { siteIds: [h.siteId] },
    }),
    variant: (req) => ({ ...req, body: { siteIds: [h.siteId, h.siteId] } }),
    count: siteCount('site_members'),
  },
  {
    route: 'POST /api/users/:uid/remove-sites',
    prepare: async () => {
      const u = await makeUser(h.deps.db);
      await addMember(h.deps.db, h.siteId, u.uid);
      return { method: 'POST', url: `/api/users/${u.uid}/remove-sites`, body: { siteIds: [h.siteId] } };
    },
    variant: (req) => ({ ...req, body: { siteIds: [h.siteId, h.siteId] } }),
    // Each execution removes one membership: the count of the remaining ones falls by exactly one.
    count: async () => -(await siteCount('site_members')()),
  },
  {
    route: 'DELETE /api/users/:uid',
    prepare: async () => {
      const u = await makeUser(h.deps.db);
      workflows.add(userDeleteWorkflowId(u.uid));
      return { method: 'DELETE', url: `/api/users/${u.uid}` };
    },
    variant: (req) => ({ ...req, url: `${req.url}?successorUid=${h.userId}` }),
    verify: async (executed) => expect([executed.deleted, executed.alreadyDeleted]).toEqual([true, false]),
  },
  {
    route: 'POST /api/sites',
    prepare: async (seed) => ({ method: 'POST', url: '/api/sites', body: { name: `idem site ${seed}` } }),
    variant: (req) => ({ ...req, body: { ...(req.body as object), timezone: 'Europe/Berlin' } }),
    count: () => count(`SELECT count(*) AS n FROM sites WHERE name LIKE 'idem site %'`, []),
  },
  {
    route: 'PATCH /api/sites/:siteId',
    prepare: async (seed) => ({ method: 'PATCH', url: `/api/sites/${await newSite(seed)}`, body: { tier: 'pro' } }),
    variant: (req) => ({ ...req, body: { tier: 'free' } }),
  },
  {
    route: 'POST /api/sites/:siteId/machines/:machineId/processes',
    prepare: async (seed) => ({ method: 'POST', url: processes(), body: { name: `proc ${seed}`, exe_path: 'C:\\Kiosk\\kiosk.exe' } }),
    variant: (req) => ({ ...req, body: { ...(req.body as object), priority: 'high' } }),
    count: () => count('SELECT count(*) AS n FROM managed_processes WHERE site_id = $1 AND machine_id = $2', [h.siteId, machineId]),
  },
  {
    route: 'PATCH /api/sites/:siteId/machines/:machineId/processes/:processId',
    prepare: async (seed) => ({ method: 'PATCH', url: `${processes()}/${await newProcess(seed)}`, body: { time_delay: 5 } }),
    variant: (req) => ({ ...req, body: { time_delay: 6 } }),
    verify: async (executed) => expect(executed.time_delay).toBe(5),
  },
  {
    route: 'DELETE /api/sites/:siteId/machines/:machineId/processes/:processId',
    prepare: async (seed) => ({ method: 'DELETE', url: `${processes()}/${await newProcess(seed)}` }),
    variant: (req) => ({ ...req, url: `${req.url}?variant=1` }),
    verify: async (executed) => expect([executed.deleted, executed.alreadyDeleted]).toEqual([true, false]),
  },
  ...processCommandFixtures,
  {
    route: 'POST /api/sites/:siteId/machines/:machineId/processes/:processId/schedule',
    prepare: async (seed) => ({
      method: 'POST',
      url: `${processes()}/${await newProcess(seed)}/schedule`,
      body: { mode: 'scheduled', blocks: [{ days: ['mon'], start: '08:00', end: '18:00' }] },
    }),
    variant: (req) => ({ ...req, body: { mode: 'off' } }),
    verify: async (executed) => expect(executed.launch_mode).toBe('scheduled'),
  },
  ...installerFixtures(),
  ...conversationFixtures,
  ...aliasFixtures,
];

beforeAll(async () => {
  h = await createHarness({ ROOST_WEBHOOK_ALLOW_PRIVATE: 'true', ROOST_ROLLOUT_POLL_MS: '100' });
  receiver = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = req.url ?? '/';
      received.set(path, (received.get(path) ?? 0) + 1);
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  receiverBase = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  worker = await startTestWorker(h);
  fleet = dbFleet(h, () => 'commit', 50);
  await enrolMachineRows(h, controlMachines);
  await enrolMachineRows(h, classicMachines);
  actor = await insertKey(h.deps.db, { uid: h.userId, scopes: fullAccessScopes(), primarySiteId: h.siteId, name: 'idempotency actor' });
  const secret = await h.enrolmentSecret();
  machineId = 'idem-m1';
  const enrol = await h.request({
    method: 'POST',
    url: '/api/agent/enrol',
    key: null,
    body: { siteId: h.siteId, enrolmentSecret: secret, machineId, hostname: 'idem.local', agentVersion: '1.0.0' },
  });
  expect(enrol.statusCode).toBe(201);
  agentToken = enrol.json().agentToken;
});
afterEach(async () => {
  const release = releaseCatalog;
  releaseCatalog = undefined;
  await release?.();
});
afterAll(async () => {
  await fleet?.stop();
  // Classic deployments created through the API run workflows too.
  if (h) {
    const { rows } = await h.deps.db.query<{ workflow_id: string }>('SELECT workflow_id FROM classic_deployments WHERE site_id = $1', [
      h.siteId,
    ]);
    for (const r of rows) workflows.add(r.workflow_id);
  }
  await terminateAll(h, workflows);
  await worker?.stop();
  await closeWorkerConnections();
  await new Promise((r) => receiver?.close(r));
  await h.close();
});

const keyed = (): RouteEntry[] => h.app.routeTable.filter((r) => r.idempotency !== 'ignored');
const modeOf = (route: string) => h.app.routeTable.find((r) => `${r.method} ${r.url}` === route)?.idempotency;

describe('the route table', () => {
  it('requires the key on the routes the Conventions name, and has a fixture for every keyed route', () => {
    const required = [
      'POST /api/roosts/:roostId/versions',
      'POST /api/roosts/:roostId/rollback',
      'POST /api/roosts/:roostId/deploy',
      'POST /api/sites/:siteId/machines/:machineId/commands',
      'POST /api/sites/:siteId/enrolment-secret',
    ];
    for (const r of required) expect([r, modeOf(r)]).toEqual([r, 'required']);
    const fixtures = KEYED.map((f) => f.route);
    expect(
      keyed()
        .map((r) => `${r.method} ${r.url}`)
        .filter((r) => !fixtures.includes(r)),
    ).toEqual([]);
    expect(fixtures.filter((r) => !modeOf(r) || modeOf(r) === 'ignored')).toEqual([]);
  });

  it('docs/agent-protocol.md states what the enrolment-secret route does with the key: required, a retry replays', () => {
    expect(modeOf('POST /api/sites/:siteId/enrolment-secret')).toBe('required');
    const doc = fs.readFileSync(path.join(__dirname, '..', '..', 'docs', 'agent-protocol.md'), 'utf8');
    const step = doc.slice(doc.indexOf('POST /api/sites/{siteId}/enrolment-secret'), doc.indexOf('POST /api/agent/enrol'));
    expect(step).toMatch(/requires `Idempotency-Key`/);
    expect(step).toMatch(/replays the same secret/);
    expect(step).not.toMatch(/ignore/i);
  });

  it('ignores the header on the routes the Conventions name', () => {
    const ignored = [
      'POST /api/roosts',
      'POST /api/keys',
      'POST /api/keys/:keyId/rotate',
      'DELETE /api/keys/:keyId',
      'POST /api/chunks/upload-urls',
    ];
    for (const r of ignored) expect([r, modeOf(r)]).toEqual([r, 'ignored']);
  });

  it('never keys a read', () => {
    expect(keyed().filter((r) => r.method === 'GET')).toEqual([]);
  });
});

/** A repeat of a key on a route that never replays: 422 idempotency_key_mismatch, answered by the route itself. */
function expectRefusedRepeat(res: Res): void {
  expect([res.status, res.json?.code, res.replayed]).toEqual([422, 'idempotency_key_mismatch', false]);
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
}

/** A repeat of the executed request with its key: the replay, or the documented refusal where nothing replays. */
function expectRepeat(f: KeyedFixture, res: Res): void {
  if (f.replays === false) expectRefusedRepeat(res);
  else expect([res.status < 300, res.replayed]).toEqual([true, true]);
}

describe.each(KEYED.map((f) => [f.route, f] as const))('%s', (route, f) => {
  const before = async () => (f.count ? f.count() : 0);

  it('handles a missing or blank key as the route requires', async () => {
    const mode = modeOf(route);
    for (const key of [undefined, '', '   ']) {
      const req = await f.prepare(`missing-${idemKey()}`);
      const n = await before();
      const res = await send(req, key);
      if (mode === 'required') {
        expect([JSON.stringify(key), res.status, res.json.code]).toEqual([JSON.stringify(key), 400, 'idempotency_key_required']);
        if (f.count) expect(await f.count()).toBe(n);
      } else {
        expect([JSON.stringify(key), res.status < 300, res.replayed]).toEqual([JSON.stringify(key), true, false]);
      }
    }
  });

  it('accepts a 255-character key and rejects a 256-character one with idempotency_key_invalid', async () => {
    const okKey = idemKey().padEnd(255, 'x');
    const req = await f.prepare(`long-${idemKey()}`, okKey);
    const n = await before();
    const tooLong = await send(req, idemKey().padEnd(256, 'x'));
    expect([tooLong.status, tooLong.json.code, tooLong.json.param]).toEqual([400, 'idempotency_key_invalid', 'Idempotency-Key']);
    if (f.count) expect(await f.count()).toBe(n);
    const ok = await send(req, okKey);
    expect(ok.status).toBeLessThan(300);
    if (f.count) expect(await f.count()).toBe(n + 1);
  });

  it('replays the first success with Idempotent-Replayed: true, the same status and the same body', async () => {
    const key = idemKey();
    const req = await f.prepare(`replay-${idemKey()}`, key);
    const n = await before();
    const first = await send(req, key);
    expect(first.status).toBeLessThan(300);
    expect(first.replayed).toBe(false);
    if (f.count) expect(await f.count()).toBe(n + 1);
    if (f.verify) await f.verify(first.json);
    for (let i = 0; i < 2; i++) {
      const again = await send(req, key);
      if (f.replays === false) {
        expectRefusedRepeat(again);
        continue;
      }
      expect([again.status, again.replayed, again.body]).toEqual([first.status, true, first.body]);
      expect(again.headers['content-type']).toBe(first.headers['content-type']);
      expect(again.headers['x-request-id']).not.toBe(first.headers['x-request-id']);
    }
    if (f.count) expect(await f.count()).toBe(n + 1);
    if (f.verify) await f.verify(first.json);
  });

  it('answers 422 idempotency_key_mismatch to a different body or query with the same key', async () => {
    const key = idemKey();
    const req = await f.prepare(`mismatch-${idemKey()}`, key);
    const first = await send(req, key);
    expect(first.status).toBeLessThan(300);
    const n = await before();
    const other = await send(f.variant(req), key);
    expect([other.status, other.json.code]).toEqual([422, 'idempotency_key_mismatch']);
    expect(other.headers['content-type']).toMatch(/^application\/problem\+json/);
    if (f.count) expect(await f.count()).toBe(n);
    // The stored response is still there for the original request (a route that never replays still refuses it).
    expectRepeat(f, await send(req, key));
  });

  it('does not cache errors: a failed attempt, then a corrected one with the same key runs', async () => {
    const key = idemKey();
    const req = await f.prepare(`error-${idemKey()}`, key);
    const n = await before();
    await setActorScopes([]);
    let failed: Res;
    try {
      failed = await send(req, key);
    } finally {
      await setActorScopes(fullAccessScopes());
    }
    expect([failed.status, failed.json.code]).toEqual([403, 'scope_insufficient']);
    expect((await send(req, key)).replayed).toBe(false); // …and it is not a replay of the 403
    if (f.count) expect(await f.count()).toBe(n + 1);
    expectRepeat(f, await send(req, key));
  });

  it('runs the mutation once for concurrent requests with the same key', async () => {
    const key = idemKey();
    const req = await f.prepare(`race-${idemKey()}`, key);
    const n = await before();
    const results = await Promise.all([send(req, key), send(req, key), send(req, key), send(req, key)]);
    const executed = results.filter((r) => r.status < 300 && !r.replayed);
    expect(executed).toHaveLength(1);
    for (const r of results) {
      if (r === executed[0]) continue;
      if (r.status < 300) expect([r.replayed, r.body]).toEqual([true, executed[0].body]);
      else if (f.replays === false && r.status === 422) expectRefusedRepeat(r);
      else {
        expect([r.status, r.json.code]).toEqual([409, 'idempotency_key_in_use']);
        expect(r.headers['retry-after']).toBe('1');
      }
    }
    if (f.count) expect(await f.count()).toBe(n + 1);
    if (f.verify) await f.verify(executed[0].json);
    // Once the first finished, everyone gets the replay (or, for a route that never replays, the refusal).
    expectRepeat(f, await send(req, key));
  });
});

describe('routes that ignore the header', () => {
  it('POST /api/roosts creates again with the same key, and any key length is fine', async () => {
    const key = idemKey().padEnd(300, 'y');
    const body = { siteId: h.siteId, name: 'ignored' };
    const a = await send({ method: 'POST', url: '/api/roosts', body }, key);
    const b = await send({ method: 'POST', url: '/api/roosts', body }, key);
    expect([a.status, b.status, a.replayed, b.replayed]).toEqual([201, 201, false, false]);
    expect(a.json.roostId).not.toBe(b.json.roostId);
  });

  it('POST /api/chunks/upload-urls signs again with the same key (no replay cache)', async () => {
    const key = idemKey();
    const body = { siteId: h.siteId, hashes: [sha256Hex('upload-urls-ignored')] };
    const a = await send({ method: 'POST', url: '/api/chunks/upload-urls', body }, key);
    const b = await send({ method: 'POST', url: '/api/chunks/upload-urls', body: { ...body, hashes: [sha256Hex('different')] } }, key);
    expect([a.status, b.status, a.replayed, b.replayed]).toEqual([200, 200, false, false]);
  });
});

describe('scope of a key', () => {
  const fixture = KEYED[0]; // publish

  it('is per API key, per user, per route: the same key string elsewhere runs its own request', async () => {
    const key = idemKey();
    const req = await fixture.prepare(`scope-${key}`);
    const first = await send(req, key);
    expect(first.status).toBe(201);
    // Another key of the same user: a request of its own (the body matches the first, so it republishes: 200).
    const second = await insertKey(h.deps.db, { uid: h.userId, scopes: fullAccessScopes(), primarySiteId: h.siteId });
    const other = await send(req, key, { apiKey: second.raw });
    expect([other.status, other.replayed]).toEqual([200, false]);
    // Another route with the same key string.
    const otherRoute = await fixture.prepare(`scope-other-${key}`);
    const third = await send(otherRoute, key);
    expect([third.status, third.replayed]).toEqual([201, false]);
  });

  it('compares bodies by content, not by key order or whitespace', async () => {
    const key = idemKey();
    const req = await fixture.prepare(`canonical-${key}`);
    const b = req.body as Record<string, unknown>;
    const first = await send({ ...req, body: JSON.stringify({ siteId: b.siteId, version: b.version }) }, key, {
      headers: { 'content-type': 'application/json' },
    });
    expect(first.status).toBe(201);
    const reordered = await send({ ...req, body: `{ "version": ${JSON.stringify(b.version, null, 2)},\n "siteId": "${b.siteId}" }` }, key, {
      headers: { 'content-type': 'application/json' },
    });
    expect([reordered.status, reordered.replayed, reordered.body]).toEqual([201, true, first.body]);
  });

  it('is not taken by a request refused before the route runs (unsupported Roost-Version, bad body)', async () => {
    const key = idemKey();
    const req = await fixture.prepare(`early-${key}`);
    const version = await send(req, key, { headers: { 'roost-version': '1999-01-01' } });
    expect([version.status, version.json.code]).toEqual([400, 'unsupported_version']);
    const invalid = await send({ ...req, body: { version: (req.body as { version: unknown }).version } }, key);
    expect([invalid.status, invalid.json.code]).toEqual([400, 'validation_failed']);
    const ok = await send(req, key);
    expect([ok.status, ok.replayed]).toEqual([201, false]);
  });
});

describe('lifetime of a key', () => {
  const fixture = KEYED[0]; // publish
  const rowOf = (req: Req, key: string) =>
    idempotencyScopeHash({
      user: h.userId,
      environment: 'live',
      keyId: actor.keyId,
      method: req.method,
      path: req.url.split('?')[0],
      idempotencyKey: key,
    });

  it('answers 409 idempotency_key_in_use while the first request runs, and takes over an abandoned reservation', async () => {
    const key = idemKey();
    const req = await fixture.prepare(`running-${key}`);
    const first = await send(req, key);
    expect(first.status).toBe(201);
    // Make the row look like a request still running.
    await h.deps.db.query(
      `UPDATE idempotency_keys SET state = 'in_progress', response_status = NULL, response_body = NULL WHERE key_hash = $1`,
      [rowOf(req, key)],
    );
    const busy = await send(req, key);
    expect([busy.status, busy.json.code, busy.headers['retry-after']]).toEqual([409, 'idempotency_key_in_use', '1']);
    // …whose process died: it stopped renewing its lease, which lapsed. The next request takes the key over and runs.
    await h.deps.db.query(`UPDATE idempotency_keys SET expires_at = now() - INTERVAL '1 second' WHERE key_hash = $1`, [rowOf(req, key)]);
    const retried = await send(req, key);
    expect([retried.status, retried.replayed]).toEqual([200, false]); // the version exists already: a republish
    expect((await send(req, key)).replayed).toBe(true);
  });

  it('expires after 24 hours: the key is usable again, even with another body', async () => {
    const key = idemKey();
    const req = await fixture.prepare(`expiry-${key}`);
    expect((await send(req, key)).status).toBe(201);
    // The replay window runs from when the response was stored.
    const { rows } = await h.deps.db.query<{ ttl: number }>(
      'SELECT EXTRACT(EPOCH FROM (expires_at - now())) AS ttl FROM idempotency_keys WHERE key_hash = $1',
      [rowOf(req, key)],
    );
    expect(Number(rows[0].ttl)).toBeLessThanOrEqual(24 * 3600);
    expect(Number(rows[0].ttl)).toBeGreaterThan(24 * 3600 - 60);
    await h.deps.db.query(`UPDATE idempotency_keys SET expires_at = now() - INTERVAL '1 second' WHERE key_hash = $1`, [rowOf(req, key)]);
    const other = await send(fixture.variant(req), key);
    expect([other.status, other.replayed]).toEqual([200, false]); // same version content, new description: ran
    expect((await send(fixture.variant(req), key)).replayed).toBe(true);
  });

  it('keeps stored responses sealed: a replayed secret is not stored in clear text', async () => {
    const key = idemKey();
    const req = { method: 'POST', url: `/api/sites/${h.siteId}/enrolment-secret` };
    const first = await send(req, key);
    expect(first.status).toBe(201);
    const secret: string = first.json.enrolmentSecret;
    const { rows } = await h.deps.db.query<{ response_body: string }>('SELECT response_body FROM idempotency_keys WHERE key_hash = $1', [
      rowOf(req, key),
    ]);
    expect(rows[0].response_body).toMatch(/^sealed:v1:/);
    expect(await count('SELECT count(*) AS n FROM idempotency_keys WHERE response_body LIKE $1', [`%${secret}%`])).toBe(0);
    const replay = await send(req, key);
    expect([replay.replayed, replay.json.enrolmentSecret]).toEqual([true, secret]);
  });

  it('purges expired rows, by key-space slice or all at once, and keeps live ones', async () => {
    const mk = (prefix: string) => prefix + sha256Hex(idemKey()).slice(prefix.length);
    const expiredA = mk('ab');
    const expiredB = mk('ab');
    const liveA = mk('ab');
    const expiredC = mk('cd');
    for (const [hash, expired] of [
      [expiredA, true],
      [expiredB, true],
      [liveA, false],
      [expiredC, true],
    ] as const) {
      await h.deps.db.query(
        `INSERT INTO idempotency_keys (key_hash, request_hash, state, response_status, response_body, expires_at)
         VALUES ($1, 'x', 'done', 201, '{}', now() + ${expired ? "INTERVAL '-1 hour'" : "INTERVAL '1 hour'"})`,
        [hash],
      );
    }
    const left = async () =>
      (
        await h.deps.db.query<{ key_hash: string }>('SELECT key_hash FROM idempotency_keys WHERE key_hash = ANY($1)', [
          [expiredA, expiredB, liveA, expiredC],
        ])
      ).rows
        .map((r) => r.key_hash)
        .sort();
    expect(await purgeExpiredIdempotencyKeys(h.deps.db, 'ab')).toBeGreaterThanOrEqual(2);
    expect(await left()).toEqual([liveA, expiredC].sort());
    await purgeExpiredIdempotencyKeys(h.deps.db, 'fe'); // another slice: nothing of ours
    expect(await left()).toEqual([liveA, expiredC].sort());
    await purgeExpiredIdempotencyKeys(h.deps.db);
    expect(await left()).toEqual([liveA]);
    await expect(purgeExpiredIdempotencyKeys(h.deps.db, "a' OR 1=1")).rejects.toThrow(/slice/);
  });
});
