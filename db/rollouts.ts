/**
 * Rollouts repository (SPEC.md "Rollout", "roost deploy"; DESIGN.md "Temporal"): the `rollouts` row, its
 * per-machine `rollout_machines` rows, the `sync_pull` commands a wave queues, and the set-based
 * reconciliation that turns agent reports (`roost_target_states`, `commands`) into per-machine outcomes.
 *
 * Everything here is site-scoped (`site_id` in every statement), idempotent (deterministic command and
 * event ids, `ON CONFLICT DO NOTHING`, status guards) and set-based: a wave of 10,000 machines costs a few
 * statements per batch of `DISPATCH_BATCH` machines, never one round trip per machine.
 *
 * Per-machine status (`rollout_machines.status`): `pending` (not dispatched yet, or waiting out the retry
 * backoff after a failed attempt; `attempts` tells which) → `dispatched` → `succeeded` | `failed`
 * (terminal: retry budget exhausted or wave timeout) ; `cancelled` when the rollout ended before the
 * machine's wave ran. Rollout stage: `canary` (created; canary wave) → `started` (fleet wave) →
 * `completed` | `failed` (docs/decisions/rollout-stages.md).
 */
import { createHash } from 'node:crypto';
import type { Pool } from 'pg';
import { withTx, Queryable } from './pool';
import { recordEvent } from './events';

export type RolloutStage = 'canary' | 'started' | 'completed' | 'failed';
export type Wave = 'canary' | 'fleet';

export const TERMINAL_STAGES: readonly RolloutStage[] = ['completed', 'failed'];

/** Tunables stored with each rollout (`rollouts.policy`); missing keys take `DEFAULT_POLICY`. */
export interface RolloutPolicy {
  /** How long a wave may run before unfinished machines fail with reason `timeout` (ms). */
  waveTimeoutMs: number;
  /** Retries per machine after its first attempt (so at most 1 + retries sync_pull commands). */
  retries: number;
  /** Backoff before the first retry (ms); doubles for each further retry. */
  retryBackoffMs: number;
  /** How often the wave watcher polls the database (ms). */
  pollIntervalMs: number;
}

export const DEFAULT_POLICY: RolloutPolicy = {
  waveTimeoutMs: 30 * 60 * 1000,
  retries: 2,
  retryBackoffMs: 10_000,
  pollIntervalMs: 2_000,
};

/** Canary wave size: ceil(CANARY_PERCENT % of targets), at least 1, at most CANARY_MAX. */
export const CANARY_PERCENT = 10;
export const CANARY_MAX = 100;
/** Machines dispatched per transaction. */
export const DISPATCH_BATCH = 500;
/** Most machines one deploy may target (SPEC.md validation of `machines`). */
export const MAX_ROLLOUT_MACHINES = 10_000;

/** A rollout as stored. `canary`/`fleet` are machine ids in wave order. */
export interface Rollout {
  siteId: string;
  rolloutId: string;
  roostId: string;
  versionId: string;
  stage: RolloutStage;
  active: boolean;
  canary: string[];
  fleet: string[];
  extractRoot: string;
  policy: RolloutPolicy;
  scheduleAt: Date | null;
  workflowId: string;
  abortReason: string | null;
  succeeded: number;
  failed: number;
  createdAt: Date;
  createdBy: string;
  completedAt: Date | null;
}

interface RolloutRow {
  site_id: string;
  rollout_id: string;
  roost_id: string;
  version_id: string;
  stage: RolloutStage;
  active: boolean;
  canary: string[];
  fleet: string[];
  extract_root: string;
  policy: Partial<RolloutPolicy>;
  schedule_at: Date | null;
  workflow_id: string;
  abort_reason: string | null;
  succeeded: number;
  failed: number;
  created_at: Date;
  created_by: string;
  completed_at: Date | null;
}

const ROLLOUT_COLUMNS = `site_id, rollout_id, roost_id, version_id, stage, active, canary, fleet, extract_root, policy, schedule_at,
  workflow_id, abort_reason, succeeded, failed, created_at, created_by, completed_at`;

/** Policy with defaults filled in (unknown keys dropped). */
export function resolvePolicy(stored: Partial<RolloutPolicy> | null | undefined): RolloutPolicy {
  const p = { ...DEFAULT_POLICY };
  for (const k of Object.keys(DEFAULT_POLICY) as (keyof RolloutPolicy)[]) {
    const v = stored?.[k];
    if (typeof v === 'number' && Number.isFinite(v) && v >= 0) p[k] = v;
  }
  return p;
}

function toRollout(r: RolloutRow): Rollout {
  return {
    siteId: r.site_id,
    rolloutId: r.rollout_id,
    roostId: r.roost_id,
    versionId: r.version_id,
    stage: r.stage,
    active: r.active,
    canary: r.canary,
    fleet: r.fleet,
    extractRoot: r.extract_root,
    policy: resolvePolicy(r.policy),
    scheduleAt: r.schedule_at,
    workflowId: r.workflow_id,
    abortReason: r.abort_reason,
    succeeded: r.succeeded,
    failed: r.failed,
    createdAt: r.created_at,
    createdBy: r.created_by,
    completedAt: r.completed_at,
  };
}

/**
 * Splits targets into the canary and fleet waves, deterministically: machines are ordered by
 * SHA-256(rolloutId + ':' + machineId) (ties impossible in practice; machine id breaks them) and the first
 * ceil(10 %) (min 1, max CANARY_MAX) form the canary. The fleet keeps the caller's order.
 * Pure; `machines` must be distinct. docs/decisions/canary-selection.md.
 */
export function splitWaves(rolloutId: string, machines: readonly string[]): { canary: string[]; fleet: string[] } {
  if (machines.length === 0) return { canary: [], fleet: [] };
  const size = Math.min(CANARY_MAX, Math.max(1, Math.ceil((machines.length * CANARY_PERCENT) / 100)));
  const keyed = machines.map((m) => ({ m, k: createHash('sha256').update(`${rolloutId}:${m}`).digest('hex') }));
  keyed.sort((a, b) => (a.k < b.k ? -1 : a.k > b.k ? 1 : a.m < b.m ? -1 : a.m > b.m ? 1 : 0));
  const canarySet = new Set(keyed.slice(0, size).map((x) => x.m));
  return { canary: keyed.slice(0, size).map((x) => x.m), fleet: machines.filter((m) => !canarySet.has(m)) };
}

/** Deterministic id of the sync_pull command for (rollout, machine, attempt): `cmd_` + 24 hex. */
export function syncPullCommandId(rolloutId: string, machineId: string, attempt: number): string {
  return `cmd_${createHash('sha256').update(`sync_pull:${rolloutId}:${machineId}:${attempt}`).digest('hex').slice(0, 24)}`;
}

/** Deterministic id of a rollout's lifecycle event, so a retried activity never records it twice. */
export function rolloutEventId(rolloutId: string, type: string): string {
  return `evt_${createHash('sha256').update(`${type}:${rolloutId}`).digest('hex').slice(0, 24)}`;
}

/** One rollout by id, or null. */
export async function getRollout(q: Queryable, siteId: string, rolloutId: string): Promise<Rollout | null> {
  const { rows } = await q.query<RolloutRow>(`SELECT ${ROLLOUT_COLUMNS} FROM rollouts WHERE site_id = $1 AND rollout_id = $2`, [siteId, rolloutId]);
  return rows[0] ? toRollout(rows[0]) : null;
}

/** The non-terminal rollout of (site, roost, version), or null (the `rollouts_one_active` index allows one). */
export async function findActiveRollout(q: Queryable, siteId: string, roostId: string, versionId: string): Promise<Rollout | null> {
  const { rows } = await q.query<RolloutRow>(
    `SELECT ${ROLLOUT_COLUMNS} FROM rollouts WHERE site_id = $1 AND roost_id = $2 AND version_id = $3 AND active`,
    [siteId, roostId, versionId],
  );
  return rows[0] ? toRollout(rows[0]) : null;
}

/** The ids of `machineIds` that are not enrolled machines of the site (input order kept). */
export async function unknownMachines(q: Queryable, siteId: string, machineIds: readonly string[]): Promise<string[]> {
  if (machineIds.length === 0) return [];
  const { rows } = await q.query<{ machine_id: string }>('SELECT machine_id FROM machines WHERE site_id = $1 AND machine_id = ANY($2::text[])', [
    siteId,
    machineIds,
  ]);
  const known = new Set(rows.map((r) => r.machine_id));
  return machineIds.filter((m) => !known.has(m));
}

/** A rollout to insert. */
export interface NewRollout {
  siteId: string;
  rolloutId: string;
  roostId: string;
  versionId: string;
  canary: string[];
  fleet: string[];
  extractRoot: string;
  policy: RolloutPolicy;
  scheduleAt: Date | null;
  workflowId: string;
  createdBy: string;
}

/**
 * Inserts the rollout (stage `canary`, active) and one `rollout_machines` row per machine (bulk UNNEST),
 * inside the caller's transaction. Throws the unique violation (23505) of `rollouts_one_active` when a
 * non-terminal rollout of the same version exists.
 */
export async function insertRollout(tx: Queryable, r: NewRollout): Promise<void> {
  await tx.query(
    `INSERT INTO rollouts (site_id, rollout_id, roost_id, version_id, stage, active, canary, fleet, extract_root, policy, schedule_at, workflow_id, created_by)
     VALUES ($1, $2, $3, $4, 'canary', true, $5, $6, $7, $8, $9, $10, $11)`,
    [r.siteId, r.rolloutId, r.roostId, r.versionId, JSON.stringify(r.canary), JSON.stringify(r.fleet), r.extractRoot, JSON.stringify(r.policy), r.scheduleAt, r.workflowId, r.createdBy],
  );
  const machines = [...r.canary, ...r.fleet];
  const waves = [...r.canary.map(() => 'canary'), ...r.fleet.map(() => 'fleet')];
  await tx.query(
    `INSERT INTO rollout_machines (site_id, rollout_id, machine_id, wave)
     SELECT $1, $2, t.machine_id, t.wave FROM UNNEST($3::text[], $4::text[]) AS t (machine_id, wave)`,
    [r.siteId, r.rolloutId, machines, waves],
  );
}

/**
 * Ends a rollout whose workflow could not be started: stage `failed`, inactive, abort reason, machines
 * cancelled. No event (the rollout never began). No-op when already terminal.
 */
export async function failUnstartedRollout(pool: Pool, siteId: string, rolloutId: string, abortReason: string): Promise<void> {
  await withTx(pool, async (tx) => {
    const upd = await tx.query(
      `UPDATE rollouts SET stage = 'failed', active = false, abort_reason = $3, completed_at = now(), updated_at = now()
        WHERE site_id = $1 AND rollout_id = $2 AND active`,
      [siteId, rolloutId, abortReason],
    );
    if (upd.rowCount === 0) return;
    await cancelOpenMachines(tx, siteId, rolloutId);
  });
}

/**
 * Cancels the unfinished machines of a rollout that is ending: their sync_pull commands still `pending`
 * are closed as cancelled (an agent that is mid-sync sees its command closed; its later reports change
 * nothing) and the machines move to `cancelled`.
 */
async function cancelOpenMachines(tx: Queryable, siteId: string, rolloutId: string): Promise<void> {
  await tx.query(
    `UPDATE commands AS c SET status = 'cancelled', result = 'cancelled', completed_at = now(), updated_at = now()
       FROM rollout_machines AS rm
      WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.status = 'dispatched'
        AND c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.status = 'pending'`,
    [siteId, rolloutId],
  );
  await tx.query(
    `UPDATE rollout_machines SET status = 'cancelled', updated_at = now() WHERE site_id = $1 AND rollout_id = $2 AND status IN ('pending', 'dispatched')`,
    [siteId, rolloutId],
  );
}

/**
 * Records `deployment.started` (rolloutId, roostId, siteId, stage) once per rollout (deterministic event
 * id). Returns false when the rollout is missing or already terminal (nothing recorded).
 */
export async function recordRolloutStarted(pool: Pool, siteId: string, rolloutId: string): Promise<boolean> {
  return withTx(pool, async (tx) => {
    const r = await getRollout(tx, siteId, rolloutId);
    if (!r || !r.active) return false;
    await tx.query('UPDATE rollouts SET updated_at = now() WHERE site_id = $1 AND rollout_id = $2', [siteId, rolloutId]);
    await recordEvent(tx, siteId, 'deployment.started', { rolloutId, roostId: r.roostId, siteId, stage: r.stage }, rolloutEventId(rolloutId, 'deployment.started'));
    return true;
  });
}

/** Per-machine outcome counts of a rollout or of one wave. */
export interface WaveCounts {
  total: number;
  pending: number;
  dispatched: number;
  succeeded: number;
  failed: number;
  cancelled: number;
  /** Of `failed`, how many failed because the wave timed out. */
  timedOut: number;
}

/** Counts machines by status (one wave, or the whole rollout when `wave` is null). */
export async function waveCounts(q: Queryable, siteId: string, rolloutId: string, wave: Wave | null): Promise<WaveCounts> {
  const { rows } = await q.query<{ status: string; n: number; timed_out: number }>(
    `SELECT status, CAST(count(*) AS INT) AS n, CAST(sum(CASE WHEN last_error = 'timeout' THEN 1 ELSE 0 END) AS INT) AS timed_out
       FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 AND ($3::text IS NULL OR wave = $3) GROUP BY status`,
    [siteId, rolloutId, wave],
  );
  const c: WaveCounts = { total: 0, pending: 0, dispatched: 0, succeeded: 0, failed: 0, cancelled: 0, timedOut: 0 };
  for (const r of rows) {
    const n = Number(r.n);
    c.total += n;
    if (r.status in c) (c as unknown as Record<string, number>)[r.status] += n;
    if (r.status === 'failed') c.timedOut += Number(r.timed_out);
  }
  return c;
}

/** Context a wave operation needs (from the rollout row). */
export interface WaveTarget {
  siteId: string;
  rolloutId: string;
  roostId: string;
  versionId: string;
  versionNumber: number;
  extractRoot: string;
  createdBy: string;
  policy: RolloutPolicy;
}

/** Loads the rollout plus the version number its sync_pull commands carry. Null when either is gone. */
export async function getWaveTarget(q: Queryable, siteId: string, rolloutId: string): Promise<(WaveTarget & { rollout: Rollout }) | null> {
  const rollout = await getRollout(q, siteId, rolloutId);
  if (!rollout) return null;
  const { rows } = await q.query<{ version_number: number }>(
    'SELECT version_number FROM roost_versions WHERE site_id = $1 AND roost_id = $2 AND version_id = $3',
    [siteId, rollout.roostId, rollout.versionId],
  );
  if (!rows[0]) return null;
  return {
    siteId,
    rolloutId,
    roostId: rollout.roostId,
    versionId: rollout.versionId,
    versionNumber: rows[0].version_number,
    extractRoot: rollout.extractRoot,
    createdBy: rollout.createdBy,
    policy: rollout.policy,
    rollout,
  };
}

/**
 * Queues `sync_pull` commands (params per docs/agent-protocol.md) for the wave's machines that are
 * `pending` and due: never dispatched, or failed earlier and past their backoff
 * (retryBackoffMs · 2^(attempts−1) after `finished_at`). Works in batches of DISPATCH_BATCH machines, one
 * transaction each: insert commands (deterministic ids, ON CONFLICT DO NOTHING) and mark the machines
 * `dispatched` with attempts + 1. Returns how many machines were dispatched. Idempotent.
 * @param commandTtlMs lifetime of each command (`expires_at`).
 * @param onBatch called after each batch (activities heartbeat there).
 */
export async function dispatchDue(pool: Pool, t: WaveTarget, wave: Wave, commandTtlMs: number, onBatch?: (dispatchedSoFar: number) => void): Promise<number> {
  let total = 0;
  let after = '';
  for (;;) {
    const n = await withTx(pool, async (tx) => {
      const { rows } = await tx.query<{ machine_id: string; attempts: number }>(
        `SELECT machine_id, attempts FROM rollout_machines
          WHERE site_id = $1 AND rollout_id = $2 AND wave = $3 AND status = 'pending' AND machine_id > $4
            AND (attempts = 0 OR finished_at IS NULL
                 OR finished_at + ($5::float8 * power(2::float8, (attempts - 1)::float8)) * INTERVAL '1 millisecond' <= now())
          ORDER BY machine_id LIMIT $6`,
        [t.siteId, t.rolloutId, wave, after, t.policy.retryBackoffMs, DISPATCH_BATCH],
      );
      if (rows.length === 0) return { count: 0, last: after };
      const machineIds = rows.map((r) => r.machine_id);
      const attempts = rows.map((r) => r.attempts + 1);
      const commandIds = rows.map((r, i) => syncPullCommandId(t.rolloutId, r.machine_id, attempts[i]));
      await tx.query(
        `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, rollout_id, created_by, expires_at)
         SELECT $1, u.machine_id, u.command_id, 'sync_pull', 'pending',
                jsonb_build_object('roostId', $2::text, 'versionId', $3::text, 'versionNumber', $4::int, 'rolloutId', $5::text,
                                   'extractRoot', $6::text, 'attempt', u.attempt),
                $5, $7, now() + $8::float8 * INTERVAL '1 millisecond'
           FROM UNNEST($9::text[], $10::text[], $11::int[]) AS u (machine_id, command_id, attempt)
         ON CONFLICT (site_id, machine_id, command_id) DO NOTHING`,
        [t.siteId, t.roostId, t.versionId, t.versionNumber, t.rolloutId, t.extractRoot, t.createdBy, commandTtlMs, machineIds, commandIds, attempts],
      );
      const upd = await tx.query(
        `UPDATE rollout_machines AS rm
            SET status = 'dispatched', attempts = u.attempt, command_id = u.command_id, dispatched_at = now(), updated_at = now()
           FROM UNNEST($3::text[], $4::text[], $5::int[]) AS u (machine_id, command_id, attempt)
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.machine_id = u.machine_id AND rm.status = 'pending'`,
        [t.siteId, t.rolloutId, machineIds, commandIds, attempts],
      );
      return { count: upd.rowCount ?? 0, last: machineIds[machineIds.length - 1] };
    });
    total += n.count;
    if (n.last === after) return total;
    onBatch?.(total);
    after = n.last;
  }
}

/**
 * One reconciliation pass over a wave, in one transaction, from agent reports:
 * - a `dispatched` machine succeeded when its target state reports the rollout's version `committed`
 *   after the dispatch (or its command completed and the state shows the version committed);
 * - it failed when its target state reports the version `failed`/`cancelled` after the dispatch, or its
 *   command failed or was cancelled: back to `pending` for a retry while attempts ≤ retries, else `failed`;
 * - at or after `deadline` every unfinished machine fails with `last_error = 'timeout'` and its still
 *   pending command is cancelled.
 * Monotonic and idempotent. Returns the wave's counts after the pass.
 */
export async function reconcileWave(pool: Pool, t: WaveTarget, wave: Wave, deadline: Date): Promise<WaveCounts> {
  return withTx(pool, async (tx) => {
    const base = [t.siteId, t.rolloutId, wave, t.roostId, t.versionId];
    await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = 'succeeded', finished_at = now(), updated_at = now(), bytes_fetched = ts.bytes_fetched, last_error = NULL
         FROM roost_target_states AS ts
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = $3 AND rm.status = 'dispatched'
          AND ts.site_id = rm.site_id AND ts.machine_id = rm.machine_id AND ts.roost_id = $4
          AND ts.reported_version_id = $5 AND ts.status = 'committed'
          AND (ts.updated_at >= rm.dispatched_at
               OR EXISTS (SELECT 1 FROM commands AS c
                           WHERE c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.status = 'completed'))`,
      base,
    );
    await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = CASE WHEN rm.attempts <= $6 THEN 'pending' ELSE 'failed' END,
              last_error = substr(COALESCE(f.error, 'sync failed'), 1, 500), finished_at = now(), updated_at = now()
         FROM (SELECT rm2.machine_id,
                      COALESCE(CASE WHEN ts.reported_version_id = $5 AND ts.status IN ('failed', 'cancelled') THEN COALESCE(ts.error, 'sync ' || ts.status) END,
                               c.error, CASE WHEN c.status IS NOT NULL THEN 'command ' || c.status END) AS error
                 FROM rollout_machines AS rm2
                 LEFT JOIN roost_target_states AS ts ON ts.site_id = rm2.site_id AND ts.machine_id = rm2.machine_id AND ts.roost_id = $4
                 LEFT JOIN commands AS c ON c.site_id = rm2.site_id AND c.machine_id = rm2.machine_id AND c.command_id = rm2.command_id
                WHERE rm2.site_id = $1 AND rm2.rollout_id = $2 AND rm2.wave = $3 AND rm2.status = 'dispatched'
                  AND ((ts.reported_version_id = $5 AND ts.status IN ('failed', 'cancelled') AND ts.updated_at >= rm2.dispatched_at)
                       OR c.status IN ('failed', 'cancelled'))) AS f
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.machine_id = f.machine_id AND rm.status = 'dispatched'`,
      [...base, t.policy.retries],
    );
    const due = await tx.query<{ due: boolean }>('SELECT now() >= $1::timestamptz AS due', [deadline]);
    if (due.rows[0].due) {
      await tx.query(
        `UPDATE commands AS c SET status = 'cancelled', result = 'cancelled', completed_at = now(), updated_at = now()
           FROM rollout_machines AS rm
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = $3 AND rm.status = 'dispatched'
            AND c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.status = 'pending'`,
        [t.siteId, t.rolloutId, wave],
      );
      await tx.query(
        `UPDATE rollout_machines SET status = 'failed', last_error = 'timeout', finished_at = now(), updated_at = now()
          WHERE site_id = $1 AND rollout_id = $2 AND wave = $3 AND status IN ('pending', 'dispatched')`,
        [t.siteId, t.rolloutId, wave],
      );
    }
    return waveCounts(tx, t.siteId, t.rolloutId, wave);
  });
}

/** The database clock plus `ms`, as a Date (wave deadlines are measured on the database clock). */
export async function dbNowPlus(q: Queryable, ms: number): Promise<Date> {
  const { rows } = await q.query<{ at: Date }>(`SELECT now() + $1::float8 * INTERVAL '1 millisecond' AS at`, [ms]);
  return rows[0].at;
}

/** Result of a stage change. */
export interface StageChange {
  stage: RolloutStage;
  /** False when the rollout was already terminal (nothing changed). */
  changed: boolean;
  succeeded: number;
  failed: number;
  abortReason: string | null;
}

/**
 * Moves a rollout to `stage` in one transaction with its event (outbox):
 * - `started`: stage only (deployment.started was recorded when the rollout began);
 * - `completed` / `failed`: inactive, completed_at, succeeded/failed counts from rollout_machines,
 *   unfinished machines cancelled, and `deployment.completed` (rolloutId, roostId, siteId, stage,
 *   succeeded, failed) or `deployment.failed` (… plus abortReason).
 * A terminal rollout never changes again (the stored outcome is returned with changed false).
 * Returns null when the rollout does not exist.
 */
export async function setRolloutStage(pool: Pool, siteId: string, rolloutId: string, stage: RolloutStage, abortReason: string | null = null): Promise<StageChange | null> {
  return withTx(pool, async (tx) => {
    const r = await getRollout(tx, siteId, rolloutId);
    if (!r) return null;
    if (!r.active) return { stage: r.stage, changed: false, succeeded: r.succeeded, failed: r.failed, abortReason: r.abortReason };
    if (stage === 'canary' || stage === 'started') {
      await tx.query('UPDATE rollouts SET stage = $3, updated_at = now() WHERE site_id = $1 AND rollout_id = $2', [siteId, rolloutId, stage]);
      return { stage, changed: r.stage !== stage, succeeded: r.succeeded, failed: r.failed, abortReason: null };
    }
    await cancelOpenMachines(tx, siteId, rolloutId);
    const c = await waveCounts(tx, siteId, rolloutId, null);
    const reason = stage === 'failed' ? abortReason ?? 'failed' : null;
    await tx.query(
      `UPDATE rollouts SET stage = $3, active = false, abort_reason = $4, succeeded = $5, failed = $6, completed_at = now(), updated_at = now()
        WHERE site_id = $1 AND rollout_id = $2`,
      [siteId, rolloutId, stage, reason, c.succeeded, c.failed],
    );
    const data: Record<string, unknown> = { rolloutId, roostId: r.roostId, siteId, stage };
    if (stage === 'failed') data.abortReason = reason;
    data.succeeded = c.succeeded;
    data.failed = c.failed;
    const type = stage === 'completed' ? 'deployment.completed' : 'deployment.failed';
    await recordEvent(tx, siteId, type, data, rolloutEventId(rolloutId, type));
    return { stage, changed: true, succeeded: c.succeeded, failed: c.failed, abortReason: reason };
  });
}
