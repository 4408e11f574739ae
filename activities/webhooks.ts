/**
 * Webhook delivery side effects (SPEC.md "Events" › Delivery; workflows/webhooks.ts;
 * docs/decisions/webhooks.md):
 *
 * - `postWebhook`: one signed POST with a timeout, no redirects, the address rules applied again at send
 *   time (a guarded DNS lookup refuses names that now resolve to loopback/private/link-local addresses
 *   unless ROOST_WEBHOOK_ALLOW_PRIVATE), any 2xx is success. Used by the delivery activity and the probe.
 * - `deliveryWorkflowId`, `startDeliveryWorkflow`: the delivery workflow id is `webhook-delivery:<id>`.
 * - Activities `prepareWebhookDelivery`, `attemptWebhookDelivery` (one attempt, recorded; Temporal's
 *   retry policy makes the next), `finishWebhookDelivery` (failed after the last attempt; fail_count and
 *   pausing).
 */
import http from 'node:http';
import https from 'node:https';
import dns from 'node:dns';
import type { LookupAddress } from 'node:dns';
import { performance } from 'node:perf_hooks';
import { ApplicationFailure, Context } from '@temporalio/activity';
import { type Client, WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import type { Pool } from 'pg';
import type { Config } from '../config/env';
import { checkWebhookUrl, isNonPublicAddress, signPayload } from '../domain/webhook-signature';
import { openSealed } from '../domain/seal';
import { secretKey } from '../config/secrets';
import { failDelivery, loadDeliveryForSend, noteNextAttempt, recordAttempt, webhookAad } from '../db/webhooks';

/** Workflow type name of deliveries (workflows/webhooks.ts). */
export const DELIVERY_WORKFLOW_TYPE = 'webhookDeliveryWorkflow';

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

/** `webhook-delivery:<deliveryId>`: one workflow id per delivery (starting it twice is harmless). */
export function deliveryWorkflowId(deliveryId: string): string {
  return `webhook-delivery:${deliveryId}`;
}

/**
 * Starts a delivery run. `reuse: 'never'` (fan-out): a delivery that already had a run is left alone
 * (REJECT_DUPLICATE; the "already started" error is swallowed and `started` is false).
 * `reuse: 'replace-finished'` (manual retry, called only once the database shows the previous run's
 * outcome): a new run of the same workflow id; a previous run still open is only returning and is
 * terminated (TERMINATE_EXISTING).
 */
export async function startDeliveryWorkflow(
  client: Client,
  taskQueue: string,
  ref: DeliveryRef,
  reuse: 'never' | 'replace-finished' = 'never',
): Promise<{ workflowId: string; started: boolean }> {
  const workflowId = deliveryWorkflowId(ref.deliveryId);
  try {
    await client.workflow.start(DELIVERY_WORKFLOW_TYPE, {
      taskQueue,
      workflowId,
      args: [ref],
      workflowIdReusePolicy: reuse === 'never' ? 'REJECT_DUPLICATE' : 'ALLOW_DUPLICATE',
      workflowIdConflictPolicy: reuse === 'never' ? 'FAIL' : 'TERMINATE_EXISTING',
    });
    return { workflowId, started: true };
  } catch (err) {
    if (err instanceof WorkflowExecutionAlreadyStartedError) return { workflowId, started: false };
    throw err;
  }
}

// ---------------------------------------------------------------------------------------------------
// Sending

/** Result of one POST. `refused`: the address rules stopped it before any byte was sent. */
export interface PostResult {
  ok: boolean;
  statusCode: number | null;
  latencyMs: number;
  error: string | null;
  refused: boolean;
}

class AddressRefusedError extends Error {
  constructor(host: string, address: string) {
    super(`refused: ${host} resolves to a loopback, private or link-local address (${address})`);
    this.name = 'AddressRefusedError';
  }
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/** dns.lookup that fails with AddressRefusedError when any resolved address is not public. */
function guardedLookup(hostname: string, options: dns.LookupOptions, callback: LookupCallback): void {
  dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err, []);
    const list = addresses as LookupAddress[];
    const bad = list.find((a) => isNonPublicAddress(a.address));
    if (bad) return callback(new AddressRefusedError(hostname, bad.address), []);
    if (list.length === 0) return callback(Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' }), []);
    if (options.all) return callback(null, list);
    return callback(null, list[0].address, list[0].family);
  });
}

/**
 * The addresses `host` resolves to that are not public (empty when all are public, when `host` is an IP
 * literal (checked by `checkWebhookUrl`) or when it does not resolve: the send-time check decides then).
 */
export async function nonPublicAddressesOf(host: string): Promise<string[]> {
  try {
    const list = await dns.promises.lookup(host, { all: true, verbatim: true });
    return list.map((a) => a.address).filter((a) => isNonPublicAddress(a));
  } catch {
    return [];
  }
}

/**
 * POSTs `body` to `url` with `headers` (Content-Type and Content-Length are set here). Never throws:
 * network errors, timeouts and refusals come back in `error`. Redirects are not followed (a 3xx is a
 * failure). `latencyMs`: from the start to the response headers (or the failure).
 */
export async function postWebhook(req: {
  url: string;
  body: string;
  headers: Record<string, string>;
  timeoutMs: number;
  allowPrivate: boolean;
}): Promise<PostResult> {
  const started = performance.now();
  const elapsed = () => Math.max(0, Math.round(performance.now() - started));
  const checked = checkWebhookUrl(req.url, req.allowPrivate);
  if (!checked.ok) return { ok: false, statusCode: null, latencyMs: 0, error: `refused: url ${checked.problem.message}`, refused: true };
  const u = new URL(checked.url);
  const mod = u.protocol === 'https:' ? https : http;
  return new Promise<PostResult>((resolve) => {
    let done = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = (r: Omit<PostResult, 'latencyMs'>) => {
      if (done) return;
      done = true;
      if (timer) clearTimeout(timer);
      resolve({ ...r, latencyMs: elapsed() });
    };
    const request = mod.request(
      u,
      {
        method: 'POST',
        agent: false,
        headers: {
          'Content-Type': 'application/json',
          'User-Agent': 'Roost-Webhooks/1',
          ...req.headers,
          'Content-Length': String(Buffer.byteLength(req.body)),
        },
        lookup: req.allowPrivate ? undefined : (guardedLookup as unknown as http.RequestOptions['lookup']),
      },
      (res) => {
        const code = res.statusCode ?? null;
        const ok = code !== null && code >= 200 && code < 300;
        finish({ ok, statusCode: code, error: ok ? null : `HTTP ${code}`, refused: false });
        // Drain what the receiver sends back, but never for long.
        res.resume();
        setTimeout(() => res.destroy(), 5_000).unref();
      },
    );
    timer = setTimeout(() => request.destroy(new Error(`timed out after ${req.timeoutMs} ms`)), req.timeoutMs);
    request.on('error', (err) => finish({ ok: false, statusCode: null, error: err.message, refused: err instanceof AddressRefusedError }));
    request.end(req.body);
  });
}

/** The delivery headers of SPEC.md "Events" › Delivery (Content-Type is added by `postWebhook`). */
export function deliveryHeaders(event: string, deliveryId: string, signature: string): Record<string, string> {
  return { 'Roost-Event': event, 'Roost-Delivery': deliveryId, 'Roost-Signature': signature };
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
  let key: Buffer | undefined;
  const sealKey = () => (key ??= secretKey(cfg));

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
