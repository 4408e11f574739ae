/**
 * Shared fixtures of the deploy, rollout and worker-restart tests: roosts with a real published version
 * (chunk bytes in blob storage), enrolled machine rows, scoped keys, an in-process worker on the
 * harness's task queue, rollouts created directly (custom policy), and `dbFleet`, a stand-in for many
 * agents that answers sync_pull commands through the same tables the agent routes write
 * (roost_target_states, commands), in bulk, so a rollout to thousands of machines stays fast.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Worker } from '@temporalio/worker';
import { quietRuntime } from '../replay/histories';
import { createHarness, type Harness } from '../support/harness';
import { insertKey } from '../support/identity';
import { newId, sha256Hex } from '../../domain/hex';
import type { Scope } from '../../domain/scopes';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName } from '../../storage/blob';
import { withTx } from '../../db/pool';
import { insertRollout } from '../../db/rollouts';
import { DEFAULT_POLICY, type RolloutPolicy, splitWaves } from '../../domain/rollout-policy';
import { rolloutWorkflowId, startRolloutWorkflow } from '../../workflows/client';
import { closeWorkerConnections, createWorker } from '../../worker/worker';

/** A live key of the harness user carrying only `scopes` (test/support/identity.ts insertKey). */
export async function scopedKey(h: Harness, scopes: Scope[]): Promise<string> {
  return (await insertKey(h.deps.db, { uid: h.userId, scopes, primarySiteId: h.siteId, name: 'scoped test key' })).raw;
}

/** Inserts enrolled machine rows (no agent token) for `ids` in the harness site. */
export async function enrolMachineRows(h: Harness, ids: string[], siteId = h.siteId): Promise<void> {
  await h.deps.db.query(
    `INSERT INTO machines (site_id, machine_id, hostname, online) SELECT $1, m, m, true FROM UNNEST($2::text[]) AS t (m)
     ON CONFLICT (site_id, machine_id) DO NOTHING`,
    [siteId, ids],
  );
}

/** `count` machine ids with a random prefix. */
export function machineIds(count: number, prefix = `m-${randomBytes(3).toString('hex')}`): string[] {
  return Array.from({ length: count }, (_, i) => `${prefix}-${String(i).padStart(5, '0')}`);
}

/** A roost with one published version (chunk bytes uploaded to blob storage). */
export interface SeededRoost {
  roostId: string;
  versionId: string;
  versionNumber: number;
  files: Record<string, string>;
}

/** Publishes a version of `files` (path → text) to `roostId` through the API. */
export async function publishFiles(
  h: Harness,
  roostId: string,
  files: Record<string, string>,
): Promise<{ versionId: string; versionNumber: number }> {
  const entries = [];
  for (const [path, text] of Object.entries(files)) {
    const bytes = Buffer.from(text);
    const hash = sha256Hex(bytes);
    await h.deps.blob.put('chunks', chunkBlobName(h.siteId, hash), bytes, 'application/octet-stream');
    entries.push({ path, size: bytes.length, chunks: bytes.length ? [{ hash, size: bytes.length }] : [] });
  }
  const version = { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'rollout-test' }, files: entries };
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    body: { siteId: h.siteId, version },
    idempotencyKey: true,
  });
  if (res.statusCode !== 201) throw new Error(`publish failed: ${res.statusCode} ${res.body}`);
  const body = res.json();
  return { versionId: body.versionId, versionNumber: body.versionNumber };
}

/** Creates a roost (targets, extract path) and publishes one version of `files`. */
export async function seedRoost(
  h: Harness,
  opts: { targets?: string[]; extractPath?: string; files?: Record<string, string> } = {},
): Promise<SeededRoost> {
  const res = await h.request({
    method: 'POST',
    url: '/api/roosts',
    body: {
      siteId: h.siteId,
      name: `rollout test ${randomBytes(3).toString('hex')}`,
      targets: opts.targets ?? [],
      extractPath: opts.extractPath ?? 'apps/test',
    },
  });
  if (res.statusCode !== 201) throw new Error(`roost create failed: ${res.statusCode} ${res.body}`);
  const roostId = res.json().roostId as string;
  const files = opts.files ?? { 'app.txt': `hello ${randomBytes(4).toString('hex')}\n`, 'conf/settings.json': '{"a":1}\n' };
  const v = await publishFiles(h, roostId, files);
  return { roostId, ...v, files };
}

export { quietRuntime };

/** A worker on the harness's task queue, running until `stop()`. */
export interface TestWorker {
  worker: Worker;
  stop(): Promise<void>;
}

/** Starts an in-process worker for the harness (unique task queue) with a zero shutdown grace time. */
export async function startTestWorker(h: Harness, identity?: string): Promise<TestWorker> {
  quietRuntime();
  const worker = await createWorker(h.deps.cfg, { cfg: h.deps.cfg, db: h.deps.db, blob: h.deps.blob }, { shutdownGraceTime: 0, identity });
  const running = worker.run();
  return {
    worker,
    async stop() {
      if (worker.getState() === 'RUNNING') worker.shutdown();
      await running;
    },
  };
}

/** What `insertRolloutRow` and `createRollout` take: the rollout's version, machines and policy. */
export interface TestRollout {
  roostId: string;
  versionId: string;
  machines: string[];
  policy?: Partial<RolloutPolicy>;
  scheduleAt?: Date | null;
  extractRoot?: string;
  /** Default: a new `rol_` id. */
  rolloutId?: string;
  /** Default: splitWaves of `machines`. */
  waves?: { canary: string[]; fleet: string[] };
}

/** Inserts a rollout row directly (bypassing the route) with a custom policy; starts no workflow. */
export async function insertRolloutRow(
  h: Harness,
  r: TestRollout,
): Promise<{ rolloutId: string; workflowId: string; canary: string[]; fleet: string[] }> {
  const rolloutId = r.rolloutId ?? newId('rol');
  const waves = r.waves ?? splitWaves(rolloutId, r.machines);
  const workflowId = rolloutWorkflowId(h.siteId, r.roostId, r.versionId);
  await withTx(h.deps.db, (tx) =>
    insertRollout(tx, {
      siteId: h.siteId,
      rolloutId,
      roostId: r.roostId,
      versionId: r.versionId,
      ...waves,
      extractRoot: r.extractRoot ?? 'apps/test',
      policy: { ...DEFAULT_POLICY, ...r.policy },
      scheduleAt: r.scheduleAt ?? null,
      workflowId,
      createdBy: h.userId,
    }),
  );
  return { rolloutId, workflowId, ...waves };
}

/** Creates a rollout row directly (insertRolloutRow) and starts its workflow. */
export async function createRollout(
  h: Harness,
  r: TestRollout,
): Promise<{ rolloutId: string; workflowId: string; canary: string[]; fleet: string[] }> {
  const created = await insertRolloutRow(h, r);
  await startRolloutWorkflow(h.deps.temporal, h.deps.cfg, {
    siteId: h.siteId,
    roostId: r.roostId,
    versionId: r.versionId,
    rolloutId: created.rolloutId,
  });
  return created;
}

/** Deploys through the route (current version, roost targets, `body` extras); throws unless 202. */
export async function deployRoute(
  h: Harness,
  roostId: string,
  body: Record<string, unknown> = {},
): Promise<{ rolloutId: string; versionId: string; workflowId: string; canary: string[]; fleet: string[] }> {
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/deploy`,
    body: { siteId: h.siteId, ...body },
    idempotencyKey: true,
  });
  if (res.statusCode !== 202) throw new Error(`deploy failed: ${res.statusCode} ${res.body}`);
  const r = res.json();
  return {
    rolloutId: r.rolloutId,
    versionId: r.versionId,
    workflowId: rolloutWorkflowId(h.siteId, roostId, r.versionId),
    canary: r.canary,
    fleet: r.fleet,
  };
}

/** What a stand-in agent does with one sync_pull attempt. */
export type Outcome = 'commit' | 'fail' | 'ignore';

/**
 * Answers the site's pending sync_pull commands every `intervalMs`, in bulk: `commit` writes target state
 * committed for the command's version and completes the command; `fail` writes target state failed and
 * fails the command; `ignore` marks it delivered and never answers (a machine that went silent).
 */
export function dbFleet(
  h: Harness,
  decide: (machineId: string, attempt: number) => Outcome = () => 'commit',
  intervalMs = 100,
): { stop(): Promise<void> } {
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const { rows } = await h.deps.db.query<{
        machine_id: string;
        command_id: string;
        params: { roostId: string; versionId: string; attempt: number };
      }>(
        `UPDATE commands SET delivered_at = now() WHERE site_id = $1 AND type = 'sync_pull' AND status = 'pending' AND delivered_at IS NULL
         RETURNING machine_id, command_id, params`,
        [h.siteId],
      );
      const groups: Record<'commit' | 'fail', typeof rows> = { commit: [], fail: [] };
      for (const r of rows) {
        const o = decide(r.machine_id, Number(r.params.attempt));
        if (o !== 'ignore') groups[o].push(r);
      }
      for (const [outcome, list] of Object.entries(groups) as ['commit' | 'fail', typeof rows][]) {
        if (list.length === 0) continue;
        const status = outcome === 'commit' ? 'committed' : 'failed';
        await h.deps.db.query(
          `INSERT INTO roost_target_states (site_id, machine_id, roost_id, reported_version_id, status, error, updated_at)
           SELECT $1, t.m, t.r, t.v, $5, $6, now() FROM UNNEST($2::text[], $3::text[], $4::text[]) AS t (m, r, v)
           ON CONFLICT (site_id, machine_id, roost_id) DO UPDATE SET reported_version_id = excluded.reported_version_id,
             status = excluded.status, error = excluded.error, updated_at = now()`,
          [
            h.siteId,
            list.map((r) => r.machine_id),
            list.map((r) => r.params.roostId),
            list.map((r) => r.params.versionId),
            status,
            outcome === 'fail' ? 'simulated failure' : null,
          ],
        );
        await h.deps.db.query(
          `UPDATE commands AS c SET status = $4, result = $5, error = $6, completed_at = now(), updated_at = now()
             FROM UNNEST($2::text[], $3::text[]) AS t (m, id)
            WHERE c.site_id = $1 AND c.machine_id = t.m AND c.command_id = t.id AND c.completed_at IS NULL`,
          [
            h.siteId,
            list.map((r) => r.machine_id),
            list.map((r) => r.command_id),
            outcome === 'commit' ? 'completed' : 'failed',
            outcome === 'commit' ? 'success' : null,
            outcome === 'fail' ? 'simulated failure' : null,
          ],
        );
      }
      await new Promise((r) => setTimeout(r, intervalMs));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
    },
  };
}

/** Per-status machine counts of a rollout. */
export async function machineStatuses(h: Harness, rolloutId: string): Promise<Record<string, number>> {
  const { rows } = await h.deps.db.query<{ status: string; n: number }>(
    'SELECT status, CAST(count(*) AS INT) AS n FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 GROUP BY status',
    [h.siteId, rolloutId],
  );
  return Object.fromEntries(rows.map((r) => [r.status, Number(r.n)]));
}

/** The rollout's deployment.* events, oldest first. */
export async function rolloutEvents(
  h: Harness,
  rolloutId: string,
): Promise<{ type: string; data: Record<string, unknown>; occurred_at: Date }[]> {
  const { rows } = await h.deps.db.query(
    `SELECT type, data, occurred_at FROM events WHERE site_id = $1 AND type LIKE 'deployment.%' AND data->>'rolloutId' = $2 ORDER BY occurred_at, type`,
    [h.siteId, rolloutId],
  );
  return rows;
}

/** Terminates workflows (best effort) so a test file leaves nothing running on the dev server. */
export async function terminateAll(h: Harness, workflowIds: Iterable<string>): Promise<void> {
  await Promise.all(
    [...new Set(workflowIds)].map((id) =>
      h.deps.temporal.workflow
        .getHandle(id)
        .terminate('test cleanup')
        .catch(() => undefined),
    ),
  );
}

/** What the rollout test files share: a harness, a worker on its task queue and a temporary folder. */
export interface RolloutSuite {
  h: Harness;
  w: TestWorker;
  tmpRoot: string;
}

/** Opens a rollout test file's suite (call in beforeAll); `name` labels the temporary folder. */
export async function openRolloutSuite(name: string): Promise<RolloutSuite> {
  const h = await createHarness();
  const w = await startTestWorker(h);
  const tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), `roost-${name}-test-`));
  return { h, w, tmpRoot };
}

/**
 * Closes what `openRolloutSuite` opened (call in afterAll): terminates `workflowIds`, stops the worker,
 * closes the worker connections and the harness (dropping the agents' keep-alive sockets, which would
 * hold close() for a minute) and removes the temporary folder. Tolerates a suite that failed to open.
 */
export async function closeRolloutSuite(s: Partial<RolloutSuite>, workflowIds: Iterable<string> = []): Promise<void> {
  if (s.h) await terminateAll(s.h, workflowIds);
  await s.w?.stop();
  await closeWorkerConnections();
  s.h?.app.server.closeAllConnections();
  await s.h?.close();
  if (s.tmpRoot) await fs.rm(s.tmpRoot, { recursive: true, force: true });
}
