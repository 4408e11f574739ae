/**
 * `webhookDeliveryWorkflow`: delivers one webhook delivery (deliveries are workflows with a retry policy
 * and a delivery history; docs/decisions/webhooks.md, docs/decisions/webhook-delivery.md). Workflow id
 * `webhook-delivery:<deliveryId>`; a manual retry is a new run of the same id. Deterministic code only:
 * activities by type, explicit timeouts, ids in payloads.
 *
 * 1. `prepareWebhookDelivery` → whether the delivery exists, and the run's retry settings (from
 *    configuration, through an activity so that replay sees the same values).
 * 2. `attemptWebhookDelivery` under Temporal's retry policy (exponential backoff, coefficient 2, capped
 *    interval, ROOST_WEBHOOK_MAX_ATTEMPTS): each attempt POSTs once and is recorded; a 2xx ends the run.
 * 3. After the last failed attempt, `finishWebhookDelivery` marks the delivery failed, adds to the
 *    subscription's fail_count and pauses it at the threshold. A subscription that was deleted, disabled
 *    or paused meanwhile ends the run without counting a failure.
 * Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import { ActivityFailure, ApplicationFailure, proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';
import type { DeliveryRef } from '../activities/webhooks';

/** How a delivery run ended. */
export interface DeliveryOutcome {
  deliveryId: string;
  status: 'succeeded' | 'failed' | 'gone';
  /** Attempt number (across runs) of the successful attempt, when succeeded. */
  attempt?: number;
  /** The subscription is paused after this run. */
  paused?: boolean;
  error?: string;
}

/** Failure types that end a run at once (activities/webhooks.ts DeliveryFailureType). */
const NON_RETRYABLE = ['webhook_gone', 'webhook_disabled', 'webhook_paused', 'url_refused'];
/** Of those, the ones that do not count against the subscription. */
const NOT_COUNTED = ['webhook_gone', 'webhook_disabled', 'webhook_paused'];

const { prepareWebhookDelivery, finishWebhookDelivery } = proxyActivities<Activities>({
  startToCloseTimeout: '30 seconds',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
});

/** Runs one delivery to success or failure. Input: ids only. */
export async function webhookDeliveryWorkflow(ref: DeliveryRef): Promise<DeliveryOutcome> {
  const plan = await prepareWebhookDelivery(ref);
  if (!plan.found) return { deliveryId: ref.deliveryId, status: 'gone' };
  const { attemptWebhookDelivery } = proxyActivities<Activities>({
    // One POST has a 10 s timeout by default (ROOST_WEBHOOK_TIMEOUT_MS ≤ 60 s), plus recording it.
    startToCloseTimeout: '90 seconds',
    retry: {
      initialInterval: plan.retry.initialIntervalMs,
      backoffCoefficient: plan.retry.backoffCoefficient,
      maximumInterval: plan.retry.maximumIntervalMs,
      maximumAttempts: plan.retry.maximumAttempts,
      nonRetryableErrorTypes: NON_RETRYABLE,
    },
  });
  try {
    const r = await attemptWebhookDelivery(ref);
    return { deliveryId: ref.deliveryId, status: 'succeeded', attempt: r.attempt };
  } catch (err) {
    if (!(err instanceof ActivityFailure)) throw err;
    const cause = err.cause;
    const type = cause instanceof ApplicationFailure ? (cause.type ?? undefined) : undefined;
    const error = cause?.message ?? err.message;
    if (type === 'webhook_gone') return { deliveryId: ref.deliveryId, status: 'gone', error };
    const f = await finishWebhookDelivery({ ...ref, error, countFailure: !(type && NOT_COUNTED.includes(type)) });
    return { deliveryId: ref.deliveryId, status: 'failed', paused: f.paused, error };
  }
}
