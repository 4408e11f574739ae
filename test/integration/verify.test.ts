/**
 * No rollout ships bytes the service has not verified once (docs/decisions/chunk-integrity.md), over the
 * real services: publish starts the version's verification (workflows/verify.ts), which re-hashes the
 * chunks it stores, reports bad bytes (`chunk.verify_failed`) and quarantines them; a deploy of a version
 * with chunks known bad is refused (409 conflict naming them); and a rollout re-checks before its first
 * wave, so bytes that were never verified and are wrong end it as failed (`chunk_verify_failed`) before
 * any machine is sent a command.
 * Set ROOST_RECORD_HISTORIES=1 to refresh test/replay/histories/verify/ and
 * test/replay/histories/rollout-chunk-verify-failed.json from these runs.
 */
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { sha256Hex } from '../../domain/hex';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName } from '../../storage/blob';
import { versionVerifyWorkflowId } from '../../workflows/client';
import type { VerifyVersionResult } from '../../activities/verify';
import type { RolloutOutcome } from '../../workflows/rollout';
import { recordHistory } from '../../scripts/record-history';
import {
  closeRolloutSuite,
  deployRoute,
  enrolMachineRows,
  machineIds,
  openRolloutSuite,
  rolloutEvents,
  type RolloutSuite,
} from './rollout-fixtures';

const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories');

let s: RolloutSuite;
const workflows: string[] = [];

beforeAll(async () => {
  s = await openRolloutSuite('verify');
});
afterAll(async () => {
  await closeRolloutSuite(s, workflows);
});

function chunk(size: number): { bytes: Buffer; hash: string } {
  const bytes = randomBytes(size);
  return { bytes, hash: sha256Hex(bytes) };
}

/** Uploads `bytes` under `hash` through a create-only upload URL, as a client does. */
async function upload(hash: string, bytes: Buffer): Promise<void> {
  const res = await s.h.request({ method: 'POST', url: '/api/chunks/upload-urls', body: { siteId: s.h.siteId, hashes: [hash] } });
  const put = await fetch(res.json().urls[hash], {
    method: 'PUT',
    body: bytes,
    headers: { 'x-ms-blob-type': 'BlockBlob', 'content-type': 'application/octet-stream' },
  });
  expect(put.status).toBe(201);
}

/** A roost targeting two enrolled machines, with one version of `chunks` published through the API. */
async function publish(chunks: { hash: string; size: number }[]): Promise<{ roostId: string; versionId: string }> {
  const targets = machineIds(2);
  await enrolMachineRows(s.h, targets);
  const roost = await s.h.request({
    method: 'POST',
    url: '/api/roosts',
    body: { siteId: s.h.siteId, name: `verify ${randomBytes(3).toString('hex')}`, targets, extractPath: 'apps/verify' },
  });
  const roostId = roost.json().roostId as string;
  const files = chunks.map((c, i) => ({ path: `f${i}.bin`, size: c.size, chunks: [c] }));
  const res = await s.h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    body: { siteId: s.h.siteId, version: { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: {}, files } },
    idempotencyKey: true,
  });
  expect(res.statusCode).toBe(201);
  return { roostId, versionId: res.json().versionId };
}

async function verification(roostId: string, versionId: string): Promise<VerifyVersionResult> {
  const id = versionVerifyWorkflowId(s.h.siteId, roostId, versionId);
  workflows.push(id);
  return (await s.h.deps.temporal.workflow.getHandle(id).result()) as VerifyVersionResult;
}

async function verifyFailedEvents(hash: string): Promise<unknown[]> {
  const { rows } = await s.h.deps.db.query(
    `SELECT data FROM events WHERE site_id = $1 AND type = 'chunk.verify_failed' AND data->>'hash' = $2`,
    [s.h.siteId, hash],
  );
  return rows.map((r) => r.data);
}

it('publish verifies the new chunks in the background: bad bytes are reported and quarantined, and deploy refuses the version until they are uploaded again', async () => {
  const good = chunk(3000);
  const meant = chunk(2000);
  const bad = randomBytes(2000);
  await upload(good.hash, good.bytes);
  await upload(meant.hash, bad); // the first upload under a digest may carry any bytes
  const { roostId, versionId } = await publish([
    { hash: good.hash, size: 3000 },
    { hash: meant.hash, size: 2000 },
  ]);

  expect(await verification(roostId, versionId)).toEqual({ verified: 2, failed: 1, failedChunks: [meant.hash] });
  if (RECORD)
    await recordHistory(
      s.h.deps.temporal,
      versionVerifyWorkflowId(s.h.siteId, roostId, versionId),
      path.join(HISTORIES, 'verify', 'verify-failed.json'),
    );
  expect(await verifyFailedEvents(meant.hash)).toEqual([
    { siteId: s.h.siteId, hash: meant.hash, expectedDigest: meant.hash, actualDigest: sha256Hex(bad) },
  ]);
  const { rows } = await s.h.deps.db.query(
    'SELECT hash, verified_at IS NOT NULL AS verified, verify_failed_digest FROM chunks WHERE site_id = $1 AND hash = ANY($2) ORDER BY hash',
    [s.h.siteId, [good.hash, meant.hash]],
  );
  expect(rows).toEqual(
    expect.arrayContaining([
      { hash: good.hash, verified: true, verify_failed_digest: null },
      { hash: meant.hash, verified: true, verify_failed_digest: sha256Hex(bad) },
    ]),
  );
  expect(await s.h.deps.blob.get('chunks', chunkBlobName(s.h.siteId, meant.hash))).toBeNull();

  const refused = await s.h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/deploy`,
    body: { siteId: s.h.siteId },
    idempotencyKey: true,
  });
  expect(refused.statusCode).toBe(409);
  expect(refused.json()).toMatchObject({ code: 'conflict', badChunks: [meant.hash] });
  const rollouts = await s.h.deps.db.query('SELECT 1 FROM rollouts WHERE site_id = $1 AND roost_id = $2', [s.h.siteId, roostId]);
  expect(rollouts.rows).toEqual([]);

  // What `roost push` does next: check says missing, the fresh upload heals, deploy goes ahead.
  const check = await s.h.request({
    method: 'POST',
    url: '/api/chunks/check',
    body: { siteId: s.h.siteId, hashes: [good.hash, meant.hash] },
  });
  expect(check.json().missing).toEqual([meant.hash]);
  await upload(meant.hash, meant.bytes);
  const again = await s.h.request({ method: 'POST', url: '/api/chunks/check', body: { siteId: s.h.siteId, hashes: [meant.hash] } });
  expect(again.json().missing).toEqual([]);
  const deployed = await deployRoute(s.h, roostId);
  workflows.push(deployed.workflowId);
});

it('a rollout verifies before its first wave: bytes never verified that are wrong fail it (chunk_verify_failed) and no machine is sent a command', async () => {
  const c = chunk(1500);
  await upload(c.hash, c.bytes);
  const { roostId, versionId } = await publish([{ hash: c.hash, size: 1500 }]);
  expect(await verification(roostId, versionId)).toMatchObject({ failed: 0 });
  // The state a deploy racing its publish's verification meets: stored bytes nobody has hashed yet, and
  // they are wrong (rewritten here behind the API's back; no URL the API hands out can do it).
  await s.h.deps.blob.put('chunks', chunkBlobName(s.h.siteId, c.hash), randomBytes(1500), 'application/octet-stream');
  await s.h.deps.db.query('UPDATE chunks SET verified_at = NULL WHERE site_id = $1 AND hash = $2', [s.h.siteId, c.hash]);

  const deployed = await deployRoute(s.h, roostId);
  workflows.push(deployed.workflowId);
  const outcome = (await s.h.deps.temporal.workflow.getHandle(deployed.workflowId).result()) as RolloutOutcome;
  expect(outcome).toMatchObject({ stage: 'failed', abortReason: 'chunk_verify_failed', succeeded: 0, failed: 0 });
  if (RECORD) await recordHistory(s.h.deps.temporal, deployed.workflowId, path.join(HISTORIES, 'rollout-chunk-verify-failed.json'));
  const events = await rolloutEvents(s.h, deployed.rolloutId);
  expect(events.map((e) => e.type)).toEqual(['deployment.started', 'deployment.failed']);
  expect(events[1].data).toMatchObject({ abortReason: 'chunk_verify_failed' });
  expect(await verifyFailedEvents(c.hash)).toHaveLength(1);
  const commands = await s.h.deps.db.query(`SELECT 1 FROM commands WHERE site_id = $1 AND params->>'versionId' = $2`, [
    s.h.siteId,
    versionId,
  ]);
  expect(commands.rows).toEqual([]);
});
