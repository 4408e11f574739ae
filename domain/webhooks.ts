/**
 * Webhook delivery ids shared by the Temporal client side (workflows/client.ts, the manual retry) and the
 * event relay (activities/events.ts): one workflow per delivery, `webhook-delivery:<deliveryId>`
 * (docs/decisions/webhook-delivery.md). Pure.
 */

/** Workflow type name of deliveries (workflows/webhooks.ts `webhookDeliveryWorkflow`). */
export const DELIVERY_WORKFLOW_TYPE = 'webhookDeliveryWorkflow';

/** `webhook-delivery:<deliveryId>`: one workflow id per delivery (starting it twice is harmless). */
export function deliveryWorkflowId(deliveryId: string): string {
  return `webhook-delivery:${deliveryId}`;
}
