/**
 * `rolloutWorkflow`: a roost deploy's canary-then-fleet rollout (SPEC.md "Rollout", deploy; DESIGN.md
 * "Temporal"). Deterministic code only: activities are imported by type, every activity has explicit
 * timeouts, and the payloads carry ids and counts, never machine lists.
 *
 * 1. `loadRollout` (plan: ids, policy, delay until scheduleAt); search attributes RoostSiteId,
 *    RoostRoostId, RoostVersionId, RoostStage.
 * 2. Durable timer until scheduleAt (the delay is measured by the activity, so no clock here).
 * 3. `markRolloutStarted` → `deployment.started` (stage canary).
 * 4. Canary wave: `dispatchWave` queues sync_pull commands, `watchWave` (heartbeating) waits until every
 *    canary machine succeeded or failed for good. Any failure → stage failed (`canary_failed`).
 * 5. Stage `started`; fleet wave the same way. Any failure → stage failed (`retry_budget_exhausted`, or
 *    `wave_timeout` when every failure was a timeout); else stage completed.
 * Stage changes and their events commit together (`changeRolloutStage`); RoostStage follows each change.
 *
 * The history has a fixed number of events whatever the number of machines (56 for a completed rollout,
 * 10,000 machines included: test/integration/rollout.test.ts).
 * Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import {
  ActivityFailure,
  ApplicationFailure,
  CancellationScope,
  isCancellation,
  proxyActivities,
  sleep,
  upsertSearchAttributes,
} from '@temporalio/workflow';
import { SearchAttributeType, defineSearchAttributeKey } from '@temporalio/common';
import type { Activities } from '../activities';
import type { RolloutFailureType, RolloutRef } from '../activities/rollout';
import type { RolloutStage, Wave, WaveCounts } from '../db/rollouts';

/** Search attributes of rollout workflows (registered on the dev server by stack/services.ts). */
export const RoostSiteId = defineSearchAttributeKey('RoostSiteId', SearchAttributeType.KEYWORD);
export const RoostRoostId = defineSearchAttributeKey('RoostRoostId', SearchAttributeType.KEYWORD);
export const RoostVersionId = defineSearchAttributeKey('RoostVersionId', SearchAttributeType.KEYWORD);
export const RoostStage = defineSearchAttributeKey('RoostStage', SearchAttributeType.KEYWORD);

/** How the workflow ended. */
export interface RolloutOutcome {
  rolloutId: string;
  stage: RolloutStage;
  succeeded: number;
  failed: number;
  abortReason: string | null;
}

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
