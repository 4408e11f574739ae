/**
 * Machines of a site, service side (api/routes/machines.ts; docs/decisions/machine-commands.md,
 * docs/decisions/machines-list.md): the machine list and detail, per-roost deployments (intended beside
 * reported version), queueing user commands, and command state with its screenshot URL. The SQL is
 * db/machines.ts.
 *
 * `online` is the agent's flag AND a heartbeat younger than cfg.ROOST_HEARTBEAT_STALE_SECONDS.
 */
import { ApiError } from '../domain/errors';
import { newId } from '../domain/hex';
import {
  type CommandRow,
  type DeploymentRow,
  type MachineDetailRow,
  type MachineRow,
  type NewCommand,
  createCommand,
  expirePendingCommands,
  getCommand,
  getMachine,
  listMachines,
  machineDeployments,
  machineExists,
} from '../db/machines';
import type { ServiceDeps } from './deps';
import { commandOrigin } from '../telemetry/tracing';

export type { CommandRow, DeploymentRow, MachineDetailRow, MachineRow };

/** Command types a user may queue through the API (sync_pull is queued by rollouts, restart_process by the processes routes). */
export const USER_COMMAND_TYPES = ['reboot_machine', 'shutdown_machine', 'capture_screenshot'] as const;
/** Default and ceiling of `timeout_seconds` (how long a command may stay undelivered/unreported before it expires). */
export const DEFAULT_COMMAND_TIMEOUT_SECONDS = 900;
export const MAX_COMMAND_TIMEOUT_SECONDS = 86400;
/** Ceiling of `params.delaySeconds` of reboot/shutdown (seconds: 7 days). */
export const MAX_DELAY_SECONDS = 604800;
/** Screenshot URLs in command state live this long (ms). */
export const SCREENSHOT_URL_TTL_MS = 5 * 60 * 1000;

/** A machine of a site, by its ids. */
export interface MachineRef {
  siteId: string;
  machineId: string;
}

/**
 * One page of a site's machines, ordered by machine id, after `after` (exclusive).
 * @returns the rows of the page and the position of the next page (undefined on the last).
 */
export async function listSiteMachines(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: { siteId: string; after: string | undefined; pageSize: number },
): Promise<{ machines: MachineRow[]; next: string | undefined }> {
  const rows = await listMachines(deps.db, input.siteId, {
    after: input.after,
    limit: input.pageSize,
    staleSeconds: deps.cfg.ROOST_HEARTBEAT_STALE_SECONDS,
  });
  const machines = rows.slice(0, input.pageSize);
  const more = rows.length > input.pageSize;
  return { machines, next: more ? machines[machines.length - 1].machine_id : undefined };
}

/**
 * One machine with its host info, metrics snapshot and live processes.
 * @throws ApiError not_found.
 */
export async function machineDetail(deps: Pick<ServiceDeps, 'db' | 'cfg'>, input: MachineRef): Promise<MachineDetailRow> {
  const row = await getMachine(deps.db, input.siteId, input.machineId, deps.cfg.ROOST_HEARTBEAT_STALE_SECONDS);
  if (!row) throw new ApiError('not_found', 'machine not found');
  return row;
}

/** A deployment row plus whether the machine runs the roost's current version (reported, committed). */
export type MachineDeployment = DeploymentRow & { inSync: boolean };

/**
 * Per roost that targets the machine (or that it has reported on): intended and reported version.
 * @throws ApiError not_found when the machine is not enrolled in the site.
 */
export async function deploymentsOfMachine(deps: Pick<ServiceDeps, 'db'>, input: MachineRef): Promise<MachineDeployment[]> {
  if (!(await machineExists(deps.db, input.siteId, input.machineId))) throw new ApiError('not_found', 'machine not found');
  const rows = await machineDeployments(deps.db, input.siteId, input.machineId);
  return rows.map((r) => ({
    ...r,
    inSync: r.current_version_id !== null && r.reported_version_id === r.current_version_id && r.status === 'committed',
  }));
}

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

/** A user's command request (`POST /api/sites/{siteId}/machines/{machineId}/commands`). */
export interface QueueCommandInput extends MachineRef {
  type: string;
  params?: Record<string, unknown>;
  /** Seconds before an unfinished command expires (default DEFAULT_COMMAND_TIMEOUT_SECONDS). */
  timeoutSeconds?: number;
  createdBy: string | null;
  auditCorrelationId?: string;
}

/**
 * Queues a user command for an online machine (params normalised, expiry set).
 * @returns the new command row (status pending, `expires_at` set).
 * @throws ApiError unsupported_command_type / validation_failed (normaliseCommandParams), not_found (no
 *         such machine), machine_offline (no fresh heartbeat: nothing queued).
 */
export async function queueUserCommand(deps: Pick<ServiceDeps, 'db' | 'cfg'>, input: QueueCommandInput): Promise<CommandRow> {
  const params = normaliseCommandParams(input.type, input.params);
  const timeoutSeconds = input.timeoutSeconds ?? DEFAULT_COMMAND_TIMEOUT_SECONDS;
  return queueForOnlineMachine(deps, {
    siteId: input.siteId,
    machineId: input.machineId,
    commandId: newId('cmd'),
    type: input.type,
    params,
    timeoutMs: Math.round(timeoutSeconds * 1000),
    createdBy: input.createdBy,
    auditCorrelationId: input.auditCorrelationId ?? null,
  });
}

/**
 * Queues `cmd` when its machine is online (a fresh heartbeat within ROOST_HEARTBEAT_STALE_SECONDS); the
 * agent's requests for it join the current request's trace and its log lines name the request.
 * @returns the new command row (status pending, `expires_at` = now + `cmd.timeoutMs`).
 * @throws ApiError not_found (no such machine), machine_offline (409; nothing queued).
 */
export async function queueForOnlineMachine(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  cmd: Omit<NewCommand, 'traceparent' | 'requestId'>,
): Promise<CommandRow> {
  const row = await createCommand(deps.db, { ...cmd, ...commandOrigin() }, deps.cfg.ROOST_HEARTBEAT_STALE_SECONDS);
  if (row === 'not_found') throw new ApiError('not_found', 'machine not found');
  if (row === 'offline') {
    throw new ApiError('machine_offline', `machine ${cmd.machineId} is offline (no fresh heartbeat); the command was not queued`, {
      extras: { machineId: cmd.machineId },
    });
  }
  return row;
}

/** A signed read URL of a command's screenshot and when it stops working (ISO). */
export interface ScreenshotLink {
  url: string;
  expiresAt: string;
}

/**
 * A command of a machine (a pending command past its expiry is closed as failed first), with a
 * short-lived (SCREENSHOT_URL_TTL_MS) signed URL of its screenshot when it has one.
 * @throws ApiError not_found.
 */
export async function commandState(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: MachineRef & { commandId: string },
): Promise<{ command: CommandRow; screenshot?: ScreenshotLink }> {
  await expirePendingCommands(deps.db, input.siteId, input.machineId, input.commandId);
  const command = await getCommand(deps.db, input.siteId, input.machineId, input.commandId);
  if (!command) throw new ApiError('not_found', 'command not found');
  if (!command.artifact_blob) return { command };
  const signed = await deps.blob.readUrl('screenshots', command.artifact_blob, SCREENSHOT_URL_TTL_MS);
  return { command, screenshot: { url: signed.url, expiresAt: new Date(signed.expiresAt).toISOString() } };
}
