/**
 * The agent protocol (docs/agent-protocol.md); the use cases are services/agent.ts:
 *
 *   POST /api/sites/{siteId}/enrolment-secret            create/rotate the site's enrolment secret (site admin)
 *   POST /api/agent/enrol                                machine enrols with the secret → sat_ token
 *   POST /api/agent/heartbeat                            liveness + metrics/processes/info snapshot
 *   GET  /api/agent/commands?wait=0..30                  pending commands, long-polled
 *   POST /api/agent/commands/{commandId}                 intermediate or terminal command status
 *   PUT  /api/agent/commands/{commandId}/screenshot      PNG of a capture_screenshot command (image/png bytes)
 *   GET  /api/agent/roosts/{roostId}/versions/{versionId} signed read URL of the version body, its signature and key id
 *   PUT  /api/agent/roosts/{roostId}/state               roost target-state report
 *   GET  /api/agent/installer/{version|latest}           signed read URL of an agent installer and its SHA-256 (self-update)
 *
 * Every /api/agent/* route but enrol takes `Authorization: Bearer sat_…`, which binds the request to one
 * site and one machine (api/plugins/auth.ts). Long-polls wait in one per-process `CommandWaiters`
 * (services/agent.ts), released when the server closes.
 */
import type { FastifyReply } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox, TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { authorizeSite, requireAgent } from '../plugins/auth';
import { TARGET_STATUSES } from '../../domain/target-state';
import {
  CommandWaiters,
  progressIntervalFor,
  MAX_SCREENSHOT_BYTES,
  MAX_WAIT_SECONDS,
  enrolAgent,
  INLINE_MAX_CHUNKS,
  INLINE_MAX_FILES,
  pollAgentCommands,
  recordAgentHeartbeat,
  reportCommandStatus,
  reportTargetState,
  rotateEnrolmentSecret,
  storeScreenshot,
  type TargetStateRow,
  versionForAgent,
} from '../../services/agent';
import { agentUpdateFor, installerDownload } from '../../services/installers';
import { CommandState, SyncCountersProps, commandView } from './machines';
import { DateTime, InstallerVersion, MachineId, Nullable, Problem, RoostId, SiteId } from '../../domain/schemas';
import { SigningKeyJwk } from './signing-keys';

const AnyMap = Type.Record(Type.String(), Type.Unknown());
const Hex64 = Type.String({ pattern: '^[0-9a-f]{64}$', description: 'lowercase SHA-256 hex' });
const Counter = Type.Integer({ minimum: 0, maximum: 2147483647 });
const agentErrors = { 400: Problem, 401: Problem, 404: Problem };

/** The one media type `PUT /api/agent/commands/{commandId}/screenshot` takes (docs/agent-protocol.md "Screenshots"). */
export const SCREENSHOT_MEDIA_TYPE = 'image/png';
/**
 * The screenshot body: PNG bytes, read by the route's own parser as a Buffer and checked by services/agent.ts
 * storeScreenshot (PNG signature). The validator takes any value; the document states the bytes (`x-roost-document`).
 */
const ScreenshotBody = Type.Unsafe<Buffer>({
  'x-roost-document': {
    type: 'string',
    format: 'binary',
    contentMediaType: SCREENSHOT_MEDIA_TYPE,
    description: `the PNG (starts with the PNG signature), at most ${MAX_SCREENSHOT_BYTES} bytes (10 MiB)`,
  },
});

/** 415 of the screenshot route for any Content-Type but image/png (JSON included, or none), naming the type it takes. */
export function screenshotMediaTypeError(): ApiError {
  return new ApiError('unsupported_media_type', `unsupported Content-Type; send the PNG as ${SCREENSHOT_MEDIA_TYPE}`, {
    extras: { param: 'Content-Type' },
  });
}

const EnrolBody = Type.Object(
  {
    siteId: SiteId,
    enrolmentSecret: Type.String({ minLength: 1, maxLength: 256 }),
    machineId: MachineId,
    hostname: Type.String({ minLength: 1, maxLength: 255 }),
    agentVersion: Type.String({ minLength: 1, maxLength: 64 }),
    timezone: Type.Optional(Type.String({ maxLength: 128 })),
    timezoneIana: Type.Optional(Type.String({ maxLength: 64 })),
    capabilities: Type.Optional(AnyMap),
  },
  { additionalProperties: false },
);

const HeartbeatBody = Type.Object(
  {
    agentVersion: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
    hostname: Type.Optional(Type.String({ minLength: 1, maxLength: 255 })),
    timezone: Type.Optional(Type.String({ maxLength: 128 })),
    timezoneIana: Type.Optional(Type.String({ maxLength: 64 })),
    metrics: Type.Optional(AnyMap),
    processes: Type.Optional(Type.Array(Type.Unknown(), { maxItems: 5000 })),
    info: Type.Optional(AnyMap),
    capabilities: Type.Optional(AnyMap),
    cortexEnabled: Type.Optional(Type.Boolean()),
    rebooting: Type.Optional(Type.Boolean()),
    shuttingDown: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: true, description: 'unknown fields are ignored (newer agents)' },
);

const CommandReportBody = Type.Object(
  {
    status: Type.String({
      pattern: '^[a-z][a-z_]{0,31}$',
      description:
        'completed, failed or cancelled close the command; any other lowercase word but pending (e.g. downloading) keeps it open',
    }),
    progress: Type.Optional(Type.Number({ minimum: 0, maximum: 100, description: 'percent' })),
    result: Type.Optional(
      Type.Union([Type.Literal('success'), Type.Literal('cancelled'), Type.Literal('staged')], {
        description: "'staged': a sync_pull with activation 'staged' has its tree staged (completed, not yet active)",
      }),
    ),
    error: Type.Optional(Type.String({ maxLength: 65536 })),
  },
  { additionalProperties: false },
);

const TargetStateFields = {
  reportedVersionId: Hex64,
  status: Type.Union(TARGET_STATUSES.map((s) => Type.Literal(s))),
  error: Type.Optional(Type.Union([Type.String({ maxLength: 65536 }), Type.Null()])),
  chunks_fetched: Counter,
  chunks_total: Counter,
  chunks_dedup: Counter,
  files_total: Counter,
  files_assembled: Counter,
  files_skipped: Counter,
  // Stored as BIGINT; kept to integers a JSON number carries exactly (a larger one was a 500 from the column).
  bytes_fetched: Type.Optional(Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER, description: 'bytes' })),
};

const TargetStateBody = Type.Object(TargetStateFields, { additionalProperties: false });

const CommandReportWithState = Type.Composite(
  [
    CommandReportBody,
    Type.Object({
      targetState: Type.Optional(
        Type.Object(
          { roostId: RoostId, ...TargetStateFields },
          {
            additionalProperties: false,
            description:
              'the target state of roost roostId, stored with the report in one transaction exactly as PUT /api/agent/roosts/{roostId}/state stores it (also when the command is already closed)',
          },
        ),
      ),
    }),
  ],
  { additionalProperties: false },
);

const TargetStateView = Type.Object({
  siteId: Type.String(),
  machineId: Type.String(),
  roostId: Type.String(),
  reportedVersionId: Type.Union([Type.String(), Type.Null()]),
  status: Type.String(),
  error: Type.Union([Type.String(), Type.Null()]),
  ...SyncCountersProps,
  updatedAt: DateTime,
});

const AgentVersionView = Type.Object({
  roostId: Type.String(),
  versionId: Type.String(),
  versionNumber: Type.Integer(),
  versionUrl: Type.String(),
  expiresAt: DateTime,
  extractPath: Type.String(),
  signature: Type.String({ description: 'Ed25519 signature (base64url) of roost-version-v1:<siteId>:<roostId>:<versionId>' }),
  signingKeyId: Type.String({ description: 'kid of the site key that made it' }),
});

const InlineSync = Type.Object(
  {
    version: AgentVersionView,
    body: Type.Optional(
      Type.Unknown({
        description: `the version body (the JSON object whose SHA-256 of its JCS form is versionId), present for a version of at most ${INLINE_MAX_FILES} files and ${INLINE_MAX_CHUNKS} distinct chunks`,
      }),
    ),
    chunkUrls: Type.Optional(
      Type.Object(
        {
          urls: Type.Record(Type.String(), Type.String(), { description: 'digest → signed GET URL (read only, 15 minutes)' }),
          expiresAt: DateTime,
          missing: Type.Array(Type.String(), { description: 'digests of the version the site does not hold (no URL issued)' }),
        },
        {
          description:
            'as POST /api/chunks/download-urls answers for every distinct chunk of the body; present with body unless it has no chunks',
        },
      ),
    ),
  },
  {
    description:
      'only with inline=sync and only on sync_pull commands whose params name a version of a live roost of the site: what GET /api/agent/roosts/{roostId}/versions/{versionId}, the body URL and POST /api/chunks/download-urls would answer',
  },
);

const PendingCommand = Type.Object({
  commandId: Type.String(),
  type: Type.String(),
  params: AnyMap,
  createdAt: DateTime,
  expiresAt: Type.Union([DateTime, Type.Null()]),
  traceparent: Type.Optional(
    Type.String({
      description:
        'W3C trace context the command was queued in (only while the server traces): send it as the `traceparent` header on the requests made for this command',
    }),
  ),
  requestId: Type.Optional(
    Type.String({
      description:
        "id (`X-Request-Id`) of the API request the command was queued for: the request itself, or the one that started or last steered the workflow that queued it; for the agent's log lines",
    }),
  ),
  sync: Type.Optional(InlineSync),
});

/** The stored target state as the agent routes answer it. */
function targetStateView(s: TargetStateRow): Static<typeof TargetStateView> {
  return {
    siteId: s.site_id,
    machineId: s.machine_id,
    roostId: s.roost_id,
    reportedVersionId: s.reported_version_id,
    status: s.status,
    error: s.error,
    chunks_fetched: s.chunks_fetched,
    chunks_total: s.chunks_total,
    chunks_dedup: s.chunks_dedup,
    files_total: s.files_total,
    files_assembled: s.files_assembled,
    files_skipped: s.files_skipped,
    bytes_fetched: s.bytes_fetched,
    updatedAt: s.updated_at.toISOString(),
  };
}

/**
 * An AbortSignal that fires when the client hangs up before the answer is written (fleet stop, network),
 * so a long-poll stops waiting and marks nothing delivered to nobody. Call `dispose` when done.
 */
function hangUpSignal(reply: FastifyReply): { signal: AbortSignal; dispose: () => void } {
  const ac = new AbortController();
  const onClose = () => {
    if (!reply.raw.writableFinished) ac.abort();
  };
  reply.raw.once('close', onClose);
  return { signal: ac.signal, dispose: () => reply.raw.off('close', onClose) };
}

const agentRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const waiters = new CommandWaiters(app.deps, app.log);
  // preClose: release waiting long-polls first, so closing the server does not wait out their `wait`.
  app.addHook('preClose', async () => waiters.close());
  app.addHook('onClose', async () => waiters.close());

  app.post(
    '/api/sites/:siteId/enrolment-secret',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['agent'],
        summary: "Create or rotate the site's agent enrolment secret (shown once)",
        params: Type.Object({ siteId: SiteId }),
        response: {
          201: Type.Object({ siteId: Type.String(), enrolmentSecret: Type.String() }),
          400: Problem,
          401: Problem,
          403: Problem,
          404: Problem,
        },
      },
    },
    async (request, reply) => {
      const { siteId } = request.params;
      await authorizeSite(request, siteId, [{ resource: 'site', id: siteId, permission: 'admin' }]);
      const created = await rotateEnrolmentSecret(app.deps, { siteId });
      // A secret shown once, like a new key's: no cache keeps it (the idempotent replay stores this header too).
      reply.code(201).header('Cache-Control', 'no-store');
      return created;
    },
  );

  app.post(
    '/api/agent/enrol',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['agent'],
        summary: 'Enrol a machine with the site enrolment secret; returns its agent token (re-enrolling rotates it)',
        body: EnrolBody,
        response: {
          201: Type.Object({
            siteId: Type.String(),
            machineId: Type.String(),
            agentToken: Type.String(),
            signingKeys: Type.Array(SigningKeyJwk, {
              description: "the site's public signing keys; the agent pins them (docs/agent-protocol.md)",
            }),
          }),
          400: Problem,
          401: Problem,
        },
      },
    },
    async (request, reply) => {
      const enrolled = await enrolAgent(app.deps, request.body);
      reply.code(201).header('Cache-Control', 'no-store'); // the agent token
      return enrolled;
    },
  );

  app.post(
    '/api/agent/heartbeat',
    {
      config: { auth: 'agent', bodyOptional: true },
      // A heartbeat without a body is a plain liveness ping.
      preValidation: async (request) => {
        request.body ??= {};
      },
      schema: {
        tags: ['agent'],
        summary: 'Heartbeat: online = true, lastHeartbeat = now, plus the snapshot fields sent',
        body: HeartbeatBody,
        response: {
          200: Type.Object({
            ok: Type.Literal(true),
            serverTime: DateTime,
            pendingCommands: Type.Integer(),
            agentUpdate: Nullable(
              Type.Object(
                { version: Type.String(), sha256: Type.String() },
                {
                  description:
                    "the catalog's latest agent version when it is newer than the agentVersion sent (self-update: GET /api/agent/installer/{version}); null otherwise",
                },
              ),
            ),
            processConfigStamp: Type.String({
              description: 'changes whenever GET /api/agent/processes would answer differently; re-read the configs only then',
            }),
          }),
          ...agentErrors,
        },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const r = await recordAgentHeartbeat(app.deps, { siteId: agent.siteId, machineId: agent.machineId, heartbeat: request.body });
      const agentUpdate = await agentUpdateFor(app.deps, request.body.agentVersion);
      return {
        ok: true as const,
        serverTime: r.serverTime.toISOString(),
        pendingCommands: r.pendingCommands,
        processConfigStamp: r.processConfigStamp,
        agentUpdate,
      };
    },
  );

  app.get(
    '/api/agent/installer/:version',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: 'An active agent installer version (or latest): its SHA-256, size and a read-only signed URL (15 min)',
        params: Type.Object({ version: Type.Union([InstallerVersion, Type.Literal('latest')]) }),
        response: {
          200: Type.Object({
            version: Type.String(),
            sha256: Type.String({ description: 'verify the downloaded bytes against this before running them' }),
            sizeBytes: Nullable(Type.Number({ description: 'bytes' })),
            downloadUrl: Type.String(),
            expiresAt: Type.String({ description: 'RFC 3339 UTC' }),
          }),
          ...agentErrors,
        },
      },
    },
    async (request) => {
      requireAgent(request);
      const d = await installerDownload(app.deps, request.params.version);
      return { ...d, expiresAt: d.expiresAt.toISOString() };
    },
  );

  app.get(
    '/api/agent/commands',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: `Pending commands of this machine, oldest first; long-polls up to wait seconds (cap ${MAX_WAIT_SECONDS})`,
        querystring: Type.Object({
          wait: Type.Optional(Type.Integer({ minimum: 0, default: 0, description: `seconds, capped at ${MAX_WAIT_SECONDS}` })),
          inline: Type.Optional(
            Type.Literal('sync', {
              description:
                'sync: each sync_pull carries `sync` (its version answer, small body and chunk URLs: docs/agent-protocol.md "Inline sync")',
            }),
          ),
        }),
        response: {
          200: Type.Object({
            commands: Type.Array(PendingCommand),
            progressIntervalMs: Type.Integer({
              minimum: 0,
              description:
                "least gap (ms) between two progress reports of these commands that the server asks for: it grows with the site's commands in flight; an agent keeps its own interval when that is longer",
            }),
          }),
          ...agentErrors,
        },
      },
    },
    async (request, reply) => {
      const agent = requireAgent(request);
      const hangUp = hangUpSignal(reply);
      try {
        const rows = await pollAgentCommands(app.deps, waiters, {
          siteId: agent.siteId,
          machineId: agent.machineId,
          waitSeconds: request.query.wait ?? 0,
          gone: hangUp.signal,
          inlineSync: request.query.inline === 'sync',
        });
        return {
          commands: rows.map((r) => ({
            commandId: r.command_id,
            type: r.type,
            params: r.params ?? {},
            createdAt: r.created_at.toISOString(),
            expiresAt: r.expires_at ? r.expires_at.toISOString() : null,
            ...(r.traceparent ? { traceparent: r.traceparent } : {}),
            ...(r.request_id ? { requestId: r.request_id } : {}),
            ...(r.sync ? { sync: r.sync } : {}),
          })),
          progressIntervalMs: progressIntervalFor(waiters.inFlightOf(agent.siteId)),
        };
      } finally {
        hangUp.dispose();
      }
    },
  );

  app.post(
    '/api/agent/commands/:commandId',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary:
          'Report a command status: intermediate values keep it open, completed/failed/cancelled close it (reports on a closed command are no-ops)',
        params: Type.Object({ commandId: Type.String({ minLength: 1, maxLength: 64 }) }),
        body: CommandReportWithState,
        response: {
          200: Type.Composite([
            CommandState,
            Type.Object({
              applied: Type.Boolean(),
              targetState: Type.Optional(
                Type.Composite([TargetStateView], { description: 'the stored target state, when targetState was sent' }),
              ),
            }),
          ]),
          ...agentErrors,
        },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const r = await reportCommandStatus(app.deps, {
        siteId: agent.siteId,
        machineId: agent.machineId,
        commandId: request.params.commandId,
        report: request.body,
      });
      return { ...commandView(r.row), applied: r.applied, ...(r.targetState ? { targetState: targetStateView(r.targetState) } : {}) };
    },
  );

  // The one route that takes bytes, in a scope of its own: image/png only (up to MAX_SCREENSHOT_BYTES), every
  // other Content-Type, JSON included, is 415 naming image/png.
  await app.register(async (bytes) => {
    bytes.removeAllContentTypeParsers();
    bytes.addContentTypeParser(SCREENSHOT_MEDIA_TYPE, { parseAs: 'buffer', bodyLimit: MAX_SCREENSHOT_BYTES }, (_req, body, done) =>
      done(null, body),
    );
    bytes.addContentTypeParser('*', (_request, _payload, done) => done(screenshotMediaTypeError()));
    bytes.withTypeProvider<TypeBoxTypeProvider>().put(
      '/api/agent/commands/:commandId/screenshot',
      {
        config: { auth: 'agent' },
        bodyLimit: MAX_SCREENSHOT_BYTES,
        schema: {
          tags: ['agent'],
          summary: 'Upload the PNG of an open capture_screenshot command (Content-Type: image/png)',
          consumes: [SCREENSHOT_MEDIA_TYPE],
          params: Type.Object({ commandId: Type.String({ minLength: 1, maxLength: 64 }) }),
          body: ScreenshotBody,
          response: {
            200: Type.Object({ commandId: Type.String(), bytes: Type.Integer() }),
            ...agentErrors,
            400: { ...Problem, description: 'validation_failed: the body is not a PNG (no PNG signature), or a malformed parameter' },
            404: { ...Problem, description: 'not_found: no capture_screenshot command of this machine with this id' },
            409: { ...Problem, description: 'conflict: the command is closed (upload before reporting completed)' },
            413: { ...Problem, description: `payload_too_large: the PNG is over ${MAX_SCREENSHOT_BYTES} bytes (10 MiB)` },
            415: { ...Problem, description: 'unsupported_media_type: a Content-Type other than image/png' },
          },
        },
      },
      async (request) => {
        const agent = requireAgent(request);
        return storeScreenshot(app.deps, {
          siteId: agent.siteId,
          machineId: agent.machineId,
          commandId: request.params.commandId,
          png: request.body,
        });
      },
    );
  });

  app.get(
    '/api/agent/roosts/:roostId/versions/:versionId',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: 'Signed read URL (15 min) of a version body of a roost of this site',
        params: Type.Object({ roostId: RoostId, versionId: Hex64 }),
        response: {
          200: AgentVersionView,
          ...agentErrors,
        },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const { roostId, versionId } = request.params;
      return versionForAgent(app.deps, { siteId: agent.siteId, machineId: agent.machineId, roostId, versionId });
    },
  );

  app.put(
    '/api/agent/roosts/:roostId/state',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: "Report this machine's target state for a roost",
        params: Type.Object({ roostId: RoostId }),
        body: TargetStateBody,
        response: { 200: TargetStateView, ...agentErrors },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const { roostId } = request.params;
      const s = await reportTargetState(app.deps, { siteId: agent.siteId, machineId: agent.machineId, roostId, report: request.body });
      return targetStateView(s);
    },
  );
};

export default agentRoutes;
