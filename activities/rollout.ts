/**
 * Activities of the rollout workflow (workflows/rollout.ts; docs/decisions/rollout-control.md,
 * docs/decisions/rollout-machine-outcomes.md). All SQL is db/rollouts.ts's.
 *
 * Payloads carry ids and counts only, never machine lists. Every activity is idempotent (it may run again
 * after a worker crash): stage changes are guarded by the stored stage, events have deterministic ids,
 * commands have deterministic ids. Business failures are non-retryable `ApplicationFailure`s whose `type`
 * is one of `RolloutFailureType`; anything else (database down, worker shutdown) is retried by Temporal.
 *
 * Rollouts started before rollout control run the fixed canary-then-fleet path of the workflow: it
 * addresses waves by name (`Wave`) with one deadline per wave; `dispatchWave` and `watchWave` keep that
 * form for them. Every other rollout addresses waves by index.
 */
import { Context, log } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import type { ActivityDeps } from './deps';
import { commandOrigin } from '../telemetry/tracing';
import {
  type StageChange,
  activateStaged,
  createRollbackRollout,
  dbNowPlus,
  dispatchDue,
  dispatchDueIn,
  getRollout,
  getWaveTarget,
  reconcileWave,
  reconcileWaves,
  retryStalledSyncs,
  type StalledSync,
  stalledSyncs,
  type WaveTarget,
  recordRolloutStarted,
  recordRolloutTransition,
  rolloutState,
  setCurrentWave,
  setRolloutStage,
  siteTimezone,
} from '../db/rollouts';
import { getRoost } from '../db/roosts';
import {
  type HistoryEntry,
  type RolloutStage,
  type RolloutState,
  TERMINAL_STAGES,
  type Wave,
  type WaveCounts,
  type WavePlan,
  sumCounts,
} from '../domain/rollout';
import { type RolloutPolicy, maxFailures, successTarget, windowDelayMs } from '../domain/rollout-policy';
import { isIanaTimeZone } from '../domain/users';

/** Workflow input: ids only. */
export interface RolloutRef {
  siteId: string;
  rolloutId: string;
}

/** `type` of the non-retryable failures the rollout activities throw; also used as `abortReason`. */
export type RolloutFailureType = 'rollout_not_found' | 'roost_deleted' | 'version_missing';

/** What the workflow needs to run a rollout (small and independent of the number of machines). */
export interface RolloutPlan {
  roostId: string;
  versionId: string;
  stage: RolloutStage;
  /** True when the rollout already ended (the workflow then returns at once). */
  terminal: boolean;
  /** Milliseconds until scheduleAt (0 when unscheduled or due), measured when the activity ran. */
  delayMs: number;
  policy: RolloutPolicy;
  canaryCount: number;
  fleetCount: number;
  /** The waves in order (names and sizes), and the rollout undone when this is a rollback. */
  waves?: WavePlan[];
  rollbackOf?: string | null;
}

/** Which part of a wave a watcher waits for (rollouts with rollout control). */
export type WatchPhase = 'sync' | 'stage' | 'activate';

/** How a watched wave ended (rollouts with rollout control). */
export type WaveOutcome = 'done' | 'advance' | 'tripped' | 'aborted';

/** Counts of the watched waves plus, for rollouts with rollout control, how the watch ended. */
export interface WatchResult extends WaveCounts {
  outcome?: WaveOutcome;
}

/** A transition the workflow records on the rollout (rollouts.state and rollouts.history). */
export interface TransitionInput extends RolloutRef {
  seq: number;
  action: string;
  state?: RolloutState;
  by?: string;
  wave?: number;
  detail?: Record<string, unknown>;
}

/** A rollback rollout created by the workflow (ids only), or why none was. */
export type RollbackStart =
  { rolloutId: string; workflowId: string; roostId: string; versionId: string; machines: number } | { refused: string };

/** Result of dispatching a wave. */
export interface DispatchResult {
  dispatched: number;
  /** Wave deadline, epoch ms on the database clock: unfinished machines fail with `timeout` then. */
  deadline: number;
}

/**
 * A wave to watch: a name (the fixed canary-then-fleet path of rollouts started before rollout control) or
 * an index into the rollout's waves.
 */
export interface WatchInput extends RolloutRef {
  wave: Wave | number;
  /** From DispatchResult.deadline when `wave` is a name (epoch ms); waves by index use per-machine deadlines. */
  deadline: number;
  phase?: WatchPhase;
  /** True for the last wave: never advance early, wait for every machine. */
  last?: boolean;
}

function businessFailure(type: RolloutFailureType, message: string): ApplicationFailure {
  return ApplicationFailure.create({ type, message, nonRetryable: true });
}

/** Builds the rollout activities over their dependencies (`createActivities` merges them). */
export function createRolloutActivities({ db, cfg }: ActivityDeps) {
  const stallMs = cfg.ROOST_COMMAND_STALL_MS;
  async function waveTarget(ref: RolloutRef) {
    const t = await getWaveTarget(db, ref.siteId, ref.rolloutId);
    if (!t) throw businessFailure('version_missing', `rollout ${ref.rolloutId} or its version no longer exists`);
    // Commands this activity dispatches carry its span, so the agents' requests join the rollout's trace,
    // and the request id of its log context, so the agents' lines name the request (docs/observability.md).
    return { ...t, ...commandOrigin() };
  }

  /**
   * Watcher over waves 0..`index` (stragglers of earlier waves included): reconciles, retries failed,
   * timed-out and stalled syncs within the retry budget (not while paused), and returns when the rollout
   * was aborted, the failure threshold tripped (once nothing is in flight), every machine finished its
   * phase, or (sync phase, not the last wave) the wave reached its success threshold.
   */
  async function watchWaves(
    ctx: Context,
    t: NonNullable<Awaited<ReturnType<typeof getWaveTarget>>>,
    index: number,
    phase: WatchPhase,
    last: boolean,
  ): Promise<WatchResult> {
    const names = t.rollout.waves.slice(0, index + 1).map((w) => w.name);
    const current = t.rollout.waves[index];
    const population = t.rollout.waves.slice(0, index + 1).reduce((a, w) => a + w.size, 0);
    const maxFailed = maxFailures(t.policy.failureThreshold ?? { count: 0 }, population);
    const target = successTarget(t.policy.successThreshold ?? null, current.size);
    const staged = (t.policy.activation ?? 'immediate') !== 'immediate';
    const pollMs = Math.max(50, t.policy.pollIntervalMs);
    /**
     * Stalled syncs this attempt has watched, by machine, command and last progress → when first seen
     * (epoch ms). A sync is given up only after this watcher saw it stalled for `stallMs` without a break, so
     * an outage (which fails the attempt; the next one starts with an empty map) never counts against the
     * agents: their reports land once it ends.
     */
    const stalledSince = new Map<string, number>();
    for (;;) {
      const state = await rolloutState(db, t.siteId, t.rolloutId);
      const byWave = await reconcileWaves(db, t, names);
      const all = sumCounts(byWave.values());
      ctx.heartbeat(all);
      if (state === null || state === 'aborted' || !['running', 'paused', 'awaiting_promotion', 'waiting_window'].includes(state))
        return { ...all, outcome: 'aborted' };
      const inFlight = all.dispatched + (all.activating ?? 0);
      if (all.failed > maxFailed && inFlight === 0) return { ...all, outcome: 'tripped' };
      if (all.pending + inFlight === 0) return { ...all, outcome: all.failed > maxFailed ? 'tripped' : 'done' };
      const w = byWave.get(current.name);
      if (phase === 'sync' && !last && w && w.succeeded >= target) return { ...all, outcome: 'advance' };
      if (all.dispatched > 0 && state !== 'paused') await retryStalled(t, names, stalledSince);
      if (all.pending > 0 && state !== 'paused')
        await dispatchDueIn(db, t, names, t.policy.waveTimeoutMs, { staged: staged && phase === 'stage' }, () => ctx.heartbeat(all));
      await ctx.sleep(pollMs);
    }
  }

  /**
   * Notices syncs whose agent stopped reporting progress (db/rollouts.ts stalledSyncs) and, once this
   * watcher has seen one stalled for `stallMs` in a row, cancels its command and sends the machine back to
   * pending within the retry budget (retryStalledSyncs); the dispatch that follows sends a new attempt.
   */
  async function retryStalled(t: WaveTarget, names: readonly string[], stalledSince: Map<string, number>): Promise<void> {
    const now = Date.now();
    const seen = new Set<string>();
    const due: StalledSync[] = [];
    for (const s of await stalledSyncs(db, t, names, stallMs)) {
      const key = `${s.machineId}|${s.commandId}|${s.progressAt}`;
      seen.add(key);
      const since = stalledSince.get(key) ?? now;
      stalledSince.set(key, since);
      if (now - since >= stallMs) due.push(s);
    }
    for (const key of stalledSince.keys()) if (!seen.has(key)) stalledSince.delete(key);
    if (due.length === 0) return;
    const moved = await retryStalledSyncs(db, t, due, stallMs);
    for (const s of due) stalledSince.delete(`${s.machineId}|${s.commandId}|${s.progressAt}`);
    log.warn('stalled syncs given up and sent back for another attempt', { rolloutId: t.rolloutId, machines: moved });
  }

  return {
    /**
     * Reads the rollout's plan. Throws `rollout_not_found` (non-retryable) when the row is missing.
     */
    async loadRollout(ref: RolloutRef): Promise<RolloutPlan> {
      const r = await getRollout(db, ref.siteId, ref.rolloutId);
      if (!r) throw businessFailure('rollout_not_found', `rollout ${ref.rolloutId} not found in site ${ref.siteId}`);
      const delayMs = r.scheduleAt ? Math.max(0, r.scheduleAt.getTime() - Date.now()) : 0;
      return {
        roostId: r.roostId,
        versionId: r.versionId,
        stage: r.stage,
        terminal: TERMINAL_STAGES.includes(r.stage),
        delayMs,
        policy: r.policy,
        canaryCount: r.canary.length,
        fleetCount: r.fleet.length,
        waves: r.waves,
        rollbackOf: r.rollbackOf,
      };
    },

    /** Records `deployment.started` once (outbox). Returns false when the rollout already ended. */
    async markRolloutStarted(ref: RolloutRef): Promise<boolean> {
      return recordRolloutStarted(db, ref.siteId, ref.rolloutId);
    },

    /**
     * Queues sync_pull commands for every pending machine of the wave (batched, idempotent) and returns
     * the count and the wave deadline (now + policy.waveTimeoutMs). Throws `roost_deleted` when the roost
     * was deleted, `version_missing` when the version is gone.
     */
    async dispatchWave(input: RolloutRef & { wave: Wave | number }): Promise<DispatchResult> {
      const t = await waveTarget(input);
      const roost = await getRoost(db, input.siteId, t.roostId);
      if (!roost) throw businessFailure('roost_deleted', `roost ${t.roostId} was deleted during the rollout`);
      const deadline = await dbNowPlus(db, t.policy.waveTimeoutMs);
      let dispatched: number;
      if (typeof input.wave === 'number') {
        const name = t.rollout.waves[input.wave]?.name;
        if (!name) throw businessFailure('rollout_not_found', `rollout ${input.rolloutId} has no wave ${input.wave}`);
        await setCurrentWave(db, input.siteId, input.rolloutId, input.wave);
        const staged = (t.policy.activation ?? 'immediate') !== 'immediate';
        dispatched = await dispatchDueIn(db, t, [name], t.policy.waveTimeoutMs, { staged });
      } else {
        dispatched = await dispatchDue(db, t, input.wave, t.policy.waveTimeoutMs);
      }
      log.info('rollout wave dispatched', { rolloutId: input.rolloutId, wave: input.wave, dispatched });
      return { dispatched, deadline: deadline.getTime() };
    },

    /**
     * Watches a wave until every machine is succeeded or failed: polls the database in aggregate every
     * policy.pollIntervalMs, re-dispatches failed machines within the retry budget after their backoff,
     * fails the unfinished ones at the deadline, and heartbeats the counts on every poll (so a crashed
     * worker is noticed within the heartbeat timeout and another worker resumes from the database).
     * Returns the wave's counts.
     */
    async watchWave(input: WatchInput): Promise<WatchResult> {
      const ctx = Context.current();
      const t = await waveTarget(input);
      if (typeof input.wave === 'number') return watchWaves(ctx, t, input.wave, input.phase ?? 'sync', input.last ?? true);
      const deadline = new Date(input.deadline);
      const pollMs = Math.max(50, t.policy.pollIntervalMs);
      for (;;) {
        const counts = await reconcileWave(db, t, input.wave, deadline);
        ctx.heartbeat(counts);
        if (counts.pending === 0 && counts.dispatched === 0) return counts;
        if (counts.pending > 0) await dispatchDue(db, t, input.wave, Math.max(0, input.deadline - Date.now()), () => ctx.heartbeat(counts));
        await ctx.sleep(pollMs); // throws CancelledFailure on cancellation or worker shutdown
      }
    },

    /**
     * Queues roost_activate for the staged machines of waves `from`..`to` and moves them to activating
     * (db/rollouts.ts activateStaged). Returns how many were queued.
     */
    async activateWaves(input: RolloutRef & { from: number; to: number }): Promise<number> {
      const t = await waveTarget(input);
      const names = t.rollout.waves.slice(input.from, input.to + 1).map((w) => w.name);
      return activateStaged(db, t, names);
    },

    /** Records a workflow transition (state with its seq, history entry once). */
    async recordTransition(input: TransitionInput): Promise<void> {
      const entry: Omit<HistoryEntry, 'at'> = { seq: input.seq, action: input.action };
      if (input.state !== undefined) entry.state = input.state;
      if (input.by !== undefined) entry.by = input.by;
      if (input.wave !== undefined) entry.wave = input.wave;
      if (input.detail !== undefined) entry.detail = input.detail;
      const ok = await recordRolloutTransition(db, input.siteId, input.rolloutId, entry);
      if (!ok) throw businessFailure('rollout_not_found', `rollout ${input.rolloutId} not found in site ${input.siteId}`);
    },

    /**
     * Milliseconds until the rollout's maintenance window opens (0: open now, or no window), measured now
     * in the site's timezone (sites.timezone; UTC when unknown).
     */
    async windowDelay(ref: RolloutRef): Promise<number> {
      const r = await getRollout(db, ref.siteId, ref.rolloutId);
      const w = r?.policy.maintenanceWindow;
      if (!w) return 0;
      const stored = await siteTimezone(db, ref.siteId);
      const tz = stored && isIanaTimeZone(stored) ? stored : 'UTC';
      return windowDelayMs(w, tz, Date.now());
    },

    /** Creates the rollback rollout of this (terminal, failed) rollout; ids only, or why not. */
    async createRollback(input: RolloutRef & { by?: string }): Promise<RollbackStart> {
      const r = await getRollout(db, input.siteId, input.rolloutId);
      if (!r) throw businessFailure('rollout_not_found', `rollout ${input.rolloutId} not found in site ${input.siteId}`);
      const out = await createRollbackRollout(db, input.siteId, input.rolloutId, input.by ?? r.createdBy);
      if (typeof out === 'string') return { refused: out };
      return {
        rolloutId: out.rollout.rolloutId,
        workflowId: out.rollout.workflowId,
        roostId: out.rollout.roostId,
        versionId: out.rollout.versionId,
        machines: out.machines,
      };
    },

    /**
     * Moves the rollout to `stage` with its event in one transaction (db/rollouts.ts setRolloutStage).
     * A terminal rollout is left as it is. Throws `rollout_not_found` (non-retryable) when it is gone.
     */
    async changeRolloutStage(input: RolloutRef & { stage: RolloutStage; abortReason?: string }): Promise<StageChange> {
      const change = await setRolloutStage(db, input.siteId, input.rolloutId, input.stage, input.abortReason ?? null);
      if (!change) throw businessFailure('rollout_not_found', `rollout ${input.rolloutId} not found in site ${input.siteId}`);
      return change;
    },
  };
}

/** The rollout activities by name (workflows import them by type through `Activities`). */
export type RolloutActivities = ReturnType<typeof createRolloutActivities>;
