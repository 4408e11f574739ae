/**
 * The server-sent event stream (api/events/hub.ts, services/events.ts; docs/decisions/event-stream.md):
 *
 *   GET /api/events/stream?siteId=…[&events=a,b][&lastEventId=N][&api_key=…]   site read
 *       Accept: text/event-stream   [Last-Event-ID: N]
 *
 * Answers 200 `text/event-stream`: `retry:`, a `connected` frame (id: the seq the stream starts
 * after), then the site's events after that seq (`id: <seq>`, `event: <name>`, data the dispatcher
 * envelope event, siteId, occurredAt, data), live, with a `keepalive` frame every
 * ROOST_STREAM_KEEPALIVE_MS. Everything that can fail (credential, site, scope, Accept, filter,
 * cursor) is checked before the stream starts and answered as problem+json; the credential and access
 * are re-checked at every keepalive and the stream ends when they are gone. The stream carries no
 * rate-limit headers (streaming routes may omit them).
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { Type } from '@sinclair/typebox';
import { ApiError, errors } from '../../domain/errors';
import { EVENT_TYPES, isEventType } from '../../domain/events';
import { siteEventHead } from '../../services/events';
import type { AppDeps } from '../context';
import { authenticate, authorizeSite } from '../plugins/auth';
import { EventHub } from '../events/hub';
import { SSE_HEADERS, SseConnection } from '../events/sse';
import { problems, SiteId } from '../../domain/schemas';

/** A stream cursor: a per-site seq as a decimal string (0 = before the first event). */
const CURSOR_RE = /^(0|[1-9][0-9]{0,15})$/;

const StreamQuery = Type.Object({
  siteId: SiteId,
  events: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 1000,
      description: `exact-match comma list of event names of the catalog (${EVENT_TYPES.join(', ')}); absent: every event`,
    }),
  ),
  lastEventId: Type.Optional(
    Type.String({
      pattern: CURSOR_RE.source,
      description: 'resume after this event id, for clients that cannot send the Last-Event-ID header (the header wins when both are sent)',
    }),
  ),
});

/** SSE framing, documented as the 200 response's text. */
const StreamBody = Type.String({
  description:
    'SSE blocks `id: <seq>` / `event: <kind>` / `data: <json>`. Kinds: `connected` (data siteId, lastEventId, serverTime, events; id = the seq the stream starts after), ' +
    '`keepalive` (data serverTime; about every 15 s), and the catalog events (data: the dispatcher envelope event, siteId, occurredAt, data; id = the per-site seq to resume from).',
});

/** Parses the `events` filter; unknown or empty names → 400 validation_failed. */
export function parseEventFilter(raw: string | undefined): Set<string> | null {
  if (raw === undefined) return null;
  const names = raw.split(',').map((s) => s.trim());
  const bad = names.filter((n) => !isEventType(n));
  if (bad.length > 0) {
    throw errors.validation(
      `events lists ${bad.map((b) => (b === '' ? 'an empty name' : `unknown event "${b}"`)).join(', ')}; the catalog is ${EVENT_TYPES.join(', ')}`,
      { 'querystring.events': bad.map((b) => (b === '' ? 'empty event name' : `unknown event ${b}`)) },
      'events',
    );
  }
  return new Set(names);
}

/**
 * The cursor a client resumes after: the Last-Event-ID header (blank counts as absent), else the
 * `lastEventId` query parameter; undefined for a live-only stream.
 * @throws ApiError validation_failed (param Last-Event-ID) when it is not a decimal event id
 */
export function requestedCursor(header: string | string[] | undefined, query: string | undefined): string | undefined {
  const raw = typeof header === 'string' && header.trim() !== '' ? header.trim() : query;
  if (raw !== undefined && !CURSOR_RE.test(raw)) {
    throw errors.validation(
      'Last-Event-ID must be an event id from this stream (a decimal number)',
      { 'headers.last-event-id': ['must be a decimal event id'] },
      'Last-Event-ID',
    );
  }
  return raw;
}

/** True when an Accept header admits `text/event-stream` (absent counts as any type, RFC 9110). */
export function acceptsEventStream(accept: string | undefined): boolean {
  if (accept === undefined || accept.trim() === '') return true;
  return accept.split(',').some((part) => {
    const [type, ...params] = part.trim().toLowerCase().split(';');
    const q = params.map((p) => p.trim()).find((p) => p.startsWith('q='));
    if (q !== undefined && Number(q.slice(2)) === 0) return false;
    return type.trim() === 'text/event-stream' || type.trim() === 'text/*' || type.trim() === '*/*';
  });
}

/** The reply headers set so far (hooks' headers, X-Request-Id…), for the hijacked response. */
function definedHeaders(all: Record<string, string | number | string[] | undefined>): Record<string, string | number | string[]> {
  const headers: Record<string, string | number | string[]> = {};
  for (const [k, v] of Object.entries(all)) if (v !== undefined) headers[k] = v;
  return headers;
}

const hubs = new WeakMap<AppDeps, EventHub>();

/** The event hub of the app built over `deps` (for tests and diagnostics); undefined before registration. */
export function eventHubOf(deps: AppDeps): EventHub | undefined {
  return hubs.get(deps);
}

/** Registers the stream route and this process's event hub (closed with the app). */
const eventRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const cfg = app.deps.cfg;
  const hub = new EventHub(app.deps, { pollMs: cfg.ROOST_STREAM_POLL_MS, log: app.log });
  hubs.set(app.deps, hub);
  // preClose: end the streams before the server waits for its connections.
  app.addHook('preClose', async () => hub.close());

  app.get(
    '/api/events/stream',
    {
      config: { allowQueryKey: true },
      schema: {
        summary: "Server-sent event stream of a site's events (resumable with Last-Event-ID)",
        tags: ['events'],
        querystring: StreamQuery,
        headers: Type.Object({
          accept: Type.Optional(Type.String({ description: 'must admit text/event-stream' })),
          'last-event-id': Type.Optional(
            Type.String({ description: 'resume after this event id (decimal seq from a previous `id:`); empty = absent' }),
          ),
        }),
        response: {
          200: { description: 'text/event-stream', content: { 'text/event-stream': { schema: StreamBody } } },
          ...problems(),
        },
      },
    },
    async (request, reply) => {
      const { siteId, events, lastEventId } = request.query;
      const needs = [{ resource: 'site' as const, id: siteId, permission: 'read' as const }];
      await authorizeSite(request, siteId, needs);
      if (!acceptsEventStream(request.headers.accept)) {
        throw errors.validation(
          'this route answers text/event-stream only; send Accept: text/event-stream',
          { 'headers.accept': ['must admit text/event-stream'] },
          'Accept',
        );
      }
      const types = parseEventFilter(events);
      const rawCursor = requestedCursor(request.headers['last-event-id'], lastEventId);
      // The hijacked reply skips the audit plugin's onSend: sample this key's use here (before the end
      // position is read, so a first-use api_key.used event is not replayed to the caller itself).
      await app.auditKeyUse(request, siteId);
      const end = await siteEventHead(app.deps, siteId);
      const cursor = rawCursor === undefined ? end : Number(rawCursor);
      if (cursor > end) {
        throw errors.validation(
          `Last-Event-ID ${cursor} is ahead of this site's last event (${end}); ids are per site`,
          { 'headers.last-event-id': ['ahead of the last event of this site'] },
          'Last-Event-ID',
        );
      }

      // HEAD: the GET's status and headers, no stream (RFC 9110 9.3.2).
      if (request.method === 'HEAD') return reply.code(200).headers(SSE_HEADERS).send('');

      reply.hijack();
      const conn = new SseConnection(reply.raw, {
        siteId,
        types,
        cursor,
        keepaliveMs: cfg.ROOST_STREAM_KEEPALIVE_MS,
        maxBufferedBytes: cfg.ROOST_STREAM_CLIENT_BUFFER_BYTES,
        stallMs: cfg.ROOST_STREAM_STALL_MS,
        onClose: (c) => hub.unsubscribe(c),
        onDrain: (c) => hub.drained(c),
        keyId: request.principal?.kind === 'user' ? request.principal.key?.keyId : undefined,
        // The credential and the access are re-checked at every keepalive: a revoked or expired key or a
        // lost membership ends the stream (the client's reconnect then gets the 401/403/404).
        recheck: async () => {
          try {
            const principal = await authenticate(app, request);
            if (!principal) return false;
            request.principal = principal;
            await authorizeSite(request, siteId, needs);
            return true;
          } catch (err) {
            if (err instanceof ApiError && err.status < 500) return false;
            app.log.warn({ err, siteId }, 'event stream: could not re-check access; the stream stays open');
            return true;
          }
        },
      });
      conn.start(definedHeaders(reply.getHeaders()), {
        siteId,
        lastEventId: String(cursor),
        serverTime: new Date().toISOString(),
        events: types ? [...types] : null,
      });
      hub.subscribe(conn);
    },
  );
};

export default eventRoutes;
