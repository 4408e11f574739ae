/**
 * `rolloutWorkflow`: the rollout of `POST /api/roosts/{roostId}/deploy` (and of
 * `POST /api/roosts/{roostId}/rollouts/{rolloutId}/rollback`); docs/decisions/rollout-stages.md,
 * docs/decisions/rollout-control.md. Deterministic code only: it imports domain types and activity types,
 * every activity has explicit timeouts, and the payloads carry ids and counts, never machine lists. The
 * client side (ids, starts, the updates below sent by their definitions) is workflows/client.ts.
 *
 * 1. `loadRollout` (plan: ids, policy, delay until scheduleAt); search attributes RoostSiteId,
 *    RoostRoostId, RoostVersionId, RoostStage (workflows/search-attributes.ts).
 * 2. Durable timer until scheduleAt (the delay is measured by the activity, so no clock here); an abort
 *    meanwhile ends the rollout at once (SCHEDULE_ABORT_PATCH).
 * 3. `markRolloutStarted` → `deployment.started` (stage canary); then (behind
 *    `patched('rollout-verify-chunks-v1')`) `verifyVersionChunks`: the server re-hashes every chunk of the
 *    version not verified yet, and a chunk whose bytes are wrong ends the rollout as failed
 *    (`chunk_verify_failed`) before any machine is sent it (docs/decisions/chunk-integrity.md).
 * 4. Waves in order (`controlledRollout`, behind `patched('rollout-control-v1')`): the policy's waves, bake
 *    timers, manual gates (`promote`), maintenance windows (the activity measures the delay), `pause` /
 *    `resume` / `abort` updates with validators, a `status` query, failure thresholds with an automatic
 *    rollback as a child workflow, and stage-then-activate.
 * 5. Stage changes and their events commit together (`changeRolloutStage`); RoostStage follows each change.
 *
 * Histories recorded before rollout control existed have no patch marker and replay on the fixed
 * canary-then-fleet path kept below (`fixedCanaryThenFleet`): canary wave, any failure → failed
 * (`canary_failed`); stage `started`; fleet wave, any failure → failed (`retry_budget_exhausted`, or
 * `wave_timeout` when every failure was a timeout); else completed. Keep it as it is: it exists for replay
 * and for runs started before the patch.
 *
 * The history has a fixed number of events whatever the number of machines (66 for a completed two-wave
 * rollout, 10,000 machines included, 8 of them the chunk verification step; 12 more per further wave).
 * Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import {
  ActivityFailure,
  ApplicationFailure,
  CancellationScope,
  ParentClosePolicy,
  allHandlersFinished,
  condition,
  defineQuery,
  defineUpdate,
  executeChild,
  isCancellation,
  patched,
  proxyActivities,
  setHandler,
  sleep,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { Activities } from '../activities';
import type { RolloutFailureType, RolloutPlan, RolloutRef, WatchPhase, WatchResult } from '../activities/rollout';
import type { RolloutStage, RolloutState, Wave, WaveCounts } from '../domain/rollout';
import { RoostRoostId, RoostSiteId, RoostStage, RoostVersionId, rolloutSearchAttributes } from './search-attributes';

/** How the workflow ended. */
export interface RolloutOutcome {
  rolloutId: string;
  stage: RolloutStage;
  succeeded: number;
  failed: number;
  abortReason: string | null;
  /** The automatic rollback's rollout id and stage, when one ran. */
  rollback?: { rolloutId: string; stage: RolloutStage; succeeded: number; failed: number } | null;
}

/** Who asks for a control action, and why (optional). */
export interface ControlArgs {
  by: string;
  reason?: string;
}

/** What a control update answers: the rollout's control state after it. */
export interface ControlResult {
  rolloutId: string;
  state: RolloutState;
  stage: RolloutStage;
  wave: number | null;
}

/** What the `status` query answers. */
export interface RolloutRuntime extends ControlResult {
  waiting: 'pause' | 'promotion' | 'window' | 'bake' | 'schedule' | null;
}

/** `type` of the ApplicationFailure a control update's validator rejects with (the client maps it to 409). */
export const CONTROL_CONFLICT = 'conflict';

/**
 * Control updates of the rollout workflow, sent by workflows/client.ts `controlRollout` for
 * `POST /api/roosts/{roostId}/rollouts/{rolloutId}/{pause|resume|promote|abort}`; each validator rejects
 * with a `CONTROL_CONFLICT` failure. `status` answers the control state and what the workflow waits for.
 */
export const pauseUpdate = defineUpdate<ControlResult, [ControlArgs]>('pause');
export const resumeUpdate = defineUpdate<ControlResult, [ControlArgs]>('resume');
export const promoteUpdate = defineUpdate<ControlResult, [ControlArgs]>('promote');
export const abortUpdate = defineUpdate<ControlResult, [ControlArgs]>('abort');
export const statusQuery = defineQuery<RolloutRuntime>('status');

/**
 * Patch id of rollout control (rollouts started before it keep the fixed canary-then-fleet path on replay).
 * Never rename it: recorded histories carry it.
 */
export const CONTROL_PATCH = 'rollout-control-v1';

/**
 * Patch id of the chunk verification every rollout runs before its first wave (rollouts started before it
 * replay without it). Never rename it: recorded histories carry it.
 */
export const VERIFY_PATCH = 'rollout-verify-chunks-v1';

/**
 * Patch id of the scheduled start an abort ends at once (before it, an aborted scheduled rollout stayed
 * active, holding its version, until scheduleAt). Never rename it: recorded histories carry it.
 */
export const SCHEDULE_ABORT_PATCH = 'rollout-schedule-abort-v1';

/**
 * Patch id of the maintenance-window wait an abort ends without a `window_open` record (before it, the
 * history said the window opened at the moment of the abort). Never rename it: recorded histories carry it.
 */
export const WINDOW_ABORT_PATCH = 'rollout-window-abort-v1';

/** abortReason of a rollout whose version references chunks whose stored bytes do not hash to their digest. */
export const CHUNK_VERIFY_FAILED = 'chunk_verify_failed';

/** Business failure types that end the rollout as failed (they are also its abortReason). */
const BUSINESS_FAILURES: readonly RolloutFailureType[] = ['rollout_not_found', 'roost_deleted', 'version_missing'];

/** Extra time a wave watcher gets past the wave timeout before Temporal gives up on the attempt. */
const WAVE_TIMEOUT_MARGIN_MS = 5 * 60 * 1000;

const { loadRollout, markRolloutStarted, changeRolloutStage, dispatchWave } = proxyActivities<Activities>({
  startToCloseTimeout: '2 minutes',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
});

function businessFailureType(err: unknown): RolloutFailureType | undefined {
  if (err instanceof ActivityFailure && err.cause instanceof ApplicationFailure) {
    const type = err.cause.type as RolloutFailureType | undefined;
    if (type && BUSINESS_FAILURES.includes(type)) return type;
  }
  return undefined;
}

/** Runs one rollout to its end. Input: ids only. */
export async function rolloutWorkflow(input: RolloutRef): Promise<RolloutOutcome> {
  const plan = await loadRollout(input);
  upsertSearchAttributes([
    { key: RoostSiteId, value: input.siteId },
    { key: RoostRoostId, value: plan.roostId },
    { key: RoostVersionId, value: plan.versionId },
    { key: RoostStage, value: plan.stage },
  ]);

  const finish = async (stage: RolloutStage, abortReason?: string): Promise<RolloutOutcome> => {
    const r = await changeRolloutStage({ ...input, stage, abortReason });
    upsertSearchAttributes([{ key: RoostStage, value: r.stage }]);
    return { rolloutId: input.rolloutId, stage: r.stage, succeeded: r.succeeded, failed: r.failed, abortReason: r.abortReason };
  };
  if (plan.terminal) return finish(plan.stage);

  if (patched(CONTROL_PATCH)) return controlledRollout(input, plan, finish);
  return fixedCanaryThenFleet(input, plan, finish);
}

/**
 * The fixed canary-then-fleet path of rollouts started before rollout control (histories without the
 * `rollout-control-v1` marker replay here): waves by name with one deadline each, no control updates.
 * Kept unchanged for replay and for runs started before the patch.
 */
async function fixedCanaryThenFleet(
  input: RolloutRef,
  plan: RolloutPlan,
  finish: (stage: RolloutStage, abortReason?: string) => Promise<RolloutOutcome>,
): Promise<RolloutOutcome> {
  const { watchWave } = proxyActivities<Activities>({
    startToCloseTimeout: plan.policy.waveTimeoutMs + WAVE_TIMEOUT_MARGIN_MS,
    heartbeatTimeout: '15 seconds',
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  });
  const runWave = async (wave: Wave): Promise<WaveCounts> => {
    const { deadline } = await dispatchWave({ ...input, wave });
    return watchWave({ ...input, wave, deadline });
  };

  try {
    if (plan.delayMs > 0) await sleep(plan.delayMs);
    if (!(await markRolloutStarted(input))) return finish('failed', 'ended');

    const canary = await runWave('canary');
    if (canary.failed > 0) return finish('failed', 'canary_failed');

    await changeRolloutStage({ ...input, stage: 'started' });
    upsertSearchAttributes([{ key: RoostStage, value: 'started' }]);
    if (plan.fleetCount > 0) {
      const fleet = await runWave('fleet');
      if (fleet.failed > 0) return finish('failed', fleet.failed === fleet.timedOut ? 'wave_timeout' : 'retry_budget_exhausted');
    }
    return finish('completed');
  } catch (err) {
    if (isCancellation(err)) {
      await CancellationScope.nonCancellable(() => finish('failed', 'cancelled'));
      throw err;
    }
    const type = businessFailureType(err);
    if (type === 'rollout_not_found') throw err; // nothing left to record the outcome on
    if (type) return finish('failed', type);
    throw err;
  }
}

function conflict(message: string): ApplicationFailure {
  return ApplicationFailure.create({ type: CONTROL_CONFLICT, message, nonRetryable: true });
}

/**
 * The rollout-control path (every rollout started since `rollout-control-v1`): waves from the policy, bake
 * time, manual gates, maintenance windows, pause / resume / promote / abort updates, failure thresholds with
 * optional automatic rollback, and staged activation. Every wait is a durable timer or `condition`; every
 * clock reading is an activity's.
 */
async function controlledRollout(
  input: RolloutRef,
  plan: RolloutPlan,
  finish: (stage: RolloutStage, abortReason?: string) => Promise<RolloutOutcome>,
): Promise<RolloutOutcome> {
  const { dispatchWave, recordTransition, windowDelay, activateWaves, createRollback, changeRolloutStage } = proxyActivities<Activities>({
    startToCloseTimeout: '2 minutes',
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
  });
  const { watchWave } = proxyActivities<Activities>({
    startToCloseTimeout: plan.policy.waveTimeoutMs + WAVE_TIMEOUT_MARGIN_MS,
    heartbeatTimeout: '15 seconds',
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  });
  const { verifyVersionChunks } = proxyActivities<Activities>({
    startToCloseTimeout: '2 hours',
    heartbeatTimeout: '1 minute',
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
  });
  const policy = plan.policy;
  const waves = plan.waves ?? [
    { name: 'canary', size: plan.canaryCount },
    { name: 'fleet', size: plan.fleetCount },
  ];
  const activation = policy.activation ?? 'immediate';
  const gate = policy.requirePromotion ?? 'none';

  let stage: RolloutStage = plan.stage;
  let paused = false;
  let aborted = false;
  let awaitingPromotion = false;
  let inWindowWait = false;
  let ending = false;
  let wave: number | null = null;
  let waiting: RolloutRuntime['waiting'] = null;
  let seq = 0;
  /** Transition writes in flight: `status` reports no wait until they are stored (the database agrees). */
  let writing = 0;

  const state = (): RolloutState =>
    aborted ? 'aborted' : paused ? 'paused' : awaitingPromotion ? 'awaiting_promotion' : inWindowWait ? 'waiting_window' : 'running';
  const snapshot = (): ControlResult => ({ rolloutId: input.rolloutId, state: state(), stage, wave });
  const saStage = () => (state() === 'running' ? stage : state());
  const transition = async (action: string, extra: { by?: string; detail?: Record<string, unknown> } = {}) => {
    const s = ++seq;
    const st = state();
    upsertSearchAttributes([{ key: RoostStage, value: saStage() }]);
    writing++;
    try {
      await recordTransition({ ...input, seq: s, action, state: st, ...(wave !== null ? { wave } : {}), ...extra });
    } finally {
      writing--;
    }
  };
  const detail = (a: ControlArgs) => (a.reason ? { detail: { reason: a.reason } } : {});

  setHandler(statusQuery, () => ({ ...snapshot(), waiting: writing > 0 ? null : waiting }));
  setHandler(
    pauseUpdate,
    async (a) => {
      paused = true;
      await transition('pause', { by: a.by, ...detail(a) });
      return snapshot();
    },
    {
      validator: (_a: ControlArgs) => {
        if (ending || aborted) throw conflict('the rollout is ending');
        if (paused) throw conflict('the rollout is already paused');
      },
    },
  );
  setHandler(
    resumeUpdate,
    async (a) => {
      paused = false;
      await transition('resume', { by: a.by, ...detail(a) });
      return snapshot();
    },
    {
      validator: (_a: ControlArgs) => {
        if (ending || aborted) throw conflict('the rollout is ending');
        if (!paused) throw conflict('the rollout is not paused');
      },
    },
  );
  setHandler(
    promoteUpdate,
    async (a) => {
      awaitingPromotion = false;
      await transition('promote', { by: a.by, ...detail(a) });
      return snapshot();
    },
    {
      validator: (_a: ControlArgs) => {
        if (ending || aborted) throw conflict('the rollout is ending');
        if (!awaitingPromotion) throw conflict('the rollout is not waiting for promotion');
      },
    },
  );
  setHandler(
    abortUpdate,
    async (a) => {
      aborted = true;
      await transition('abort', { by: a.by, ...detail(a) });
      return snapshot();
    },
    {
      validator: (_a: ControlArgs) => {
        if (ending || aborted) throw conflict('the rollout is already ending');
      },
    },
  );

  const end = async (st: RolloutStage, reason?: string): Promise<RolloutOutcome> => {
    ending = true;
    await condition(allHandlersFinished);
    return finish(st, reason);
  };
  const endAborted = async (): Promise<RolloutOutcome> => {
    const out = await end('failed', 'aborted');
    upsertSearchAttributes([{ key: RoostStage, value: 'aborted' }]);
    return out;
  };

  /** Waits while paused (true when aborted meanwhile). */
  const holdWhilePaused = async (): Promise<boolean> => {
    if (paused) {
      waiting = 'pause';
      await condition(() => !paused || aborted);
      waiting = null;
    }
    return aborted;
  };

  const runRollback = async (outcome: RolloutOutcome, by?: string): Promise<RolloutOutcome> => {
    const rb = await createRollback({ ...input, ...(by ? { by } : {}) });
    if ('refused' in rb) {
      await recordTransition({ ...input, seq: ++seq, action: 'rollback_skipped', detail: { reason: rb.refused } });
      return { ...outcome, rollback: null };
    }
    await recordTransition({
      ...input,
      seq: ++seq,
      action: 'rollback_started',
      detail: { rollbackRolloutId: rb.rolloutId, machines: rb.machines },
    });
    const child = await executeChild(rolloutWorkflow, {
      workflowId: rb.workflowId,
      args: [{ siteId: input.siteId, rolloutId: rb.rolloutId }],
      taskQueue: workflowInfo().taskQueue,
      parentClosePolicy: ParentClosePolicy.ABANDON,
      memo: { rolloutId: rb.rolloutId },
      typedSearchAttributes: rolloutSearchAttributes({
        siteId: input.siteId,
        roostId: rb.roostId,
        versionId: rb.versionId,
        stage: 'started',
      }),
    });
    // The rollback's completion marks this rollout rolled_back in the database (db/rollouts.ts setRolloutStage).
    if (child.stage === 'completed') upsertSearchAttributes([{ key: RoostStage, value: 'rolled_back' }]);
    return { ...outcome, rollback: { rolloutId: rb.rolloutId, stage: child.stage, succeeded: child.succeeded, failed: child.failed } };
  };

  const tripped = async (index: number, r: WatchResult): Promise<RolloutOutcome> => {
    const reason =
      index === 0 && !plan.rollbackOf && waves.length > 1
        ? 'canary_failed'
        : r.failed > 0 && r.failed === r.timedOut
          ? 'wave_timeout'
          : 'retry_budget_exhausted';
    const out = await end('failed', reason);
    return policy.autoRollback ? runRollback(out) : out;
  };

  const watch = (index: number, phase: WatchPhase, last: boolean) => watchWave({ ...input, wave: index, deadline: 0, phase, last });

  try {
    if (plan.delayMs > 0) {
      waiting = 'schedule';
      if (patched(SCHEDULE_ABORT_PATCH)) {
        // An abort while waiting for scheduleAt ends the rollout now: it is terminal, its machines
        // cancelled, and its version free for another deploy (docs/decisions/rollout-control.md).
        await condition(() => aborted, plan.delayMs);
        waiting = null;
        if (aborted) return endAborted();
      } else {
        await sleep(plan.delayMs);
      }
      waiting = null;
    }
    if (!(await markRolloutStarted(input))) return end('failed', 'ended');
    if (patched(VERIFY_PATCH)) {
      // No machine is sent bytes the service has not hashed once (docs/decisions/chunk-integrity.md).
      const verified = await verifyVersionChunks({ siteId: input.siteId, roostId: plan.roostId, versionId: plan.versionId, order: 'desc' });
      if (verified.failed > 0) return end('failed', CHUNK_VERIFY_FAILED);
    }
    const lastIndex = waves.length - 1;
    for (let i = 0; i <= lastIndex; i++) {
      if (waves[i].size === 0) continue;
      if (i > 0) {
        if (stage === 'canary') {
          stage = 'started';
          await changeRolloutStage({ ...input, stage: 'started' });
          upsertSearchAttributes([{ key: RoostStage, value: saStage() }]);
        }
        if ((policy.bakeMs ?? 0) > 0) {
          waiting = 'bake';
          await condition(() => aborted, policy.bakeMs ?? 0);
          waiting = null;
        }
        if (!aborted && (gate === 'everyWave' || (gate === 'canary' && i === 1))) {
          awaitingPromotion = true;
          waiting = 'promotion';
          await transition('awaiting_promotion', { detail: { nextWave: i } });
          await condition(() => !awaitingPromotion || aborted);
          waiting = null;
        }
      }
      if (await holdWhilePaused()) break;
      if (policy.maintenanceWindow) {
        for (;;) {
          const delay = await windowDelay(input);
          if (delay <= 0 || aborted) break;
          if (!inWindowWait) {
            inWindowWait = true;
            await transition('waiting_window', { detail: { nextWave: i, delayMs: delay } });
          }
          waiting = 'window';
          await condition(() => aborted, delay);
          waiting = null;
        }
        if (inWindowWait) {
          inWindowWait = false;
          // An abort ends the wait, but the window did not open: nothing to record (runs started before
          // WINDOW_ABORT_PATCH recorded window_open here, and replay keeps that).
          if (!(aborted && patched(WINDOW_ABORT_PATCH))) await transition('window_open', { detail: { nextWave: i } });
        }
        if (await holdWhilePaused()) break;
      }
      if (aborted) break;
      wave = i;
      await dispatchWave({ ...input, wave: i });
      const last = i === lastIndex;
      if (activation === 'immediate') {
        const r = await watch(i, 'sync', last);
        if (r.outcome === 'aborted' || aborted) break;
        if (r.outcome === 'tripped') return tripped(i, r);
        continue;
      }
      const staged = await watch(i, 'stage', true);
      if (staged.outcome === 'aborted' || aborted) break;
      if (staged.outcome === 'tripped') return tripped(i, staged);
      if (activation === 'wave' || last) {
        const from = activation === 'wave' ? i : 0;
        await activateWaves({ ...input, from, to: i });
        await recordTransition({ ...input, seq: ++seq, action: 'activation_started', wave: i, detail: { from, to: i } });
        const r = await watch(i, 'activate', true);
        if (r.outcome === 'aborted' || aborted) break;
        if (r.outcome === 'tripped') return tripped(i, r);
      }
    }
    if (aborted) return endAborted();
    return end('completed');
  } catch (err) {
    if (isCancellation(err)) {
      await CancellationScope.nonCancellable(() => finish('failed', 'cancelled'));
      throw err;
    }
    const type = businessFailureType(err);
    if (type === 'rollout_not_found') throw err;
    if (type) return end('failed', type);
    throw err;
  }
}
