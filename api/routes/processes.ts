/**
 * Managed processes (machine scoped; docs/contract.md "Processes", docs/decisions/managed-processes.md); the use
 * cases are services/processes.ts. Base `/api/sites/{siteId}/machines/{machineId}/processes`:
 *
 *   GET    (base)                          merged config and live status, unpaged (machine read or site read)
 *   GET    /{processId}                    detail
 *   POST   (base)                          create (name, absolute exe_path); 409 duplicate_process_name
 *   PATCH  /{processId}                    change fields (at least one; id/processId are forbidden_field)
 *   DELETE /{processId}                    idempotent (alreadyDeleted)
 *   POST   /{processId}/kill|restart|start|stop   202 {commandId, status: pending}
 *   POST   /{processId}/schedule           mode off|always|scheduled plus blocks
 *
 * Mutations need machine write or site write and Idempotency-Key; capabilities MACHINE_CONFIG_WRITE (config)
 * and MACHINE_EXEC_COMMAND (commands). Unknown process: 404 process_not_found.
 *
 * Also `GET /api/agent/processes` (agent token): the configs the machine's agent runs.
 */
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import {
  HHMM_RE,
  LAUNCH_MODES,
  MAX_RELAUNCH_ATTEMPTS,
  MAX_SCHEDULE_BLOCKS,
  MAX_TIME_DELAY_SECONDS,
  MAX_TIME_TO_INIT_SECONDS,
  PRIORITIES,
  PROCESS_ID_RE,
  type ProcessAction,
  SCHEDULE_DAYS,
  VISIBILITIES,
} from '../../domain/processes';
import type { Requirement } from '../../domain/scopes';
import { DateTime, MachineId, MachinePath, Nullable, SiteId, problems } from '../../domain/schemas';
import {
  type MergedProcess,
  type ProcessRow,
  agentProcessConfigs,
  createProcess,
  machineProcesses,
  patchProcess,
  processDetail,
  queueProcessCommand,
  removeProcess,
  setSchedule,
} from '../../services/processes';
import { authorizeSite, requireAgent } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';

const ProcessId = Type.String({ pattern: PROCESS_ID_RE.source, description: 'process id (prc_…)' });
const MachineParams = Type.Object({ siteId: SiteId, machineId: MachineId });
const ProcessParams = Type.Object({ siteId: SiteId, machineId: MachineId, processId: ProcessId });
const lit = (values: readonly string[]) => Type.String({ enum: [...values], description: values.join(' | ') });

const Block = Type.Object(
  {
    days: Type.Array(lit(SCHEDULE_DAYS), { minItems: 1, maxItems: 7, uniqueItems: true }),
    start: Type.String({ pattern: HHMM_RE.source, description: 'HH:MM, site time' }),
    end: Type.String({ pattern: HHMM_RE.source, description: 'HH:MM; earlier than start spans midnight' }),
  },
  { additionalProperties: false },
);

const fields = {
  name: Type.String({ minLength: 1, maxLength: 128 }),
  exe_path: MachinePath('absolute path of the executable'),
  file_path: Nullable(Type.String({ maxLength: 1024, description: 'document or arguments passed to the executable' })),
  cwd: Nullable(MachinePath('absolute working directory')),
  priority: lit(PRIORITIES),
  visibility: lit(VISIBILITIES),
  launch_mode: lit(LAUNCH_MODES),
  time_delay: Type.Integer({ minimum: 0, maximum: MAX_TIME_DELAY_SECONDS, description: 'seconds to wait before launching' }),
  time_to_init: Type.Integer({ minimum: 0, maximum: MAX_TIME_TO_INIT_SECONDS, description: 'seconds a launch takes to count as running' }),
  relaunch_attempts: Type.Integer({ minimum: 0, maximum: MAX_RELAUNCH_ATTEMPTS, description: 'relaunches after crashes before giving up' }),
  schedules: Type.Array(Block, { maxItems: MAX_SCHEDULE_BLOCKS }),
  schedulePresetId: Nullable(Type.String({ minLength: 1, maxLength: 64 })),
};
/** Server-managed ids a client may not send (answered 400 forbidden_field, not validation_failed). */
const forbidden = {
  id: Type.Optional(Type.Unknown({ 'x-roost-forbidden': true, description: 'server-managed: 400 forbidden_field' })),
  processId: Type.Optional(Type.Unknown({ 'x-roost-forbidden': true, description: 'server-managed: 400 forbidden_field' })),
};

/** `scheduled` needs at least one schedule block (stated to the validator and the document alike). */
function scheduledNeedsBlocks(mode: string, blocks: string, required = true) {
  return {
    if: { properties: { [mode]: { const: 'scheduled' } }, required: [mode] },
    then: { ...(required ? { required: [blocks] } : {}), properties: { [blocks]: { type: 'array', minItems: 1 } } },
  };
}

const CreateBody = Type.Object(
  {
    name: fields.name,
    exe_path: fields.exe_path,
    ...Object.fromEntries(
      Object.entries(fields)
        .filter(([k]) => k !== 'name' && k !== 'exe_path')
        .map(([k, v]) => [k, Type.Optional(v)]),
    ),
    ...forbidden,
  } as { name: typeof fields.name; exe_path: typeof fields.exe_path },
  { additionalProperties: false, ...scheduledNeedsBlocks('launch_mode', 'schedules') },
);
const PatchBody = Type.Object(
  { ...Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, Type.Optional(v)])), ...forbidden },
  { additionalProperties: false, minProperties: 1, description: 'at least one field to change' },
);
type FieldsIn = Partial<{ [K in keyof typeof fields]: Static<(typeof fields)[K]> }> & { id?: unknown; processId?: unknown };

const Live = Type.Object({
  pid: Nullable(Type.Integer()),
  status: Type.String({ description: 'running, starting, stopped, crashed, waiting (schedule/delay), failed…' }),
  responsive: Nullable(Type.Boolean()),
  restarts: Type.Optional(Type.Integer()),
  updatedAt: Type.Optional(Type.String()),
});

/** A process config (the Process config table's names) merged with its live status. */
const ProcessRecord = Type.Object({
  processId: Type.String(),
  id: Type.String({ description: 'same as processId' }),
  siteId: Type.String(),
  machineId: Type.String(),
  name: Type.String(),
  exe_path: Type.String(),
  file_path: Nullable(Type.String()),
  cwd: Nullable(Type.String()),
  priority: Type.String(),
  visibility: Type.String(),
  launch_mode: Type.String(),
  autolaunch: Type.Boolean({ description: 'derived: launch_mode is not off' }),
  time_delay: Type.Integer(),
  time_to_init: Type.Integer(),
  relaunch_attempts: Type.Integer(),
  schedules: Type.Array(Block),
  schedulePresetId: Nullable(Type.String()),
  createdAt: DateTime,
  updatedAt: DateTime,
  live: Nullable(Live),
});

function record(row: ProcessRow, live: MergedProcess['live'] = null): Static<typeof ProcessRecord> {
  return {
    processId: row.process_id,
    id: row.process_id,
    siteId: row.site_id,
    machineId: row.machine_id,
    name: row.name,
    exe_path: row.exe_path,
    file_path: row.file_path,
    cwd: row.cwd,
    priority: row.priority,
    visibility: row.visibility,
    launch_mode: row.launch_mode,
    autolaunch: row.launch_mode !== 'off',
    time_delay: row.time_delay,
    time_to_init: row.time_to_init,
    relaunch_attempts: row.relaunch_attempts,
    schedules: row.schedules as Static<typeof Block>[],
    schedulePresetId: row.schedule_preset_id,
    createdAt: row.created_at.toISOString(),
    updatedAt: row.updated_at.toISOString(),
    live,
  };
}

/** Body fields to the service's names; id/processId are forbidden_field. */
function toFields(b: FieldsIn) {
  for (const k of ['id', 'processId'] as const) {
    if (b[k] !== undefined) throw new ApiError('forbidden_field', `${k} is server-managed and cannot be sent`, { extras: { param: k } });
  }
  const { schedulePresetId, id: _id, processId: _pid, ...rest } = b;
  return { ...rest, ...(schedulePresetId !== undefined ? { schedule_preset_id: schedulePresetId } : {}) };
}

const read = (s: string, m: string): Requirement[] => [
  { resource: 'machine', id: m, permission: 'read' },
  { resource: 'site', id: s, permission: 'read' },
];
const write = (s: string, m: string): Requirement[] => [
  { resource: 'machine', id: m, permission: 'write' },
  { resource: 'site', id: s, permission: 'write' },
];

const BASE = '/api/sites/:siteId/machines/:machineId/processes';

const processRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const tags = ['processes'];

  app.get(
    BASE,
    {
      schema: {
        tags,
        summary: 'Managed processes of a machine: config merged with live status (unpaged)',
        params: MachineParams,
        response: {
          200: Type.Object({ siteId: Type.String(), machineId: Type.String(), processes: Type.Array(ProcessRecord) }),
          ...problems(),
        },
      },
    },
    async (request) => {
      const { siteId, machineId } = request.params;
      await authorizeSite(request, siteId, read(siteId, machineId));
      const list = await machineProcesses(app.deps, { siteId, machineId });
      return { siteId, machineId, processes: list.map((p) => record(p.row, p.live)) };
    },
  );

  app.get(
    `${BASE}/:processId`,
    {
      schema: {
        tags,
        summary: 'One managed process with its live status',
        params: ProcessParams,
        response: { 200: ProcessRecord, ...problems() },
      },
    },
    async (request) => {
      const { siteId, machineId, processId } = request.params;
      await authorizeSite(request, siteId, read(siteId, machineId));
      const p = await processDetail(app.deps, { siteId, machineId, processId });
      return record(p.row, p.live);
    },
  );

  app.post(
    BASE,
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Register a managed process',
        params: MachineParams,
        body: CreateBody,
        response: { 201: ProcessRecord, ...problems(409, 422) },
      },
    },
    async (request, reply) => {
      const { siteId, machineId } = request.params;
      const user = await authorizeSite(request, siteId, write(siteId, machineId));
      await enforceCapability(request, 'MACHINE_CONFIG_WRITE', siteId);
      const f = toFields(request.body as FieldsIn);
      const row = await createProcess(app.deps, {
        siteId,
        machineId,
        userId: user.userId,
        fields: f as typeof f & { name: string; exe_path: string },
      });
      return reply.code(201).send(record(row));
    },
  );

  app.patch(
    `${BASE}/:processId`,
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Change fields of a managed process',
        params: ProcessParams,
        body: PatchBody,
        response: { 200: ProcessRecord, ...problems(409, 422) },
      },
    },
    async (request) => {
      const { siteId, machineId, processId } = request.params;
      await authorizeSite(request, siteId, write(siteId, machineId));
      await enforceCapability(request, 'MACHINE_CONFIG_WRITE', siteId);
      return record(await patchProcess(app.deps, { siteId, machineId, processId, fields: toFields(request.body as FieldsIn) }));
    },
  );

  app.delete(
    `${BASE}/:processId`,
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Delete a managed process (idempotent)',
        params: ProcessParams,
        response: {
          200: Type.Object({ processId: Type.String(), deleted: Type.Literal(true), alreadyDeleted: Type.Boolean() }),
          ...problems(422),
        },
      },
    },
    async (request) => {
      const { siteId, machineId, processId } = request.params;
      await authorizeSite(request, siteId, write(siteId, machineId));
      await enforceCapability(request, 'MACHINE_CONFIG_WRITE', siteId);
      return removeProcess(app.deps, { siteId, machineId, processId });
    },
  );

  const command = (action: ProcessAction, summary: string) =>
    app.post(
      `${BASE}/:processId/${action}`,
      {
        config: { idempotency: 'required' },
        schema: {
          tags,
          summary,
          params: ProcessParams,
          response: {
            202: Type.Object({ commandId: Type.String(), status: Type.Literal('pending'), type: Type.String(), processId: Type.String() }),
            ...problems(409, 422),
          },
        },
      },
      async (request, reply) => {
        const { siteId, machineId, processId } = request.params;
        const user = await authorizeSite(request, siteId, write(siteId, machineId));
        await enforceCapability(request, 'MACHINE_EXEC_COMMAND', siteId);
        const row = await queueProcessCommand(app.deps, { siteId, machineId, processId, action, userId: user.userId });
        return reply.code(202).send({ commandId: row.command_id, status: 'pending' as const, type: row.type, processId });
      },
    );
  command('kill', 'Force a managed process to end (kill_process)');
  command('restart', 'Graceful stop, then start (restart_process)');
  command('start', 'Start a managed process (start_process)');
  command('stop', 'Graceful stop of a managed process (stop_process)');

  app.post(
    `${BASE}/:processId/schedule`,
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Set the launch mode and schedule blocks (written to the config, not queued)',
        params: ProcessParams,
        body: Type.Object(
          { mode: lit(LAUNCH_MODES), blocks: Type.Optional(Type.Array(Block, { maxItems: MAX_SCHEDULE_BLOCKS })) },
          // Without `blocks` the current ones stay: `scheduled` then needs the process to have some (checked by the service).
          { additionalProperties: false, ...scheduledNeedsBlocks('mode', 'blocks', false) },
        ),
        response: { 200: ProcessRecord, ...problems(422) },
      },
    },
    async (request) => {
      const { siteId, machineId, processId } = request.params;
      await authorizeSite(request, siteId, write(siteId, machineId));
      await enforceCapability(request, 'MACHINE_CONFIG_WRITE', siteId);
      return record(await setSchedule(app.deps, { siteId, machineId, processId, mode: request.body.mode, blocks: request.body.blocks }));
    },
  );

  app.get(
    '/api/agent/processes',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: "The machine's managed process configs and the site's time zone (agent token)",
        response: { 200: Type.Object({ timezone: Type.String(), processes: Type.Array(ProcessRecord) }), ...problems() },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const r = await agentProcessConfigs(app.deps, { siteId: agent.siteId, machineId: agent.machineId });
      return { timezone: r.timezone, processes: r.processes.map((p) => record(p)) };
    },
  );
};

export default processRoutes;
