/**
 * Managed processes repository (`/api/sites/{siteId}/machines/{machineId}/processes`, `GET /api/agent/processes`;
 * docs/decisions/managed-processes.md). Every query names `site_id` and `machine_id`. Live names are unique per
 * machine through the partial unique index `managed_processes_live_name`, so two concurrent creates of one
 * name give one row and one `duplicate` (SQLSTATE 23505), on PostgreSQL and CockroachDB alike.
 */
import type { Queryable } from './pool';
import { updateSets } from './sql';
import type { ScheduleBlock } from '../domain/processes';

/** The writable fields of a process config (wire names = column names). */
export interface ProcessFields {
  name: string;
  exe_path: string;
  file_path: string | null;
  cwd: string | null;
  priority: string;
  visibility: string;
  launch_mode: string;
  time_delay: number;
  time_to_init: number;
  relaunch_attempts: number;
  schedules: ScheduleBlock[];
  schedule_preset_id: string | null;
}

/** The columns of ProcessFields, the only ones a PATCH may set. */
const FIELD_COLUMNS: readonly (keyof ProcessFields)[] = [
  'name',
  'exe_path',
  'file_path',
  'cwd',
  'priority',
  'visibility',
  'launch_mode',
  'time_delay',
  'time_to_init',
  'relaunch_attempts',
  'schedules',
  'schedule_preset_id',
];

/** Only the ProcessFields keys of `f` (anything else a caller's object carries never reaches SQL). */
function pickFields(f: Partial<ProcessFields>): Partial<ProcessFields> {
  return Object.fromEntries(FIELD_COLUMNS.filter((k) => f[k] !== undefined).map((k) => [k, f[k]]));
}

/** A stored process config. */
export interface ProcessRow extends ProcessFields {
  site_id: string;
  machine_id: string;
  process_id: string;
  created_by: string | null;
  created_at: Date;
  updated_at: Date;
  deleted_at: Date | null;
}

const COLUMNS = `site_id, machine_id, process_id, name, exe_path, file_path, cwd, priority, visibility, launch_mode, time_delay, time_to_init,
  relaunch_attempts, schedules, schedule_preset_id, created_by, created_at, updated_at, deleted_at`;

const isUniqueViolation = (err: unknown) => (err as { code?: string }).code === '23505';

/** Inserts a process config; 'duplicate' when the machine already has a live process of that name. */
export async function insertProcess(
  q: Queryable,
  ids: { siteId: string; machineId: string; processId: string; createdBy: string | null },
  f: ProcessFields,
): Promise<ProcessRow | 'duplicate'> {
  try {
    const { rows } = await q.query<ProcessRow>(
      `INSERT INTO managed_processes (site_id, machine_id, process_id, name, exe_path, file_path, cwd, priority, visibility, launch_mode,
                                      time_delay, time_to_init, relaunch_attempts, schedules, schedule_preset_id, created_by)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
       RETURNING ${COLUMNS}`,
      [
        ids.siteId,
        ids.machineId,
        ids.processId,
        f.name,
        f.exe_path,
        f.file_path,
        f.cwd,
        f.priority,
        f.visibility,
        f.launch_mode,
        f.time_delay,
        f.time_to_init,
        f.relaunch_attempts,
        JSON.stringify(f.schedules),
        f.schedule_preset_id,
        ids.createdBy,
      ],
    );
    return rows[0];
  } catch (err) {
    if (isUniqueViolation(err)) return 'duplicate';
    throw err;
  }
}

/** One process (deleted ones too, for idempotent delete), or null. */
export async function getProcess(q: Queryable, siteId: string, machineId: string, processId: string): Promise<ProcessRow | null> {
  const { rows } = await q.query<ProcessRow>(
    `SELECT ${COLUMNS} FROM managed_processes WHERE site_id = $1 AND machine_id = $2 AND process_id = $3`,
    [siteId, machineId, processId],
  );
  return rows[0] ?? null;
}

/**
 * The live (not deleted) process, locked for the rest of transaction `tx` (read, check and write of a
 * change as one step: two concurrent changes of `launch_mode` and `schedules` are checked one after the
 * other); null when absent or deleted.
 */
export async function lockProcess(tx: Queryable, siteId: string, machineId: string, processId: string): Promise<ProcessRow | null> {
  const { rows } = await tx.query<ProcessRow>(
    `SELECT ${COLUMNS} FROM managed_processes WHERE site_id = $1 AND machine_id = $2 AND process_id = $3 AND deleted_at IS NULL FOR UPDATE`,
    [siteId, machineId, processId],
  );
  return rows[0] ?? null;
}

/** The live (not deleted) processes of a machine, by name. */
export async function listProcesses(q: Queryable, siteId: string, machineId: string): Promise<ProcessRow[]> {
  const { rows } = await q.query<ProcessRow>(
    `SELECT ${COLUMNS} FROM managed_processes WHERE site_id = $1 AND machine_id = $2 AND deleted_at IS NULL ORDER BY name, process_id`,
    [siteId, machineId],
  );
  return rows;
}

/** Updates the given fields of a live process; null when absent or deleted, 'duplicate' when the new name is taken. */
export async function updateProcess(
  q: Queryable,
  siteId: string,
  machineId: string,
  processId: string,
  f: Partial<ProcessFields>,
): Promise<ProcessRow | null | 'duplicate'> {
  const args: unknown[] = [siteId, machineId, processId];
  const sets = updateSets(pickFields(f), args, ['schedules']);
  try {
    const { rows } = await q.query<ProcessRow>(
      `UPDATE managed_processes SET ${[...sets, 'updated_at = now()'].join(', ')}
        WHERE site_id = $1 AND machine_id = $2 AND process_id = $3 AND deleted_at IS NULL RETURNING ${COLUMNS}`,
      args,
    );
    return rows[0] ?? null;
  } catch (err) {
    if (isUniqueViolation(err)) return 'duplicate';
    throw err;
  }
}

/** Soft-deletes a process: 'deleted' now, 'already' when it was deleted before, 'not_found' when it never existed. */
export async function deleteProcess(
  q: Queryable,
  siteId: string,
  machineId: string,
  processId: string,
): Promise<'deleted' | 'already' | 'not_found'> {
  const r = await q.query(
    `UPDATE managed_processes SET deleted_at = now(), updated_at = now()
      WHERE site_id = $1 AND machine_id = $2 AND process_id = $3 AND deleted_at IS NULL`,
    [siteId, machineId, processId],
  );
  if ((r.rowCount ?? 0) > 0) return 'deleted';
  return (await getProcess(q, siteId, machineId, processId)) ? 'already' : 'not_found';
}

/** The live process list the machine's agent last reported (machines.processes), or null when the machine is unknown. */
export async function reportedProcesses(q: Queryable, siteId: string, machineId: string): Promise<unknown[] | null> {
  const { rows } = await q.query<{ processes: unknown[] }>('SELECT processes FROM machines WHERE site_id = $1 AND machine_id = $2', [
    siteId,
    machineId,
  ]);
  return rows[0] ? (Array.isArray(rows[0].processes) ? rows[0].processes : []) : null;
}

/**
 * What `GET /api/agent/processes` answers, in one query: the site's IANA time zone (sites.timezone, null
 * when the site is unknown) and the machine's live processes by name.
 */
export async function agentProcessView(
  q: Queryable,
  siteId: string,
  machineId: string,
): Promise<{ timezone: string | null; processes: ProcessRow[] }> {
  const cols = COLUMNS.split(',')
    .map((c) => `p.${c.trim()}`)
    .join(', ');
  const { rows } = await q.query<ProcessRow & { site_timezone: string }>(
    `SELECT s.timezone AS site_timezone, ${cols}
       FROM sites s
       LEFT JOIN managed_processes p ON p.site_id = s.site_id AND p.machine_id = $2 AND p.deleted_at IS NULL
      WHERE s.site_id = $1
      ORDER BY p.name, p.process_id`,
    [siteId, machineId],
  );
  if (rows.length === 0) return { timezone: null, processes: [] };
  return {
    timezone: rows[0].site_timezone,
    processes: rows.filter((r) => r.process_id !== null).map(({ site_timezone: _tz, ...p }) => p),
  };
}
