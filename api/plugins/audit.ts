/**
 * Audit recording (the log is read by `GET /api/sites/{siteId}/audit-log`; the event `api_key.used`):
 * one `onSend` hook, so routes need no audit code. For a successful (status < 400) request of a
 * site-scoped route by a user principal (API key, session or ID token), before the response is sent, one
 * SERIALIZABLE transaction (services/audit.ts `recordSiteActivity`) appends to that site's chain:
 *
 * 1. `api_key_used` (API keys only, sampled): when this key has no sample from this client address on
 *    this site within ROOST_AUDIT_KEY_USE_SAMPLE_SECONDS (default 1 h). On the first use ever from the
 *    address, also the `api_key.used` event (outbox). An in-process cache in front of the table means a
 *    known key and address costs no database work (docs/decisions/audit-key-use.md);
 * 2. `signed_url_issued` for routes that issue signed URLs (chunk upload and download URLs, a screenshot
 *    URL): one record per call with the count and a digest of the hashes, never the URLs;
 * 3. a mutation record for every other non-GET request: the route's kind (table below, or the route's
 *    `config.audit`, else `<METHOD> <route pattern>`), with route, params, status, requestId, the
 *    idempotency replay flag and the ids the response names, plus what the route put in
 *    `request.auditDetails` (a site PATCH's changed settings). Never bodies, secrets or raw keys.
 *
 * "Site-scoped" means the request passed `authorizeSite` (api/plugins/auth.ts sets
 * `request.authorizedSiteId`); an idempotent replay (which skips the handler) uses the siteId of its
 * path, query or body. Refused requests (4xx/5xx) write nothing. Agent-token calls are not audited.
 * The mutation record is written by the mutation's own transaction (services/audit.ts AuditedMutation: every
 * transaction of the request that writes inserts it into `audit_outbox` just before its COMMIT), and linked into
 * the chain after the response is ready, with the status and the ids the response names; a request that died
 * in between leaves it in the outbox, and a pass every 30 s links records older than a minute. So no committed
 * mutation lacks its record. A failed link is logged and retried by that pass; it does not fail the response.
 * docs/decisions/audit-recording.md.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { apiKeyActor, AUDIT_KIND_SIGNED_URL_ISSUED, hashSetDigest, userActor } from '../../domain/audit';
import {
  type AuditedMutation,
  type AuditInput,
  beginAuditedMutation,
  linkStaleAuditOutbox,
  recordSiteActivity,
} from '../../services/audit';
import type { UserPrincipal } from '../context';
import { SITE_ID_RE } from '../../domain/schemas';
import { headerText } from '../../domain/input';

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * Audit kind of this route's successful non-GET requests (default: the table in
     * api/plugins/audit.ts, else `<METHOD> <route pattern>`); false: the route only reads (no record).
     */
    audit?: string | false;
  }
}

/** Kinds of the mutation routes that exist; null: a read that uses POST (no mutation record). */
export const MUTATION_KINDS: Record<string, string | null> = {
  'POST /api/roosts': 'roost_created',
  'PATCH /api/roosts/:roostId': 'roost_updated',
  'DELETE /api/roosts/:roostId': 'roost_deleted',
  'POST /api/roosts/:roostId/versions': 'version_published',
  'PATCH /api/roosts/:roostId/versions/:versionRef': 'version_updated',
  'POST /api/roosts/:roostId/rollback': 'version_rolled_back',
  'POST /api/roosts/:roostId/deploy': 'roost_deployed',
  'POST /api/chunks/check': null,
  'POST /api/chunks/:digest/mount': 'chunk_mounted',
  'POST /api/sites/:siteId/enrolment-secret': 'enrolment_secret_rotated',
  'POST /api/sites/:siteId/machines/:machineId/commands': 'machine_command_queued',
  'POST /api/sites/:siteId/deployments': 'classic_deployment_created',
  'POST /api/sites/:siteId/deployments/:deploymentId/retry': 'classic_deployment_retried',
  'POST /api/sites/:siteId/deployments/:deploymentId/cancel': 'classic_deployment_cancelled',
  'POST /api/sites/:siteId/deployments/:deploymentId/uninstall': 'classic_deployment_uninstalled',
  'DELETE /api/sites/:siteId/deployments/:deploymentId': 'classic_deployment_deleted',
  'POST /api/sites/:siteId/installer-templates': 'installer_template_created',
  'PATCH /api/sites/:siteId/installer-templates/:templateId': 'installer_template_updated',
  'DELETE /api/sites/:siteId/installer-templates/:templateId': 'installer_template_deleted',
  'POST /api/sites/:siteId/machines/:machineId/processes': 'process_created',
  'PATCH /api/sites/:siteId/machines/:machineId/processes/:processId': 'process_updated',
  'DELETE /api/sites/:siteId/machines/:machineId/processes/:processId': 'process_deleted',
  'POST /api/sites/:siteId/machines/:machineId/processes/:processId/kill': 'process_command_queued',
  'POST /api/sites/:siteId/machines/:machineId/processes/:processId/restart': 'process_command_queued',
  'POST /api/sites/:siteId/machines/:machineId/processes/:processId/start': 'process_command_queued',
  'POST /api/sites/:siteId/machines/:machineId/processes/:processId/stop': 'process_command_queued',
  'POST /api/sites/:siteId/machines/:machineId/processes/:processId/schedule': 'process_schedule_set',
};

/** Routes that issue signed URLs, and how to read what they issued from the response body. */
const SIGNED_URL_ROUTES: Record<
  string,
  { purpose: string; read: (body: JsonObject | undefined) => { hashes: string[]; count: number; expiresAt: string | null } | null }
> = {
  'POST /api/chunks/upload-urls': { purpose: 'chunk_upload', read: chunkUrls },
  'POST /api/chunks/download-urls': { purpose: 'chunk_download', read: chunkUrls },
  'GET /api/chunks/download-urls': { purpose: 'chunk_download', read: chunkUrls },
  'GET /api/sites/:siteId/machines/:machineId/commands/:commandId': {
    purpose: 'screenshot',
    read: (b) =>
      b && typeof b.screenshotUrl === 'string'
        ? { hashes: [], count: 1, expiresAt: typeof b.screenshotExpiresAt === 'string' ? b.screenshotExpiresAt : null }
        : null,
  },
};

function chunkUrls(body: JsonObject | undefined): { hashes: string[]; count: number; expiresAt: string | null } | null {
  if (!body || typeof body.urls !== 'object' || body.urls === null) return null;
  const hashes = Object.keys(body.urls as object);
  return hashes.length ? { hashes, count: hashes.length, expiresAt: typeof body.expiresAt === 'string' ? body.expiresAt : null } : null;
}

/** Response fields naming what a mutation made or touched (ids only), copied into its record. */
const RESULT_ID_FIELDS = [
  'roostId',
  'versionId',
  'versionNumber',
  'currentVersionId',
  'rolloutId',
  'commandId',
  'machineId',
  'digest',
  'dryRun',
  'alreadyRunning',
  'deploymentId',
  'templateId',
  'processId',
  'affected',
  'alreadyDeleted',
  'conversationId',
];

/** Largest response body parsed for ids or URL counts. */
const MAX_PARSED_BODY = 4 * 1024 * 1024;
/** Characters of a User-Agent kept in records and events. */
const MAX_USER_AGENT = 512;
/** Entries of the in-process key-use cache before it is cleared. */
const CACHE_MAX = 50_000;

/** A parsed JSON object body. */
type JsonObject = Record<string, unknown>;

function parseBody(payload: unknown): JsonObject | undefined {
  const text = typeof payload === 'string' ? payload : Buffer.isBuffer(payload) ? payload.toString('utf8') : null;
  if (text === null || text.length > MAX_PARSED_BODY) return undefined;
  try {
    const parsed: unknown = JSON.parse(text);
    return parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed) ? (parsed as JsonObject) : undefined;
  } catch {
    return undefined;
  }
}

/** siteId of an idempotent replay: path, then query, then body. */
function siteIdOfRequest(request: FastifyRequest): string | undefined {
  for (const src of [request.params, request.query, request.body]) {
    const v = (src as Record<string, unknown> | undefined)?.siteId;
    if (typeof v === 'string' && SITE_ID_RE.test(v)) return v;
  }
  return undefined;
}

function actorOf(user: UserPrincipal): string {
  return user.key ? apiKeyActor(user.key.keyId) : userActor(user.userId);
}

/** The ids a response names (RESULT_ID_FIELDS), for a mutation's record. */
function resultIds(payload: unknown): Record<string, unknown> {
  const body = parseBody(payload);
  const result: Record<string, unknown> = {};
  if (body && typeof body === 'object' && !Array.isArray(body)) {
    for (const f of RESULT_ID_FIELDS) {
      const v = body[f];
      if (typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean') result[f] = v;
    }
  }
  return result;
}

/** The kind of the request's mutation record: null when the request makes none (reads, signed-URL routes). */
function mutationKind(request: FastifyRequest): string | null {
  const route = request.routeOptions.url ?? request.url.split('?', 1)[0];
  const key = `${request.method} ${route}`;
  if (SIGNED_URL_ROUTES[key]) return null;
  if (request.method === 'GET' || request.method === 'HEAD' || request.method === 'OPTIONS') return null;
  const configured = request.routeOptions.config?.audit;
  if (configured === false) return null;
  return configured ?? (key in MUTATION_KINDS ? MUTATION_KINDS[key] : key);
}

/** The record of the request's action (signed URLs or mutation), or null when it made none. */
function actionRecord(request: FastifyRequest, reply: FastifyReply, payload: unknown, actor: string, replayed: boolean): AuditInput | null {
  const route = request.routeOptions.url ?? request.url.split('?', 1)[0];
  const key = `${request.method} ${route}`;
  const common = { method: request.method, route, params: request.params ?? {}, status: reply.statusCode, requestId: request.id };
  const signed = SIGNED_URL_ROUTES[key];
  if (signed) {
    const issued = signed.read(parseBody(payload));
    if (!issued) return null;
    return {
      kind: AUDIT_KIND_SIGNED_URL_ISSUED,
      actor,
      attributes: {
        ...common,
        purpose: signed.purpose,
        count: issued.count,
        hashesDigest: issued.hashes.length ? hashSetDigest(issued.hashes) : null,
        expiresAt: issued.expiresAt,
      },
    };
  }
  const kind = mutationKind(request);
  if (kind === null) return null;
  return { kind, actor, attributes: { ...request.auditDetails, ...common, idempotentReplay: replayed, result: resultIds(payload) } };
}

/** How often the API links outbox records whose request died (ms), and how old they must be first. */
const OUTBOX_PASS_MS = 30_000;
const OUTBOX_STALE_MS = 60_000;

export default fp(async function auditPlugin(app: FastifyInstance) {
  const windowMs = app.deps.cfg.ROOST_AUDIT_KEY_USE_SAMPLE_SECONDS * 1000;
  /** `site|key|ip` → when the last sample was (epoch ms), as the table said. */
  const sampled = new Map<string, number>();

  /**
   * Samples the request's key use (api_key_used record, api_key.used event on a new address) and
   * appends `action` when given, in one transaction. Never throws: a failure is logged.
   */
  async function note(
    request: FastifyRequest,
    siteId: string,
    actionOf: (actor: string) => AuditInput | null,
    outbox?: { outboxId: string; attributes: Record<string, unknown> },
  ): Promise<void> {
    const p = request.principal;
    if (!p || p.kind !== 'user') return;
    try {
      const actor = actorOf(p);
      const action = outbox ? null : actionOf(actor);
      const now = Date.now();
      const key = p.key;
      const ip = request.ip || 'unknown';
      const ua = request.headers['user-agent'];
      const userAgent = ua === undefined ? null : headerText(ua).slice(0, MAX_USER_AGENT);
      const cacheKey = key ? `${siteId}|${key.keyId}|${ip}` : '';
      const cached = key ? sampled.get(cacheKey) : undefined;
      const checkKeyUse = key !== null && (cached === undefined || now - cached >= windowMs);
      if (!action && !outbox && !checkKeyUse) return;
      const use = await recordSiteActivity(app.deps, {
        siteId,
        actor,
        action,
        ...(outbox ? { outbox } : {}),
        keyUse:
          key && checkKeyUse
            ? {
                keyId: key.keyId,
                keyPrefix: key.keyPrefix,
                ip,
                userAgent,
                method: request.method,
                route: request.routeOptions.url ?? null,
                requestId: request.id,
              }
            : null,
        now,
        windowMs,
      });
      if (use) {
        if (sampled.size >= CACHE_MAX) sampled.clear();
        sampled.set(cacheKey, use.lastSampledAt);
      }
    } catch (err) {
      request.log.error({ err, siteId }, 'could not append to the audit log');
    }
  }

  app.addHook('onResponse', async (request) => request.auditMutation?.end());

  // Records whose request died between its commit and its response are linked by a periodic pass.
  let outboxTimer: NodeJS.Timeout | undefined;
  const linkStale = () =>
    void linkStaleAuditOutbox(app.deps, OUTBOX_STALE_MS).catch((err: unknown) =>
      app.log.warn({ err }, 'could not link stale audit records'),
    );
  app.addHook('onReady', async () => {
    linkStale();
    outboxTimer = setInterval(linkStale, OUTBOX_PASS_MS);
    outboxTimer.unref();
  });
  app.addHook('onClose', async () => clearInterval(outboxTimer));

  // Streaming routes hijack the reply (no onSend): they call this once the stream is accepted.
  app.decorate('auditKeyUse', (request: FastifyRequest, siteId: string) => note(request, siteId, () => null));

  // A mutating request by a user records its mutation in its own transactions (services/audit.ts
  // AuditedMutation): started here, after authentication, validation and the Idempotency-Key reservation, right
  // before the handler. A callback hook, so the handler runs in the async context it sets.
  app.addHook('preHandler', (request, _reply, done) => {
    const p = request.principal;
    const kind = p?.kind === 'user' ? mutationKind(request) : null;
    if (p?.kind === 'user' && kind !== null) {
      const route = request.routeOptions.url ?? request.url.split('?', 1)[0];
      request.auditMutation = beginAuditedMutation({
        kind,
        actor: actorOf(p),
        attributes: { method: request.method, route, params: request.params ?? {}, requestId: request.id },
        siteId: () => request.authorizedSiteId,
        details: () => request.auditDetails,
      });
    }
    done();
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const mutation = request.auditMutation;
    mutation?.end();
    if (mutation?.committedSiteId) {
      // Its record committed with the mutation: link it now, with what the response says (any status: the
      // mutation happened even when the request failed afterwards).
      request.auditMutation = undefined;
      await note(request, mutation.committedSiteId, () => null, {
        outboxId: mutation.outboxId,
        attributes: { status: reply.statusCode, idempotentReplay: false, result: reply.statusCode < 400 ? resultIds(payload) : {} },
      });
      return payload;
    }
    if (reply.statusCode >= 400) return payload;
    const replayed = reply.getHeader('idempotent-replayed') === 'true';
    const siteId = request.authorizedSiteId ?? (replayed ? siteIdOfRequest(request) : undefined);
    if (!siteId) return payload;
    await note(request, siteId, (actor) => actionRecord(request, reply, payload, actor, replayed));
    return payload;
  });
});

declare module 'fastify' {
  interface FastifyRequest {
    /** The audited mutation of this request, from its preHandler until its response (api/plugins/audit.ts). */
    auditMutation?: AuditedMutation;
    /**
     * What the route's service said about its mutation, added to the mutation record's attributes (a site
     * PATCH's `changes`: each changed setting's old and new value). Set it inside the mutation's transaction
     * so the record commits with it. Never bodies, secrets or raw keys.
     */
    auditDetails?: Record<string, unknown>;
  }
  interface FastifyInstance {
    /**
     * Samples key use for a request whose reply is hijacked (the event stream): the api_key_used audit
     * record and the api_key.used event, as the onSend hook does for every other site request.
     */
    auditKeyUse(request: FastifyRequest, siteId: string): Promise<void>;
  }
}
