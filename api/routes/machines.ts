/**
 * Machines (site scoped), SPEC.md "Machines (site scoped)", "Machine", "Command":
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
import type { FastifyInstance } from 'fastify';
import { Type, type Static } from '@sinclair/typebox';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { newId } from '../../domain/hex';
import type { Requirement } from '../../domain/scopes';
import { authorizeSite } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';
import { PagingQuery, pageTokens, parsePaging } from '../pagination';
import type { BlobStore } from '../../storage/blob';
import {
  type CommandRow,
  type MachineRow,
  createCommand,
  expirePendingCommands,
  getCommand,
  getMachine,
  listMachines,
  machineDeployments,
  machineExists,
} from '../../db/machines';
import { CommandId, DateTime, MachineId, NullableDateTime, Problem, SiteId } from '../../domain/schemas';
export { MachineId, Problem };

const Timestamp = DateTime;
const NullableTimestamp = NullableDateTime;
const AnyMap = Type.Record(Type.String(), Type.Unknown());

/** Command types a user may queue through the API (sync_pull is queued by rollouts, restart_process by the processes routes). */
export const USER_COMMAND_TYPES = ['reboot_machine', 'shutdown_machine', 'capture_screenshot'] as const;
/** Default and ceiling of `timeout_seconds` (how long a command may stay undelivered/unreported before it expires). */
export const DEFAULT_COMMAND_TIMEOUT_SECONDS = 900;
export const MAX_COMMAND_TIMEOUT_SECONDS = 86400;
/** Ceiling of `params.delaySeconds` of reboot/shutdown (7 days). */
export const MAX_DELAY_SECONDS = 604800;
/** Screenshot URLs in command state live this long. */
export const SCREENSHOT_URL_TTL_MS = 5 * 60 * 1000;

export const MachineSummary = Type.Object({
  machineId: Type.String(),
  siteId: Type.String(),
  hostname: Type.Union([Type.String(), Type.Null()]),
  online: Type.Boolean({ description: 'agent-reported AND heartbeat younger than the stale threshold' }),
  lastHeartbeat: NullableTimestamp,
  agent_version: Type.Union([Type.String(), Type.Null()]),
  machine_timezone: Type.Union([Type.String(), Type.Null()]),
  machine_timezone_iana: Type.Union([Type.String(), Type.Null()]),
  cortexEnabled: Type.Boolean({ description: 'missing means enabled' }),
  rebooting: Type.Boolean(),
  shuttingDown: Type.Boolean(),
  capabilities: AnyMap,
  enrolledAt: Timestamp,
  updatedAt: Timestamp,
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
  createdAt: Timestamp,
  updatedAt: Timestamp,
  deliveredAt: NullableTimestamp,
  completedAt: NullableTimestamp,
  expiresAt: NullableTimestamp,
  screenshotUrl: Type.Optional(Type.String({ description: 'signed read URL of the uploaded PNG (capture_screenshot)' })),
  screenshotExpiresAt: Type.Optional(Timestamp),
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

/** API view of a command row; with `blob`, a stored screenshot gets a short-lived signed URL. */
export async function commandView(r: CommandRow, blob?: BlobStore): Promise<CommandState> {
  const view: CommandState = {
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
  };
  if (blob && r.artifact_blob) {
    const signed = await blob.readUrl('screenshots', r.artifact_blob, SCREENSHOT_URL_TTL_MS);
    view.screenshotUrl = signed.url;
    view.screenshotExpiresAt = new Date(signed.expiresAt).toISOString();
  }
  return view;
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

/** The progress counters of a roost target state (SPEC.md "Roost target state"; domain/target-state.ts), as TypeBox properties. */
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
  updatedAt: NullableTimestamp,
});

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
  { additionalProperties: false },
);

const CommandCreated = Type.Object({
  commandId: Type.String(),
  machineId: Type.String(),
  siteId: Type.String(),
  status: Type.Literal('pending'),
  type: Type.String(),
  params: AnyMap,
  createdAt: Timestamp,
  expiresAt: Timestamp,
});

const errorResponses = { 400: Problem, 401: Problem, 403: Problem, 404: Problem };

function paramError(key: string, msg: string): ApiError {
  return new ApiError('validation_failed', `${key} ${msg}`, { extras: { param: key, errors: { [key]: [msg] } } });
}

/**
 * Validates and normalises the type-specific params of a user command.
 * @throws ApiError unsupported_command_type (unknown type), validation_failed (bad params, dotted path `params.x`)
 */
export function normaliseCommandParams(type: string, params: Record<string, unknown> | undefined): Record<string, unknown> {
  const p = params ?? {};
  const allowOnly = (keys: string[]) => {
    for (const k of Object.keys(p)) if (!keys.includes(k)) throw paramError(`params.${k}`, `is not a parameter of ${type}`);
  };
  switch (type) {
    case 'reboot_machine':
    case 'shutdown_machine': {
      allowOnly(['delaySeconds']);
      const d = p.delaySeconds ?? 0;
      if (typeof d !== 'number' || !Number.isInteger(d) || d < 0 || d > MAX_DELAY_SECONDS) {
        throw paramError('params.delaySeconds', `must be an integer from 0 to ${MAX_DELAY_SECONDS} (seconds)`);
      }
      return { delaySeconds: d };
    }
    case 'capture_screenshot': {
      allowOnly(['monitor']);
      const m = p.monitor ?? 0;
      const ok = m === 'all' || m === 'primary' || (typeof m === 'number' && Number.isInteger(m) && m >= 0 && m <= 255);
      if (!ok) throw paramError('params.monitor', 'must be "all", "primary" or a non-negative integer monitor index');
      return { monitor: m };
    }
    default:
      throw new ApiError(
        'unsupported_command_type',
        `command type "${type.slice(0, 64)}" is not supported; use one of ${USER_COMMAND_TYPES.join(', ')}`,
        {
          extras: { param: 'type', supported: [...USER_COMMAND_TYPES] },
        },
      );
  }
}

export default async function machinesRoutes(root: FastifyInstance): Promise<void> {
  const app = root.withTypeProvider<TypeBoxTypeProvider>();
  const stale = () => app.deps.cfg.ROOST_HEARTBEAT_STALE_SECONDS;

  app.get(
    '/api/sites/:siteId/machines',
    {
      schema: {
        tags: ['machines'],
        summary: 'List the machines of a site',
        params: SiteParams,
        querystring: Type.Object(PagingQuery),
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
      const paging = parsePaging<string>(request.query, { defaultSize: 50, maxSize: 200, accept: (p) => typeof p === 'string' });
      const rows = await listMachines(app.deps.db, siteId, { after: paging.after, limit: paging.pageSize, staleSeconds: stale() });
      const page = rows.slice(0, paging.pageSize);
      const more = rows.length > paging.pageSize;
      return { machines: page.map(machineView), ...pageTokens(more ? page[page.length - 1].machine_id : undefined) };
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
      const row = await getMachine(app.deps.db, siteId, machineId, stale());
      if (!row) throw new ApiError('not_found', 'machine not found');
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
      if (!(await machineExists(app.deps.db, siteId, machineId))) throw new ApiError('not_found', 'machine not found');
      const rows = await machineDeployments(app.deps.db, siteId, machineId);
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
          inSync: r.current_version_id !== null && r.reported_version_id === r.current_version_id && r.status === 'committed',
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
      const params = normaliseCommandParams(body.type, body.params);
      const timeoutSeconds = body.timeout_seconds ?? DEFAULT_COMMAND_TIMEOUT_SECONDS;
      const row = await createCommand(
        app.deps.db,
        {
          siteId,
          machineId,
          commandId: newId('cmd'),
          type: body.type,
          params,
          timeoutMs: Math.round(timeoutSeconds * 1000),
          createdBy: user.userId,
          auditCorrelationId: body.auditCorrelationId ?? null,
        },
        stale(),
      );
      if (row === 'not_found') throw new ApiError('not_found', 'machine not found');
      if (row === 'offline') {
        throw new ApiError('machine_offline', `machine ${machineId} is offline (no fresh heartbeat); the command was not queued`, {
          extras: { machineId },
        });
      }
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
      await expirePendingCommands(app.deps.db, siteId, machineId, commandId);
      const row = await getCommand(app.deps.db, siteId, machineId, commandId);
      if (!row) throw new ApiError('not_found', 'command not found');
      return commandView(row, app.deps.blob);
    },
  );
}
