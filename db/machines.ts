/**
 * Machines repository (docs/agent-protocol.md): enrolment, heartbeats, the per-machine command queue, agent
 * target-state reports, and the reads behind the site-scoped machines routes (api/routes/machines.ts, through
 * services/machines.ts and services/agent.ts). Every query names `site_id`; multi-statement writes run in
 * `withTx`.
 *
 * Liveness: a machine is online when its agent said so (`online`) AND its last heartbeat is younger than
 * `staleSeconds` (cfg.ROOST_HEARTBEAT_STALE_SECONDS), both judged by the database clock.
 *
 * Command delivery is at-least-once: a pending command is handed to the agent (delivered_at set) and
 * handed out again if it is still pending REDELIVER_AFTER_SECONDS later; agents dedupe by commandId. A
 * pending command whose expires_at has passed is closed as failed with error `expired`.
 */
import type { Pool } from 'pg';
import { withTx, type Queryable } from './pool';
import { recordEvent } from './events';
import type { SyncCounters, TargetStatus } from '../domain/target-state';

/** Seconds after which a delivered command that is still `pending` is handed out again. */
export const REDELIVER_AFTER_SECONDS = 60;

/** Most commands handed to an agent by one poll. */
export const MAX_COMMANDS_PER_POLL = 100;

/** Terminal command statuses: reporting one closes the command (completed_at set). */
export const TERMINAL_COMMAND_STATUSES = ['completed', 'failed', 'cancelled'] as const;

/** Longest stored error text (chars); longer command and target-state errors are truncated (docs/agent-protocol.md). */
export const MAX_ERROR_LENGTH = 2000;

/** SET list of a heartbeat's UPDATE: liveness now, and every snapshot field sent ($3..$13; absent ones keep their value). */
const HEARTBEAT_SET = `online = true, last_heartbeat = now(), updated_at = now(),
  agent_version = COALESCE($3, agent_version),
  hostname = COALESCE($4, hostname),
  machine_timezone = COALESCE($5, machine_timezone),
  machine_timezone_iana = COALESCE($6, machine_timezone_iana),
  metrics = COALESCE($7::jsonb, metrics),
  processes = COALESCE($8::jsonb, processes),
  info = COALESCE($9::jsonb, info),
  capabilities = COALESCE($10::jsonb, capabilities),
  cortex_enabled = COALESCE($11, cortex_enabled),
  rebooting = COALESCE($12, rebooting),
  shutting_down = COALESCE($13, shutting_down)`;

/** SQL: machine is online (agent-reported and heartbeat fresh). `$stale` is the placeholder of the stale seconds. */
function onlineExpr(alias: string, stale: string): string {
  return `(${alias}.online AND ${alias}.last_heartbeat IS NOT NULL AND ${alias}.last_heartbeat > now() - (${stale}::INT * INTERVAL '1 second'))`;
}

/** SQL: a command row that may be handed to its agent now. */
const DELIVERABLE = `status = 'pending' AND (expires_at IS NULL OR expires_at > now())
  AND (delivered_at IS NULL OR delivered_at < now() - (${REDELIVER_AFTER_SECONDS} * INTERVAL '1 second'))`;

/**
 * What a heartbeat answers besides its time ($1 site, $2 machine): `n` the machine's deliverable commands,
 * `stamp` what its managed-process config depends on (every config row, deleted ones included, and the
 * site's time zone; services/agent.ts processConfigStamp).
 */
const AFTER_BEAT = `(SELECT count(*)::INT FROM commands WHERE site_id = $1 AND machine_id = $2 AND ${DELIVERABLE}) AS n,
  (SELECT count(*)::TEXT || '/' || COALESCE(max(updated_at)::TEXT, '-') FROM managed_processes WHERE site_id = $1 AND machine_id = $2)
    || '/' || COALESCE((SELECT timezone FROM sites WHERE site_id = $1), '') AS stamp`;

/** `e` cut to MAX_ERROR_LENGTH chars (ending in an ellipsis when cut); null stays null. */
export function truncateError(e: string | null | undefined): string | null {
  if (e === null || e === undefined) return null;
  return e.length > MAX_ERROR_LENGTH ? `${e.slice(0, MAX_ERROR_LENGTH - 1)}…` : e;
}

// ---------------------------------------------------------------------------------------------------
// Enrolment

/** Stores the SHA-256 hex of a site's new enrolment secret (rotation invalidates the old one). False when the site does not exist. */
export async function setSiteEnrolmentSecretHash(db: Queryable, siteId: string, secretHash: string): Promise<boolean> {
  const r = await db.query('UPDATE sites SET enrolment_secret_hash = $2 WHERE site_id = $1', [siteId, secretHash]);
  return r.rowCount === 1;
}

/** The stored enrolment-secret digest of a site, or null when the site is unknown or has none. */
export async function siteEnrolmentSecretHash(db: Queryable, siteId: string): Promise<string | null> {
  const { rows } = await db.query<{ h: string | null }>('SELECT enrolment_secret_hash AS h FROM sites WHERE site_id = $1', [siteId]);
  return rows[0]?.h ?? null;
}

export interface EnrolInput {
  siteId: string;
  machineId: string;
  hostname: string;
  agentVersion: string;
  timezone?: string;
  timezoneIana?: string;
  capabilities?: Record<string, unknown>;
}

/**
 * Creates or re-enrols a machine with a new agent-token digest (the old token stops working), marks it
 * online with a fresh heartbeat and records `machine.online` when it was not live before.
 *
 * No statement reads an absent key: a new machine is one `INSERT … ON CONFLICT DO NOTHING`, a known one one
 * `UPDATE` that reads its previous liveness in the same statement. (A `SELECT` of the not-yet-existing row
 * first took a SERIALIZABLE predicate lock on the index page, and every concurrent enrolment of a
 * neighbouring machine id inserting into that page was a read/write conflict: a fleet of 300 enrolling 50
 * at a time retried 1.5 transactions per enrolment and some gave up with 500; docs/benchmarks.md "Fleet
 * start".)
 * @returns true when the machine row is new.
 */
export async function enrolMachine(db: Pool, input: EnrolInput, tokenHash: string, staleSeconds: number): Promise<boolean> {
  const capabilities = input.capabilities === undefined ? null : JSON.stringify(input.capabilities);
  /** $1..$8 of both statements: the machine's row as enrolment writes it. */
  const row = [
    input.siteId,
    input.machineId,
    input.hostname,
    tokenHash,
    input.agentVersion,
    input.timezone ?? null,
    input.timezoneIana ?? null,
    capabilities,
  ];
  return withTx(db, async (tx) => {
    const inserted = await tx.query<{ last_heartbeat: Date }>(
      `INSERT INTO machines (site_id, machine_id, hostname, agent_token_hash, agent_version, online, last_heartbeat,
                             machine_timezone, machine_timezone_iana, capabilities, rebooting, shutting_down, enrolled_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, true, now(), $6, $7, COALESCE($8::jsonb, '{}'::jsonb), false, false, now(), now())
       ON CONFLICT (site_id, machine_id) DO NOTHING
       RETURNING last_heartbeat`,
      row,
    );
    let wasLive = false;
    let lastHeartbeat = inserted.rows[0]?.last_heartbeat;
    if (!lastHeartbeat) {
      const updated = await tx.query<{ was_live: boolean; last_heartbeat: Date }>(
        `UPDATE machines m SET
           hostname = $3, agent_token_hash = $4, agent_version = $5,
           online = true, last_heartbeat = now(), rebooting = false, shutting_down = false,
           machine_timezone = COALESCE($6, m.machine_timezone),
           machine_timezone_iana = COALESCE($7, m.machine_timezone_iana),
           capabilities = CASE WHEN $8::jsonb IS NULL THEN m.capabilities ELSE $8::jsonb END,
           updated_at = now()
         FROM (SELECT ${onlineExpr('p', '$9')} AS live FROM machines p WHERE p.site_id = $1 AND p.machine_id = $2) prev
         WHERE m.site_id = $1 AND m.machine_id = $2
         RETURNING prev.live AS was_live, m.last_heartbeat`,
        [...row, staleSeconds],
      );
      // Deleted between the two statements by a concurrent request: retried as a serialization failure.
      if (!updated.rows[0]) throw Object.assign(new Error('machine row vanished during enrolment'), { code: '40001' });
      wasLive = updated.rows[0].was_live;
      lastHeartbeat = updated.rows[0].last_heartbeat;
    }
    if (!wasLive) {
      await recordEvent(tx, input.siteId, 'machine.online', {
        machineId: input.machineId,
        siteId: input.siteId,
        lastHeartbeat: lastHeartbeat.toISOString(),
      });
    }
    return inserted.rows.length > 0;
  });
}

// ---------------------------------------------------------------------------------------------------
// Heartbeat

export interface HeartbeatInput {
  agentVersion?: string;
  hostname?: string;
  timezone?: string;
  timezoneIana?: string;
  metrics?: Record<string, unknown>;
  processes?: unknown[];
  info?: Record<string, unknown>;
  capabilities?: Record<string, unknown>;
  cortexEnabled?: boolean;
  rebooting?: boolean;
  shuttingDown?: boolean;
}

/**
 * Records a heartbeat: online = true, last_heartbeat = now, and whatever snapshot fields were sent
 * (absent fields keep their stored value). Records `machine.online` when the machine was not live.
 * @returns the server time of the heartbeat and the number of deliverable pending commands; null when
 *          the machine row is gone.
 */
export async function recordHeartbeat(
  db: Pool,
  siteId: string,
  machineId: string,
  hb: HeartbeatInput,
  staleSeconds: number,
): Promise<{ serverTime: Date; pendingCommands: number; processConfigStamp: string } | null> {
  const j = (v: unknown) => (v === undefined ? null : JSON.stringify(v));
  const values = [
    siteId,
    machineId,
    hb.agentVersion ?? null,
    hb.hostname ?? null,
    hb.timezone ?? null,
    hb.timezoneIana ?? null,
    j(hb.metrics),
    j(hb.processes),
    j(hb.info),
    j(hb.capabilities),
    hb.cortexEnabled ?? null,
    hb.rebooting ?? null,
    hb.shuttingDown ?? null,
  ];
  // A machine that is online stays online: one statement, no event, so no read-then-write transaction,
  // and the statement also answers what the heartbeat returns (AFTER_BEAT). In PostgreSQL's SERIALIZABLE,
  // heartbeats of neighbouring machines (one B-tree leaf page of the primary key) each read the page and
  // wrote a new row version into it, a read/write cycle that aborted most of them once a fleet beat at once
  // (3,219 of 3,304 retries in a 1,000-machine rollout, docs/benchmarks.md "On a quiet
  // machine"). A single statement needs no transaction of its own (CockroachDB retries an
  // implicit transaction itself). Only a machine coming (back) online, which records `machine.online` with
  // its state change, takes the transaction below.
  const live = await db.query<{ last_heartbeat: Date; n: number; stamp: string }>(
    `WITH beat AS (
       UPDATE machines SET ${HEARTBEAT_SET}
        WHERE site_id = $1 AND machine_id = $2 AND ${onlineExpr('machines', '$14')}
        RETURNING last_heartbeat)
     SELECT beat.last_heartbeat, ${AFTER_BEAT} FROM beat`,
    [...values, staleSeconds],
  );
  if (live.rows[0]) {
    const r = live.rows[0];
    return { serverTime: r.last_heartbeat, pendingCommands: r.n, processConfigStamp: r.stamp };
  }
  const beat = await withTx(db, async (tx) => {
    const prev = await tx.query<{ live: boolean }>(
      `SELECT ${onlineExpr('m', '$3')} AS live FROM machines m WHERE m.site_id = $1 AND m.machine_id = $2`,
      [siteId, machineId, staleSeconds],
    );
    if (prev.rows.length === 0) return null;
    const { rows } = await tx.query<{ last_heartbeat: Date }>(
      `UPDATE machines SET ${HEARTBEAT_SET} WHERE site_id = $1 AND machine_id = $2 RETURNING last_heartbeat`,
      values,
    );
    if (!prev.rows[0].live) {
      await recordEvent(tx, siteId, 'machine.online', { machineId, siteId, lastHeartbeat: rows[0].last_heartbeat.toISOString() });
    }
    return rows[0].last_heartbeat;
  });
  if (beat === null) return null;
  const { rows } = await db.query<{ n: number; stamp: string }>(`SELECT ${AFTER_BEAT}`, [siteId, machineId]);
  return { serverTime: beat, pendingCommands: rows[0].n, processConfigStamp: rows[0].stamp };
}

// ---------------------------------------------------------------------------------------------------
// Commands

export interface CommandRow {
  site_id: string;
  machine_id: string;
  command_id: string;
  type: string;
  status: string;
  params: Record<string, unknown>;
  result: string | null;
  error: string | null;
  progress: number | null;
  rollout_id: string | null;
  deployment_id: string | null;
  audit_correlation_id: string | null;
  created_by: string | null;
  created_at: Date;
  expires_at: Date | null;
  delivered_at: Date | null;
  completed_at: Date | null;
  updated_at: Date;
  artifact_blob: string | null;
  /** W3C trace context the command was queued in (tracing on), sent back by the agent on its requests. */
  traceparent: string | null;
  /** `X-Request-Id` of the API request the command was queued for (migration 022); the agent logs it. */
  request_id: string | null;
}

/**
 * Where a command comes from, for the agent's logs and traces (docs/observability.md): the W3C
 * `traceparent` of the span that queued it (tracing on) and the `X-Request-Id` of the API request it was
 * queued for (the request itself, or the one that started or last steered the queuing workflow).
 */
export interface CommandOrigin {
  traceparent?: string | null;
  requestId?: string | null;
}

const COMMAND_COLUMNS = `site_id, machine_id, command_id, type, status, params, result, error, progress, rollout_id, deployment_id,
  audit_correlation_id, created_by, created_at, expires_at, delivered_at, completed_at, updated_at, artifact_blob, traceparent, request_id`;

/** SQL: a command's expiry has passed (a pending one is then closed, never handed out). */
const EXPIRED = `(expires_at IS NOT NULL AND expires_at <= now())`;
/** SQL: close the pending commands of site $1 whose expiry has passed (failed, error `expired`). */
const EXPIRE_SITE_PENDING = `UPDATE commands SET status = 'failed', error = 'expired', completed_at = now(), updated_at = now()
  WHERE site_id = $1 AND status = 'pending' AND ${EXPIRED}`;
/** SQL: the same for machine $2 of site $1 only. */
const EXPIRE_PENDING = `${EXPIRE_SITE_PENDING} AND machine_id = $2`;

/**
 * Closes the site's pending commands whose expiry has passed, whatever their machine (status failed, error
 * `expired`; through the partial index commands_pending). The long-poll check runs it every few seconds
 * (services/agent.ts CommandWaiters): a long-poll no longer claims on arrival, which used to close them.
 * @returns how many were closed.
 */
export async function expireSitePendingCommands(db: Queryable, siteId: string): Promise<number> {
  const r = await db.query(EXPIRE_SITE_PENDING, [siteId]);
  return r.rowCount ?? 0;
}

/**
 * Closes the machine's pending commands whose expiry has passed (status failed, error `expired`).
 * With `commandId`, only that command. Returns how many were closed.
 */
export async function expirePendingCommands(db: Queryable, siteId: string, machineId: string, commandId?: string): Promise<number> {
  const r = await db.query(`${EXPIRE_PENDING} AND ($3::TEXT IS NULL OR command_id = $3)`, [siteId, machineId, commandId ?? null]);
  return r.rowCount ?? 0;
}

/**
 * The site's ($1) commands in flight, as a scalar subquery: handed out and not finished, handed out or
 * reported on less than REDELIVER_AFTER_SECONDS ago (read from the partial index `commands_in_flight`).
 */
const RECENT = `now() - (${REDELIVER_AFTER_SECONDS} * INTERVAL '1 second')`;
const IN_FLIGHT_COUNT = `(SELECT count(*)::INT FROM commands WHERE site_id = $1 AND completed_at IS NULL AND delivered_at IS NOT NULL
                                        AND (delivered_at >= ${RECENT} OR updated_at >= ${RECENT}))`;

/**
 * Of `machineIds` (one site), at most `limit` with at least one deliverable command, and `inFlight`: the
 * site's commands handed out and not finished (delivered, not completed) that were handed out or reported
 * on less than REDELIVER_AFTER_SECONDS ago (an agent that went silent stops counting). The machines are
 * taken in id order from `pivot` on, wrapping around (the caller picks a different pivot each time, so a
 * limit spreads over the whole fleet instead of always favouring the lowest ids). One statement for any
 * number of ids; the ready parts read the partial index `commands_pending` (migration
 * 023_commands_pending_index.sql), the count `commands_in_flight` (migration 024), so the cost follows the
 * site's pending and in-flight commands, not its command history. `withCount` false skips the count
 * (inFlight 0), for the second and later slices of one check.
 */
export async function machinesWithDeliverable(
  db: Queryable,
  siteId: string,
  machineIds: string[],
  limit = machineIds.length,
  pivot = '',
  withCount = true,
): Promise<{ ready: string[]; inFlight: number }> {
  if (machineIds.length === 0) return { ready: [], inFlight: 0 };
  const part = (cmp: string) =>
    `(SELECT DISTINCT machine_id FROM commands WHERE site_id = $1 AND machine_id = ANY($2::TEXT[]) AND machine_id ${cmp} $4
       AND ${DELIVERABLE} ORDER BY machine_id LIMIT $3)`;
  const { rows } = await db.query<{ in_flight: number; ready: string[] }>(
    `SELECT CASE WHEN $5::BOOL THEN ${IN_FLIGHT_COUNT} ELSE 0 END AS in_flight,
            ARRAY(${part('>=')} UNION ALL ${part('<')}) AS ready`,
    [siteId, machineIds, Math.max(0, limit), pivot, withCount],
  );
  return { ready: rows[0].ready.slice(0, Math.max(0, limit)), inFlight: rows[0].in_flight };
}

/**
 * One page of the site's machines with a deliverable command, any machine (not a given list): ids
 * `> after` and, with `upTo`, `<= upTo`, ascending, at most `limit`; with `withCount`, also `inFlight` as
 * machinesWithDeliverable counts it (0 otherwise). The long-poll check reads these pages and keeps the
 * machines that have a poll waiting, when too many polls wait for an id list: a list of thousands of ids
 * cost PostgreSQL milliseconds of planning per statement, four times a second, whether or not anything was
 * pending (docs/benchmarks.md "The long-poll check"). Reads the partial index `commands_pending`, so the cost
 * follows the rows read, at most `limit`.
 */
export async function deliverableMachinesPage(
  db: Queryable,
  siteId: string,
  after: string,
  upTo: string | null,
  limit: number,
  withCount = false,
): Promise<{ machineIds: string[]; inFlight: number }> {
  const { rows } = await db.query<{ in_flight: number; ids: string[] }>(
    `SELECT CASE WHEN $5::BOOL THEN ${IN_FLIGHT_COUNT} ELSE 0 END AS in_flight,
            ARRAY(SELECT DISTINCT machine_id FROM commands WHERE site_id = $1 AND machine_id > $2 AND ($3::TEXT IS NULL OR machine_id <= $3)
                     AND ${DELIVERABLE} ORDER BY machine_id LIMIT $4) AS ids`,
    [siteId, after, upTo, Math.max(0, limit), withCount],
  );
  return { machineIds: rows[0].ids, inFlight: rows[0].in_flight };
}

/**
 * Hands out the machine's deliverable commands, oldest first (at most `limit`), and marks them delivered;
 * the same statement closes the machine's pending commands whose expiry has passed (as
 * `expirePendingCommands`), so a long-poll costs one statement, not two. One statement: two concurrent
 * polls may both receive a command (at-least-once). It is a single UPDATE whose CASEs tell the two kinds of
 * rows apart (expired vs deliverable: disjoint), not a data-modifying WITH beside a second UPDATE of
 * `commands`: CockroachDB refuses two modifications of one table in a statement
 * (sql.multiple_modifications_of_table.enabled).
 */
export async function claimCommands(
  db: Queryable,
  siteId: string,
  machineId: string,
  limit = MAX_COMMANDS_PER_POLL,
): Promise<CommandRow[]> {
  const { rows } = await db.query<CommandRow & { claim_expired: boolean }>(
    `UPDATE commands SET
            status = CASE WHEN ${EXPIRED} THEN 'failed' ELSE status END,
            error = CASE WHEN ${EXPIRED} THEN 'expired' ELSE error END,
            completed_at = CASE WHEN ${EXPIRED} THEN now() ELSE completed_at END,
            updated_at = CASE WHEN ${EXPIRED} THEN now() ELSE updated_at END,
            delivered_at = CASE WHEN ${EXPIRED} THEN delivered_at ELSE now() END
      WHERE site_id = $1 AND machine_id = $2 AND status = 'pending'
        AND (${EXPIRED}
             OR command_id IN (SELECT command_id FROM commands WHERE site_id = $1 AND machine_id = $2 AND ${DELIVERABLE}
                                ORDER BY created_at, command_id LIMIT $3))
      RETURNING ${COMMAND_COLUMNS}, (status = 'failed') AS claim_expired`,
    [siteId, machineId, limit],
  );
  return rows
    .filter((r) => !r.claim_expired)
    .map(({ claim_expired: _expired, ...row }) => row)
    .sort((a, b) => a.created_at.getTime() - b.created_at.getTime() || (a.command_id < b.command_id ? -1 : 1));
}

export interface CommandReport {
  status: string;
  progress?: number;
  result?: string;
  error?: string;
}

/**
 * Applies an agent's report to an open command: an intermediate status keeps it open, a terminal one
 * closes it (completed_at). On `completed` result defaults to `success` (a staged sync_pull reports
 * `staged`; a roost_activate reports `success`), on `cancelled` to `cancelled`;
 * on `failed` error defaults to `failed`. A report on a closed command changes nothing.
 * @returns the row after the report and whether it changed; null when the command is not this machine's.
 */
export async function reportCommand(
  db: Queryable,
  siteId: string,
  machineId: string,
  commandId: string,
  report: CommandReport,
): Promise<{ row: CommandRow; changed: boolean } | null> {
  const r = reportValues(report);
  const { rows } = await db.query<CommandRow>(
    `UPDATE commands SET ${REPORT_SET} WHERE site_id = $1 AND machine_id = $2 AND command_id = $3 AND completed_at IS NULL
      RETURNING ${COMMAND_COLUMNS}`,
    [siteId, machineId, commandId, r.status, r.result, r.error, r.progress, r.terminal],
  );
  if (rows[0]) return { row: rows[0], changed: true };
  const row = await getCommand(db, siteId, machineId, commandId);
  return row ? { row, changed: false } : null;
}

/** SQL: the SET list of a command report ($4 status, $5 result, $6 error, $7 progress, $8 terminal). */
const REPORT_SET = `status = $4, result = $5, error = $6, progress = COALESCE($7, progress), updated_at = now(),
            completed_at = CASE WHEN $8 THEN now() ELSE NULL END,
            delivered_at = COALESCE(delivered_at, now())`;

/** The stored values of a report: result and error defaulted as `reportCommand` describes. */
function reportValues(report: CommandReport): {
  status: string;
  result: string | null;
  error: string | null;
  progress: number | null;
  terminal: boolean;
} {
  const terminal = (TERMINAL_COMMAND_STATUSES as readonly string[]).includes(report.status);
  let result: string | null = null;
  let error: string | null = null;
  if (report.status === 'completed') result = report.result ?? 'success';
  else if (report.status === 'cancelled') result = report.result ?? 'cancelled';
  if (report.status === 'failed') error = truncateError(report.error ?? 'failed');
  else if (!terminal && report.error !== undefined) error = truncateError(report.error);
  return { status: report.status, result, error, progress: report.progress ?? null, terminal };
}

/** One command of a machine, or null. */
export async function getCommand(db: Queryable, siteId: string, machineId: string, commandId: string): Promise<CommandRow | null> {
  const { rows } = await db.query<CommandRow>(
    `SELECT ${COMMAND_COLUMNS} FROM commands WHERE site_id = $1 AND machine_id = $2 AND command_id = $3`,
    [siteId, machineId, commandId],
  );
  return rows[0] ?? null;
}

/** Records the blob a command produced (screenshot). False when the command is not this machine's. */
export async function setCommandArtifact(
  db: Queryable,
  siteId: string,
  machineId: string,
  commandId: string,
  blobName: string,
): Promise<boolean> {
  const r = await db.query(
    'UPDATE commands SET artifact_blob = $4, updated_at = now() WHERE site_id = $1 AND machine_id = $2 AND command_id = $3',
    [siteId, machineId, commandId, blobName],
  );
  return r.rowCount === 1;
}

export interface NewCommand extends CommandOrigin {
  siteId: string;
  machineId: string;
  commandId: string;
  type: string;
  params: Record<string, unknown>;
  timeoutMs: number;
  createdBy: string | null;
  auditCorrelationId?: string | null;
  rolloutId?: string | null;
  deploymentId?: string | null;
}

/**
 * Queues a command for a machine that exists and is online, in one transaction.
 * @returns the new row, or 'not_found' / 'offline'.
 */
export async function createCommand(db: Pool, cmd: NewCommand, staleSeconds: number): Promise<CommandRow | 'not_found' | 'offline'> {
  return withTx(db, async (tx) => {
    const m = await tx.query<{ live: boolean }>(
      `SELECT ${onlineExpr('m', '$3')} AS live FROM machines m WHERE m.site_id = $1 AND m.machine_id = $2`,
      [cmd.siteId, cmd.machineId, staleSeconds],
    );
    if (m.rows.length === 0) return 'not_found' as const;
    if (!m.rows[0].live) return 'offline' as const;
    const { rows } = await tx.query<CommandRow>(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, created_by, audit_correlation_id, rollout_id,
                             deployment_id, created_at, updated_at, expires_at, traceparent, request_id)
       VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $8, $9, now(), now(), now() + ($10::INT * INTERVAL '1 millisecond'), $11, $12)
       RETURNING ${COMMAND_COLUMNS}`,
      [
        cmd.siteId,
        cmd.machineId,
        cmd.commandId,
        cmd.type,
        JSON.stringify(cmd.params),
        cmd.createdBy,
        cmd.auditCorrelationId ?? null,
        cmd.rolloutId ?? null,
        cmd.deploymentId ?? null,
        cmd.timeoutMs,
        cmd.traceparent ?? null,
        cmd.requestId ?? null,
      ],
    );
    return rows[0];
  });
}

// ---------------------------------------------------------------------------------------------------
// Roost sync (agent side)

export interface AgentVersionRow {
  extract_path: string;
  version_number: number;
  blob_name: string;
  /** Version signature (base64url) and its key id; null until signed (db/signing-keys.ts). */
  signature: string | null;
  signing_key_id: string | null;
}

/** A version of a live (not deleted) roost of the site, or null. */
export async function roostVersionForAgent(
  db: Queryable,
  siteId: string,
  roostId: string,
  versionId: string,
): Promise<AgentVersionRow | null> {
  const { rows } = await db.query<AgentVersionRow>(
    `SELECT r.extract_path, v.version_number, v.blob_name, v.signature, v.signing_key_id
       FROM roosts r JOIN roost_versions v ON v.site_id = r.site_id AND v.roost_id = r.roost_id
      WHERE r.site_id = $1 AND r.roost_id = $2 AND v.version_id = $3 AND r.deleted_at IS NULL`,
    [siteId, roostId, versionId],
  );
  return rows[0] ?? null;
}

/** Whether the roost exists (and is not deleted) and whether `versionId` is one of its versions. */
export async function roostAndVersionExist(
  db: Queryable,
  siteId: string,
  roostId: string,
  versionId: string,
): Promise<{ roost: boolean; version: boolean }> {
  const { rows } = await db.query<{ version: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM roost_versions v WHERE v.site_id = r.site_id AND v.roost_id = r.roost_id AND v.version_id = $3) AS version
       FROM roosts r WHERE r.site_id = $1 AND r.roost_id = $2 AND r.deleted_at IS NULL`,
    [siteId, roostId, versionId],
  );
  return { roost: rows.length > 0, version: rows[0]?.version ?? false };
}

export interface TargetStateInput extends Omit<SyncCounters, 'bytes_fetched'> {
  reportedVersionId: string;
  status: TargetStatus;
  error?: string | null;
  bytes_fetched?: number;
}

export interface TargetStateRow extends SyncCounters {
  site_id: string;
  machine_id: string;
  roost_id: string;
  reported_version_id: string | null;
  status: TargetStatus;
  error: string | null;
  updated_at: Date;
}

/** SQL: the columns of roost_target_states an upsert writes, in the order of `targetStateValues` ($1…$13). */
const TARGET_STATE_INSERT = `INSERT INTO roost_target_states (site_id, machine_id, roost_id, reported_version_id, status, error, chunks_fetched, chunks_total,
                                      chunks_dedup, files_total, files_assembled, files_skipped, bytes_fetched, updated_at)`;
/** SQL: what an upsert of a target state changes on an existing row. */
const TARGET_STATE_ON_CONFLICT = `ON CONFLICT (site_id, machine_id, roost_id) DO UPDATE SET
       reported_version_id = excluded.reported_version_id, status = excluded.status, error = excluded.error,
       chunks_fetched = excluded.chunks_fetched, chunks_total = excluded.chunks_total, chunks_dedup = excluded.chunks_dedup,
       files_total = excluded.files_total, files_assembled = excluded.files_assembled, files_skipped = excluded.files_skipped,
       bytes_fetched = excluded.bytes_fetched, updated_at = now()`;
/** The row values of a target state (roost_target_states columns after the site, machine and roost). The error is kept only on failed/cancelled. */
function targetStateValues(s: TargetStateInput): unknown[] {
  const keepsError = s.status === 'failed' || s.status === 'cancelled';
  return [
    s.reportedVersionId,
    s.status,
    keepsError ? truncateError(s.error ?? null) : null,
    s.chunks_fetched,
    s.chunks_total,
    s.chunks_dedup,
    s.files_total,
    s.files_assembled,
    s.files_skipped,
    s.bytes_fetched ?? 0,
  ];
}

/** Upserts the machine's reported state for a roost (one statement). The error is kept only on failed/cancelled. */
export async function upsertTargetState(
  db: Queryable,
  siteId: string,
  machineId: string,
  roostId: string,
  s: TargetStateInput,
): Promise<TargetStateRow> {
  const { rows } = await db.query<TargetStateRow>(
    `${TARGET_STATE_INSERT}
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, now())
     ${TARGET_STATE_ON_CONFLICT}
     RETURNING *`,
    [siteId, machineId, roostId, ...targetStateValues(s)],
  );
  return rows[0];
}

/** What `reportCommandWithState` found and did. */
export type ReportWithStateResult =
  | { found: 'no_roost' }
  | { found: 'no_version' }
  | { found: 'no_command' }
  | { found: 'all'; row: CommandRow; changed: boolean; stored: TargetStateRow };

const TS_COLUMNS = [
  'reported_version_id',
  'status',
  'error',
  'chunks_fetched',
  'chunks_total',
  'chunks_dedup',
  'files_total',
  'files_assembled',
  'files_skipped',
  'bytes_fetched',
  'updated_at',
] as const;

/**
 * A command report and the machine's target state of a roost in one statement (atomic: both or neither):
 * checks that `roostId` is a live roost of the site, `state.reportedVersionId` one of its versions and the
 * command this machine's, then applies the report as `reportCommand` does (a closed command is left as
 * it is) and upserts the target state as `upsertTargetState` does (also when the command was closed: it
 * says what the disk holds). Nothing changes unless all three hold; `found` says which failed first, in
 * that order. One round trip instead of five (check, BEGIN, report, upsert, COMMIT): a fleet's reports
 * are the bulk of a rollout's statements (docs/benchmarks.md "10,000 machines").
 */
export async function reportCommandWithState(
  db: Queryable,
  siteId: string,
  machineId: string,
  commandId: string,
  report: CommandReport,
  roostId: string,
  state: TargetStateInput,
): Promise<ReportWithStateResult> {
  const r = reportValues(report);
  const { rows } = await db.query<Record<string, unknown>>(
    `WITH chk AS (
       SELECT EXISTS (SELECT 1 FROM roosts WHERE site_id = $1 AND roost_id = $9 AND deleted_at IS NULL) AS roost,
              EXISTS (SELECT 1 FROM roost_versions WHERE site_id = $1 AND roost_id = $9 AND version_id = $10) AS version,
              EXISTS (SELECT 1 FROM commands WHERE site_id = $1 AND machine_id = $2 AND command_id = $3) AS command
     ), upd AS (
       UPDATE commands SET ${REPORT_SET}
        WHERE site_id = $1 AND machine_id = $2 AND command_id = $3 AND completed_at IS NULL
          AND (SELECT roost AND version FROM chk)
       RETURNING ${COMMAND_COLUMNS}
     ), ts AS (
       ${TARGET_STATE_INSERT}
       SELECT $1, $2, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, now()
        WHERE (SELECT roost AND version AND command FROM chk)
       ${TARGET_STATE_ON_CONFLICT}
       RETURNING ${TS_COLUMNS.join(', ')}
     )
     SELECT chk.roost AS chk_roost, chk.version AS chk_version, chk.command AS chk_command,
            EXISTS (SELECT 1 FROM upd) AS chk_changed,
            ${TS_COLUMNS.map((c) => `ts.${c} AS ts_${c}`).join(', ')},
            c.*
       FROM chk
       LEFT JOIN ts ON true
       LEFT JOIN LATERAL (
         SELECT ${COMMAND_COLUMNS} FROM upd
         UNION ALL
         SELECT ${COMMAND_COLUMNS} FROM commands
          WHERE site_id = $1 AND machine_id = $2 AND command_id = $3 AND NOT EXISTS (SELECT 1 FROM upd)
       ) AS c ON true`,
    [siteId, machineId, commandId, r.status, r.result, r.error, r.progress, r.terminal, roostId, ...targetStateValues(state)],
  );
  const row = rows[0];
  if (!row.chk_roost) return { found: 'no_roost' };
  if (!row.chk_version) return { found: 'no_version' };
  if (!row.chk_command) return { found: 'no_command' };
  const stored = { site_id: siteId, machine_id: machineId, roost_id: roostId } as Record<string, unknown>;
  const command: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(row)) {
    if (k.startsWith('ts_')) stored[k.slice(3)] = v;
    else if (!k.startsWith('chk_')) command[k] = v;
  }
  return {
    found: 'all',
    row: command as unknown as CommandRow,
    changed: row.chk_changed === true,
    stored: stored as unknown as TargetStateRow,
  };
}

// ---------------------------------------------------------------------------------------------------
// Site-scoped reads (machines routes)

export interface MachineRow {
  site_id: string;
  machine_id: string;
  hostname: string | null;
  agent_version: string | null;
  live: boolean;
  last_heartbeat: Date | null;
  machine_timezone: string | null;
  machine_timezone_iana: string | null;
  cortex_enabled: boolean | null;
  rebooting: boolean;
  shutting_down: boolean;
  capabilities: Record<string, unknown>;
  enrolled_at: Date;
  updated_at: Date;
}

export interface MachineDetailRow extends MachineRow {
  info: Record<string, unknown>;
  metrics: Record<string, unknown> | null;
  processes: unknown[];
}

const MACHINE_COLUMNS = `m.site_id, m.machine_id, m.hostname, m.agent_version, m.last_heartbeat, m.machine_timezone, m.machine_timezone_iana,
  m.cortex_enabled, m.rebooting, m.shutting_down, m.capabilities, m.enrolled_at, m.updated_at`;

/** One page of a site's machines ordered by machine id, after `after` (exclusive). Fetches limit+1 rows so callers can tell whether more follow. */
export async function listMachines(
  db: Queryable,
  siteId: string,
  opts: { after?: string; limit: number; staleSeconds: number },
): Promise<MachineRow[]> {
  const { rows } = await db.query<MachineRow>(
    `SELECT ${MACHINE_COLUMNS}, ${onlineExpr('m', '$4')} AS live
       FROM machines m WHERE m.site_id = $1 AND ($2::TEXT IS NULL OR m.machine_id > $2)
      ORDER BY m.machine_id LIMIT $3`,
    [siteId, opts.after ?? null, opts.limit + 1, opts.staleSeconds],
  );
  return rows;
}

/** One machine with its host info, metrics snapshot and live processes, or null. */
export async function getMachine(db: Queryable, siteId: string, machineId: string, staleSeconds: number): Promise<MachineDetailRow | null> {
  const { rows } = await db.query<MachineDetailRow>(
    `SELECT ${MACHINE_COLUMNS}, m.info, m.metrics, m.processes, ${onlineExpr('m', '$3')} AS live
       FROM machines m WHERE m.site_id = $1 AND m.machine_id = $2`,
    [siteId, machineId, staleSeconds],
  );
  return rows[0] ?? null;
}

/** True when the machine is enrolled in the site. */
export async function machineExists(db: Queryable, siteId: string, machineId: string): Promise<boolean> {
  const { rows } = await db.query('SELECT 1 FROM machines WHERE site_id = $1 AND machine_id = $2', [siteId, machineId]);
  return rows.length > 0;
}

export interface DeploymentRow {
  roost_id: string;
  name: string;
  extract_path: string;
  current_version_id: string | null;
  current_version_number: number | null;
  reported_version_id: string | null;
  reported_version_number: number | null;
  status: TargetStatus | null;
  error: string | null;
  chunks_fetched: number | null;
  chunks_total: number | null;
  chunks_dedup: number | null;
  files_total: number | null;
  files_assembled: number | null;
  files_skipped: number | null;
  bytes_fetched: number | null;
  updated_at: Date | null;
}

/**
 * Per live roost of the site that targets the machine or that the machine has reported state for: the
 * roost's current pointer (intended) beside the machine's reported state. Ordered by roost id.
 */
export async function machineDeployments(db: Queryable, siteId: string, machineId: string): Promise<DeploymentRow[]> {
  const { rows } = await db.query<DeploymentRow>(
    `SELECT r.roost_id, r.name, r.extract_path, r.current_version_id, cv.version_number AS current_version_number,
            s.reported_version_id, rv.version_number AS reported_version_number, s.status, s.error,
            s.chunks_fetched, s.chunks_total, s.chunks_dedup, s.files_total, s.files_assembled, s.files_skipped, s.bytes_fetched, s.updated_at
       FROM roosts r
       LEFT JOIN roost_target_states s ON s.site_id = r.site_id AND s.roost_id = r.roost_id AND s.machine_id = $2
       LEFT JOIN roost_versions cv ON cv.site_id = r.site_id AND cv.roost_id = r.roost_id AND cv.version_id = r.current_version_id
       LEFT JOIN roost_versions rv ON rv.site_id = r.site_id AND rv.roost_id = r.roost_id AND rv.version_id = s.reported_version_id
      WHERE r.site_id = $1 AND r.deleted_at IS NULL AND (r.targets @> $3::jsonb OR s.machine_id IS NOT NULL)
      ORDER BY r.roost_id`,
    [siteId, machineId, JSON.stringify([machineId])],
  );
  return rows;
}

/**
 * Cancels the pending commands `uid` queued itself (not those a rollout queued on its behalf: the
 * rollout workflow owns them) on `siteIds`, or on every site when `siteIds` is null, in the caller's
 * transaction. Returns how many it cancelled. Used when a user leaves sites (`POST
 * /api/users/{uid}/remove-sites`) and by the user-delete cascade.
 */
export async function cancelUserCommands(tx: Queryable, uid: string, siteIds: string[] | null, reason: string): Promise<number> {
  if (siteIds && siteIds.length === 0) return 0;
  const { rowCount } = await tx.query(
    `UPDATE commands SET status = 'cancelled', result = 'cancelled', error = $3, completed_at = now(), updated_at = now()
      WHERE created_by = $1 AND status = 'pending' AND rollout_id IS NULL AND ($2::text[] IS NULL OR site_id = ANY($2::text[]))`,
    [uid, siteIds, truncateError(reason)],
  );
  return rowCount ?? 0;
}
