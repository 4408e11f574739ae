/**
 * Rollouts repository (`POST /api/roosts/{roostId}/deploy` and the `/api/roosts/{roostId}/rollouts` routes;
 * docs/decisions/rollout-stages.md, docs/decisions/rollout-machine-outcomes.md): the `rollouts` row, its
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
 * machine's wave ran; with staged activation `dispatched` → `staged` → `activating` → `succeeded`.
 * Rollout stage: `canary` (created; canary wave) → `started` (later waves) → `completed` | `failed`
 * (docs/decisions/rollout-stages.md); the control `state` beside it (running, paused, …) is described in
 * docs/decisions/rollout-control.md. The types are domain/rollout.ts's; the policy is
 * domain/rollout-policy.ts's `RolloutPolicy`.
 */
import { createHash } from 'node:crypto';
import type { Pool } from 'pg';
import { withTx, type Queryable } from './pool';
import { recordEvent } from './events';
import { activateCommandId, dispatchActivation, DEFAULT_ACTIVATION_TTL_MS } from './activation';
import {
  type HistoryEntry,
  type Rollout,
  type RolloutMachine,
  type RolloutMachineStatus,
  type RolloutStage,
  type RolloutState,
  type Wave,
  type WaveCounts,
  type WavePlan,
  emptyCounts,
  rollbackWorkflowId,
  sumCounts,
} from '../domain/rollout';
import { type RolloutPolicy, resolvePolicy, rollbackPolicy, waveNames } from '../domain/rollout-policy';

/** Machines dispatched per transaction. */
export const DISPATCH_BATCH = 500;

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
  state: RolloutState | null;
  state_seq: number;
  history: HistoryEntry[];
  waves: WavePlan[] | null;
  current_wave: number | null;
  rollback_of: string | null;
  rolled_back_by: string | null;
  updated_at: Date;
}

const ROLLOUT_COLUMNS = `site_id, rollout_id, roost_id, version_id, stage, active, canary, fleet, extract_root, policy, schedule_at,
  workflow_id, abort_reason, succeeded, failed, created_at, created_by, completed_at, state, state_seq, history, waves, current_wave,
  rollback_of, rolled_back_by, updated_at`;

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
    state: r.state ?? (r.active ? 'running' : r.stage === 'completed' ? 'completed' : 'failed'),
    stateSeq: Number(r.state_seq ?? 0),
    history: r.history ?? [],
    waves: r.waves ?? [
      { name: 'canary', size: r.canary.length },
      { name: 'fleet', size: r.fleet.length },
    ],
    currentWave: r.current_wave,
    rollbackOf: r.rollback_of,
    rolledBackBy: r.rolled_back_by,
    updatedAt: r.updated_at,
  };
}

/** Deterministic id of the sync_pull command for (rollout, machine, attempt): `cmd_` + 24 hex. */
export function syncPullCommandId(rolloutId: string, machineId: string, attempt: number): string {
  return `cmd_${createHash('sha256').update(`sync_pull:${rolloutId}:${machineId}:${attempt}`).digest('hex').slice(0, 24)}`;
}

/** Deterministic id of a rollout's lifecycle event, so a retried activity never records it twice. */
export function rolloutEventId(rolloutId: string, type: string): string {
  return `evt_${createHash('sha256').update(`${type}:${rolloutId}`).digest('hex').slice(0, 24)}`;
}

/** One rollout by id, or null; `lock`: locked for the rest of transaction `q` (SELECT … FOR UPDATE). */
export async function getRollout(q: Queryable, siteId: string, rolloutId: string, opts: { lock?: boolean } = {}): Promise<Rollout | null> {
  const { rows } = await q.query<RolloutRow>(
    `SELECT ${ROLLOUT_COLUMNS} FROM rollouts WHERE site_id = $1 AND rollout_id = $2${opts.lock ? ' FOR UPDATE' : ''}`,
    [siteId, rolloutId],
  );
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

/** The non-terminal rollouts of a roost (any version), oldest first: what deleting the roost aborts. */
export async function activeRolloutsOfRoost(q: Queryable, siteId: string, roostId: string): Promise<Rollout[]> {
  const { rows } = await q.query<RolloutRow>(
    `SELECT ${ROLLOUT_COLUMNS} FROM rollouts WHERE site_id = $1 AND roost_id = $2 AND active ORDER BY created_at, rollout_id`,
    [siteId, roostId],
  );
  return rows.map(toRollout);
}

/** The ids of `machineIds` that are not enrolled machines of the site (input order kept). */
export async function unknownMachines(q: Queryable, siteId: string, machineIds: readonly string[]): Promise<string[]> {
  if (machineIds.length === 0) return [];
  const { rows } = await q.query<{ machine_id: string }>(
    'SELECT machine_id FROM machines WHERE site_id = $1 AND machine_id = ANY($2::text[])',
    [siteId, machineIds],
  );
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
  /**
   * The machines of every wave in order (domain/rollout-policy.ts planWaves). Absent: the two
   * waves `canary` and `fleet` as before. Named by `waveNames` unless `waveNames` is given.
   */
  waves?: string[][];
  waveNames?: string[];
  /** Initial stage (default `canary`; rollback rollouts skip the canary and start at `started`). */
  stage?: RolloutStage;
  /** Rollback rollouts: the rollout undone, and the version each machine goes back to. */
  rollbackOf?: string;
  targetVersions?: Map<string, string>;
}

/**
 * Inserts the rollout (stage `canary` unless told, state running, active) and one `rollout_machines` row
 * per machine (bulk UNNEST) with the version each machine reports committed now (`previous_version_id`,
 * what a rollback returns it to), inside the caller's transaction. Throws the unique violation (23505)
 * of `rollouts_one_active` when a non-terminal rollout of the same version exists.
 */
export async function insertRollout(tx: Queryable, r: NewRollout): Promise<void> {
  const waves = r.waves ?? [r.canary, r.fleet];
  const names = r.waveNames ?? (r.waves ? waveNames(waves.length) : ['canary', 'fleet']);
  const plan: WavePlan[] = waves.map((w, i) => ({ name: names[i], size: w.length }));
  await tx.query(
    `INSERT INTO rollouts (site_id, rollout_id, roost_id, version_id, stage, active, canary, fleet, extract_root, policy, schedule_at, workflow_id, created_by,
                           state, waves, rollback_of)
     VALUES ($1, $2, $3, $4, $12, true, $5, $6, $7, $8, $9, $10, $11, 'running', $13, $14)`,
    [
      r.siteId,
      r.rolloutId,
      r.roostId,
      r.versionId,
      JSON.stringify(r.canary),
      JSON.stringify(r.fleet),
      r.extractRoot,
      JSON.stringify(r.policy),
      r.scheduleAt,
      r.workflowId,
      r.createdBy,
      r.stage ?? 'canary',
      JSON.stringify(plan),
      r.rollbackOf ?? null,
    ],
  );
  const machines: string[] = [];
  const waveOf: string[] = [];
  waves.forEach((w, i) => {
    for (const m of w) {
      machines.push(m);
      waveOf.push(names[i]);
    }
  });
  const targets = machines.map((m) => r.targetVersions?.get(m) ?? null);
  await tx.query(
    `INSERT INTO rollout_machines (site_id, rollout_id, machine_id, wave, target_version_id, previous_version_id)
     SELECT $1, $2, t.machine_id, t.wave, t.target, ts.reported_version_id
       FROM UNNEST($3::text[], $4::text[], $6::text[]) AS t (machine_id, wave, target)
       LEFT JOIN roost_target_states AS ts ON ts.site_id = $1 AND ts.machine_id = t.machine_id AND ts.roost_id = $5 AND ts.status = 'committed'`,
    [r.siteId, r.rolloutId, machines, waveOf, r.roostId, targets],
  );
}

/**
 * In one transaction: returns the non-terminal rollout of (site, roost, version) when there is one, else
 * inserts `r` (`insertRollout`) and returns null.
 * @throws the unique violation of `rollouts_one_active` when a concurrent deploy of the same version
 *   committed first (`isActiveRolloutRace` tells it apart; calling again then finds that rollout).
 */
export async function insertRolloutUnlessActive(pool: Pool, r: NewRollout): Promise<Rollout | null> {
  return withTx(pool, async (tx) => {
    const existing = await findActiveRollout(tx, r.siteId, r.roostId, r.versionId);
    if (existing) return existing;
    await insertRollout(tx, r);
    return null;
  });
}

/** True when `err` is a unique violation (SQLSTATE 23505), as a concurrent insert of the same active rollout raises. */
export function isActiveRolloutRace(err: unknown): boolean {
  return (err as { code?: string } | null)?.code === '23505';
}

/** The site's IANA timezone (sites.timezone; '' or null when unset, null when the site is unknown). */
export async function siteTimezone(q: Queryable, siteId: string): Promise<string | null> {
  const { rows } = await q.query<{ timezone: string | null }>('SELECT timezone FROM sites WHERE site_id = $1', [siteId]);
  return rows[0] ? rows[0].timezone : null;
}

/**
 * Ends a rollout whose workflow could not be started: stage `failed`, inactive, abort reason, machines
 * cancelled. No event (the rollout never began). No-op when already terminal.
 */
export async function failUnstartedRollout(pool: Pool, siteId: string, rolloutId: string, abortReason: string): Promise<void> {
  await withTx(pool, async (tx) => {
    const upd = await tx.query(
      `UPDATE rollouts SET stage = 'failed', state = 'failed', active = false, abort_reason = $3, completed_at = now(), updated_at = now()
        WHERE site_id = $1 AND rollout_id = $2 AND active`,
      [siteId, rolloutId, abortReason],
    );
    if (upd.rowCount === 0) return;
    await cancelOpenMachines(tx, siteId, rolloutId);
  });
}

/**
 * Cancels the unfinished machines of a rollout that is ending: their sync_pull (or roost_activate)
 * commands still `pending` are closed as cancelled (an agent that is mid-sync sees its command closed; its
 * later reports change nothing) and the machines move to `cancelled` (staged machines keep their staged
 * tree on disk, never activated; their live tree is unchanged).
 */
async function cancelOpenMachines(tx: Queryable, siteId: string, rolloutId: string): Promise<void> {
  await tx.query(
    `UPDATE commands AS c SET status = 'cancelled', result = 'cancelled', completed_at = now(), updated_at = now()
       FROM rollout_machines AS rm
      WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.status IN ('dispatched', 'activating')
        AND c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.status = 'pending'`,
    [siteId, rolloutId],
  );
  await tx.query(
    `UPDATE rollout_machines SET status = 'cancelled', updated_at = now()
      WHERE site_id = $1 AND rollout_id = $2 AND status IN ('pending', 'dispatched', 'staged', 'activating')`,
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
    await recordEvent(
      tx,
      siteId,
      'deployment.started',
      { rolloutId, roostId: r.roostId, siteId, stage: r.stage },
      rolloutEventId(rolloutId, 'deployment.started'),
    );
    return true;
  });
}

function addCount(c: WaveCounts, status: string, n: number, timedOut: number): void {
  c.total += n;
  if (status in c) (c as unknown as Record<string, number>)[status] += n;
  if (status === 'failed') c.timedOut += timedOut;
}

/** Counts machines by status (one wave, or the whole rollout when `wave` is null). */
export async function waveCounts(q: Queryable, siteId: string, rolloutId: string, wave: Wave | null): Promise<WaveCounts> {
  return sumCounts((await countsByWave(q, siteId, rolloutId, wave === null ? null : [wave])).values());
}

/** Counts per wave name, for the waves `names` (every wave when null). */
export async function countsByWave(
  q: Queryable,
  siteId: string,
  rolloutId: string,
  names: readonly string[] | null,
): Promise<Map<string, WaveCounts>> {
  const { rows } = await q.query<{ wave: string; status: string; n: number; timed_out: number }>(
    `SELECT wave, status, CAST(count(*) AS INT) AS n, CAST(sum(CASE WHEN last_error = 'timeout' THEN 1 ELSE 0 END) AS INT) AS timed_out
       FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 AND ($3::text[] IS NULL OR wave = ANY($3::text[])) GROUP BY wave, status`,
    [siteId, rolloutId, names],
  );
  const out = new Map<string, WaveCounts>();
  for (const r of rows) {
    let c = out.get(r.wave);
    if (!c) out.set(r.wave, (c = emptyCounts()));
    addCount(c, r.status, Number(r.n), Number(r.timed_out));
  }
  return out;
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
  /** W3C trace context the dispatched sync_pull commands carry (the dispatching activity's span), if any. */
  traceparent?: string;
  /** Request id the dispatched commands carry (the request that started or last steered the rollout), if any. */
  requestId?: string;
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
 * `pending` and due (see `dispatchDueIn`). Used by the fixed canary-then-fleet path of rollouts started
 * before rollout control (workflows/rollout.ts), which addresses waves by name.
 */
export async function dispatchDue(
  pool: Pool,
  t: WaveTarget,
  wave: Wave,
  commandTtlMs: number,
  onBatch?: (dispatchedSoFar: number) => void,
): Promise<number> {
  return dispatchDueIn(pool, t, [wave], commandTtlMs, {}, onBatch);
}

/**
 * Queues `sync_pull` commands (params per docs/agent-protocol.md, plus `activation: 'staged'` when
 * `opts.staged`) for the machines of waves `names` that are `pending` and due: never dispatched, or
 * failed earlier and past their backoff (retryBackoffMs · 2^(attempts−1) after `finished_at`). Each
 * machine gets its own version (`target_version_id`, else the rollout's). Works in batches of
 * DISPATCH_BATCH machines, one transaction each: insert commands (deterministic ids, ON CONFLICT DO
 * NOTHING) and mark the machines `dispatched` with attempts + 1 and, on the first dispatch, their
 * deadline (now + policy.waveTimeoutMs). Returns how many machines were dispatched. Idempotent.
 * @param commandTtlMs lifetime of each command (`expires_at`).
 * @param onBatch called after each batch (activities heartbeat there).
 */
export async function dispatchDueIn(
  pool: Pool,
  t: WaveTarget,
  names: readonly string[],
  commandTtlMs: number,
  opts: { staged?: boolean },
  onBatch?: (dispatchedSoFar: number) => void,
): Promise<number> {
  let total = 0;
  let after = '';
  for (;;) {
    const n = await withTx(pool, async (tx) => {
      const { rows } = await tx.query<{ machine_id: string; attempts: number; version_id: string; version_number: number }>(
        `SELECT rm.machine_id, rm.attempts, rv.version_id, rv.version_number FROM rollout_machines AS rm
           JOIN roost_versions AS rv ON rv.site_id = rm.site_id AND rv.roost_id = $7 AND rv.version_id = COALESCE(rm.target_version_id, $8)
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status = 'pending' AND rm.machine_id > $4
            AND (rm.attempts = 0 OR rm.finished_at IS NULL
                 OR rm.finished_at + ($5::float8 * power(2::float8, (rm.attempts - 1)::float8)) * INTERVAL '1 millisecond' <= now())
          ORDER BY rm.machine_id LIMIT $6`,
        [t.siteId, t.rolloutId, names, after, t.policy.retryBackoffMs, DISPATCH_BATCH, t.roostId, t.versionId],
      );
      if (rows.length === 0) return { count: 0, last: after };
      const machineIds = rows.map((r) => r.machine_id);
      const attempts = rows.map((r) => r.attempts + 1);
      const commandIds = rows.map((r, i) => syncPullCommandId(t.rolloutId, r.machine_id, attempts[i]));
      await tx.query(
        `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, rollout_id, created_by, expires_at, traceparent, request_id)
         SELECT $1, u.machine_id, u.command_id, 'sync_pull', 'pending',
                jsonb_build_object('roostId', $2::text, 'versionId', u.version_id, 'versionNumber', u.version_number, 'rolloutId', $5::text,
                                   'extractRoot', $6::text, 'attempt', u.attempt)
                  || CASE WHEN $12::bool THEN jsonb_build_object('activation', 'staged') ELSE '{}'::jsonb END,
                $5, $7, now() + $8::float8 * INTERVAL '1 millisecond', $13::text, $14::text
           FROM UNNEST($9::text[], $10::text[], $11::int[], $3::text[], $4::int[]) AS u (machine_id, command_id, attempt, version_id, version_number)
         ON CONFLICT (site_id, machine_id, command_id) DO NOTHING`,
        [
          t.siteId,
          t.roostId,
          rows.map((r) => r.version_id),
          rows.map((r) => r.version_number),
          t.rolloutId,
          t.extractRoot,
          t.createdBy,
          commandTtlMs,
          machineIds,
          commandIds,
          attempts,
          opts.staged === true,
          t.traceparent ?? null,
          t.requestId ?? null,
        ],
      );
      const upd = await tx.query(
        `UPDATE rollout_machines AS rm
            SET status = 'dispatched', attempts = u.attempt, command_id = u.command_id, dispatched_at = now(), updated_at = now(),
                deadline_at = COALESCE(rm.deadline_at, now() + $6::float8 * INTERVAL '1 millisecond')
           FROM UNNEST($3::text[], $4::text[], $5::int[]) AS u (machine_id, command_id, attempt)
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.machine_id = u.machine_id AND rm.status = 'pending'`,
        [t.siteId, t.rolloutId, machineIds, commandIds, attempts, t.policy.waveTimeoutMs],
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
 * One reconciliation pass over a wave with a fixed wave deadline (the fixed canary-then-fleet path of
 * rollouts started before rollout control).
 */
export async function reconcileWave(pool: Pool, t: WaveTarget, wave: Wave, deadline: Date): Promise<WaveCounts> {
  const byWave = await reconcileWaves(pool, t, [wave], deadline);
  return sumCounts(byWave.values());
}

/**
 * One reconciliation pass over the waves `names`, in one transaction, from agent reports. Each machine's
 * version is its `target_version_id`, else the rollout's.
 * - a `dispatched` machine succeeded when its target state reports its version `committed` after the
 *   dispatch (or its command completed, not as `staged`, and the state shows the version committed), or
 *   when its command completed (not as `staged`) and a report of another version replaced the state after
 *   the dispatch (two rollouts of different versions on one machine: the newer one's sync followed ours);
 * - a `dispatched` machine whose command completed with result `staged` is `staged` (staged activation);
 * - it failed when its target state reports the version `failed`/`cancelled` after the dispatch, or its
 *   command failed or was cancelled: back to `pending` for a retry while attempts ≤ retries, else `failed`;
 * - an `activating` machine succeeded when its state reports the version committed after the activation
 *   (or its roost_activate completed and another version's report replaced the state after it),
 *   failed (no retry) when its roost_activate command failed or was cancelled;
 * - deadlines: with `deadline` (rollouts started before rollout control) every unfinished machine fails with
 *   `last_error = 'timeout'` at or after it (still pending commands cancelled); without, each machine's own
 *   `deadline_at` applies and a timed-out sync is retried within the retry budget like a failed one (its
 *   open command cancelled), failing with `timeout` once the budget is spent.
 * Monotonic and idempotent. Returns the counts per wave after the pass.
 */
export async function reconcileWaves(
  pool: Pool,
  t: WaveTarget,
  names: readonly string[],
  deadline?: Date,
): Promise<Map<string, WaveCounts>> {
  return withTx(pool, async (tx) => {
    const base = [t.siteId, t.rolloutId, names, t.roostId, t.versionId];
    // The second alternative: another version's report (a newer rollout of the roost on the same machine)
    // replaced the target state after this dispatch, and this rollout's command had completed, so the machine
    // did commit this version before moving on. Its EXISTS runs only for those rows: during a rollout an
    // agent's reports name the version it syncs, so a moved-past state is rare and the pass stays a join by
    // primary key.
    const completed = `EXISTS (SELECT 1 FROM commands AS c
                                WHERE c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.status = 'completed'
                                  AND (c.result IS NULL OR c.result <> 'staged'))`;
    const ours = `ts.reported_version_id = COALESCE(rm.target_version_id, $5)`;
    await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = 'succeeded', finished_at = now(), updated_at = now(), last_error = NULL,
              bytes_fetched = CASE WHEN ${ours} THEN GREATEST(rm.bytes_fetched, ts.bytes_fetched) ELSE rm.bytes_fetched END
         FROM roost_target_states AS ts
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status IN ('dispatched', 'activating')
          AND ts.site_id = rm.site_id AND ts.machine_id = rm.machine_id AND ts.roost_id = $4
          AND ((${ours} AND ts.status = 'committed' AND (ts.updated_at >= rm.dispatched_at OR ${completed}))
               OR (ts.reported_version_id <> COALESCE(rm.target_version_id, $5) AND ts.updated_at >= rm.dispatched_at AND ${completed}))`,
      base,
    );
    await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = 'staged', staged_at = now(), updated_at = now(), last_error = NULL,
              bytes_fetched = COALESCE((SELECT ts.bytes_fetched FROM roost_target_states AS ts
                                         WHERE ts.site_id = rm.site_id AND ts.machine_id = rm.machine_id AND ts.roost_id = $3
                                           AND ts.reported_version_id = COALESCE(rm.target_version_id, $5)), rm.bytes_fetched)
         FROM commands AS c
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($4::text[]) AND rm.status = 'dispatched'
          AND c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id
          AND c.status = 'completed' AND c.result = 'staged'`,
      [t.siteId, t.rolloutId, t.roostId, names, t.versionId],
    );
    // Per-row lookups by primary key (EXISTS, and the error read only for the rows that change), no join of
    // rollout_machines with itself: with statistics that missed the wave's dispatch (a fresh rollout,
    // or a large table where one rollout is a small fraction) PostgreSQL nested the self-join and read
    // 9,900 × 4,950 rows, 30 s a pass at 10,000 machines (docs/benchmarks.md "Statistics"). The wave's
    // failed target states and the rollout's failed commands are read once (uncorrelated INs over the
    // partial indexes of migration 025), and only the machines found there get the per-row EXISTS: that
    // EXISTS alone probed the target state of every dispatched machine on every pass (83 ms at 9,900),
    // and PostgreSQL answered the command part by reading every failed command of the database
    // (docs/benchmarks.md "The long-poll check").
    const failedState = `ts.reported_version_id = COALESCE(rm.target_version_id, $5) AND ts.status IN ('failed', 'cancelled')`;
    const tsOf = `ts.site_id = rm.site_id AND ts.machine_id = rm.machine_id AND ts.roost_id = $4`;
    const cOf = `c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id`;
    await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = CASE WHEN rm.attempts <= $6 THEN 'pending' ELSE 'failed' END,
              last_error = substr(COALESCE(
                (SELECT COALESCE(ts.error, 'sync ' || ts.status) FROM roost_target_states AS ts WHERE ${tsOf} AND ${failedState}),
                (SELECT COALESCE(c.error, 'command ' || c.status) FROM commands AS c WHERE ${cOf}),
                'sync failed'), 1, 500),
              finished_at = now(), updated_at = now()
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status = 'dispatched'
          AND ((rm.machine_id IN (SELECT ts.machine_id FROM roost_target_states AS ts
                                   WHERE ts.site_id = $1 AND ts.roost_id = $4 AND ts.status IN ('failed', 'cancelled'))
                AND EXISTS (SELECT 1 FROM roost_target_states AS ts WHERE ${tsOf} AND ${failedState} AND ts.updated_at >= rm.dispatched_at))
               OR (rm.machine_id, rm.command_id) IN (SELECT c.machine_id, c.command_id FROM commands AS c
                                                      WHERE c.site_id = $1 AND c.rollout_id = $2 AND c.status IN ('failed', 'cancelled')))`,
      [...base, t.policy.retries],
    );
    await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = 'failed', last_error = substr(COALESCE(c.error, 'activation ' || c.status), 1, 500), finished_at = now(), updated_at = now()
         FROM commands AS c
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status = 'activating'
          AND c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.status IN ('failed', 'cancelled')`,
      [t.siteId, t.rolloutId, names],
    );
    if (deadline) {
      // Rollouts started before rollout control: one wave deadline, unfinished machines fail at it.
      const due = `now() >= $4::timestamptz`;
      const args = [t.siteId, t.rolloutId, names, deadline];
      await tx.query(
        `UPDATE commands AS c SET status = 'cancelled', result = 'cancelled', completed_at = now(), updated_at = now()
           FROM rollout_machines AS rm
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status IN ('dispatched', 'activating') AND ${due}
            AND c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.status = 'pending'`,
        args,
      );
      await tx.query(
        `UPDATE rollout_machines AS rm SET status = 'failed', last_error = 'timeout', finished_at = now(), updated_at = now()
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status IN ('pending', 'dispatched', 'activating')
            AND ${due}`,
        args,
      );
      return countsByWave(tx, t.siteId, t.rolloutId, names);
    }
    // Per-machine deadlines. A timed-out sync uses the retry budget like a failed one: its open command is
    // cancelled (an agent still on it learns so at its next report) and the machine goes back to pending
    // with a fresh deadline at its next dispatch, or fails with `timeout` once the budget is spent. A
    // timed-out activation fails (activations are not retried).
    const due = `rm.deadline_at IS NOT NULL AND rm.deadline_at <= now()`;
    await tx.query(
      `UPDATE commands AS c SET status = 'cancelled', result = 'cancelled', error = COALESCE(c.error, 'timeout'), completed_at = now(), updated_at = now()
         FROM rollout_machines AS rm
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status IN ('dispatched', 'activating') AND ${due}
          AND c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id AND c.completed_at IS NULL`,
      [t.siteId, t.rolloutId, names],
    );
    await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = CASE WHEN rm.status = 'dispatched' AND rm.attempts <= $4 THEN 'pending' ELSE 'failed' END,
              deadline_at = CASE WHEN rm.status = 'dispatched' AND rm.attempts <= $4 THEN NULL ELSE rm.deadline_at END,
              last_error = 'timeout', finished_at = now(), updated_at = now()
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status IN ('pending', 'dispatched', 'activating')
          AND ${due} AND (rm.status <> 'pending' OR rm.attempts > 0)`,
      [t.siteId, t.rolloutId, names, t.policy.retries],
    );
    return countsByWave(tx, t.siteId, t.rolloutId, names);
  });
}

/** A sync of a rollout whose agent has reported nothing for a while (`stalledSyncs`). */
export interface StalledSync {
  machineId: string;
  commandId: string;
  /** Last sign of progress (dispatch, command report or target-state report), epoch ms on the database clock. */
  progressAt: number;
}

/**
 * Dispatched machines of waves `names` whose sync_pull was taken by the agent (its status is no longer
 * `pending`) but shows no progress (command report, target-state report for the roost) for `stallMs` or
 * more, oldest first, at most `limit`. Commands still pending are not stalled: their agent has not picked
 * them up, which the deadline covers.
 */
export async function stalledSyncs(
  q: Queryable,
  t: WaveTarget,
  names: readonly string[],
  stallMs: number,
  limit = 1000,
): Promise<StalledSync[]> {
  const { rows } = await q.query<{ machine_id: string; command_id: string; progress_at: number }>(
    `SELECT rm.machine_id, rm.command_id, progress_at FROM (
       SELECT rm.machine_id, rm.command_id,
              EXTRACT(EPOCH FROM GREATEST(rm.dispatched_at, c.updated_at, COALESCE(ts.updated_at, rm.dispatched_at))) * 1000 AS progress_at,
              GREATEST(rm.dispatched_at, c.updated_at, COALESCE(ts.updated_at, rm.dispatched_at)) AS last_progress
         FROM rollout_machines AS rm
         JOIN commands AS c ON c.site_id = rm.site_id AND c.machine_id = rm.machine_id AND c.command_id = rm.command_id
         LEFT JOIN roost_target_states AS ts ON ts.site_id = rm.site_id AND ts.machine_id = rm.machine_id AND ts.roost_id = $4
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.wave = ANY($3::text[]) AND rm.status = 'dispatched'
          AND c.status <> 'pending' AND c.completed_at IS NULL
          -- Each term of last_progress must be old enough: said on the columns, rows dispatched or
          -- reported within stallMs are left out before the sort (most of a wave that is under way).
          AND (rm.dispatched_at IS NULL OR rm.dispatched_at <= now() - $5::float8 * INTERVAL '1 millisecond')
          AND c.updated_at <= now() - $5::float8 * INTERVAL '1 millisecond') AS rm
      WHERE rm.last_progress <= now() - $5::float8 * INTERVAL '1 millisecond'
      ORDER BY rm.last_progress, rm.machine_id LIMIT $6`,
    [t.siteId, t.rolloutId, names, t.roostId, stallMs, limit],
  );
  return rows.map((r) => ({ machineId: r.machine_id, commandId: r.command_id, progressAt: Number(r.progress_at) }));
}

/**
 * Gives up on stalled syncs (`stalledSyncs`), in one transaction: each open command is cancelled with error
 * `stalled` (an agent still on it learns so at its next report), and its machine, when still dispatched with
 * that command, goes back to `pending` for another attempt while attempts ≤ `policy.retries`, else fails.
 * @param stallMs how long they showed no progress (for `last_error`)
 * @returns how many machines were moved
 */
export async function retryStalledSyncs(pool: Pool, t: WaveTarget, stalled: readonly StalledSync[], stallMs: number): Promise<number> {
  if (stalled.length === 0) return 0;
  const machineIds = stalled.map((s) => s.machineId);
  const commandIds = stalled.map((s) => s.commandId);
  return withTx(pool, async (tx) => {
    await tx.query(
      `UPDATE commands AS c SET status = 'cancelled', result = 'cancelled', error = 'stalled', completed_at = now(), updated_at = now()
         FROM UNNEST($2::text[], $3::text[]) AS u (machine_id, command_id)
        WHERE c.site_id = $1 AND c.machine_id = u.machine_id AND c.command_id = u.command_id AND c.completed_at IS NULL`,
      [t.siteId, machineIds, commandIds],
    );
    const upd = await tx.query(
      `UPDATE rollout_machines AS rm
          SET status = CASE WHEN rm.attempts <= $5 THEN 'pending' ELSE 'failed' END,
              last_error = $6, finished_at = now(), updated_at = now()
         FROM UNNEST($3::text[], $4::text[]) AS u (machine_id, command_id)
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.machine_id = u.machine_id AND rm.command_id = u.command_id
          AND rm.status = 'dispatched'`,
      [
        t.siteId,
        t.rolloutId,
        machineIds,
        commandIds,
        t.policy.retries,
        `stalled: no progress reported for ${Math.round(stallMs / 1000)} s`,
      ],
    );
    return upd.rowCount ?? 0;
  });
}

/**
 * Queues `roost_activate` (db/activation.ts) for the `staged` machines of waves `names` and moves them
 * to `activating` (command id, dispatched_at and deadline = now + `ttlMs`), in batches. Idempotent.
 * Returns how many machines were moved.
 */
export async function activateStaged(
  pool: Pool,
  t: WaveTarget,
  names: readonly string[],
  ttlMs = DEFAULT_ACTIVATION_TTL_MS,
): Promise<number> {
  let total = 0;
  for (;;) {
    const n = await withTx(pool, async (tx) => {
      const { rows } = await tx.query<{ machine_id: string }>(
        `SELECT machine_id FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2 AND wave = ANY($3::text[]) AND status = 'staged'
          ORDER BY machine_id LIMIT $4`,
        [t.siteId, t.rolloutId, names, DISPATCH_BATCH],
      );
      if (rows.length === 0) return 0;
      const ids = rows.map((r) => r.machine_id);
      await dispatchActivation(
        tx,
        {
          siteId: t.siteId,
          rolloutId: t.rolloutId,
          roostId: t.roostId,
          versionId: t.versionId,
          extractRoot: t.extractRoot,
          createdBy: t.createdBy,
          traceparent: t.traceparent,
          requestId: t.requestId,
        },
        ids,
        {
          commandTtlMs: ttlMs,
        },
      );
      const upd = await tx.query(
        `UPDATE rollout_machines AS rm SET status = 'activating', command_id = u.command_id, dispatched_at = now(), updated_at = now(),
                deadline_at = now() + $5::float8 * INTERVAL '1 millisecond'
           FROM UNNEST($3::text[], $4::text[]) AS u (machine_id, command_id)
          WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.machine_id = u.machine_id AND rm.status = 'staged'`,
        [t.siteId, t.rolloutId, ids, ids.map((m) => activateCommandId(t.rolloutId, m, t.versionId)), ttlMs],
      );
      return upd.rowCount ?? 0;
    });
    if (n === 0) return total;
    total += n;
  }
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
export async function setRolloutStage(
  pool: Pool,
  siteId: string,
  rolloutId: string,
  stage: RolloutStage,
  abortReason: string | null = null,
): Promise<StageChange | null> {
  return withTx(pool, async (tx) => {
    const r = await getRollout(tx, siteId, rolloutId);
    if (!r) return null;
    if (!r.active) return { stage: r.stage, changed: false, succeeded: r.succeeded, failed: r.failed, abortReason: r.abortReason };
    if (stage === 'canary' || stage === 'started') {
      await tx.query('UPDATE rollouts SET stage = $3, updated_at = now() WHERE site_id = $1 AND rollout_id = $2', [
        siteId,
        rolloutId,
        stage,
      ]);
      return { stage, changed: r.stage !== stage, succeeded: r.succeeded, failed: r.failed, abortReason: null };
    }
    await cancelOpenMachines(tx, siteId, rolloutId);
    const c = await waveCounts(tx, siteId, rolloutId, null);
    const reason = stage === 'failed' ? (abortReason ?? 'failed') : null;
    const state: RolloutState = stage === 'completed' ? 'completed' : reason === 'aborted' ? 'aborted' : 'failed';
    await tx.query(
      `UPDATE rollouts SET stage = $3, active = false, abort_reason = $4, succeeded = $5, failed = $6, completed_at = now(), updated_at = now(), state = $7
        WHERE site_id = $1 AND rollout_id = $2`,
      [siteId, rolloutId, stage, reason, c.succeeded, c.failed, state],
    );
    const data: Record<string, unknown> = { rolloutId, roostId: r.roostId, siteId, stage };
    if (stage === 'failed') data.abortReason = reason;
    data.succeeded = c.succeeded;
    data.failed = c.failed;
    const type = stage === 'completed' ? 'deployment.completed' : 'deployment.failed';
    await recordEvent(tx, siteId, type, data, rolloutEventId(rolloutId, type));
    if (stage === 'completed' && r.rollbackOf) {
      // A completed rollback marks the rollout it undid as rolled back (its own history says so).
      const entry = { action: 'rolled_back', state: 'rolled_back', at: new Date().toISOString(), detail: { rollbackRolloutId: rolloutId } };
      await tx.query(
        `UPDATE rollouts SET state = 'rolled_back', state_seq = state_seq + 1,
                history = history || jsonb_build_array($3::jsonb || jsonb_build_object('seq', state_seq + 1)), updated_at = now()
          WHERE site_id = $1 AND rollout_id = $2 AND NOT active`,
        [siteId, r.rollbackOf, JSON.stringify(entry)],
      );
    }
    return { stage, changed: true, succeeded: c.succeeded, failed: c.failed, abortReason: reason };
  });
}

// ---------------------------------------------------------------------------------------------------
// Rollout control: control state and history, listing, rollback rollouts, delta plans

/**
 * Writes the rollout's control `state` (when given and `seq` is newer than the stored state_seq) and
 * appends `entry` to its history once (an entry with the same seq is never appended twice). A terminal
 * rollout keeps its state; only `rolled_back` may be written on one. Returns false when the rollout is
 * missing.
 */
export async function recordRolloutTransition(
  pool: Pool,
  siteId: string,
  rolloutId: string,
  entry: Omit<HistoryEntry, 'at'>,
): Promise<boolean> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ active: boolean; state_seq: number; dup: boolean }>(
      `SELECT active, state_seq, history @> $3::jsonb AS dup FROM rollouts WHERE site_id = $1 AND rollout_id = $2`,
      [siteId, rolloutId, JSON.stringify([{ seq: entry.seq, action: entry.action }])],
    );
    const r = rows[0];
    if (!r) return false;
    if (r.dup) return true;
    const full: HistoryEntry = { ...entry, at: new Date().toISOString() };
    const writeState = entry.state !== undefined && entry.seq > Number(r.state_seq) && (r.active || entry.state === 'rolled_back');
    await tx.query(
      `UPDATE rollouts SET history = history || $3::jsonb, updated_at = now(),
              state = CASE WHEN $4::bool THEN $5 ELSE state END, state_seq = CASE WHEN $4::bool THEN $6 ELSE state_seq END
        WHERE site_id = $1 AND rollout_id = $2`,
      [siteId, rolloutId, JSON.stringify([full]), writeState, entry.state ?? null, entry.seq],
    );
    return true;
  });
}

/** Stores the index of the wave being dispatched (`current_wave`). */
export async function setCurrentWave(q: Queryable, siteId: string, rolloutId: string, wave: number): Promise<void> {
  await q.query('UPDATE rollouts SET current_wave = $3, updated_at = now() WHERE site_id = $1 AND rollout_id = $2', [
    siteId,
    rolloutId,
    wave,
  ]);
}

/** The control state of a rollout (null when missing). */
export async function rolloutState(q: Queryable, siteId: string, rolloutId: string): Promise<RolloutState | null> {
  const { rows } = await q.query<{ state: RolloutState | null; active: boolean; stage: RolloutStage }>(
    'SELECT state, active, stage FROM rollouts WHERE site_id = $1 AND rollout_id = $2',
    [siteId, rolloutId],
  );
  const r = rows[0];
  if (!r) return null;
  return r.state ?? (r.active ? 'running' : r.stage === 'completed' ? 'completed' : 'failed');
}

/** Position of the rollout list: newest first by (created_at, rollout_id). */
export interface RolloutListPosition {
  t: string;
  id: string;
}

/** A page of a roost's rollouts, newest first, optionally of one stage. */
export async function listRollouts(
  q: Queryable,
  siteId: string,
  roostId: string,
  opts: { limit: number; after?: RolloutListPosition; stage?: RolloutStage },
): Promise<{ rows: Rollout[]; more: boolean }> {
  const { rows } = await q.query<RolloutRow>(
    `SELECT ${ROLLOUT_COLUMNS} FROM rollouts
      WHERE site_id = $1 AND roost_id = $2 AND ($3::text IS NULL OR stage = $3)
        AND ($4::timestamptz IS NULL OR created_at < $4::timestamptz OR (created_at = $4::timestamptz AND rollout_id < $5))
      ORDER BY created_at DESC, rollout_id DESC LIMIT $6`,
    [siteId, roostId, opts.stage ?? null, opts.after?.t ?? null, opts.after?.id ?? '', opts.limit + 1],
  );
  return { rows: rows.slice(0, opts.limit).map(toRollout), more: rows.length > opts.limit };
}

interface RolloutMachineRow {
  machine_id: string;
  wave: string;
  status: RolloutMachineStatus;
  attempts: number;
  command_id: string | null;
  last_error: string | null;
  bytes_fetched: string | number;
  previous_version_id: string | null;
  target_version_id: string | null;
  dispatched_at: Date | null;
  finished_at: Date | null;
  staged_at: Date | null;
  deadline_at: Date | null;
  updated_at: Date;
}

function toRolloutMachine(m: RolloutMachineRow): RolloutMachine {
  return {
    machineId: m.machine_id,
    wave: m.wave,
    status: m.status,
    attempts: m.attempts,
    commandId: m.command_id,
    lastError: m.last_error,
    bytesFetched: Number(m.bytes_fetched),
    previousVersionId: m.previous_version_id,
    targetVersionId: m.target_version_id,
    dispatchedAt: m.dispatched_at,
    finishedAt: m.finished_at,
    stagedAt: m.staged_at,
    deadlineAt: m.deadline_at,
    updatedAt: m.updated_at,
  };
}

/** A page of a rollout's machines ordered by machine id, optionally filtered by status and wave name. */
export async function listRolloutMachines(
  q: Queryable,
  siteId: string,
  rolloutId: string,
  opts: { limit: number; after?: string; status?: RolloutMachineStatus; wave?: string },
): Promise<{ rows: RolloutMachine[]; more: boolean }> {
  const { rows } = await q.query<RolloutMachineRow>(
    `SELECT machine_id, wave, status, attempts, command_id, last_error, bytes_fetched, previous_version_id, target_version_id,
            dispatched_at, finished_at, staged_at, deadline_at, updated_at
       FROM rollout_machines
      WHERE site_id = $1 AND rollout_id = $2 AND machine_id > $3 AND ($4::text IS NULL OR status = $4) AND ($5::text IS NULL OR wave = $5)
      ORDER BY machine_id LIMIT $6`,
    [siteId, rolloutId, opts.after ?? '', opts.status ?? null, opts.wave ?? null, opts.limit + 1],
  );
  return { rows: rows.slice(0, opts.limit).map(toRolloutMachine), more: rows.length > opts.limit };
}

/** Why a rollback rollout could not be created. */
export type RollbackRefusal =
  'not_found' | 'not_terminal' | 'completed' | 'already_rolled_back' | 'is_rollback' | 'nothing_to_roll_back' | 'version_busy';

/** A rollback rollout: created by this call (`created` true) or found, made by an earlier one (false). */
export interface RollbackCreated {
  rollout: Rollout;
  machines: number;
  created: boolean;
}

/** Deterministic id of the rollback rollout of `rolloutId` (so a retried activity creates it once). */
export function rollbackRolloutId(rolloutId: string): string {
  return `rol_${createHash('sha256').update(`rollback:${rolloutId}`).digest('hex').slice(0, 24)}`;
}

/**
 * Creates the rollback rollout of a failed (or aborted) rollout, in one transaction: every machine of
 * the rollout whose target state reports the rollout's version committed (it switched) and that had a
 * committed version before (`previous_version_id`) is sent back to that version, in one wave named
 * `rollback` (no canary; stage `started`; retries and timeout of the original; no thresholds, gates or
 * windows). The new rollout's version is the most common previous version; `target_version_id` carries
 * each machine's own. The original gets `rolled_back_by`. Idempotent: the rollback's id is derived from
 * the original's, and an existing one is returned with `created` false. The original's row is locked
 * first, so of concurrent calls one creates and the others find its rollback.
 */
export async function createRollbackRollout(
  pool: Pool,
  siteId: string,
  rolloutId: string,
  createdBy: string,
): Promise<RollbackCreated | RollbackRefusal> {
  return withTx(pool, async (tx) => {
    const r = await getRollout(tx, siteId, rolloutId, { lock: true });
    if (!r) return 'not_found';
    const id = rollbackRolloutId(rolloutId);
    if (r.rolledBackBy) {
      const existing = r.rolledBackBy === id ? await getRollout(tx, siteId, id) : null;
      if (existing) {
        const { rows } = await tx.query<{ n: number }>(
          'SELECT CAST(count(*) AS INT) AS n FROM rollout_machines WHERE site_id = $1 AND rollout_id = $2',
          [siteId, id],
        );
        return { rollout: existing, machines: Number(rows[0].n), created: false };
      }
      return 'already_rolled_back';
    }
    if (r.active) return 'not_terminal';
    if (r.stage === 'completed') return 'completed';
    if (r.rollbackOf) return 'is_rollback';
    const { rows } = await tx.query<{ machine_id: string; previous_version_id: string }>(
      `SELECT rm.machine_id, rm.previous_version_id FROM rollout_machines AS rm
         JOIN roost_target_states AS ts ON ts.site_id = rm.site_id AND ts.machine_id = rm.machine_id AND ts.roost_id = $3
         JOIN roost_versions AS rv ON rv.site_id = rm.site_id AND rv.roost_id = $3 AND rv.version_id = rm.previous_version_id
        WHERE rm.site_id = $1 AND rm.rollout_id = $2 AND rm.previous_version_id IS NOT NULL AND rm.previous_version_id <> $4
          AND ts.reported_version_id = $4 AND ts.status = 'committed'
        ORDER BY rm.machine_id`,
      [siteId, rolloutId, r.roostId, r.versionId],
    );
    if (rows.length === 0) return 'nothing_to_roll_back';
    const tally = new Map<string, number>();
    for (const m of rows) tally.set(m.previous_version_id, (tally.get(m.previous_version_id) ?? 0) + 1);
    const versionId = [...tally.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))[0][0];
    if (await findActiveRollout(tx, siteId, r.roostId, versionId)) return 'version_busy';
    const machines = rows.map((m) => m.machine_id);
    const policy = rollbackPolicy(r.policy);
    const targetVersions = new Map(
      rows.filter((m) => m.previous_version_id !== versionId).map((m) => [m.machine_id, m.previous_version_id]),
    );
    await insertRollout(tx, {
      siteId,
      rolloutId: id,
      roostId: r.roostId,
      versionId,
      canary: [],
      fleet: machines,
      extractRoot: r.extractRoot,
      policy,
      scheduleAt: null,
      workflowId: rollbackWorkflowId(siteId, rolloutId),
      createdBy,
      waves: [machines],
      waveNames: ['rollback'],
      stage: 'started',
      rollbackOf: rolloutId,
      targetVersions,
    });
    await tx.query('UPDATE rollouts SET rolled_back_by = $3, updated_at = now() WHERE site_id = $1 AND rollout_id = $2', [
      siteId,
      rolloutId,
      id,
    ]);
    const created = await getRollout(tx, siteId, id);
    return { rollout: created as Rollout, machines: machines.length, created: true };
  });
}

/** Per-machine download estimate of a deploy (dry-run delta plan). */
export interface MachineDelta {
  machineId: string;
  currentVersionId: string | null;
  bytes: number;
  chunks: number;
}

/** Delta plan totals and the per-current-version groups. */
export interface DeltaPlan {
  machines: MachineDelta[];
  byCurrentVersion: { currentVersionId: string | null; machines: number; bytes: number; chunks: number }[];
  totals: { machines: number; bytes: number; chunks: number };
}

/**
 * What each machine would download to go to `versionId`: the distinct chunks of the target version
 * (version_chunks) that are not chunks of the version it reports committed now (a machine with no
 * committed version downloads every chunk). Computed once per distinct current version (a handful of
 * set-based queries, whatever the number of machines). Writes nothing. `machines` keeps input order.
 */
export async function deltaPlan(
  q: Queryable,
  siteId: string,
  roostId: string,
  versionId: string,
  machineIds: readonly string[],
): Promise<DeltaPlan> {
  const { rows: current } = await q.query<{ machine_id: string; version_id: string | null }>(
    `SELECT t.machine_id, ts.reported_version_id AS version_id FROM UNNEST($3::text[]) AS t (machine_id)
       LEFT JOIN roost_target_states AS ts ON ts.site_id = $1 AND ts.roost_id = $2 AND ts.machine_id = t.machine_id AND ts.status = 'committed'`,
    [siteId, roostId, machineIds],
  );
  const currentOf = new Map(current.map((r) => [r.machine_id, r.version_id]));
  const versions = [...new Set(current.map((r) => r.version_id).filter((v): v is string => v !== null))];
  const { rows: deltas } = await q.query<{ base: string | null; bytes: string; chunks: number }>(
    `SELECT b.base, CAST(COALESCE(sum(vc.size), 0) AS BIGINT) AS bytes, CAST(count(vc.hash) AS INT) AS chunks
       FROM (SELECT CAST(NULL AS TEXT) AS base UNION ALL SELECT u FROM UNNEST($4::text[]) AS u) AS b
       LEFT JOIN version_chunks AS vc ON vc.site_id = $1 AND vc.roost_id = $2 AND vc.version_id = $3
            AND NOT EXISTS (SELECT 1 FROM version_chunks AS p WHERE p.site_id = $1 AND p.roost_id = $2 AND p.version_id = b.base AND p.hash = vc.hash)
      GROUP BY b.base`,
    [siteId, roostId, versionId, versions],
  );
  const deltaOf = new Map(deltas.map((d) => [d.base, { bytes: Number(d.bytes), chunks: Number(d.chunks) }]));
  const machines: MachineDelta[] = machineIds.map((m) => {
    const cur = currentOf.get(m) ?? null;
    const d = deltaOf.get(cur) ?? { bytes: 0, chunks: 0 };
    return { machineId: m, currentVersionId: cur, bytes: d.bytes, chunks: d.chunks };
  });
  const groups = new Map<string | null, { currentVersionId: string | null; machines: number; bytes: number; chunks: number }>();
  const totals = { machines: machines.length, bytes: 0, chunks: 0 };
  for (const m of machines) {
    let g = groups.get(m.currentVersionId);
    if (!g) groups.set(m.currentVersionId, (g = { currentVersionId: m.currentVersionId, machines: 0, bytes: 0, chunks: 0 }));
    g.machines++;
    g.bytes += m.bytes;
    g.chunks += m.chunks;
    totals.bytes += m.bytes;
    totals.chunks += m.chunks;
  }
  return { machines, byCurrentVersion: [...groups.values()], totals };
}

/** Machine counts by status for each of `rolloutIds` (one grouped query). */
export async function countsByRollout(q: Queryable, siteId: string, rolloutIds: readonly string[]): Promise<Map<string, WaveCounts>> {
  const out = new Map<string, WaveCounts>();
  if (rolloutIds.length === 0) return out;
  const { rows } = await q.query<{ rollout_id: string; status: string; n: number; timed_out: number }>(
    `SELECT rollout_id, status, CAST(count(*) AS INT) AS n, CAST(sum(CASE WHEN last_error = 'timeout' THEN 1 ELSE 0 END) AS INT) AS timed_out
       FROM rollout_machines WHERE site_id = $1 AND rollout_id = ANY($2::text[]) GROUP BY rollout_id, status`,
    [siteId, rolloutIds],
  );
  for (const id of rolloutIds) out.set(id, emptyCounts());
  for (const r of rows) addCount(out.get(r.rollout_id) as WaveCounts, r.status, Number(r.n), Number(r.timed_out));
  return out;
}

/**
 * Rollouts of all sites by stage and control state (metrics: `roost_rollouts`, docs/observability.md).
 * Rows written before rollout control have no state: running while active, else their stage.
 */
export async function countRolloutsByStageAndState(db: Queryable): Promise<{ stage: string; state: string; count: number }[]> {
  const { rows } = await db.query<{ stage: string; state: string; n: number }>(
    `SELECT stage, COALESCE(state, CASE WHEN active THEN 'running' ELSE stage END) AS state, CAST(count(*) AS INT) AS n
       FROM rollouts GROUP BY 1, 2`,
  );
  return rows.map((r) => ({ stage: r.stage, state: r.state, count: Number(r.n) }));
}

/** An active rollout that may have lost its workflow start (`unstartedRollouts`). */
export interface UnstartedRollout {
  siteId: string;
  rolloutId: string;
  workflowId: string;
}

/**
 * Active rollouts created at least `olderThanMs` ago (database clock) none of whose machines was ever
 * dispatched, oldest first, at most `limit`: the candidates for a rollout whose API process died between
 * committing the row and starting its workflow (services/rollouts.ts `failLostRolloutStarts` asks Temporal
 * which of them have no workflow). A scheduled rollout, or one waiting for its window, is a candidate too
 * and is then found running.
 */
export async function unstartedRollouts(q: Queryable, olderThanMs: number, limit: number): Promise<UnstartedRollout[]> {
  const { rows } = await q.query<{ site_id: string; rollout_id: string; workflow_id: string }>(
    `SELECT r.site_id, r.rollout_id, r.workflow_id FROM rollouts AS r
      WHERE r.active AND r.created_at <= now() - $1::float8 * INTERVAL '1 millisecond'
        AND NOT EXISTS (SELECT 1 FROM rollout_machines AS rm
                         WHERE rm.site_id = r.site_id AND rm.rollout_id = r.rollout_id AND (rm.status <> 'pending' OR rm.attempts > 0))
      ORDER BY r.created_at, r.rollout_id LIMIT $2`,
    [olderThanMs, limit],
  );
  return rows.map((r) => ({ siteId: r.site_id, rolloutId: r.rollout_id, workflowId: r.workflow_id }));
}

/**
 * Active rollouts of roosts deleted at least `deletedBeforeMs` ago (database clock), oldest first, at most
 * `limit`: the rollouts whose abort the delete could not send (services/rollouts.ts
 * `abortDeletedRoostRollouts`). Starts from the active rollouts (partial index rollouts_one_active) and reads
 * each one's roost by primary key.
 */
export async function activeRolloutsOfDeletedRoosts(q: Queryable, deletedBeforeMs: number, limit: number): Promise<Rollout[]> {
  const { rows } = await q.query<RolloutRow>(
    `SELECT ${ROLLOUT_COLUMNS} FROM rollouts AS r
      WHERE r.active
        AND EXISTS (SELECT 1 FROM roosts AS ro WHERE ro.site_id = r.site_id AND ro.roost_id = r.roost_id
                       AND ro.deleted_at <= now() - $1::float8 * INTERVAL '1 millisecond')
      ORDER BY r.created_at, r.rollout_id LIMIT $2`,
    [deletedBeforeMs, limit],
  );
  return rows.map(toRollout);
}
