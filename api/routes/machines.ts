/**
 * Machines (site scoped); the use cases are services/machines.ts:
 *
 *   GET  /api/sites/{siteId}/machines                                  list (paged: default 50, max 200)
 *   GET  /api/sites/{siteId}/machines/{machineId}                      detail: host info, metrics, processes
 *   GET  /api/sites/{siteId}/machines/{machineId}/deployments          per-roost intended vs reported version
 *   POST /api/sites/{siteId}/machines/{machineId}/commands             queue reboot/shutdown/screenshot (Idempotency-Key)
 *   GET  /api/sites/{siteId}/machines/{machineId}/commands/{commandId} command state, polled until terminal
 *
 * Scopes: reads need machine read (that machine, or `*` for the list) or site read; commands need
 * machine write or site write. `online` is the agent's flag AND a heartbeat younger than
 * ROOST_HEARTBEAT_STALE_SECONDS. docs/decisions/machine-commands.md, docs/decisions/machines-list.md.
 */
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import type { Requirement } from '../../domain/scopes';
import { authorizeSite } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';
import { parsePaging } from '../pagination';
import {
  type CommandRow,
  type MachineRow,
  type ScreenshotLink,
  DEFAULT_COMMAND_TIMEOUT_SECONDS,
  MAX_COMMAND_TIMEOUT_SECONDS,
  MAX_DELAY_SECONDS,
  commandState,
  deploymentsOfMachine,
  listSiteMachines,
  machineDetail,
  queueUserCommand,
} from '../../services/machines';
import { CommandId, DateTime, MachineId, NullableDateTime, pagingQuery, Problem, SiteId } from '../../domain/schemas';

/** Page sizes of `GET /api/sites/{siteId}/machines` (docs/decisions/machines-list.md). */
export const MACHINE_PAGE = { defaultSize: 50, maxSize: 200 };

const AnyMap = Type.Record(Type.String(), Type.Unknown());

export const MachineSummary = Type.Object({
  machineId: Type.String(),
  siteId: Type.String(),
  hostname: Type.Union([Type.String(), Type.Null()]),
  online: Type.Boolean({ description: 'agent-reported AND heartbeat younger than the stale threshold' }),
  lastHeartbeat: NullableDateTime,
  agent_version: Type.Union([Type.String(), Type.Null()]),
  machine_timezone: Type.Union([Type.String(), Type.Null()]),
  machine_timezone_iana: Type.Union([Type.String(), Type.Null()]),
  cortexEnabled: Type.Boolean({ description: 'missing means enabled' }),
  rebooting: Type.Boolean(),
  shuttingDown: Type.Boolean(),
  capabilities: AnyMap,
  enrolledAt: DateTime,
  updatedAt: DateTime,
});
export type MachineSummary = Static<typeof MachineSummary>;

export const MachineDetail = Type.Composite([
  MachineSummary,
  Type.Object({
    info: AnyMap,
    metrics: Type.Union([AnyMap, Type.Null()]),
    processes: Type.Array(Type.Unknown()),
  }),
]);

export const CommandState = Type.Object({
  commandId: Type.String(),
  machineId: Type.String(),
  siteId: Type.String(),
  type: Type.String(),
  status: Type.String({ description: 'pending, an intermediate value (e.g. downloading), completed, failed or cancelled' }),
  params: AnyMap,
  result: Type.Union([Type.String(), Type.Null()], { description: 'success or cancelled' }),
  error: Type.Union([Type.String(), Type.Null()]),
  progress: Type.Union([Type.Number(), Type.Null()], { description: 'percent, 0..100' }),
  rolloutId: Type.Union([Type.String(), Type.Null()]),
  deployment_id: Type.Union([Type.String(), Type.Null()]),
  auditCorrelationId: Type.Union([Type.String(), Type.Null()]),
  createdAt: DateTime,
  updatedAt: DateTime,
  deliveredAt: NullableDateTime,
  completedAt: NullableDateTime,
  expiresAt: NullableDateTime,
  screenshotUrl: Type.Optional(Type.String({ description: 'signed read URL of the uploaded PNG (capture_screenshot)' })),
  screenshotExpiresAt: Type.Optional(DateTime),
});
export type CommandState = Static<typeof CommandState>;

const iso = (d: Date | null | undefined): string | null => (d ? d.toISOString() : null);

/** API view of a machine row. */
export function machineView(r: MachineRow): MachineSummary {
  return {
    machineId: r.machine_id,
    siteId: r.site_id,
    hostname: r.hostname,
    online: r.live,
    lastHeartbeat: iso(r.last_heartbeat),
    agent_version: r.agent_version,
    machine_timezone: r.machine_timezone,
    machine_timezone_iana: r.machine_timezone_iana,
    cortexEnabled: r.cortex_enabled !== false,
    rebooting: r.rebooting,
    shuttingDown: r.shutting_down,
    capabilities: r.capabilities ?? {},
    enrolledAt: r.enrolled_at.toISOString(),
    updatedAt: r.updated_at.toISOString(),
  };
}

/** API view of a command row; `screenshot` is the signed URL of its stored screenshot, when it has one. */
export function commandView(r: CommandRow, screenshot?: ScreenshotLink): CommandState {
  return {
    commandId: r.command_id,
    machineId: r.machine_id,
    siteId: r.site_id,
    type: r.type,
    status: r.status,
    params: r.params ?? {},
    result: r.result,
    error: r.error,
    progress: r.progress,
    rolloutId: r.rollout_id,
    deployment_id: r.deployment_id,
    auditCorrelationId: r.audit_correlation_id,
    createdAt: r.created_at.toISOString(),
    updatedAt: r.updated_at.toISOString(),
    deliveredAt: iso(r.delivered_at),
    completedAt: iso(r.completed_at),
    expiresAt: iso(r.expires_at),
    ...(screenshot ? { screenshotUrl: screenshot.url, screenshotExpiresAt: screenshot.expiresAt } : {}),
  };
}

const machineRead = (siteId: string, machineId: string): Requirement[] => [
  { resource: 'machine', id: machineId, permission: 'read' },
  { resource: 'site', id: siteId, permission: 'read' },
];
const machineWrite = (siteId: string, machineId: string): Requirement[] => [
  { resource: 'machine', id: machineId, permission: 'write' },
  { resource: 'site', id: siteId, permission: 'write' },
];

const SiteParams = Type.Object({ siteId: SiteId });
const MachineParams = Type.Object({ siteId: SiteId, machineId: MachineId });
const CommandParams = Type.Object({ siteId: SiteId, machineId: MachineId, commandId: CommandId });

/** The progress counters of a roost target state (domain/target-state.ts SyncCounters), as TypeBox properties. */
export const SyncCountersProps = {
  chunks_fetched: Type.Integer(),
  chunks_total: Type.Integer(),
  chunks_dedup: Type.Integer(),
  files_total: Type.Integer(),
  files_assembled: Type.Integer(),
  files_skipped: Type.Integer(),
  bytes_fetched: Type.Integer({ description: 'bytes' }),
};

const Deployment = Type.Object({
  roostId: Type.String(),
  name: Type.String(),
  extractPath: Type.String(),
  currentVersionId: Type.Union([Type.String(), Type.Null()], { description: "the roost's current pointer (intended version)" }),
  currentVersionNumber: Type.Union([Type.Integer(), Type.Null()]),
  reportedVersionId: Type.Union([Type.String(), Type.Null()], { description: 'what the agent last reported; null before any report' }),
  reportedVersionNumber: Type.Union([Type.Integer(), Type.Null()]),
  status: Type.Union([Type.String(), Type.Null()], {
    description: 'pending, downloading, assembling, committed, failed, cancelled; null before any report',
  }),
  inSync: Type.Boolean({ description: 'reported version is the current one and committed' }),
  error: Type.Union([Type.String(), Type.Null()]),
  ...SyncCountersProps,
  updatedAt: NullableDateTime,
});

/** What every command body may carry beside `type` and `params`. */
const commandCommon = () => ({
  timeout_seconds: Type.Optional(
    Type.Number({
      exclusiveMinimum: 0,
      maximum: MAX_COMMAND_TIMEOUT_SECONDS,
      description: `seconds before an unfinished command expires (default ${DEFAULT_COMMAND_TIMEOUT_SECONDS})`,
    }),
  ),
  auditCorrelationId: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
});
/**
 * The exact command bodies by type, for the document (`x-roost-document`, api/openapi.ts): the handler answers an
 * unknown type with 400 unsupported_command_type and a wrong parameter with validation_failed naming `params.x`.
 */
const CommandBodiesByType = Type.Union([
  Type.Object(
    {
      type: Type.Union([Type.Literal('reboot_machine'), Type.Literal('shutdown_machine')]),
      params: Type.Optional(
        Type.Object(
          { delaySeconds: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_DELAY_SECONDS, description: 'seconds; default 0' })) },
          { additionalProperties: false },
        ),
      ),
      ...commandCommon(),
    },
    { additionalProperties: false },
  ),
  Type.Object(
    {
      type: Type.Literal('capture_screenshot'),
      params: Type.Optional(
        Type.Object(
          {
            monitor: Type.Optional(
              Type.Union([Type.Literal('all'), Type.Literal('primary'), Type.Integer({ minimum: 0, maximum: 255 })], {
                description: 'default 0',
              }),
            ),
          },
          { additionalProperties: false },
        ),
      ),
      ...commandCommon(),
    },
    { additionalProperties: false },
  ),
]);
const CommandCreateBody = Type.Object(
  {
    type: Type.String({ minLength: 1, maxLength: 64, description: 'reboot_machine | shutdown_machine | capture_screenshot' }),
    params: Type.Optional(
      Type.Object(
        {},
        {
          additionalProperties: true,
          description:
            'reboot_machine/shutdown_machine: {delaySeconds?: integer >= 0, default 0}; capture_screenshot: {monitor?: "all" | "primary" | integer >= 0, default 0}',
        },
      ),
    ),
    timeout_seconds: Type.Optional(
      Type.Number({
        exclusiveMinimum: 0,
        maximum: MAX_COMMAND_TIMEOUT_SECONDS,
        description: `seconds before an unfinished command expires (default ${DEFAULT_COMMAND_TIMEOUT_SECONDS})`,
      }),
    ),
    auditCorrelationId: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
  },
  { additionalProperties: false, 'x-roost-document': CommandBodiesByType },
);

const CommandCreated = Type.Object({
  commandId: Type.String(),
  machineId: Type.String(),
  siteId: Type.String(),
  status: Type.Literal('pending'),
  type: Type.String(),
  params: AnyMap,
  createdAt: DateTime,
  expiresAt: DateTime,
});

const errorResponses = { 400: Problem, 401: Problem, 403: Problem, 404: Problem };

const machinesRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/api/sites/:siteId/machines',
    {
      schema: {
        tags: ['machines'],
        summary: 'List the machines of a site',
        params: SiteParams,
        querystring: Type.Object(pagingQuery(MACHINE_PAGE)),
        response: {
          200: Type.Object({ machines: Type.Array(MachineSummary), next_page_token: Type.String(), nextPageToken: Type.String() }),
          ...errorResponses,
        },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      await authorizeSite(request, siteId, [
        { resource: 'site', id: siteId, permission: 'read' },
        { resource: 'machine', id: '*', permission: 'read' },
      ]);
      const paging = parsePaging(request, { ...MACHINE_PAGE, accept: (p): p is string => typeof p === 'string' });
      const page = await listSiteMachines(app.deps, { siteId, after: paging.after, pageSize: paging.pageSize });
      return { machines: page.machines.map(machineView), ...paging.tokens(page.next) };
    },
  );

  app.get(
    '/api/sites/:siteId/machines/:machineId',
    {
      schema: { tags: ['machines'], summary: 'Machine detail', params: MachineParams, response: { 200: MachineDetail, ...errorResponses } },
    },
    async (request) => {
      const { siteId, machineId } = request.params;
      await authorizeSite(request, siteId, machineRead(siteId, machineId));
      const row = await machineDetail(app.deps, { siteId, machineId });
      return { ...machineView(row), info: row.info ?? {}, metrics: row.metrics, processes: row.processes ?? [] };
    },
  );

  app.get(
    '/api/sites/:siteId/machines/:machineId/deployments',
    {
      schema: {
        tags: ['machines'],
        summary: 'Per-roost intended (currentVersionId) and reported (reportedVersionId) versions of a machine',
        params: MachineParams,
        response: {
          200: Type.Object({ siteId: Type.String(), machineId: Type.String(), deployments: Type.Array(Deployment) }),
          ...errorResponses,
        },
      },
    },
    async (request) => {
      const { siteId, machineId } = request.params;
      await authorizeSite(request, siteId, machineRead(siteId, machineId));
      const rows = await deploymentsOfMachine(app.deps, { siteId, machineId });
      return {
        siteId,
        machineId,
        deployments: rows.map((r) => ({
          roostId: r.roost_id,
          name: r.name,
          extractPath: r.extract_path,
          currentVersionId: r.current_version_id,
          currentVersionNumber: r.current_version_number,
          reportedVersionId: r.reported_version_id,
          reportedVersionNumber: r.reported_version_number,
          status: r.status,
          inSync: r.inSync,
          error: r.error,
          chunks_fetched: r.chunks_fetched ?? 0,
          chunks_total: r.chunks_total ?? 0,
          chunks_dedup: r.chunks_dedup ?? 0,
          files_total: r.files_total ?? 0,
          files_assembled: r.files_assembled ?? 0,
          files_skipped: r.files_skipped ?? 0,
          bytes_fetched: r.bytes_fetched ?? 0,
          updatedAt: iso(r.updated_at),
        })),
      };
    },
  );

  app.post(
    '/api/sites/:siteId/machines/:machineId/commands',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['machines'],
        summary: 'Queue a remote command (reboot_machine, shutdown_machine, capture_screenshot)',
        params: MachineParams,
        body: CommandCreateBody,
        response: { 202: CommandCreated, ...errorResponses, 409: Problem, 422: Problem },
      },
    },
    async (request, reply) => {
      const { siteId, machineId } = request.params;
      const user = await authorizeSite(request, siteId, machineWrite(siteId, machineId));
      await enforceCapability(request, 'MACHINE_EXEC_COMMAND', siteId);
      const body = request.body;
      const row = await queueUserCommand(app.deps, {
        siteId,
        machineId,
        type: body.type,
        params: body.params,
        timeoutSeconds: body.timeout_seconds,
        createdBy: user.userId,
        auditCorrelationId: body.auditCorrelationId,
      });
      reply.code(202);
      return {
        commandId: row.command_id,
        machineId: row.machine_id,
        siteId: row.site_id,
        status: 'pending' as const,
        type: row.type,
        params: row.params,
        createdAt: row.created_at.toISOString(),
        expiresAt: (row.expires_at as Date).toISOString(),
      };
    },
  );

  app.get(
    '/api/sites/:siteId/machines/:machineId/commands/:commandId',
    {
      schema: {
        tags: ['machines'],
        summary: 'Command state, polled until terminal',
        params: CommandParams,
        response: { 200: CommandState, ...errorResponses },
      },
    },
    async (request) => {
      const { siteId, machineId, commandId } = request.params;
      await authorizeSite(request, siteId, machineRead(siteId, machineId));
      const state = await commandState(app.deps, { siteId, machineId, commandId });
      return commandView(state.command, state.screenshot);
    },
  );
};

export default machinesRoutes;
