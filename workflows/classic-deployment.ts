/**
 * `classicDeploymentWorkflow`: the fan-out of one classic installer deployment
 * (`POST /api/sites/{siteId}/deployments`; docs/decisions/classic-deployments.md). Not a roost rollout:
 * roost deploys are `rolloutWorkflow` (workflows/rollout.ts) and share nothing with this file.
 *
 * One workflow per deployment (id `classic-deployment:<siteId>:<deploymentId>`, started with USE_EXISTING,
 * so a repeated create cannot start two). Deterministic code only: payloads carry ids and counts.
 *
 * 1. `loadClassicDeployment`: counts and mode; search attributes RoostSiteId, RoostDeploymentId,
 *    RoostDeploymentStatus (workflows/search-attributes.ts).
 * 2. `driveClassicDeployment`: one heartbeating activity that reconciles agent reports from the database
 *    and dispatches targets (one at a time when serial, up to the parallelism bound when parallel) until no
 *    target is pending or in flight. Agents never signal the workflow; the history does not grow with the
 *    number of targets.
 * 3. Updates `retry`, `cancel` and `uninstall` (sent by workflows/client.ts) apply their change through an
 *    activity while the drive runs (it picks the change up on its next pass); after the drive returns the
 *    workflow waits for running handlers, settles once more and loops when a handler reopened targets.
 *    A finished deployment gets a new run through update-with-start.
 * 4. Continue-as-new when Temporal suggests it (many updates on one run).
 *
 * Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import {
  ApplicationFailure,
  allHandlersFinished,
  condition,
  continueAsNew,
  defineQuery,
  defineUpdate,
  proxyActivities,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { Activities } from '../activities';
import type { ClassicAction, ClassicActionResult, ClassicRef, DeploymentStatus, TargetCounts } from '../domain/classic';
import { RoostDeploymentId, RoostDeploymentStatus, RoostSiteId } from './search-attributes';

/** Who asks for a control action. */
export interface ClassicControlArgs {
  by: string;
}

/** How the workflow ended. */
export interface ClassicOutcome {
  deploymentId: string;
  status: DeploymentStatus;
  counts: TargetCounts;
}

/** `type` of the ApplicationFailure an update's validator or handler rejects with (the client maps it to 409). */
export const CLASSIC_CONFLICT = 'conflict';
/** `type` of the ApplicationFailure an uninstall is rejected with when the deployment has not ended (409 deployment_in_flight). */
export const CLASSIC_IN_FLIGHT = 'deployment_in_flight';

/** Control updates (`POST …/deployments/{deploymentId}/retry|cancel|uninstall`) and the `progress` query. */
export const retryUpdate = defineUpdate<ClassicActionResult, [ClassicControlArgs]>('retry');
export const cancelUpdate = defineUpdate<ClassicActionResult, [ClassicControlArgs]>('cancel');
export const uninstallUpdate = defineUpdate<ClassicActionResult, [ClassicControlArgs]>('uninstall');
export const progressQuery = defineQuery<{ status: DeploymentStatus | null; counts: TargetCounts | null }>('progress');

/** History length past which a run continues as new even without Temporal's suggestion. */
const MAX_RUN_HISTORY = 4000;

const { loadClassicDeployment, applyClassicAction, settleClassicDeployment } = proxyActivities<Activities>({
  startToCloseTimeout: '2 minutes',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
});

/** Runs one classic deployment until every target is terminal. Input: ids only. */
export async function classicDeploymentWorkflow(input: ClassicRef): Promise<ClassicOutcome> {
  let status: DeploymentStatus | null = null;
  let counts: TargetCounts | null = null;

  const act = async (action: ClassicAction, a: ClassicControlArgs): Promise<ClassicActionResult> => {
    const r = await applyClassicAction({ ...input, action, by: a.by });
    if ('refused' in r) {
      const type = r.code === 'deployment_in_flight' ? CLASSIC_IN_FLIGHT : CLASSIC_CONFLICT;
      throw ApplicationFailure.create({ type, message: r.refused, nonRetryable: true });
    }
    status = r.status;
    upsertSearchAttributes([{ key: RoostDeploymentStatus, value: r.status }]);
    return r;
  };
  setHandler(retryUpdate, (a) => act('retry', a));
  setHandler(cancelUpdate, (a) => act('cancel', a));
  setHandler(uninstallUpdate, (a) => act('uninstall', a));
  setHandler(progressQuery, () => ({ status, counts }));

  const plan = await loadClassicDeployment(input);
  status = plan.status;
  upsertSearchAttributes([
    { key: RoostSiteId, value: input.siteId },
    { key: RoostDeploymentId, value: input.deploymentId },
    { key: RoostDeploymentStatus, value: plan.status },
  ]);

  const { driveClassicDeployment } = proxyActivities<Activities>({
    startToCloseTimeout: plan.driveTimeoutMs,
    // Every reconcile pass heartbeats (ROOST_CLASSIC_POLL_MS ≤ 10 s): a killed worker's drive resumes on another within 15 s.
    heartbeatTimeout: '15 seconds',
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  });

  for (;;) {
    const driven = await driveClassicDeployment(input);
    counts = driven.counts;
    status = driven.status;
    upsertSearchAttributes([{ key: RoostDeploymentStatus, value: driven.status }]);
    await condition(allHandlersFinished);
    const settled = await settleClassicDeployment(input);
    counts = settled.counts;
    status = settled.status;
    upsertSearchAttributes([{ key: RoostDeploymentStatus, value: settled.status }]);
    // A handler admitted meanwhile may reopen targets: finish only with none running.
    if ((settled.open === 0 || settled.gone) && allHandlersFinished())
      return { deploymentId: input.deploymentId, status: settled.status, counts: settled.counts };
    const info = workflowInfo();
    if (info.continueAsNewSuggested || info.historyLength > MAX_RUN_HISTORY) {
      await condition(allHandlersFinished);
      await continueAsNew<typeof classicDeploymentWorkflow>(input);
    }
  }
}
