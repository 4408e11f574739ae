/**
 * Activity metrics of a worker (docs/observability.md "Worker"), as a Temporal activity interceptor: every
 * execution's duration and outcome by activity type, failures by the ApplicationFailure type the code
 * names, and the business counters that activity results carry (webhook attempts and deliveries, sweep
 * results). Activities themselves know nothing about it.
 */
import { ApplicationFailure, CancelledFailure } from '@temporalio/common';
import type { Context as ActivityContext } from '@temporalio/activity';
import type { ActivityInterceptors } from '@temporalio/worker';
import { activityDuration, activityFailures, sweepItems, webhookAttempts, webhookDeliveries } from '../telemetry/metrics';

/** Sweep activities (activities/sweeps.ts) and the sweep their counts belong to. */
const SWEEP_OF: Record<string, string> = {
  sweepStaleMachines: 'heartbeat-staleness',
  condemnUnreferencedChunks: 'chunk-gc',
  reclaimCondemnedChunks: 'chunk-gc',
  verifyChunkSample: 'chunk-verify',
  announceExpiredKeys: 'key-expiry',
};

/** Failure types of attemptWebhookDelivery (activities/webhooks.ts) that skip the POST. */
const WEBHOOK_SKIPPED = new Set(['webhook_gone', 'webhook_disabled', 'webhook_paused']);

/** The bounded failure label of an error: the ApplicationFailure type, else cancelled, timeout or error. */
export function failureKind(err: unknown): string {
  if (err instanceof CancelledFailure || (err as Error)?.name === 'CancelledFailure') return 'cancelled';
  if (err instanceof ApplicationFailure && err.type && /^[a-zA-Z0-9_.-]{1,64}$/.test(err.type)) return err.type;
  if ((err as Error)?.name === 'TimeoutFailure') return 'timeout';
  return 'error';
}

/** Business counters carried by a completed activity's result. */
function countResult(activity: string, result: unknown): void {
  const sweep = SWEEP_OF[activity];
  if (sweep && result && typeof result === 'object') {
    // Numeric fields only (processed, emitted, scanned, condemned, …): a fixed set per activity.
    for (const [field, v] of Object.entries(result as Record<string, unknown>)) {
      if (typeof v === 'number' && field !== 'next' && v > 0) sweepItems.inc({ sweep, result: field }, v);
    }
    return;
  }
  if (activity === 'attemptWebhookDelivery') {
    // statusCode null: the delivery had already succeeded, nothing was sent.
    if ((result as { statusCode: number | null } | undefined)?.statusCode != null) {
      webhookAttempts.inc({ outcome: 'succeeded' });
      webhookDeliveries.inc({ outcome: 'delivered' });
    }
  } else if (activity === 'finishWebhookDelivery' && (result as { failed?: boolean } | undefined)?.failed) {
    webhookDeliveries.inc({ outcome: 'failed' });
  }
}

/** Counters carried by a failed activity. */
function countFailure(activity: string, kind: string): void {
  if (activity !== 'attemptWebhookDelivery') return;
  if (kind === 'url_refused') webhookAttempts.inc({ outcome: 'refused' });
  else if (WEBHOOK_SKIPPED.has(kind)) webhookAttempts.inc({ outcome: 'skipped' });
  else if (kind !== 'cancelled') webhookAttempts.inc({ outcome: 'failed' });
}

/** The activity interceptor factory (Worker.create `interceptors.activity`). */
export function activityMetrics(ctx: ActivityContext): ActivityInterceptors {
  const activity = ctx.info.activityType;
  return {
    inbound: {
      async execute(input, next) {
        const end = activityDuration.startTimer({ activity });
        try {
          const result = await next(input);
          end({ outcome: 'completed' });
          countResult(activity, result);
          return result;
        } catch (err) {
          const kind = failureKind(err);
          end({ outcome: kind === 'cancelled' ? 'cancelled' : 'failed' });
          activityFailures.inc({ activity, failure: kind });
          countFailure(activity, kind);
          throw err;
        }
      },
    },
  };
}
