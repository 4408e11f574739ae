/**
 * The agent's self-upgrade (agent/self-update.ts; docs/decisions/agent-self-update.md) against a real
 * catalog entry served by the real API (uploaded through the three steps, verified by the finalise
 * workflow, made latest): the heartbeat offers it, the agent fetches the signed URL, verifies the
 * catalog checksum, swaps its executable (the running one kept as `.old`) and restarts; the restarted
 * agent's heartbeat reports the new agentVersion and is offered nothing. Bytes changed in storage after
 * finalise are refused and nothing is swapped. Holds the catalog lock (test/support/catalog-lock.ts).
 */
import { createHash, randomInt } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Agent } from '../../agent/agent';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { lockCatalog } from '../support/catalog-lock';
import { startTestWorker, type TestWorker } from './rollout-fixtures';
import { closeWorkerConnections } from '../../worker/worker';
import { waitFor } from '../support/wait';

let h: Harness;
let w: TestWorker;
let api: string;
let tmp: string;
let unlock: (() => Promise<void>) | undefined;
const major = randomInt(100_000, 900_000);
const agents: Agent[] = [];

beforeAll(async () => {
  h = await createHarness();
  w = await startTestWorker(h, 'self-update-worker');
  api = await h.listen();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-self-update-'));
  unlock = await lockCatalog(h);
});
afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop().catch(() => undefined)));
  await unlock?.();
  await w?.stop();
  await closeWorkerConnections();
  await h?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

/** Uploads `bytes` as `version` through the three steps and makes it latest. */
async function publish(version: string, bytes: Buffer): Promise<void> {
  const key = idemKey();
  const sha256 = createHash('sha256').update(bytes).digest('hex');
  const r = await h.request({ method: 'POST', url: '/api/installer/upload', body: { version, sha256 }, idempotencyKey: key });
  expect(r.statusCode).toBe(201);
  const put = await fetch(r.json().uploadUrl, { method: 'PUT', body: bytes, headers: { 'x-ms-blob-type': 'BlockBlob' } });
  expect(put.status).toBe(201);
  const fin = await h.request({ method: 'PUT', url: '/api/installer/upload', body: { version }, idempotencyKey: key });
  expect([fin.statusCode, fin.json().latest]).toEqual([200, true]);
}

async function agentAt(machineId: string, agentVersion: string, exePath: string, restarts: string[]): Promise<Agent> {
  const agent = new Agent({
    baseUrl: api,
    siteId: h.siteId,
    enrolmentSecret: await h.enrolmentSecret(),
    machineId,
    agentVersion,
    rootDir: path.join(tmp, machineId),
    heartbeatMs: 0,
    selfUpdate: { exePath, restart: (v) => void restarts.push(v), platform: 'linux' },
  });
  agents.push(agent);
  await agent.enrol();
  return agent;
}

const agentVersionOf = async (machineId: string) =>
  (await h.deps.db.query('SELECT agent_version FROM machines WHERE site_id = $1 AND machine_id = $2', [h.siteId, machineId])).rows[0]
    ?.agent_version;

it('downloads the latest catalog version, verifies it, swaps the executable, restarts and reports the new version', async () => {
  const next = `${major}.1.0`;
  const newExe = Buffer.from(`#!/bin/sh\necho roost agent ${next}\n`);
  await publish(next, newExe);
  const exePath = path.join(tmp, 'roost');
  fs.writeFileSync(exePath, '#!/bin/sh\necho old agent\n', { mode: 0o755 });
  const restarts: string[] = [];
  const agent = await agentAt('self-update-1', `${major}.0.0`, exePath, restarts);

  const updated = new Promise<{ version: string; previousPath: string }>((resolve, reject) => {
    agent.once('self-update', resolve);
    agent.once('self-update-failed', reject);
  });
  await agent.heartbeat();
  const done = await updated;
  expect(done.version).toBe(next);
  expect(fs.readFileSync(exePath).equals(newExe)).toBe(true);
  expect(fs.readFileSync(done.previousPath, 'utf8')).toBe('#!/bin/sh\necho old agent\n');
  expect(fs.statSync(exePath).mode & 0o111).not.toBe(0);
  expect(restarts).toEqual([next]);

  // The restarted binary is the new version: its heartbeat reports it and nothing newer is offered.
  const restarted = await agentAt('self-update-1', next, exePath, restarts);
  const answer = (await restarted.heartbeat()) as { agentUpdate?: unknown };
  expect(answer.agentUpdate).toBeNull();
  expect(await agentVersionOf('self-update-1')).toBe(next);
  expect(restarts).toEqual([next]);
});

it('refuses bytes that changed in storage after finalise: nothing is swapped, nothing restarts', async () => {
  const next = `${major}.2.0`;
  await publish(next, Buffer.from(`#!/bin/sh\necho roost agent ${next}\n`));
  // Tampering behind the catalog's back (storage credentials, not the API): the catalog keeps its checksum.
  await h.deps.blob.put('installers', `agent/${next}/roost-agent`, Buffer.from('#!/bin/sh\necho evil\n'), 'application/octet-stream');
  const exePath = path.join(tmp, 'roost-2');
  fs.writeFileSync(exePath, '#!/bin/sh\necho current\n', { mode: 0o755 });
  const restarts: string[] = [];
  const agent = await agentAt('self-update-2', `${major}.1.0`, exePath, restarts);
  const failed = new Promise<Error>((resolve) => agent.once('self-update-failed', resolve));
  await agent.heartbeat();
  expect((await failed).name).toBe('SelfUpdateRefused');
  expect(fs.readFileSync(exePath, 'utf8')).toBe('#!/bin/sh\necho current\n');
  expect(fs.existsSync(`${exePath}.new`)).toBe(false);
  expect(fs.existsSync(`${exePath}.old`)).toBe(false);
  expect(restarts).toEqual([]);
});

it('refuses an offer that is the running executable itself (a build reporting another version): no swap, no restart, not tried again', async () => {
  const next = `${major}.3.0`;
  const sameBytes = Buffer.from(`#!/bin/sh\necho roost agent built as an older version\n`);
  await publish(next, sameBytes);
  const exePath = path.join(tmp, 'roost-3');
  fs.writeFileSync(exePath, sameBytes, { mode: 0o755 });
  const restarts: string[] = [];
  const agent = await agentAt('self-update-3', `${major}.2.0`, exePath, restarts);
  const failures: Error[] = [];
  agent.on('self-update-failed', (err: Error) => failures.push(err));
  await agent.heartbeat();
  await waitFor('the refusal', () => failures.length === 1);
  expect(failures[0]).toMatchObject({ name: 'SelfUpdateRefused', sameBuild: true });
  expect(failures[0].message).toContain(`npm run build:agent -- --version ${next}`);
  // The next heartbeats offer it again; the agent does not take it again (no loop of swaps and restarts).
  const offered = (await agent.heartbeat()) as { agentUpdate?: { version: string } | null };
  expect(offered.agentUpdate?.version).toBe(next);
  await agent.heartbeat();
  await new Promise((resolve) => setTimeout(resolve, 200));
  expect(failures).toHaveLength(1);
  expect(fs.readFileSync(exePath).equals(sameBytes)).toBe(true);
  expect([fs.existsSync(`${exePath}.new`), fs.existsSync(`${exePath}.old`)]).toEqual([false, false]);
  expect(restarts).toEqual([]);
});
