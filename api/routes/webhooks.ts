/**
 * Webhook subscriptions, delivery history, manual retry and the probe (SPEC.md "Webhook subscription",
 * "Events"; the spec does not show the management routes: docs/decisions/webhooks.md):
 *
 *   POST   /api/sites/{siteId}/webhooks                                            create; `signingSecret` shown once (Idempotency-Key)
 *   GET    /api/sites/{siteId}/webhooks                                            list, newest first (paged: default 20, max 100)
 *   GET    /api/sites/{siteId}/webhooks/{webhookId}                                one subscription
 *   PATCH  /api/sites/{siteId}/webhooks/{webhookId}                                url, name, events, enabled, paused (Idempotency-Key)
 *   DELETE /api/sites/{siteId}/webhooks/{webhookId}                                delete with its history (Idempotency-Key)
 *   POST   /api/sites/{siteId}/webhooks/{webhookId}/rotate-secret                  new secret once; the old one signs during graceHours (Idempotency-Key)
 *   GET    /api/sites/{siteId}/webhooks/{webhookId}/deliveries                     history, newest first, with attempts (paged: default 20, max 100)
 *   POST   /api/sites/{siteId}/webhooks/{webhookId}/deliveries/{deliveryId}/retry  new delivery run (Idempotency-Key)
 *   POST   /api/webhooks/probe?siteId=<id>                                         one signed probe delivery, no retry
 *
 * Scopes: reads need site read; every mutation and the probe need site admin (subscriptions hold
 * secrets and send site data off-site). Mutations and the probe count in the WEBHOOK_MANAGE capability
 * bucket. Delivery URL rules: docs/decisions/webhook-urls.md.
 */
import type { FastifyInstance } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { newId, randomToken } from '../../domain/hex';
import { seal } from '../../domain/seal';
import { checkWebhookUrl, signPayload } from '../../domain/webhook-signature';
import type { EventType } from '../../db/events';
import {
  type AttemptRow,
  DELIVERY_ID_RE,
  type DeliveryRow,
  deleteWebhook,
  getDelivery,
  getWebhook,
  insertWebhook,
  isDeliveryPosition,
  isWebhookPosition,
  listDeliveries,
  listWebhooks,
  reopenDelivery,
  rotateWebhookSecret,
  updateWebhook,
  WEBHOOK_ID_RE,
  webhookAad,
  type WebhookRow,
} from '../../db/webhooks';
import { deliveryHeaders, deliveryWorkflowId, nonPublicAddressesOf, postWebhook, startDeliveryWorkflow } from '../../activities/webhooks';
import { secretKey } from '../../config/secrets';
import { authorizeSite } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';
import { PagingQuery, pageTokens, parsePaging } from '../pagination';
import { rejectForeignFields } from './roosts';
import { problems } from '../../domain/schemas';
import { DateTime, NullableDateTime, SiteId } from '../../domain/schemas';

// ---------------------------------------------------------------------------------------------------
// Catalog and limits

/** The event catalog of SPEC.md "Events" (accepted by subscriptions and the probe). */
export const WEBHOOK_EVENTS = [
  'version.published',
  'version.rolled_back',
  'deployment.started',
  'deployment.completed',
  'deployment.failed',
  'machine.online',
  'machine.offline',
  'chunk.garbage_collected',
  'chunk.verify_failed',
  'quota.warning',
  'quota.exceeded',
  'api_key.used',
  'api_key.expired',
] as const satisfies readonly EventType[];
// Compile-time check that the list covers db/events.ts EventType.
const catalogComplete: Exclude<EventType, (typeof WEBHOOK_EVENTS)[number]> extends never ? true : never = true;
void catalogComplete;

/** Planned events (SPEC.md): rejected until accepted. */
export const PLANNED_EVENTS = ['roost.created', 'roost.updated', 'roost.deleted'] as const;

/** Most event names one subscription lists. */
export const MAX_EVENTS_PER_WEBHOOK = WEBHOOK_EVENTS.length;
/** Default and maximum rotation grace, hours (SPEC.md: like API keys, 24 h). */
export const DEFAULT_GRACE_HOURS = 24;
export const MAX_GRACE_HOURS = 168;
/** List paging (the spec's Limits table is silent): default 20, max 100. */
export const WEBHOOK_PAGE = { defaultSize: 20, maxSize: 100 };
export const DELIVERY_PAGE = { defaultSize: 20, maxSize: 100 };
/** Largest probe payload (serialised), bytes. */
export const MAX_PROBE_PAYLOAD_BYTES = 64 * 1024;

// ---------------------------------------------------------------------------------------------------
// Schemas

const WebhookId = Type.String({ pattern: WEBHOOK_ID_RE.source, description: 'webhook id (wh_…)' });
const DeliveryId = Type.String({ pattern: DELIVERY_ID_RE.source, description: 'delivery id (dlv_…)' });
const Timestamp = DateTime;
const NullableTimestamp = NullableDateTime;

const Url = Type.String({
  minLength: 1,
  maxLength: 2048,
  description: 'https URL receiving the deliveries (http and private addresses only with ROOST_WEBHOOK_ALLOW_PRIVATE)',
});
const Name = Type.String({ minLength: 1, maxLength: 100, pattern: '\\S', description: 'label' });
const Events = Type.Array(Type.String({ minLength: 1, maxLength: 100 }), {
  minItems: 1,
  maxItems: MAX_EVENTS_PER_WEBHOOK,
  description: `non-empty subset of the event catalog: ${WEBHOOK_EVENTS.join(', ')}`,
});

const SiteParams = Type.Object({ siteId: SiteId });
const WebhookParams = Type.Object({ siteId: SiteId, webhookId: WebhookId });
const DeliveryParams = Type.Object({ siteId: SiteId, webhookId: WebhookId, deliveryId: DeliveryId });

const CreateBody = Type.Object(
  { url: Url, name: Name, events: Events, enabled: Type.Optional(Type.Boolean({ description: 'default true' })) },
  { additionalProperties: false },
);
type CreateBody = Static<typeof CreateBody>;

/** PATCH body; other fields are 400 forbidden_field (checked in the handler, like the other PATCH routes). */
const PatchBody = Type.Object({
  url: Type.Optional(Url),
  name: Type.Optional(Name),
  events: Type.Optional(Events),
  enabled: Type.Optional(Type.Boolean()),
  paused: Type.Optional(Type.Boolean({ description: 'false resumes a paused subscription and resets failCount' })),
});
const PATCH_FIELDS = new Set(['url', 'name', 'events', 'enabled', 'paused']);

const RotateBody = Type.Object(
  {
    graceHours: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_GRACE_HOURS,
        description: `hours the previous secret keeps signing (default ${DEFAULT_GRACE_HOURS}; 0 ends it now)`,
      }),
    ),
  },
  { additionalProperties: false },
);

const WebhookProps = {
  webhookId: Type.String(),
  siteId: Type.String(),
  url: Type.String(),
  name: Type.String(),
  events: Type.Array(Type.String()),
  enabled: Type.Boolean(),
  paused: Type.Boolean({ description: 'set after repeated failed deliveries (or by PATCH); paused subscriptions get no new deliveries' }),
  createdAt: Timestamp,
  createdBy: Type.String({ description: 'user id' }),
  updatedAt: Timestamp,
  lastTriggered: Type.Union([Timestamp, Type.Null()], { description: 'start of the latest delivery attempt' }),
  lastStatus: Type.Union([Type.Literal('succeeded'), Type.Literal('failed'), Type.Null()], {
    description: 'outcome of the latest finished delivery',
  }),
  lastResponseCode: Type.Union([Type.Integer(), Type.Null()], { description: 'HTTP status of the latest attempt (null: no response)' }),
  failCount: Type.Integer({ description: 'consecutive failed deliveries (reset by a success or by unpausing)' }),
  secretRotatedAt: NullableTimestamp,
  previousSecretExpiresAt: Type.Union([Timestamp, Type.Null()], { description: 'the previous secret also signs until then' }),
};
const WebhookView = Type.Object(WebhookProps);
type WebhookView = Static<typeof WebhookView>;
const SigningSecret = Type.String({ description: 'HMAC signing secret (whsec_…), returned once; store it now' });
const WebhookCreated = Type.Object({ ...WebhookProps, signingSecret: SigningSecret });

const AttemptView = Type.Object({
  attempt: Type.Integer({ description: '1, 2, … across runs of the delivery' }),
  status: Type.Union([Type.Literal('succeeded'), Type.Literal('failed')]),
  startedAt: Timestamp,
  latencyMs: Type.Integer(),
  responseCode: Type.Union([Type.Integer(), Type.Null()], { description: 'null when no response came (timeout, refused, network error)' }),
  error: Type.Union([Type.String(), Type.Null()]),
});
type AttemptView = Static<typeof AttemptView>;
const DeliveryView = Type.Object({
  deliveryId: Type.String(),
  webhookId: Type.String(),
  eventId: Type.String(),
  event: Type.String(),
  status: Type.Union([Type.Literal('pending'), Type.Literal('succeeded'), Type.Literal('failed')]),
  attemptCount: Type.Integer(),
  attempts: Type.Array(AttemptView),
  lastError: Type.Union([Type.String(), Type.Null()]),
  nextAttemptAt: NullableTimestamp,
  createdAt: Timestamp,
  updatedAt: Timestamp,
  completedAt: NullableTimestamp,
  envelope: Type.Record(Type.String(), Type.Unknown(), { description: 'the dispatcher envelope sent (event, siteId, occurredAt, data)' }),
});
type DeliveryView = Static<typeof DeliveryView>;

const Paging = { next_page_token: Type.String(), nextPageToken: Type.String() };

const ProbeQuery = Type.Object({ siteId: SiteId });
const ProbeBody = Type.Object(
  {
    url: Url,
    event: Type.String({ minLength: 1, maxLength: 100, description: 'an event of the catalog' }),
    payload: Type.Record(Type.String(), Type.Unknown(), { description: 'sent as the envelope data' }),
    signingSecret: Type.Optional(
      Type.String({ minLength: 8, maxLength: 256, description: 'secret to sign with; default: a fresh one, returned in the response' }),
    ),
  },
  { additionalProperties: false },
);
const ProbeResult = Type.Object({
  ok: Type.Boolean({ description: 'the receiver answered 2xx' }),
  statusCode: Type.Union([Type.Integer(), Type.Null()]),
  latencyMs: Type.Integer(),
  error: Type.Union([Type.String(), Type.Null()]),
  id: Type.String({ description: 'the probe envelope id (also Roost-Delivery)' }),
  event: Type.String(),
  occurredAt: Timestamp,
  signingSecret: Type.Optional(Type.String({ description: 'the generated secret the probe was signed with (only when none was sent)' })),
});

// ---------------------------------------------------------------------------------------------------
// Views and rules

const iso = (d: Date | null) => (d === null ? null : d.toISOString());

function webhookView(r: WebhookRow): WebhookView {
  const graceOpen =
    r.previous_secret_sealed !== null && r.previous_secret_expires_at !== null && r.previous_secret_expires_at.getTime() > Date.now();
  return {
    webhookId: r.webhook_id,
    siteId: r.site_id,
    url: r.url,
    name: r.name,
    events: r.events,
    enabled: r.enabled,
    paused: r.paused,
    createdAt: r.created_at.toISOString(),
    createdBy: r.created_by,
    updatedAt: r.updated_at.toISOString(),
    lastTriggered: iso(r.last_triggered_at),
    lastStatus: r.last_status === 'succeeded' || r.last_status === 'failed' ? r.last_status : null,
    lastResponseCode: r.last_response_code,
    failCount: Number(r.fail_count),
    secretRotatedAt: iso(r.secret_rotated_at),
    previousSecretExpiresAt: graceOpen ? iso(r.previous_secret_expires_at) : null,
  };
}

function attemptView(a: AttemptRow): AttemptView {
  const ok = a.response_code !== null && a.response_code >= 200 && a.response_code < 300;
  return {
    attempt: Number(a.attempt_no),
    status: ok ? 'succeeded' : 'failed',
    startedAt: a.started_at.toISOString(),
    latencyMs: Number(a.latency_ms),
    responseCode: a.response_code,
    error: a.error,
  };
}

function deliveryView(d: DeliveryRow, attempts: AttemptRow[]): DeliveryView {
  return {
    deliveryId: d.delivery_id,
    webhookId: d.webhook_id,
    eventId: d.event_id,
    event: d.event_type,
    status: d.status,
    attemptCount: Number(d.attempts),
    attempts: attempts.map(attemptView),
    lastError: d.last_error,
    nextAttemptAt: d.status === 'pending' ? iso(d.next_attempt_at) : null,
    createdAt: d.created_at.toISOString(),
    updatedAt: d.updated_at.toISOString(),
    completedAt: iso(d.completed_at),
    envelope: JSON.parse(d.payload) as Record<string, unknown>,
  };
}

function invalid(param: string, message: string): ApiError {
  return new ApiError('validation_failed', `${param} ${message}`, { extras: { param, errors: { [param]: [message] } } });
}

/**
 * Event names: each in the catalog (planned and unknown names refused with a clear message), no repeats.
 * Errors are keyed `<param>.<i>`, or `param` itself when `single` (the probe's one `event`).
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
        {
          extras: { param },
        },
      );
    }
  }
  return r.url;
}

const newSecret = () => `whsec_${randomToken(32)}`;

// ---------------------------------------------------------------------------------------------------
// Routes

/** Registers the webhook routes. */
export default async function webhookRoutes(root: FastifyInstance): Promise<void> {
  const app = root.withTypeProvider<TypeBoxTypeProvider>();
  const { db, cfg } = app.deps;
  let key: Buffer | undefined;
  const sealKey = () => (key ??= secretKey(cfg));
  const read = (siteId: string) => [{ resource: 'site' as const, id: siteId, permission: 'read' as const }];
  const admin = (siteId: string) => [{ resource: 'site' as const, id: siteId, permission: 'admin' as const }];
  const found = async (siteId: string, webhookId: string) => {
    const w = await getWebhook(db, siteId, webhookId);
    if (!w) throw new ApiError('not_found', 'webhook not found');
    return w;
  };

  app.post(
    '/api/sites/:siteId/webhooks',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['webhooks'],
        summary: 'Create a webhook subscription; the signing secret is returned once in `signingSecret`',
        params: SiteParams,
        body: CreateBody,
        response: { 201: WebhookCreated, ...problems(409, 422, 429) },
      },
    },
    async (request, reply) => {
      const { siteId } = request.params;
      const user = await authorizeSite(request, siteId, admin(siteId));
      const body: CreateBody = request.body;
      const events = checkEvents(body.events);
      const url = await checkUrl(body.url, cfg.ROOST_WEBHOOK_ALLOW_PRIVATE);
      await enforceCapability(request, 'WEBHOOK_MANAGE', siteId);
      const webhookId = newId('wh');
      const secret = newSecret();
      const row = await insertWebhook(db, {
        siteId,
        webhookId,
        url,
        name: body.name.trim(),
        events,
        enabled: body.enabled ?? true,
        secretSealed: seal(sealKey(), secret, webhookAad(siteId, webhookId)),
        createdBy: user.userId,
      });
      reply.code(201).header('Cache-Control', 'no-store');
      return { ...webhookView(row), signingSecret: secret };
    },
  );

  app.get(
    '/api/sites/:siteId/webhooks',
    {
      schema: {
        tags: ['webhooks'],
        summary: "The site's webhook subscriptions, newest first",
        params: SiteParams,
        querystring: Type.Object(PagingQuery),
        response: { 200: Type.Object({ webhooks: Type.Array(WebhookView), ...Paging }), ...problems() },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      await authorizeSite(request, siteId, read(siteId));
      const paging = parsePaging(request.query as Record<string, unknown>, { ...WEBHOOK_PAGE, accept: isWebhookPosition });
      const rows = await listWebhooks(db, siteId, { after: paging.after as [string, string] | undefined, limit: paging.pageSize });
      const page = rows.slice(0, paging.pageSize);
      const last = page[page.length - 1];
      return {
        webhooks: page.map(webhookView),
        ...pageTokens(rows.length > paging.pageSize && last ? [last.created_at_text, last.webhook_id] : undefined),
      };
    },
  );

  app.get(
    '/api/sites/:siteId/webhooks/:webhookId',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'One webhook subscription (never its secret)',
        params: WebhookParams,
        response: { 200: WebhookView, ...problems() },
      },
    },
    async (request) => {
      const { siteId, webhookId } = request.params;
      await authorizeSite(request, siteId, read(siteId));
      return webhookView(await found(siteId, webhookId));
    },
  );

  app.patch(
    '/api/sites/:siteId/webhooks/:webhookId',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['webhooks'],
        summary: 'Change url, name, events, enabled or paused (other fields: 400 forbidden_field)',
        params: WebhookParams,
        body: PatchBody,
        response: { 200: WebhookView, ...problems(409, 422, 429) },
      },
    },
    async (request) => {
      const { siteId, webhookId } = request.params;
      await authorizeSite(request, siteId, admin(siteId));
      const body = request.body as Static<typeof PatchBody> & Record<string, unknown>;
      rejectForeignFields(body, PATCH_FIELDS);
      if (Object.keys(body).length === 0) {
        throw new ApiError('validation_failed', 'send at least one of url, name, events, enabled, paused', {
          extras: { errors: { '': ['nothing to change'] } },
        });
      }
      await found(siteId, webhookId);
      const changes = {
        url: body.url === undefined ? undefined : await checkUrl(body.url, cfg.ROOST_WEBHOOK_ALLOW_PRIVATE),
        name: body.name?.trim(),
        events: body.events === undefined ? undefined : checkEvents(body.events),
        enabled: body.enabled,
        paused: body.paused,
      };
      await enforceCapability(request, 'WEBHOOK_MANAGE', siteId);
      const row = await updateWebhook(db, siteId, webhookId, changes);
      if (!row) throw new ApiError('not_found', 'webhook not found');
      return webhookView(row);
    },
  );

  app.delete(
    '/api/sites/:siteId/webhooks/:webhookId',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['webhooks'],
        summary: 'Delete a webhook subscription with its delivery history (pending deliveries stop)',
        params: WebhookParams,
        response: {
          200: Type.Object({ webhookId: Type.String(), siteId: Type.String(), deleted: Type.Literal(true) }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request) => {
      const { siteId, webhookId } = request.params;
      await authorizeSite(request, siteId, admin(siteId));
      await found(siteId, webhookId);
      await enforceCapability(request, 'WEBHOOK_MANAGE', siteId);
      if (!(await deleteWebhook(db, siteId, webhookId))) throw new ApiError('not_found', 'webhook not found');
      return { webhookId, siteId, deleted: true as const };
    },
  );

  app.post(
    '/api/sites/:siteId/webhooks/:webhookId/rotate-secret',
    {
      config: { idempotency: 'required' },
      // The body is optional: no body means the defaults.
      preValidation: async (request) => {
        if (request.body === undefined || request.body === null) request.body = {};
      },
      schema: {
        tags: ['webhooks'],
        summary: 'Rotate the signing secret (new secret once); the previous one keeps signing for graceHours (default 24)',
        params: WebhookParams,
        body: RotateBody,
        response: { 200: WebhookCreated, ...problems(409, 422, 429) },
      },
    },
    async (request, reply) => {
      const { siteId, webhookId } = request.params;
      await authorizeSite(request, siteId, admin(siteId));
      await found(siteId, webhookId);
      await enforceCapability(request, 'WEBHOOK_MANAGE', siteId);
      const graceHours = request.body.graceHours ?? DEFAULT_GRACE_HOURS;
      const secret = newSecret();
      const row = await rotateWebhookSecret(
        db,
        siteId,
        webhookId,
        seal(sealKey(), secret, webhookAad(siteId, webhookId)),
        graceHours > 0 ? new Date(Date.now() + graceHours * 3_600_000) : null,
      );
      if (!row) throw new ApiError('not_found', 'webhook not found');
      reply.header('Cache-Control', 'no-store');
      return { ...webhookView(row), signingSecret: secret };
    },
  );

  app.get(
    '/api/sites/:siteId/webhooks/:webhookId/deliveries',
    {
      schema: {
        tags: ['webhooks'],
        summary: "The subscription's deliveries, newest first, each with its attempts (status, latency, response code)",
        params: WebhookParams,
        querystring: Type.Object(PagingQuery),
        response: { 200: Type.Object({ deliveries: Type.Array(DeliveryView), ...Paging }), ...problems() },
      },
    },
    async (request) => {
      const { siteId, webhookId } = request.params;
      await authorizeSite(request, siteId, read(siteId));
      const paging = parsePaging(request.query as Record<string, unknown>, { ...DELIVERY_PAGE, accept: isDeliveryPosition });
      await found(siteId, webhookId);
      const { rows, attempts } = await listDeliveries(db, siteId, webhookId, {
        after: paging.after as [string, string] | undefined,
        limit: paging.pageSize,
      });
      const page = rows.slice(0, paging.pageSize);
      const last = page[page.length - 1];
      return {
        deliveries: page.map((d) => deliveryView(d, attempts.get(d.delivery_id) ?? [])),
        ...pageTokens(rows.length > paging.pageSize && last ? [last.created_at_text, last.delivery_id] : undefined),
      };
    },
  );

  app.post(
    '/api/sites/:siteId/webhooks/:webhookId/deliveries/:deliveryId/retry',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['webhooks'],
        summary: 'Deliver a finished delivery again (a new delivery run; its attempts are appended)',
        params: DeliveryParams,
        response: {
          202: Type.Object({
            deliveryId: Type.String(),
            webhookId: Type.String(),
            status: Type.Literal('pending'),
            workflowId: Type.String(),
          }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request, reply) => {
      const { siteId, webhookId, deliveryId } = request.params;
      await authorizeSite(request, siteId, admin(siteId));
      const webhook = await found(siteId, webhookId);
      const delivery = await getDelivery(db, siteId, deliveryId);
      if (!delivery || delivery.webhook_id !== webhookId) throw new ApiError('not_found', 'delivery not found');
      if (!webhook.enabled) throw new ApiError('conflict', 'the subscription is disabled; enable it before retrying deliveries');
      const workflowId = deliveryWorkflowId(deliveryId);
      if (delivery.status === 'pending')
        throw new ApiError('conflict', 'this delivery is still being attempted; retry it once it has finished');
      await enforceCapability(request, 'WEBHOOK_MANAGE', siteId);
      const reopened = await reopenDelivery(db, siteId, webhookId, deliveryId);
      if (reopened === 'not_found') throw new ApiError('not_found', 'delivery not found');
      if (reopened === 'in_progress')
        throw new ApiError('conflict', 'this delivery is still being attempted; retry it once it has finished');
      // The previous run wrote its outcome (the delivery is no longer pending), so a run still open is only
      // returning: replace it.
      await startDeliveryWorkflow(app.deps.temporal, cfg.ROOST_TASK_QUEUE, { siteId, deliveryId, manual: true }, 'replace-finished');
      reply.code(202);
      return { deliveryId, webhookId, status: 'pending' as const, workflowId };
    },
  );

  app.post(
    '/api/webhooks/probe',
    {
      config: { idempotency: 'optional' },
      schema: {
        tags: ['webhooks'],
        summary: 'Send one signed probe delivery to a URL and report the result (no retry)',
        querystring: ProbeQuery,
        body: ProbeBody,
        response: { 200: ProbeResult, ...problems(409, 413, 422, 429) },
      },
    },
    async (request) => {
      const { siteId } = request.query;
      await authorizeSite(request, siteId, admin(siteId));
      const body = request.body;
      const [event] = checkEvents([body.event], 'event', true);
      const url = await checkUrl(body.url, cfg.ROOST_WEBHOOK_ALLOW_PRIVATE);
      await enforceCapability(request, 'WEBHOOK_MANAGE', siteId);
      const id = newId('prb');
      const occurredAt = new Date().toISOString();
      const raw = JSON.stringify({ id, event, occurredAt, siteId, data: body.payload });
      if (Buffer.byteLength(raw) > MAX_PROBE_PAYLOAD_BYTES)
        throw new ApiError('payload_too_large', `the probe envelope must be at most ${MAX_PROBE_PAYLOAD_BYTES} bytes`, {
          extras: { param: 'payload' },
        });
      const generated = body.signingSecret === undefined ? newSecret() : undefined;
      const secret = body.signingSecret ?? (generated as string);
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
        ...(generated ? { signingSecret: generated } : {}),
      };
    },
  );
}
