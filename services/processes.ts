/**
 * Managed processes of a machine, service side (api/routes/processes.ts; docs/decisions/managed-processes.md):
 * config CRUD merged with the live status the agent reports in its heartbeat, the control commands
 * (kill, restart, start, stop: queued like any machine command), schedules, and the agent's read of its
 * configs (`GET /api/agent/processes`). SQL: db/processes.ts, commands through db/machines.ts.
 */
import { ApiError } from '../domain/errors';
import { newId } from '../domain/hex';
import { absolutePathProblem } from '../domain/paths';
import { PROCESS_COMMANDS, type ProcessAction, type ScheduleBlock, scheduleProblems } from '../domain/processes';
import { isIanaTimeZone } from '../domain/users';
import { type CommandRow, machineExists } from '../db/machines';
import { withTx } from '../db/pool';
import {
  agentProcessView,
  type ProcessFields,
  type ProcessRow,
  deleteProcess as deleteProcessRow,
  getProcess,
  insertProcess,
  listProcesses,
  lockProcess,
  reportedProcesses,
  updateProcess,
} from '../db/processes';
import type { ServiceDeps } from './deps';
import { queueForOnlineMachine } from './machines';

export type { ProcessFields, ProcessRow };

/** A machine of a site. */
export interface MachineRef {
  siteId: string;
  machineId: string;
}

/** What the agent last reported of a managed process (heartbeat `processes` entries that carry a processId). */
export interface LiveStatus {
  pid: number | null;
  status: string;
  responsive: boolean | null;
  restarts?: number;
  updatedAt?: string;
}

/** A process config with its live status (null before the agent reported it). */
export interface MergedProcess {
  row: ProcessRow;
  live: LiveStatus | null;
}

/** How long a process command may wait undelivered before it expires (seconds). */
export const PROCESS_COMMAND_TIMEOUT_SECONDS = 300;

function invalid(errors: Record<string, string[]>): ApiError {
  const [first] = Object.keys(errors);
  return new ApiError('validation_failed', `${first} ${errors[first][0]}`, { extras: { param: first, errors } });
}

function processNotFound(processId: string): ApiError {
  return new ApiError('process_not_found', `no process ${processId} on this machine`, { extras: { param: 'processId' } });
}

function duplicateName(name: string | undefined): ApiError {
  return new ApiError('duplicate_process_name', `a process named "${name}" already exists on this machine`, { extras: { param: 'name' } });
}

/**
 * Checks the path fields and the schedule of a (partial) config against the launch mode it will have.
 * @throws ApiError validation_failed keyed by field.
 */
function checkFields(f: Partial<ProcessFields>, effectiveMode: string, effectiveSchedules: ScheduleBlock[]): void {
  const errors: Record<string, string[]> = {};
  for (const k of ['exe_path', 'cwd'] as const) {
    const v = f[k];
    if (typeof v === 'string') {
      const why = absolutePathProblem(v);
      if (why) errors[k] = [why];
    }
  }
  if (f.schedules !== undefined) Object.assign(errors, scheduleProblems(f.schedules, 'schedules'));
  if (effectiveMode === 'scheduled' && effectiveSchedules.length === 0 && !errors.schedules) {
    errors.schedules = ['must have at least one block when launch_mode is scheduled'];
  }
  if (Object.keys(errors).length > 0) throw invalid(errors);
}

async function requireMachine(deps: Pick<ServiceDeps, 'db'>, m: MachineRef): Promise<void> {
  if (!(await machineExists(deps.db, m.siteId, m.machineId))) throw new ApiError('not_found', 'machine not found');
}

function liveOf(reported: unknown[], processId: string): LiveStatus | null {
  for (const e of reported) {
    if (e && typeof e === 'object' && (e as { processId?: unknown }).processId === processId) {
      const x = e as Record<string, unknown>;
      return {
        pid: typeof x.pid === 'number' ? x.pid : null,
        status: typeof x.status === 'string' ? x.status : 'unknown',
        responsive: typeof x.responsive === 'boolean' ? x.responsive : null,
        ...(typeof x.restarts === 'number' ? { restarts: x.restarts } : {}),
        ...(typeof x.updatedAt === 'string' ? { updatedAt: x.updatedAt } : {}),
      };
    }
  }
  return null;
}

/** Every live process config of a machine with its reported status. @throws ApiError not_found (machine). */
export async function machineProcesses(deps: Pick<ServiceDeps, 'db'>, m: MachineRef): Promise<MergedProcess[]> {
  const reported = await reportedProcesses(deps.db, m.siteId, m.machineId);
  if (reported === null) throw new ApiError('not_found', 'machine not found');
  const rows = await listProcesses(deps.db, m.siteId, m.machineId);
  return rows.map((row) => ({ row, live: liveOf(reported, row.process_id) }));
}

/** One process with its status. @throws ApiError not_found (machine), process_not_found. */
export async function processDetail(deps: Pick<ServiceDeps, 'db'>, input: MachineRef & { processId: string }): Promise<MergedProcess> {
  const reported = await reportedProcesses(deps.db, input.siteId, input.machineId);
  if (reported === null) throw new ApiError('not_found', 'machine not found');
  const row = await getProcess(deps.db, input.siteId, input.machineId, input.processId);
  if (!row || row.deleted_at) throw processNotFound(input.processId);
  return { row, live: liveOf(reported, row.process_id) };
}

/**
 * Registers a process (defaults: priority normal, visibility visible, launch_mode off, time_delay 0,
 * time_to_init 0, relaunch_attempts 3). Race-safe: of two concurrent creates of one name, one gets
 * duplicate_process_name.
 * @throws ApiError validation_failed, not_found (machine), duplicate_process_name (409).
 */
export async function createProcess(
  deps: Pick<ServiceDeps, 'db'>,
  input: MachineRef & { userId: string | null; fields: Partial<ProcessFields> & { name: string; exe_path: string } },
): Promise<ProcessRow> {
  const f: ProcessFields = {
    file_path: null,
    cwd: null,
    priority: 'normal',
    visibility: 'visible',
    launch_mode: 'off',
    time_delay: 0,
    time_to_init: 0,
    relaunch_attempts: 3,
    schedules: [],
    schedule_preset_id: null,
    ...stripUndefined(input.fields),
  } as ProcessFields;
  checkFields(f, f.launch_mode, f.schedules);
  await requireMachine(deps, input);
  const row = await insertProcess(
    deps.db,
    { siteId: input.siteId, machineId: input.machineId, processId: newId('prc'), createdBy: input.userId },
    f,
  );
  if (row === 'duplicate') {
    throw duplicateName(f.name);
  }
  return row;
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/**
 * Changes the given fields (at least one).
 * @throws ApiError validation_failed, not_found (machine), process_not_found, duplicate_process_name.
 */
export async function patchProcess(
  deps: Pick<ServiceDeps, 'db'>,
  input: MachineRef & { processId: string; fields: Partial<ProcessFields> },
): Promise<ProcessRow> {
  const f = stripUndefined(input.fields);
  if (Object.keys(f).length === 0) throw invalid({ body: ['must change at least one field'] });
  await requireMachine(deps, input);
  // Checked against the row as it is when written: a concurrent change is seen, not overwritten. Every
  // refusal is thrown inside the transaction, so it rolls back (a name clash has already aborted it).
  return withTx(deps.db, async (tx) => {
    const current = await lockProcess(tx, input.siteId, input.machineId, input.processId);
    if (!current) throw processNotFound(input.processId);
    checkFields(f, f.launch_mode ?? current.launch_mode, f.schedules ?? current.schedules);
    const row = await updateProcess(tx, input.siteId, input.machineId, input.processId, f);
    if (row === null) throw processNotFound(input.processId);
    if (row === 'duplicate') {
      throw duplicateName(f.name);
    }
    return row;
  });
}

/**
 * Sets the launch mode and, when given, the schedule blocks (`POST …/schedule`; written to the config, the
 * agent picks it up on its next config read). `scheduled` needs a non-empty schedule.
 */
export async function setSchedule(
  deps: Pick<ServiceDeps, 'db'>,
  input: MachineRef & { processId: string; mode: string; blocks?: ScheduleBlock[] },
): Promise<ProcessRow> {
  await requireMachine(deps, input);
  // As patchProcess: the blocks kept when none are given are the ones stored when this writes.
  return withTx(deps.db, async (tx) => {
    const current = await lockProcess(tx, input.siteId, input.machineId, input.processId);
    if (!current) throw processNotFound(input.processId);
    const errors = input.blocks !== undefined ? scheduleProblems(input.blocks, 'blocks') : {};
    const blocks = input.blocks ?? current.schedules;
    if (input.mode === 'scheduled' && blocks.length === 0 && !errors.blocks)
      errors.blocks = ['must be a non-empty array when mode is scheduled'];
    if (Object.keys(errors).length > 0) throw invalid(errors);
    const changes = input.blocks !== undefined ? { launch_mode: input.mode, schedules: blocks } : { launch_mode: input.mode };
    const row = await updateProcess(tx, input.siteId, input.machineId, input.processId, changes);
    if (!row || row === 'duplicate') throw processNotFound(input.processId);
    return row;
  });
}

/** Deletes a process config; a repeat answers alreadyDeleted true. @throws ApiError not_found (machine), process_not_found. */
export async function removeProcess(
  deps: Pick<ServiceDeps, 'db'>,
  input: MachineRef & { processId: string },
): Promise<{ processId: string; deleted: true; alreadyDeleted: boolean }> {
  await requireMachine(deps, input);
  const r = await deleteProcessRow(deps.db, input.siteId, input.machineId, input.processId);
  if (r === 'not_found') throw processNotFound(input.processId);
  return { processId: input.processId, deleted: true, alreadyDeleted: r === 'already' };
}

/**
 * Queues kill_process | restart_process | start_process | stop_process for an online machine.
 * @throws ApiError not_found (machine), process_not_found, machine_offline (409, nothing queued).
 */
export async function queueProcessCommand(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: MachineRef & { processId: string; action: ProcessAction; userId: string | null },
): Promise<CommandRow> {
  await requireMachine(deps, input);
  const p = await getProcess(deps.db, input.siteId, input.machineId, input.processId);
  if (!p || p.deleted_at) throw processNotFound(input.processId);
  return queueForOnlineMachine(deps, {
    siteId: input.siteId,
    machineId: input.machineId,
    commandId: newId('cmd'),
    type: PROCESS_COMMANDS[input.action],
    params: { processId: p.process_id, name: p.name },
    timeoutMs: PROCESS_COMMAND_TIMEOUT_SECONDS * 1000,
    createdBy: input.userId,
  });
}

/** The agent's view: its machine's process configs and the site's time zone (schedules are in it). */
export async function agentProcessConfigs(
  deps: Pick<ServiceDeps, 'db'>,
  m: MachineRef,
): Promise<{ timezone: string; processes: ProcessRow[] }> {
  const { timezone: tz, processes } = await agentProcessView(deps.db, m.siteId, m.machineId);
  return { timezone: tz && isIanaTimeZone(tz) ? tz : 'UTC', processes };
}
