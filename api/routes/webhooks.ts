/**
 * Webhook subscriptions, delivery history, manual retry and the probe (services/webhooks.ts;
 * docs/decisions/webhooks.md):
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
 * bucket once the request is valid. Delivery URL rules: docs/decisions/webhook-urls.md.
 */
import type { FastifyRequest } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { DateTime, HttpsUrl, NullableDateTime, pagingQuery, PageTokens, problems, SiteId, NON_BLANK_TEXT } from '../../domain/schemas';
import {
  type AttemptRow,
  createWebhook,
  DEFAULT_GRACE_HOURS,
  DELIVERY_ID_RE,
  type DeliveryRow,
  deleteWebhook,
  getWebhook,
  isDeliveryPosition,
  isWebhookPosition,
  listDeliveryPage,
  listWebhookPage,
  MAX_EVENTS_PER_WEBHOOK,
  MAX_GRACE_HOURS,
  probeWebhook,
  retryDelivery,
  rotateWebhookSecret,
  updateWebhook,
  WEBHOOK_EVENTS,
  WEBHOOK_ID_RE,
  type WebhookRow,
} from '../../services/webhooks';
import { authorizeSite, siteRequirement } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';
import { parsePaging } from '../pagination';
import { rejectForeignFields } from './roosts';

/** List paging (default 20, max 100). */
export const WEBHOOK_PAGE = { defaultSize: 20, maxSize: 100 };
export const DELIVERY_PAGE = { defaultSize: 20, maxSize: 100 };

// ---------------------------------------------------------------------------------------------------
// Schemas

const WebhookId = Type.String({ pattern: WEBHOOK_ID_RE.source, description: 'webhook id (wh_…)' });
const DeliveryId = Type.String({ pattern: DELIVERY_ID_RE.source, description: 'delivery id (dlv_…)' });

// The document states the https form (no fragment); domain/webhook-signature.ts checkWebhookUrl also refuses non-public
// addresses and, with ROOST_WEBHOOK_ALLOW_PRIVATE, accepts http.
const Url = HttpsUrl('https URL receiving the deliveries (http and private addresses only with ROOST_WEBHOOK_ALLOW_PRIVATE)', {
  fragment: false,
});
const Name = Type.String({ minLength: 1, maxLength: 100, pattern: NON_BLANK_TEXT, description: 'label' });
// The handler names the unknown event in its 400 validation_failed; the document lists the catalog (`x-roost-enum`).
const Event = Type.String({ minLength: 1, maxLength: 100, 'x-roost-enum': [...WEBHOOK_EVENTS] });
const Events = Type.Array(Event, {
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

/** PATCH body; other fields are 400 forbidden_field (checked in the handler, like the other PATCH routes). */
const PatchBody = Type.Object(
  {
    url: Type.Optional(Url),
    name: Type.Optional(Name),
    events: Type.Optional(Events),
    enabled: Type.Optional(Type.Boolean()),
    paused: Type.Optional(Type.Boolean({ description: 'false resumes a paused subscription and resets failCount' })),
  },
  { 'x-roost-closed': true, minProperties: 1 },
);
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
  createdAt: DateTime,
  createdBy: Type.String({ description: 'user id' }),
  updatedAt: DateTime,
  lastTriggered: Type.Union([DateTime, Type.Null()], { description: 'start of the latest delivery attempt' }),
  lastStatus: Type.Union([Type.Literal('succeeded'), Type.Literal('failed'), Type.Null()], {
    description: 'outcome of the latest finished delivery',
  }),
  lastResponseCode: Type.Union([Type.Integer(), Type.Null()], { description: 'HTTP status of the latest attempt (null: no response)' }),
  failCount: Type.Integer({ description: 'consecutive failed deliveries (reset by a success or by unpausing)' }),
  secretRotatedAt: NullableDateTime,
  previousSecretExpiresAt: Type.Union([DateTime, Type.Null()], { description: 'the previous secret also signs until then' }),
};
const WebhookView = Type.Object(WebhookProps);
type WebhookView = Static<typeof WebhookView>;
const SigningSecret = Type.String({ description: 'HMAC signing secret (whsec_…), returned once; store it now' });
const WebhookCreated = Type.Object({ ...WebhookProps, signingSecret: SigningSecret });

const AttemptView = Type.Object({
  attempt: Type.Integer({ description: '1, 2, … across runs of the delivery' }),
  status: Type.Union([Type.Literal('succeeded'), Type.Literal('failed')]),
  startedAt: DateTime,
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
  nextAttemptAt: NullableDateTime,
  createdAt: DateTime,
  updatedAt: DateTime,
  completedAt: NullableDateTime,
  envelope: Type.Record(Type.String(), Type.Unknown(), { description: 'the dispatcher envelope sent (event, siteId, occurredAt, data)' }),
});
type DeliveryView = Static<typeof DeliveryView>;

const ProbeQuery = Type.Object({ siteId: SiteId });
const ProbeBody = Type.Object(
  {
    url: Url,
    event: Type.String({ ...Event, description: 'an event of the catalog' }),
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
  occurredAt: DateTime,
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

// ---------------------------------------------------------------------------------------------------
// Routes

const read = (siteId: string) => siteRequirement(siteId, 'read');
const admin = (siteId: string) => siteRequirement(siteId, 'admin');
/** The capability rate limit of webhook mutations, counted once the request is valid (services' `beforeChange`). */
const manage = (request: FastifyRequest, siteId: string) => () => enforceCapability(request, 'WEBHOOK_MANAGE', siteId);

/** Registers the webhook routes. */
const webhookRoutes: FastifyPluginAsyncTypebox = async (app) => {
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
      const { row, secret } = await createWebhook(app.deps, {
        ...request.body,
        siteId,
        createdBy: user.userId,
        beforeChange: manage(request, siteId),
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
        querystring: Type.Object(pagingQuery(WEBHOOK_PAGE)),
        response: { 200: Type.Object({ webhooks: Type.Array(WebhookView), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      await authorizeSite(request, siteId, read(siteId));
      const paging = parsePaging(request, { ...WEBHOOK_PAGE, accept: isWebhookPosition });
      const { rows, next } = await listWebhookPage(app.deps, { siteId, after: paging.after, pageSize: paging.pageSize });
      return { webhooks: rows.map(webhookView), ...paging.tokens(next) };
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
      return webhookView(await getWebhook(app.deps, siteId, webhookId));
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
      const { url, name, events, enabled, paused } = body;
      const changes = { url, name, events, enabled, paused };
      return webhookView(await updateWebhook(app.deps, { siteId, webhookId, changes, beforeChange: manage(request, siteId) }));
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
      await deleteWebhook(app.deps, { siteId, webhookId, beforeChange: manage(request, siteId) });
      return { webhookId, siteId, deleted: true as const };
    },
  );

  app.post(
    '/api/sites/:siteId/webhooks/:webhookId/rotate-secret',
    {
      config: { idempotency: 'required', bodyOptional: true },
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
      const graceHours = request.body.graceHours ?? DEFAULT_GRACE_HOURS;
      const { row, secret } = await rotateWebhookSecret(app.deps, { siteId, webhookId, graceHours, beforeChange: manage(request, siteId) });
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
        querystring: Type.Object(pagingQuery(DELIVERY_PAGE)),
        response: { 200: Type.Object({ deliveries: Type.Array(DeliveryView), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      const { siteId, webhookId } = request.params;
      await authorizeSite(request, siteId, read(siteId));
      const paging = parsePaging(request, { ...DELIVERY_PAGE, accept: isDeliveryPosition });
      const page = await listDeliveryPage(app.deps, { siteId, webhookId, after: paging.after, pageSize: paging.pageSize });
      return {
        deliveries: page.rows.map((d) => deliveryView(d, page.attempts.get(d.delivery_id) ?? [])),
        ...paging.tokens(page.next),
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
      const { workflowId } = await retryDelivery(app.deps, { siteId, webhookId, deliveryId, beforeChange: manage(request, siteId) });
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
      const { generatedSecret, ...result } = await probeWebhook(app.deps, {
        ...request.body,
        siteId,
        beforeChange: manage(request, siteId),
      });
      return {
        ...result,
        ...(generatedSecret ? { signingSecret: generatedSecret } : {}),
      };
    },
  );
};

export default webhookRoutes;
