/**
 * `eventRelayWorkflow`: the long-running webhook fan-out (docs/decisions/webhooks.md, docs/decisions/webhook-relay.md).
 * One heartbeating activity (`relayEvents`, activities/events.ts) polls the outbox, creates deliveries
 * and starts their workflows for a few minutes, then returns; the workflow continues as new, so its
 * history stays a handful of events however long it runs. Several relays may run at once (each on its
 * own task queue, id `event-relay:<taskQueue>`): fan-out is idempotent in the database.
 * Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import { continueAsNew, proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';

const { relayEvents } = proxyActivities<Activities>({
  // The activity returns after ROOST_WEBHOOK_RELAY_RUN_SECONDS (≤ 10 minutes).
  startToCloseTimeout: '15 minutes',
  heartbeatTimeout: '30 seconds',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
});

/** Runs one relay activity, then continues as new. Never returns. */
export async function eventRelayWorkflow(): Promise<never> {
  await relayEvents();
  return continueAsNew<typeof eventRelayWorkflow>();
}
