/**
 * Activities of the rollout workflow (workflows/rollout.ts; SPEC.md "Rollout"; DESIGN.md "Temporal").
 *
 * Payloads carry ids and counts only, never machine lists. Every activity is idempotent (it may run again
 * after a worker crash): stage changes are guarded by the stored stage, events have deterministic ids,
 * commands have deterministic ids. Business failures are non-retryable `ApplicationFailure`s whose `type`
 * is one of `RolloutFailureType`; anything else (database down, worker shutdown) is retried by Temporal.
 */
import { Context, log } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import type { ActivityDeps } from './index';
import {
  RolloutPolicy,
  RolloutStage,
  StageChange,
  TERMINAL_STAGES,
  Wave,
  WaveCounts,
  dbNowPlus,
  dispatchDue,
  getRollout,
  getWaveTarget,
  reconcileWave,
  recordRolloutStarted,
  setRolloutStage,
} from '../db/rollouts';
import { getRoost } from '../db/roosts';

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
}

/** Result of dispatching a wave. */
export interface DispatchResult {
  dispatched: number;
  /** Wave deadline, epoch ms on the database clock: unfinished machines fail with `timeout` then. */
  deadline: number;
}

/** A wave to watch. */
export interface WatchInput extends RolloutRef {
  wave: Wave;
  /** From DispatchResult.deadline. */
  deadline: number;
}

function businessFailure(type: RolloutFailureType, message: string): ApplicationFailure {
  return ApplicationFailure.create({ type, message, nonRetryable: true });
}

/** Builds the rollout activities over their dependencies (`createActivities` merges them). */
export function createRolloutActivities({ db }: ActivityDeps) {
  async function waveTarget(ref: RolloutRef) {
    const t = await getWaveTarget(db, ref.siteId, ref.rolloutId);
    if (!t) throw businessFailure('version_missing', `rollout ${ref.rolloutId} or its version no longer exists`);
    return t;
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
    async dispatchWave(input: RolloutRef & { wave: Wave }): Promise<DispatchResult> {
      const t = await waveTarget(input);
      const roost = await getRoost(db, input.siteId, t.roostId);
      if (!roost) throw businessFailure('roost_deleted', `roost ${t.roostId} was deleted during the rollout`);
      const deadline = await dbNowPlus(db, t.policy.waveTimeoutMs);
      const dispatched = await dispatchDue(db, t, input.wave, t.policy.waveTimeoutMs);
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
    async watchWave(input: WatchInput): Promise<WaveCounts> {
      const ctx = Context.current();
      const t = await waveTarget(input);
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

export type RolloutActivities = ReturnType<typeof createRolloutActivities>;
