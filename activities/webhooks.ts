/**
 * Webhook delivery side effects (workflows/webhooks.ts; docs/decisions/webhooks.md,
 * docs/decisions/webhook-delivery.md):
 *
 * - `startDeliveryWorkflow`: the event relay's first start of a delivery run (activities/events.ts);
 *   the workflow id is `webhook-delivery:<id>` (domain/webhooks.ts). A manual retry's new run is started
 *   by services/webhooks.ts.
 * - Activities `prepareWebhookDelivery`, `attemptWebhookDelivery` (one attempt, recorded; Temporal's
 *   retry policy makes the next), `finishWebhookDelivery` (failed after the last attempt; fail_count and
 *   pausing). The POST itself is net/webhooks.ts `postWebhook`.
 */
import { ApplicationFailure, Context } from '@temporalio/activity';
import { type Client, WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import type { Pool } from 'pg';
import type { Config } from '../config/env';
import { sealKeyOf } from '../config/secrets';
import { failDelivery, loadDeliveryForSend, noteNextAttempt, recordAttempt, webhookAad } from '../db/webhooks';
import { openSealed } from '../domain/seal';
import { DELIVERY_WORKFLOW_TYPE, deliveryWorkflowId } from '../domain/webhooks';
import { signPayload } from '../domain/webhook-signature';
import { deliveryHeaders, postWebhook } from '../net/webhooks';

export { DELIVERY_WORKFLOW_TYPE, deliveryWorkflowId };

/** What a delivery run works on. `manual`: a retry asked through the API (delivers to paused subscriptions too). */
export interface DeliveryRef {
  siteId: string;
  deliveryId: string;
  manual?: boolean;
}

/** Retry settings of one delivery run (from configuration; returned by an activity so replay is stable). */
export interface DeliveryRetry {
  initialIntervalMs: number;
  maximumIntervalMs: number;
  backoffCoefficient: number;
  maximumAttempts: number;
}

/** Business failure types of `attemptWebhookDelivery` (non-retryable). */
export type DeliveryFailureType = 'webhook_gone' | 'webhook_disabled' | 'webhook_paused' | 'url_refused';
export const NON_RETRYABLE_DELIVERY_FAILURES: readonly DeliveryFailureType[] = [
  'webhook_gone',
  'webhook_disabled',
  'webhook_paused',
  'url_refused',
];

/**
 * Starts the first run of a delivery (the event relay's fan-out). A delivery that already had a run is
 * left alone (REJECT_DUPLICATE; the "already started" error is swallowed and `started` is false). By
 * type name: this module cannot import workflows/client.ts without an import cycle through the
 * workflows' activity types.
 * @throws Temporal client errors other than "already started" (service unavailable).
 */
export async function startDeliveryWorkflow(
  client: Client,
  taskQueue: string,
  ref: DeliveryRef,
): Promise<{ workflowId: string; started: boolean }> {
  const workflowId = deliveryWorkflowId(ref.deliveryId);
  try {
    await client.workflow.start(DELIVERY_WORKFLOW_TYPE, {
      taskQueue,
      workflowId,
      args: [ref],
      workflowIdReusePolicy: 'REJECT_DUPLICATE',
      workflowIdConflictPolicy: 'FAIL',
    });
    return { workflowId, started: true };
  } catch (err) {
    if (err instanceof WorkflowExecutionAlreadyStartedError) return { workflowId, started: false };
    throw err;
  }
}

// ---------------------------------------------------------------------------------------------------
// Activities

/** What delivery activities need. */
export interface WebhookActivityDeps {
  db: Pool;
  cfg: Config;
}

/** The retry settings of delivery runs under `cfg`. */
export function deliveryRetry(cfg: Config): DeliveryRetry {
  return {
    initialIntervalMs: cfg.ROOST_WEBHOOK_RETRY_INITIAL_MS,
    maximumIntervalMs: Math.max(cfg.ROOST_WEBHOOK_RETRY_MAX_MS, cfg.ROOST_WEBHOOK_RETRY_INITIAL_MS),
    backoffCoefficient: 2,
    maximumAttempts: cfg.ROOST_WEBHOOK_MAX_ATTEMPTS,
  };
}

/** The delivery activities over `deps`. */
export function createWebhookActivities(deps: WebhookActivityDeps) {
  const { db, cfg } = deps;
  const sealKey = () => sealKeyOf(cfg);

  return {
    /** Whether the delivery exists, and the retry settings of this run. */
    async prepareWebhookDelivery(ref: DeliveryRef): Promise<{ found: boolean; retry: DeliveryRetry }> {
      const loaded = await loadDeliveryForSend(db, ref.siteId, ref.deliveryId);
      return { found: loaded !== undefined, retry: deliveryRetry(cfg) };
    },

    /**
     * One attempt: signs the stored payload (current secret, plus the previous one inside its grace
     * window), POSTs it, records the attempt. Resolves on a 2xx (or when the delivery already succeeded);
     * throws a retryable failure otherwise, and a non-retryable one (type DeliveryFailureType) when the
     * subscription is gone, disabled, paused (automatic runs) or the address is refused.
     */
    async attemptWebhookDelivery(ref: DeliveryRef): Promise<{ attempt: number; statusCode: number | null; latencyMs: number }> {
      const loaded = await loadDeliveryForSend(db, ref.siteId, ref.deliveryId);
      if (!loaded) throw ApplicationFailure.nonRetryable('the delivery or its subscription was deleted', 'webhook_gone');
      const { delivery, webhook } = loaded;
      if (delivery.status === 'succeeded') return { attempt: delivery.attempts, statusCode: null, latencyMs: 0 };
      if (!webhook.enabled) throw ApplicationFailure.nonRetryable('the subscription is disabled', 'webhook_disabled');
      if (webhook.paused && !ref.manual) throw ApplicationFailure.nonRetryable('the subscription is paused', 'webhook_paused');

      const aad = webhookAad(webhook.site_id, webhook.webhook_id);
      const secrets = [openSealed(sealKey(), webhook.secret_sealed, aad).toString('utf8')];
      if (
        webhook.previous_secret_sealed &&
        webhook.previous_secret_expires_at &&
        webhook.previous_secret_expires_at.getTime() > Date.now()
      ) {
        secrets.push(openSealed(sealKey(), webhook.previous_secret_sealed, aad).toString('utf8'));
      }
      const startedAt = new Date();
      const t = Math.floor(startedAt.getTime() / 1000);
      const result = await postWebhook({
        url: webhook.url,
        body: delivery.payload,
        headers: deliveryHeaders(delivery.event_type, delivery.delivery_id, signPayload(secrets, delivery.payload, t)),
        timeoutMs: cfg.ROOST_WEBHOOK_TIMEOUT_MS,
        allowPrivate: cfg.ROOST_WEBHOOK_ALLOW_PRIVATE,
      });
      const attempt = await recordAttempt(db, {
        siteId: ref.siteId,
        deliveryId: ref.deliveryId,
        webhookId: webhook.webhook_id,
        startedAt,
        latencyMs: result.latencyMs,
        responseCode: result.statusCode,
        error: result.error,
        succeeded: result.ok,
      });
      if (result.ok) return { attempt, statusCode: result.statusCode, latencyMs: result.latencyMs };
      if (result.refused) throw ApplicationFailure.nonRetryable(result.error ?? 'address refused', 'url_refused');
      // When the retry policy will try again, say when (shown in the delivery history).
      const info = Context.current().info;
      const retry = deliveryRetry(cfg);
      if (info.attempt < retry.maximumAttempts) {
        const delay = Math.min(retry.maximumIntervalMs, retry.initialIntervalMs * retry.backoffCoefficient ** (info.attempt - 1));
        await noteNextAttempt(db, ref.siteId, ref.deliveryId, new Date(Date.now() + delay));
      }
      throw ApplicationFailure.retryable(`attempt ${attempt} failed: ${result.error}`, 'delivery_attempt_failed');
    },

    /**
     * Marks the delivery failed after its last attempt. `countFailure` (false when the subscription was
     * gone, disabled or paused) adds one to fail_count; the subscription pauses at
     * ROOST_WEBHOOK_PAUSE_AFTER_FAILURES. Idempotent.
     */
    async finishWebhookDelivery(
      input: DeliveryRef & { error: string; countFailure: boolean },
    ): Promise<{ failed: boolean; failCount: number; paused: boolean }> {
      return failDelivery(db, {
        siteId: input.siteId,
        deliveryId: input.deliveryId,
        error: input.error.slice(0, 1000),
        countFailure: input.countFailure,
        pauseAfter: cfg.ROOST_WEBHOOK_PAUSE_AFTER_FAILURES,
      });
    },
  };
}
