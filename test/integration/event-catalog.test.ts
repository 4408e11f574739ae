/**
 * The event catalog audit (docs/contract.md "Event catalog"): every event the
 * code records carries exactly the data fields of the spec's table (names and JSON types), and is
 * written in the transaction of the state change that causes it. Each event is triggered the way it
 * happens in production: routes (publish, rollback, deploy with a worker, enrolment, chunk uploads),
 * and the sweep repository functions the background workflows call (machine.offline, chunk GC, chunk
 * verify, key expiry). Same transaction: PostgreSQL's now() is the transaction's start time, so the
 * event's occurred_at equals the timestamp the state change wrote with now(); and failed operations
 * record nothing.
 */
import { randomBytes } from 'node:crypto';
import type { EventType } from '../../domain/events';
import { EVENT_TYPES } from '../../domain/events';
import { sha256Hex } from '../../domain/hex';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName } from '../../storage/blob';
import { announceKeyExpiry, condemnChunk, finishReclaim, markMachineOffline, recordVerifyResult } from '../../db/sweeps';
import { closeWorkerConnections } from '../../worker/worker';
import { withUsage } from '../../db/quota';
import { createHarness, type Harness } from '../support/harness';
import { insertKey } from '../support/identity';
import {
  type TestWorker,
  dbFleet,
  deployRoute,
  enrolMachineRows,
  machineIds,
  publishFiles,
  seedRoost,
  startTestWorker,
  terminateAll,
} from './rollout-fixtures';
import { waitFor } from '../support/wait';

/** JSON type of a data field: one of these, or several joined by `|`. */
type Json = 'string' | 'integer' | 'number' | 'boolean' | 'null';
interface Fields {
  required: Record<string, string>;
  optional?: Record<string, string>;
}

/** docs/contract.md "Event catalog", data fields per event (with the JSON type each carries here). */
const CATALOG: Record<EventType, Fields> = {
  'version.published': {
    required: {
      roostId: 'string',
      siteId: 'string',
      versionId: 'string',
      versionNumber: 'integer',
      description: 'string|null',
      totalFiles: 'integer',
      totalSize: 'integer',
      createdBy: 'string',
    },
  },
  'version.rolled_back': {
    required: { roostId: 'string', siteId: 'string', fromVersion: 'string', toVersion: 'string', triggeredBy: 'string' },
  },
  'deployment.started': { required: { rolloutId: 'string', roostId: 'string', siteId: 'string', stage: 'string' } },
  'deployment.completed': {
    required: { rolloutId: 'string', roostId: 'string', siteId: 'string', stage: 'string', succeeded: 'integer', failed: 'integer' },
  },
  'deployment.failed': {
    required: {
      rolloutId: 'string',
      roostId: 'string',
      siteId: 'string',
      stage: 'string',
      abortReason: 'string',
      succeeded: 'integer',
      failed: 'integer',
    },
  },
  'machine.online': { required: { machineId: 'string', siteId: 'string', lastHeartbeat: 'string' } },
  'machine.offline': { required: { machineId: 'string', siteId: 'string', lastHeartbeat: 'string|null' } },
  'chunk.garbage_collected': { required: { siteId: 'string', hash: 'string', sizeBytes: 'integer' } },
  'chunk.verify_failed': { required: { siteId: 'string', hash: 'string', expectedDigest: 'string', actualDigest: 'string|null' } },
  'quota.warning': { required: { siteId: 'string', tier: 'string', threshold: 'number', usedBytes: 'integer', limitBytes: 'integer' } },
  // "a blockedAt timestamp may also appear"
  'quota.exceeded': {
    required: { siteId: 'string', tier: 'string', usedBytes: 'integer', limitBytes: 'integer' },
    optional: { blockedAt: 'string' },
  },
  'api_key.used': { required: { keyId: 'string', keyPrefix: 'string', ip: 'string', userAgent: 'string|null', firstUseFromIp: 'boolean' } },
  'api_key.expired': { required: { keyId: 'string', keyPrefix: 'string', name: 'string', expiresAt: 'integer' } },
};

function jsonType(v: unknown): Json | 'object' | 'array' {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v as Json | 'object';
}

/** Problems of one event's data against the table: missing, extra and mistyped fields. */
function mismatches(type: string, data: Record<string, unknown>): string[] {
  const spec = CATALOG[type as EventType];
  if (!spec) return [`${type}: not in the catalog`];
  const out: string[] = [];
  const all = { ...spec.required, ...(spec.optional ?? {}) };
  for (const k of Object.keys(spec.required)) if (!(k in data)) out.push(`${type}: missing ${k}`);
  for (const [k, v] of Object.entries(data)) {
    if (!(k in all)) {
      out.push(`${type}: extra field ${k}`);
      continue;
    }
    const t = jsonType(v);
    const allowed = all[k].split('|');
    if (!allowed.includes(t) && !(t === 'integer' && allowed.includes('number'))) out.push(`${type}: ${k} is ${t}, expected ${all[k]}`);
  }
  return out;
}

const TINY_TIER = 'catalog-tiny';
const TINY_LIMIT = 1000;

let h: Harness;
let w: TestWorker;
let quotaSite: { siteId: string; apiKey: string };
const workflows: string[] = [];
/** Every site this file records events in. */
const sites: string[] = [];

beforeAll(async () => {
  h = await createHarness({ ROOST_QUOTA_TIERS: JSON.stringify({ [TINY_TIER]: TINY_LIMIT }) });
  w = await startTestWorker(h);
  const o = await h.other();
  quotaSite = { siteId: o.siteId, apiKey: o.apiKey };
  await h.deps.db.query('UPDATE sites SET tier = $2 WHERE site_id = $1', [quotaSite.siteId, TINY_TIER]);
  sites.push(h.siteId, quotaSite.siteId);
});
afterAll(async () => {
  await terminateAll(h, workflows);
  await w?.stop();
  await closeWorkerConnections();
  await h?.close();
});

interface Row {
  event_id: string;
  type: string;
  data: Record<string, unknown>;
  occurred_at: Date;
}

async function eventsWhere(siteId: string, type: string, match: Record<string, unknown> = {}): Promise<Row[]> {
  const { rows } = await h.deps.db.query<Row>(
    `SELECT event_id, type, data, occurred_at FROM events WHERE site_id = $1 AND type = $2 AND data @> $3::jsonb ORDER BY occurred_at, event_id`,
    [siteId, type, JSON.stringify(match)],
  );
  return rows;
}

async function one(siteId: string, type: string, match: Record<string, unknown> = {}): Promise<Row> {
  const rows = await eventsWhere(siteId, type, match);
  expect([type, rows.length]).toEqual([type, 1]);
  expect(mismatches(type, rows[0].data)).toEqual([]);
  return rows[0];
}

/** The version body as published (fetched back through the API). */
async function storedBody(versionId: string): Promise<unknown> {
  const roost = (await h.deps.db.query('SELECT roost_id FROM roost_versions WHERE site_id = $1 AND version_id = $2', [h.siteId, versionId]))
    .rows[0].roost_id;
  const res = await h.request({ method: 'GET', url: `/api/roosts/${roost}/versions/${versionId}?siteId=${h.siteId}` });
  expect(res.statusCode).toBe(200);
  return res.json().version;
}

describe('events recorded by the routes', () => {
  it('version.published and version.rolled_back (rollback route and re-publishing an older version)', async () => {
    const seeded = await seedRoost(h);
    const published = await one(h.siteId, 'version.published', { versionId: seeded.versionId });
    const { rows: v } = await h.deps.db.query('SELECT created_at FROM roost_versions WHERE site_id = $1 AND version_id = $2', [
      h.siteId,
      seeded.versionId,
    ]);
    expect(published.occurred_at).toEqual(v[0].created_at);
    expect(published.data).toMatchObject({
      roostId: seeded.roostId,
      siteId: h.siteId,
      versionNumber: 1,
      totalFiles: 2,
      createdBy: h.userId,
    });

    const v2 = await publishFiles(h, seeded.roostId, { 'second.txt': 'two\n' });
    const rb = await h.request({
      method: 'POST',
      url: `/api/roosts/${seeded.roostId}/rollback`,
      body: { siteId: h.siteId },
      idempotencyKey: true,
    });
    expect(rb.statusCode).toBe(200);
    const rolled = await one(h.siteId, 'version.rolled_back', { roostId: seeded.roostId });
    expect(rolled.data).toEqual({
      roostId: seeded.roostId,
      siteId: h.siteId,
      fromVersion: v2.versionId,
      toVersion: seeded.versionId,
      triggeredBy: h.userId,
    });
    const { rows: r } = await h.deps.db.query('SELECT updated_at FROM roosts WHERE site_id = $1 AND roost_id = $2', [
      h.siteId,
      seeded.roostId,
    ]);
    expect(rolled.occurred_at).toEqual(r[0].updated_at);

    // A refused rollback (target is current) records nothing.
    const noop = await h.request({
      method: 'POST',
      url: `/api/roosts/${seeded.roostId}/rollback`,
      body: { siteId: h.siteId, targetVersion: seeded.versionId },
      idempotencyKey: true,
    });
    expect(noop.json().code).toBe('rollback_no_op');
    expect(await eventsWhere(h.siteId, 'version.rolled_back', { roostId: seeded.roostId })).toHaveLength(1);

    // Re-publishing v2's exact body moves the pointer back (200, no new version): version.rolled_back
    // from the publish path.
    const again = await h.request({
      method: 'POST',
      url: `/api/roosts/${seeded.roostId}/versions`,
      body: { siteId: h.siteId, version: await storedBody(v2.versionId) },
      idempotencyKey: true,
    });
    expect([again.statusCode, again.json().versionId]).toEqual([200, v2.versionId]);
    const both = await eventsWhere(h.siteId, 'version.rolled_back', { roostId: seeded.roostId });
    expect(both).toHaveLength(2);
    expect(mismatches('version.rolled_back', both[1].data)).toEqual([]);
    expect(both[1].data).toMatchObject({ fromVersion: seeded.versionId, toVersion: v2.versionId });
    expect(await eventsWhere(h.siteId, 'version.published', { roostId: seeded.roostId })).toHaveLength(2);
  });

  it('deployment.started, deployment.completed and deployment.failed (deploy route, worker, agents)', async () => {
    const good = machineIds(2, `good-${randomBytes(2).toString('hex')}`);
    const bad = machineIds(2, `bad-${randomBytes(2).toString('hex')}`);
    await enrolMachineRows(h, [...good, ...bad]);
    const fleet = dbFleet(h, (m) => (bad.includes(m) ? 'fail' : 'commit'));
    try {
      const okRoost = await seedRoost(h, { targets: good });
      const badRoost = await seedRoost(h, { targets: bad });
      const ok = await deployRoute(h, okRoost.roostId, { policy: { retries: 0, bakeSeconds: 0 } });
      const ko = await deployRoute(h, badRoost.roostId, { policy: { retries: 0, bakeSeconds: 0 } });
      workflows.push(ok.workflowId, ko.workflowId);
      await h.deps.temporal.workflow.getHandle(ok.workflowId).result();
      await h.deps.temporal.workflow.getHandle(ko.workflowId).result();

      for (const [r, roostId, end] of [
        [ok, okRoost.roostId, 'deployment.completed'],
        [ko, badRoost.roostId, 'deployment.failed'],
      ] as const) {
        const started = await one(h.siteId, 'deployment.started', { rolloutId: r.rolloutId });
        expect(started.data).toMatchObject({ rolloutId: r.rolloutId, roostId, siteId: h.siteId });
        const finished = await one(h.siteId, end, { rolloutId: r.rolloutId });
        const { rows } = await h.deps.db.query(
          'SELECT completed_at, succeeded, failed FROM rollouts WHERE site_id = $1 AND rollout_id = $2',
          [h.siteId, r.rolloutId],
        );
        expect(finished.occurred_at).toEqual(rows[0].completed_at);
        expect(finished.data).toMatchObject({ succeeded: rows[0].succeeded, failed: rows[0].failed });
      }
      expect((await one(h.siteId, 'deployment.completed', { rolloutId: ok.rolloutId })).data).toMatchObject({
        stage: 'completed',
        succeeded: 2,
        failed: 0,
      });
      expect((await one(h.siteId, 'deployment.failed', { rolloutId: ko.rolloutId })).data).toMatchObject({
        stage: 'failed',
        abortReason: expect.any(String),
      });
    } finally {
      await fleet.stop();
    }
  });

  it('machine.online on enrolment, in the transaction that sets the heartbeat', async () => {
    const secret = await h.enrolmentSecret();
    const machineId = `cat-${randomBytes(3).toString('hex')}`;
    const res = await h.request({
      method: 'POST',
      url: '/api/agent/enrol',
      key: null,
      body: { siteId: h.siteId, enrolmentSecret: secret, machineId, hostname: `${machineId}.local`, agentVersion: '1.2.3' },
    });
    expect(res.statusCode).toBeLessThan(300);
    const online = await one(h.siteId, 'machine.online', { machineId });
    const { rows } = await h.deps.db.query<{ last_heartbeat: Date }>(
      'SELECT last_heartbeat FROM machines WHERE site_id = $1 AND machine_id = $2',
      [h.siteId, machineId],
    );
    expect(online.data).toEqual({ machineId, siteId: h.siteId, lastHeartbeat: rows[0].last_heartbeat.toISOString() });
    expect(online.occurred_at).toEqual(rows[0].last_heartbeat);
  });

  it('quota.warning at 50 % and 80 %, and quota.exceeded on the first refused write', async () => {
    const { siteId, apiKey } = quotaSite;
    const roost = await h.request({ method: 'POST', url: '/api/roosts', key: apiKey, body: { siteId, name: 'quota' } });
    expect(roost.statusCode).toBe(201);
    const roostId = roost.json().roostId;
    const publish = async (text: string) => {
      const bytes = Buffer.from(text);
      const hash = sha256Hex(bytes);
      await h.deps.blob.put('chunks', chunkBlobName(siteId, hash), bytes, 'application/octet-stream');
      const version = {
        schemaVersion: 2,
        mediaType: VERSION_MEDIA_TYPE,
        config: { producer: 'catalog-test' },
        files: [{ path: `${hash}.txt`, size: bytes.length, chunks: [{ hash, size: bytes.length }] }],
      };
      return h.request({
        method: 'POST',
        url: `/api/roosts/${roostId}/versions`,
        key: apiKey,
        body: { siteId, version },
        idempotencyKey: true,
      });
    };
    expect((await publish('a'.repeat(600))).statusCode).toBe(201);
    expect((await publish('b'.repeat(300))).statusCode).toBe(201);
    const warnings = await eventsWhere(siteId, 'quota.warning');
    expect(warnings.map((e) => e.data.threshold)).toEqual([0.5, 0.8]);
    for (const e of warnings) expect(mismatches('quota.warning', e.data)).toEqual([]);
    expect(warnings[0].data).toEqual({ siteId, tier: TINY_TIER, threshold: 0.5, usedBytes: 600, limitBytes: TINY_LIMIT });

    const refused = await h.request({
      method: 'POST',
      url: '/api/chunks/upload-urls',
      key: apiKey,
      body: { siteId, hashes: [sha256Hex(randomBytes(8))] },
    });
    expect(refused.json().code).toBe('quota_exceeded');
    const exceeded = await one(siteId, 'quota.exceeded');
    expect(exceeded.data).toMatchObject({ siteId, tier: TINY_TIER, usedBytes: 900, limitBytes: TINY_LIMIT });
  });

  it('api_key.used on the first use of a key from an address', async () => {
    const { raw, keyId } = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
      primarySiteId: h.siteId,
    });
    const res = await h.request({
      method: 'GET',
      url: `/api/sites/${h.siteId}/quota`,
      key: raw,
      headers: { 'user-agent': 'catalog-test/1.0' },
    });
    expect(res.statusCode).toBe(200);
    const used = await waitFor('api_key.used', async () => (await eventsWhere(h.siteId, 'api_key.used', { keyId }))[0]);
    expect(mismatches('api_key.used', used.data)).toEqual([]);
    expect(used.data).toMatchObject({ keyId, firstUseFromIp: true, userAgent: 'catalog-test/1.0' });
  });
});

describe('events recorded by the sweeps (the repository functions their workflows call)', () => {
  it('machine.offline when the heartbeat is stale', async () => {
    const [machineId] = machineIds(1, `stale-${randomBytes(2).toString('hex')}`);
    await enrolMachineRows(h, [machineId]);
    await h.deps.db.query(`UPDATE machines SET last_heartbeat = now() - INTERVAL '1 hour' WHERE site_id = $1 AND machine_id = $2`, [
      h.siteId,
      machineId,
    ]);
    expect(await markMachineOffline(h.deps.db, h.siteId, machineId, 60)).toBe(true);
    const offline = await one(h.siteId, 'machine.offline', { machineId });
    expect(offline.data).toMatchObject({ machineId, siteId: h.siteId });
  });

  it('chunk.verify_failed and chunk.garbage_collected', async () => {
    const hash = sha256Hex(randomBytes(16));
    await h.deps.db.query(
      withUsage(`INSERT INTO chunks (site_id, hash, size, created_at) VALUES ($1, $2, 16, now() - INTERVAL '40 days') RETURNING size`, 1),
      [h.siteId, hash],
    );
    expect(await recordVerifyResult(h.deps.db, h.siteId, hash, 'f'.repeat(64))).toBe(true);
    expect((await one(h.siteId, 'chunk.verify_failed', { hash })).data).toEqual({
      siteId: h.siteId,
      hash,
      expectedDigest: hash,
      actualDigest: 'f'.repeat(64),
    });

    expect(await condemnChunk(h.deps.db, h.siteId, hash, 0)).toBe(true);
    expect(await finishReclaim(h.deps.db, h.siteId, hash)).toBe(true);
    expect((await one(h.siteId, 'chunk.garbage_collected', { hash })).data).toEqual({ siteId: h.siteId, hash, sizeBytes: 16 });
  });

  it('api_key.expired once a key is past expiresAt', async () => {
    const expiresAt = Date.now() - 60_000;
    const { keyId } = await insertKey(h.deps.db, {
      uid: h.userId,
      scopes: [{ resource: 'site', id: h.siteId, permissions: ['read'] }],
      primarySiteId: h.siteId,
      expiresAt,
      name: 'expiring',
    });
    expect(await announceKeyExpiry(h.deps.db, keyId, Date.now())).toBe(1);
    const expired = await one(h.siteId, 'api_key.expired', { keyId });
    expect(expired.data).toMatchObject({ keyId, name: 'expiring', expiresAt });
  });
});

describe('the whole catalog', () => {
  it('every event recorded in this file has exactly the fields of the table, and every catalog event was seen', async () => {
    const { rows } = await h.deps.db.query<Row>('SELECT event_id, type, data, occurred_at FROM events WHERE site_id = ANY($1::text[])', [
      sites,
    ]);
    expect(rows.flatMap((r) => mismatches(r.type, r.data))).toEqual([]);
    expect([...new Set(rows.map((r) => r.type))].sort()).toEqual([...EVENT_TYPES].sort());
    expect(Object.keys(CATALOG).sort()).toEqual([...EVENT_TYPES].sort());
  });
});
