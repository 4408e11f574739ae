/**
 * Webhook subscriptions, their delivery history, manual retry and the probe (the routes under
 * `/api/sites/{siteId}/webhooks` and `POST /api/webhooks/probe`; docs/decisions/webhooks.md,
 * docs/decisions/webhook-urls.md, docs/decisions/webhook-delivery.md). Rows: db/webhooks.ts. Secrets
 * (`whsec_…`) are returned once and stored sealed (domain/seal.ts) under the seal key
 * (config/secrets.ts `sealKeyOf`), associated data `webhookAad(siteId, webhookId)`.
 *
 * Mutations take `beforeChange`: called once the request is known to be valid and the subscription to
 * exist, before anything changes (the routes count the request in their capability rate limit there).
 */
import type { Client } from '@temporalio/client';
import { sealKeyOf } from '../config/secrets';
import {
  type AttemptRow,
  type DeliveryPosition,
  type DeliveryRow,
  deleteWebhook as deleteWebhookRows,
  getDelivery,
  getWebhook as getWebhookRow,
  insertWebhook,
  listDeliveries,
  listWebhooks,
  reopenDelivery,
  rotateWebhookSecret as rotateSecretRow,
  updateWebhook as updateWebhookRow,
  webhookAad,
  type WebhookPosition,
  type WebhookRow,
} from '../db/webhooks';
import { ApiError } from '../domain/errors';
import { EVENT_TYPES } from '../domain/events';
import { newId, randomToken } from '../domain/hex';
import { seal } from '../domain/seal';
import { deliveryWorkflowId } from '../domain/webhooks';
import { checkWebhookUrl, signPayload } from '../domain/webhook-signature';
import { deliveryHeaders, nonPublicAddressesOf, postWebhook } from '../net/webhooks';
import { webhookDeliveryWorkflow } from '../workflows/webhooks';
import type { ServiceDeps } from './deps';

export {
  type AttemptRow,
  DELIVERY_ID_RE,
  type DeliveryPosition,
  type DeliveryRow,
  isDeliveryPosition,
  isWebhookPosition,
  WEBHOOK_ID_RE,
  type WebhookPosition,
  type WebhookRow,
} from '../db/webhooks';

/** The events subscriptions and the probe accept: the whole catalog (domain/events.ts). */
export const WEBHOOK_EVENTS = EVENT_TYPES;
/** Planned events: refused with a clear message until they are accepted. */
export const PLANNED_EVENTS = ['roost.created', 'roost.updated', 'roost.deleted'] as const;
/** Most event names one subscription lists. */
export const MAX_EVENTS_PER_WEBHOOK = WEBHOOK_EVENTS.length;
/** Default and maximum rotation grace, hours (like API keys: 24 h). */
export const DEFAULT_GRACE_HOURS = 24;
export const MAX_GRACE_HOURS = 168;
/** Largest probe envelope (serialised), bytes. */
export const MAX_PROBE_PAYLOAD_BYTES = 64 * 1024;

type WebhookDeps = Pick<ServiceDeps, 'db' | 'cfg'>;
/** Called before a mutation changes anything (see the module comment). */
type BeforeChange = () => Promise<void>;

const newSecret = () => `whsec_${randomToken(32)}`;

function invalid(param: string, message: string): ApiError {
  return new ApiError('validation_failed', `${param} ${message}`, { extras: { param, errors: { [param]: [message] } } });
}

/**
 * Event names: each in the catalog (planned and unknown names refused with a clear message), repeats
 * merged. Errors are keyed `<param>.<i>`, or `param` itself when `single` (the probe's one `event`).
 * @throws ApiError validation_failed
 */
function checkEvents(events: string[], param = 'events', single = false): string[] {
  const errs: Record<string, string[]> = {};
  const catalog = new Set<string>(WEBHOOK_EVENTS);
  const planned = new Set<string>(PLANNED_EVENTS);
  events.forEach((e, i) => {
    const at = single ? param : `${param}.${i}`;
    if (planned.has(e)) errs[at] = [`${e} is a planned event and is not accepted yet`];
    else if (!catalog.has(e)) errs[at] = [`unknown event ${e}; accepted: ${WEBHOOK_EVENTS.join(', ')}`];
  });
  const keys = Object.keys(errs);
  if (keys.length)
    throw new ApiError('validation_failed', `${keys.length === 1 ? errs[keys[0]][0] : `${keys.length} event names are not accepted`}`, {
      extras: { param: keys[0], errors: errs },
    });
  return [...new Set(events)];
}

/**
 * Validates a delivery URL (shape, then where it points: the host's current addresses when it is a
 * name). Returns the normalised URL.
 * @throws ApiError validation_failed (shape), url_not_allowed (loopback/private/link-local)
 */
async function checkUrl(raw: string, allowPrivate: boolean, param = 'url'): Promise<string> {
  const r = checkWebhookUrl(raw, allowPrivate);
  if (!r.ok) {
    if (r.problem.kind === 'invalid') throw invalid(param, r.problem.message);
    throw new ApiError('url_not_allowed', `${param} ${r.problem.message}`, { extras: { param } });
  }
  if (!allowPrivate) {
    const bad = await nonPublicAddressesOf(r.host);
    if (bad.length) {
      throw new ApiError(
        'url_not_allowed',
        `${param} host ${r.host} resolves to a loopback, private or link-local address (${bad[0]}); deliveries go to public addresses only`,
        { extras: { param } },
      );
    }
  }
  return r.url;
}

/**
 * The subscription `webhookId` of the site.
 * @throws ApiError not_found
 */
export async function getWebhook(deps: Pick<ServiceDeps, 'db'>, siteId: string, webhookId: string): Promise<WebhookRow> {
  const w = await getWebhookRow(deps.db, siteId, webhookId);
  if (!w) throw new ApiError('not_found', 'webhook not found');
  return w;
}

/**
 * Creates a subscription with a new signing secret (returned once in `secret`, stored sealed).
 * @throws ApiError validation_failed (events, url), url_not_allowed
 */
export async function createWebhook(
  deps: WebhookDeps,
  input: { siteId: string; createdBy: string; url: string; name: string; events: string[]; enabled?: boolean; beforeChange: BeforeChange },
): Promise<{ row: WebhookRow; secret: string }> {
  const { siteId } = input;
  const events = checkEvents(input.events);
  const url = await checkUrl(input.url, deps.cfg.ROOST_WEBHOOK_ALLOW_PRIVATE);
  await input.beforeChange();
  const webhookId = newId('wh');
  const secret = newSecret();
  const row = await insertWebhook(deps.db, {
    siteId,
    webhookId,
    url,
    name: input.name.trim(),
    events,
    enabled: input.enabled ?? true,
    secretSealed: seal(sealKeyOf(deps.cfg), secret, webhookAad(siteId, webhookId)),
    createdBy: input.createdBy,
  });
  return { row, secret };
}

/** A page of the site's subscriptions, newest first; `next` is the last row's position when more follow. */
export async function listWebhookPage(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; after?: WebhookPosition; pageSize: number },
): Promise<{ rows: WebhookRow[]; next: WebhookPosition | undefined }> {
  const rows = await listWebhooks(deps.db, input.siteId, { after: input.after, limit: input.pageSize });
  const page = rows.slice(0, input.pageSize);
  const last = page[page.length - 1];
  return { rows: page, next: rows.length > input.pageSize && last ? [last.created_at_text, last.webhook_id] : undefined };
}

/**
 * Changes url, name, events, enabled or paused (unpausing resets failCount). Absent fields stay.
 * @throws ApiError not_found, validation_failed, url_not_allowed
 */
export async function updateWebhook(
  deps: WebhookDeps,
  input: {
    siteId: string;
    webhookId: string;
    changes: { url?: string; name?: string; events?: string[]; enabled?: boolean; paused?: boolean };
    beforeChange: BeforeChange;
  },
): Promise<WebhookRow> {
  const { siteId, webhookId, changes } = input;
  await getWebhook(deps, siteId, webhookId);
  const checked = {
    url: changes.url === undefined ? undefined : await checkUrl(changes.url, deps.cfg.ROOST_WEBHOOK_ALLOW_PRIVATE),
    name: changes.name?.trim(),
    events: changes.events === undefined ? undefined : checkEvents(changes.events),
    enabled: changes.enabled,
    paused: changes.paused,
  };
  await input.beforeChange();
  const row = await updateWebhookRow(deps.db, siteId, webhookId, checked);
  if (!row) throw new ApiError('not_found', 'webhook not found');
  return row;
}

/**
 * Deletes a subscription with its deliveries and attempts (pending deliveries stop at their next attempt).
 * @throws ApiError not_found
 */
export async function deleteWebhook(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; webhookId: string; beforeChange: BeforeChange },
): Promise<void> {
  await getWebhook(deps, input.siteId, input.webhookId);
  await input.beforeChange();
  if (!(await deleteWebhookRows(deps.db, input.siteId, input.webhookId))) throw new ApiError('not_found', 'webhook not found');
}

/**
 * Rotates the signing secret: a new one (returned once) signs from now on, the previous one also signs
 * for `graceHours` (0: stops at once).
 * @throws ApiError not_found
 */
export async function rotateWebhookSecret(
  deps: WebhookDeps,
  input: { siteId: string; webhookId: string; graceHours: number; beforeChange: BeforeChange },
): Promise<{ row: WebhookRow; secret: string }> {
  const { siteId, webhookId, graceHours } = input;
  await getWebhook(deps, siteId, webhookId);
  await input.beforeChange();
  const secret = newSecret();
  const row = await rotateSecretRow(
    deps.db,
    siteId,
    webhookId,
    seal(sealKeyOf(deps.cfg), secret, webhookAad(siteId, webhookId)),
    graceHours > 0 ? new Date(Date.now() + graceHours * 3_600_000) : null,
  );
  if (!row) throw new ApiError('not_found', 'webhook not found');
  return { row, secret };
}

/**
 * A page of a subscription's deliveries, newest first, with their attempts (oldest first).
 * @throws ApiError not_found (the subscription)
 */
export async function listDeliveryPage(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; webhookId: string; after?: DeliveryPosition; pageSize: number },
): Promise<{ rows: DeliveryRow[]; attempts: Map<string, AttemptRow[]>; next: DeliveryPosition | undefined }> {
  await getWebhook(deps, input.siteId, input.webhookId);
  const { rows, attempts } = await listDeliveries(deps.db, input.siteId, input.webhookId, { after: input.after, limit: input.pageSize });
  const page = rows.slice(0, input.pageSize);
  const last = page[page.length - 1];
  return { rows: page, attempts, next: rows.length > input.pageSize && last ? [last.created_at_text, last.delivery_id] : undefined };
}

/**
 * Starts a new run of a finished delivery (ALLOW_DUPLICATE on `webhook-delivery:<deliveryId>`); a
 * previous run still open is only returning (the database shows its outcome) and is terminated.
 */
async function restartDeliveryWorkflow(client: Client, taskQueue: string, siteId: string, deliveryId: string): Promise<string> {
  const workflowId = deliveryWorkflowId(deliveryId);
  await client.workflow.start(webhookDeliveryWorkflow, {
    taskQueue,
    workflowId,
    args: [{ siteId, deliveryId, manual: true }],
    workflowIdReusePolicy: 'ALLOW_DUPLICATE',
    workflowIdConflictPolicy: 'TERMINATE_EXISTING',
  });
  return workflowId;
}

/**
 * Delivers a finished delivery again: reopens it (pending) and starts a new delivery run on
 * ROOST_TASK_QUEUE (its attempts are appended; paused subscriptions are delivered to as well).
 * @returns the delivery run's workflow id
 * @throws ApiError not_found (subscription or delivery), conflict (subscription disabled, delivery still being attempted)
 */
export async function retryDelivery(
  deps: ServiceDeps,
  input: { siteId: string; webhookId: string; deliveryId: string; beforeChange: BeforeChange },
): Promise<{ workflowId: string }> {
  const { siteId, webhookId, deliveryId } = input;
  const webhook = await getWebhook(deps, siteId, webhookId);
  const delivery = await getDelivery(deps.db, siteId, deliveryId);
  if (!delivery || delivery.webhook_id !== webhookId) throw new ApiError('not_found', 'delivery not found');
  if (!webhook.enabled) throw new ApiError('conflict', 'the subscription is disabled; enable it before retrying deliveries');
  const stillRunning = () => new ApiError('conflict', 'this delivery is still being attempted; retry it once it has finished');
  if (delivery.status === 'pending') throw stillRunning();
  await input.beforeChange();
  const reopened = await reopenDelivery(deps.db, siteId, webhookId, deliveryId);
  if (reopened === 'not_found') throw new ApiError('not_found', 'delivery not found');
  if (reopened === 'in_progress') throw stillRunning();
  // The previous run wrote its outcome (the delivery is no longer pending), so a run still open is only
  // returning: replace it.
  return { workflowId: await restartDeliveryWorkflow(deps.temporal, deps.cfg.ROOST_TASK_QUEUE, siteId, deliveryId) };
}

/** What a probe reports: the receiver's answer and the envelope sent. */
export interface ProbeResult {
  ok: boolean;
  statusCode: number | null;
  latencyMs: number;
  error: string | null;
  /** The probe envelope id (also `Roost-Delivery`). */
  id: string;
  event: string;
  /** ISO 8601. */
  occurredAt: string;
  /** The generated secret the probe was signed with, only when none was given. */
  generatedSecret?: string;
}

/**
 * Sends one signed probe delivery (envelope `{ id, event, occurredAt, siteId, data: payload }`) to `url`,
 * no retry; signs with `signingSecret`, or a fresh secret that is returned.
 * @throws ApiError validation_failed (event, url), url_not_allowed (also when refused at send time),
 *   payload_too_large (envelope over MAX_PROBE_PAYLOAD_BYTES)
 */
export async function probeWebhook(
  deps: Pick<ServiceDeps, 'cfg'>,
  input: {
    siteId: string;
    url: string;
    event: string;
    payload: Record<string, unknown>;
    signingSecret?: string;
    beforeChange: BeforeChange;
  },
): Promise<ProbeResult> {
  const { cfg } = deps;
  const [event] = checkEvents([input.event], 'event', true);
  const url = await checkUrl(input.url, cfg.ROOST_WEBHOOK_ALLOW_PRIVATE);
  await input.beforeChange();
  const id = newId('prb');
  const occurredAt = new Date().toISOString();
  const raw = JSON.stringify({ id, event, occurredAt, siteId: input.siteId, data: input.payload });
  if (Buffer.byteLength(raw) > MAX_PROBE_PAYLOAD_BYTES)
    throw new ApiError('payload_too_large', `the probe envelope must be at most ${MAX_PROBE_PAYLOAD_BYTES} bytes`, {
      extras: { param: 'payload' },
    });
  const generatedSecret = input.signingSecret === undefined ? newSecret() : undefined;
  const secret = input.signingSecret ?? (generatedSecret as string);
  const t = Math.floor(Date.now() / 1000);
  const result = await postWebhook({
    url,
    body: raw,
    headers: deliveryHeaders(event, id, signPayload(secret, raw, t)),
    timeoutMs: cfg.ROOST_WEBHOOK_TIMEOUT_MS,
    allowPrivate: cfg.ROOST_WEBHOOK_ALLOW_PRIVATE,
  });
  if (result.refused) throw new ApiError('url_not_allowed', `url ${result.error}`, { extras: { param: 'url' } });
  return {
    ok: result.ok,
    statusCode: result.statusCode,
    latencyMs: result.latencyMs,
    error: result.error,
    id,
    event,
    occurredAt,
    generatedSecret,
  };
}
