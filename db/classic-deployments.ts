/**
 * Classic deployments repository (`/api/sites/{siteId}/deployments`; docs/decisions/classic-deployments.md):
 * deployments and their targets, installer templates, and the set-based dispatch and reconcile passes of the
 * deployment workflow (activities/classic-deployment.ts). Every query names `site_id`; multi-statement
 * writes run in `withTx`. Roost rollouts live in db/rollouts.ts and never share rows with this module.
 *
 * Agents never report to these tables: they report their `classic_install` / `classic_uninstall` commands
 * (db/machines.ts reportCommand), and `reconcileDeployment` folds the command statuses into the targets in
 * one statement per pass, so a deployment of thousands of machines costs a few queries a second.
 */
import { createHash } from 'node:crypto';
import type { Pool } from 'pg';
import { withTx, type Queryable } from './pool';
import { newestFirstPage, updateSets } from './sql';
import type { CommandOrigin } from './machines';
import {
  CLASSIC_INSTALL,
  CLASSIC_UNINSTALL,
  type ClassicCommandParams,
  DEFAULT_DEPLOY_QUOTA,
  DEFAULT_INSTALL_TIMEOUT_SECONDS,
  type DeploymentStatus,
  TARGET_DEADLINE_MARGIN_MS,
  type TargetAction,
  type TargetCounts,
  type TargetStatus,
  deriveDeploymentStatus,
  emptyTargetCounts,
} from '../domain/classic';

export { unknownMachines } from './rollouts';

/** A stored classic deployment. */
export interface DeploymentRow {
  site_id: string;
  deployment_id: string;
  name: string;
  installer_url: string;
  installer_name: string;
  silent_flags: string;
  verify_path: string | null;
  sha256: string | null;
  close_processes: string[];
  suppress_projects: string[];
  parallel_install: boolean;
  timeout_seconds: number | null;
  template_id: string | null;
  status: DeploymentStatus;
  cancel_requested: boolean;
  uninstall_requested: boolean;
  workflow_id: string;
  created_by: string;
  created_at: Date;
  updated_at: Date;
  completed_at: Date | null;
  /** created_at as the database prints it (list position). */
  position_at: string;
}

const DEPLOYMENT_COLUMNS = `site_id, deployment_id, name, installer_url, installer_name, silent_flags, verify_path, sha256, close_processes,
  suppress_projects, parallel_install, timeout_seconds, template_id, status, cancel_requested, uninstall_requested, workflow_id,
  created_by, created_at, updated_at, completed_at, created_at::text AS position_at`;

/** One target of a deployment. */
export interface TargetRow {
  machine_id: string;
  position: number;
  action: TargetAction;
  status: TargetStatus;
  progress: number | null;
  error: string | null;
  attempts: number;
  command_id: string | null;
  dispatched_at: Date | null;
  finished_at: Date | null;
  updated_at: Date;
}

/** A deployment to insert (its targets in the create body's order). */
export interface NewDeployment {
  siteId: string;
  deploymentId: string;
  name: string;
  installerUrl: string;
  installerName: string;
  silentFlags: string;
  verifyPath: string | null;
  sha256: string | null;
  closeProcesses: string[];
  suppressProjects: string[];
  parallelInstall: boolean;
  timeoutSeconds: number | null;
  templateId: string | null;
  workflowId: string;
  createdBy: string;
  machines: string[];
}

/** The site's deployQuota (most targets of one classic deployment); the default when the site is unknown. */
export async function siteDeployQuota(q: Queryable, siteId: string): Promise<number> {
  const { rows } = await q.query<{ deploy_quota: number }>('SELECT deploy_quota FROM sites WHERE site_id = $1', [siteId]);
  return rows[0]?.deploy_quota ?? DEFAULT_DEPLOY_QUOTA;
}

/** Inserts a deployment (status pending) and its targets (pending, in order) in one transaction. */
export async function insertDeployment(pool: Pool, d: NewDeployment): Promise<DeploymentRow> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<DeploymentRow>(
      `INSERT INTO classic_deployments (site_id, deployment_id, name, installer_url, installer_name, silent_flags, verify_path, sha256,
                                        close_processes, suppress_projects, parallel_install, timeout_seconds, template_id, workflow_id, created_by)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
       RETURNING ${DEPLOYMENT_COLUMNS}`,
      [
        d.siteId,
        d.deploymentId,
        d.name,
        d.installerUrl,
        d.installerName,
        d.silentFlags,
        d.verifyPath,
        d.sha256,
        JSON.stringify(d.closeProcesses),
        JSON.stringify(d.suppressProjects),
        d.parallelInstall,
        d.timeoutSeconds,
        d.templateId,
        d.workflowId,
        d.createdBy,
      ],
    );
    await tx.query(
      `INSERT INTO classic_deployment_targets (site_id, deployment_id, machine_id, position)
       SELECT $1, $2, u.m, u.i::INT - 1 FROM UNNEST($3::text[]) WITH ORDINALITY AS u (m, i)`,
      [d.siteId, d.deploymentId, d.machines],
    );
    return rows[0];
  });
}

/** One deployment, or null. */
export async function getDeployment(q: Queryable, siteId: string, deploymentId: string): Promise<DeploymentRow | null> {
  const { rows } = await q.query<DeploymentRow>(
    `SELECT ${DEPLOYMENT_COLUMNS} FROM classic_deployments WHERE site_id = $1 AND deployment_id = $2`,
    [siteId, deploymentId],
  );
  return rows[0] ?? null;
}

/** A page of the site's deployments, newest first, after the `[created_at text, id]` position `after`. */
export async function listDeployments(
  q: Queryable,
  siteId: string,
  opts: { limit: number; after?: [string, string]; status?: DeploymentStatus },
): Promise<{ rows: DeploymentRow[]; more: boolean }> {
  return newestFirstPage<DeploymentRow>(q, {
    select: `SELECT ${DEPLOYMENT_COLUMNS} FROM classic_deployments`,
    idColumn: 'deployment_id',
    where: opts.status ? 'site_id = $1 AND status = $2' : 'site_id = $1',
    args: opts.status ? [siteId, opts.status] : [siteId],
    limit: opts.limit,
    after: opts.after,
  });
}

/** Every target of a deployment, in the create body's order. */
export async function listTargets(q: Queryable, siteId: string, deploymentId: string): Promise<TargetRow[]> {
  const { rows } = await q.query<TargetRow>(
    `SELECT machine_id, position, action, status, progress, error, attempts, command_id, dispatched_at, finished_at, updated_at
       FROM classic_deployment_targets WHERE site_id = $1 AND deployment_id = $2 ORDER BY position`,
    [siteId, deploymentId],
  );
  return rows;
}

/** Number of targets of a deployment. */
export async function targetTotal(q: Queryable, siteId: string, deploymentId: string): Promise<number> {
  const { rows } = await q.query<{ n: number }>(
    'SELECT count(*)::INT AS n FROM classic_deployment_targets WHERE site_id = $1 AND deployment_id = $2',
    [siteId, deploymentId],
  );
  return rows[0].n;
}

/** Target counts per status of each deployment of `deploymentIds` (one query). */
export async function countsByDeployment(
  q: Queryable,
  siteId: string,
  deploymentIds: readonly string[],
): Promise<Map<string, TargetCounts>> {
  const out = new Map<string, TargetCounts>();
  if (deploymentIds.length === 0) return out;
  const { rows } = await q.query<{ deployment_id: string; status: TargetStatus; n: number }>(
    `SELECT deployment_id, status, count(*)::INT AS n FROM classic_deployment_targets
      WHERE site_id = $1 AND deployment_id = ANY($2::text[]) GROUP BY deployment_id, status`,
    [siteId, deploymentIds],
  );
  for (const id of deploymentIds) out.set(id, emptyTargetCounts());
  for (const r of rows) {
    const c = out.get(r.deployment_id)!;
    if (r.status in c) c[r.status] = r.n;
  }
  return out;
}

/** Deletes a terminal deployment and its targets (commands keep their deployment_id as history). */
export async function deleteDeployment(
  pool: Pool,
  siteId: string,
  deploymentId: string,
  terminal: readonly DeploymentStatus[],
): Promise<'deleted' | 'not_found' | 'in_flight'> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ status: DeploymentStatus }>(
      'SELECT status FROM classic_deployments WHERE site_id = $1 AND deployment_id = $2',
      [siteId, deploymentId],
    );
    if (!rows[0]) return 'not_found' as const;
    if (!terminal.includes(rows[0].status)) return 'in_flight' as const;
    await tx.query('DELETE FROM classic_deployment_targets WHERE site_id = $1 AND deployment_id = $2', [siteId, deploymentId]);
    await tx.query('DELETE FROM classic_deployments WHERE site_id = $1 AND deployment_id = $2', [siteId, deploymentId]);
    return 'deleted' as const;
  });
}

// ---------------------------------------------------------------------------------------------------
// Control actions (run by the workflow's update handlers, activities/classic-deployment.ts)

/** Counts an action changed, and the deployment's status afterwards. */
export interface ActionResult {
  affected: number;
  status: DeploymentStatus;
}

/**
 * retry: failed targets back to pending (their next dispatch is a new attempt with a new command);
 * completed, cancelled and in-flight targets are left alone.
 */
export async function requeueFailedTargets(pool: Pool, siteId: string, deploymentId: string): Promise<ActionResult | null> {
  return withTx(pool, async (tx) => {
    if (!(await lockDeployment(tx, siteId, deploymentId))) return null;
    const r = await tx.query(
      `UPDATE classic_deployment_targets SET status = 'pending', error = NULL, progress = NULL, command_id = NULL, dispatched_at = NULL,
              deadline_at = NULL, finished_at = NULL, updated_at = now()
        WHERE site_id = $1 AND deployment_id = $2 AND status = 'failed'`,
      [siteId, deploymentId],
    );
    const affected = r.rowCount ?? 0;
    if (affected > 0) {
      await tx.query(
        `UPDATE classic_deployments SET cancel_requested = false, completed_at = NULL, updated_at = now() WHERE site_id = $1 AND deployment_id = $2`,
        [siteId, deploymentId],
      );
    }
    return { affected, status: await storeDerivedStatus(tx, siteId, deploymentId) };
  });
}

/**
 * cancel: pending targets (not dispatched, or dispatched but not yet taken up by the agent: their command is
 * still `pending` and is cancelled with them) become cancelled. In-flight installs are not interrupted.
 */
export async function cancelPendingTargets(pool: Pool, siteId: string, deploymentId: string): Promise<ActionResult | null> {
  return withTx(pool, async (tx) => {
    if (!(await lockDeployment(tx, siteId, deploymentId))) return null;
    const { rows } = await tx.query<{ machine_id: string; command_id: string | null }>(
      `UPDATE classic_deployment_targets AS t SET status = 'cancelled', finished_at = now(), updated_at = now()
        WHERE t.site_id = $1 AND t.deployment_id = $2 AND t.status = 'pending'
          AND (t.command_id IS NULL OR EXISTS (SELECT 1 FROM commands AS c WHERE c.site_id = t.site_id AND c.machine_id = t.machine_id
                                                  AND c.command_id = t.command_id AND c.status = 'pending'))
        RETURNING t.machine_id, t.command_id`,
      [siteId, deploymentId],
    );
    const withCommand = rows.filter((r) => r.command_id !== null);
    if (withCommand.length > 0) {
      await tx.query(
        `UPDATE commands SET status = 'cancelled', result = 'cancelled', completed_at = now(), updated_at = now()
          WHERE site_id = $1 AND status = 'pending' AND (machine_id, command_id) IN (SELECT * FROM UNNEST($2::text[], $3::text[]))`,
        [siteId, withCommand.map((r) => r.machine_id), withCommand.map((r) => r.command_id)],
      );
    }
    if (rows.length > 0) {
      await tx.query(
        `UPDATE classic_deployments SET cancel_requested = true, updated_at = now() WHERE site_id = $1 AND deployment_id = $2`,
        [siteId, deploymentId],
      );
    }
    return { affected: rows.length, status: await storeDerivedStatus(tx, siteId, deploymentId) };
  });
}

/**
 * uninstall: every target back to pending with action `uninstall`, only when the deployment's status is one
 * of `terminal` (checked under the deployment's row lock, so of two uninstalls at once the second finds the
 * first's deployment in flight).
 * @returns null when the deployment is gone, 'in_flight' (nothing changed) when it has not ended.
 */
export async function queueUninstall(
  pool: Pool,
  siteId: string,
  deploymentId: string,
  terminal: readonly DeploymentStatus[],
): Promise<ActionResult | null | 'in_flight'> {
  return withTx(pool, async (tx) => {
    const locked = await lockDeployment(tx, siteId, deploymentId);
    if (!locked) return null;
    if (!terminal.includes(locked.status)) return 'in_flight' as const;
    const r = await tx.query(
      `UPDATE classic_deployment_targets SET action = 'uninstall', status = 'pending', error = NULL, progress = NULL, command_id = NULL,
              dispatched_at = NULL, deadline_at = NULL, finished_at = NULL, updated_at = now()
        WHERE site_id = $1 AND deployment_id = $2`,
      [siteId, deploymentId],
    );
    await tx.query(
      `UPDATE classic_deployments SET uninstall_requested = true, cancel_requested = false, completed_at = NULL, updated_at = now()
        WHERE site_id = $1 AND deployment_id = $2`,
      [siteId, deploymentId],
    );
    return { affected: r.rowCount ?? 0, status: await storeDerivedStatus(tx, siteId, deploymentId) };
  });
}

/** Locks the deployment's row for the transaction; its stored status, or undefined when it is gone. */
async function lockDeployment(tx: Queryable, siteId: string, deploymentId: string): Promise<{ status: DeploymentStatus } | undefined> {
  const { rows } = await tx.query<{ status: DeploymentStatus }>(
    'SELECT status FROM classic_deployments WHERE site_id = $1 AND deployment_id = $2 FOR UPDATE',
    [siteId, deploymentId],
  );
  return rows[0];
}

// ---------------------------------------------------------------------------------------------------
// Dispatch and reconcile (the deployment workflow's activities)

/** Deterministic command id of a target's attempt, so a retried dispatch never queues twice. */
export function classicCommandId(deploymentId: string, machineId: string, action: TargetAction, attempt: number): string {
  return `cmd_${createHash('sha256').update(`classic:${deploymentId}:${machineId}:${action}:${attempt}`).digest('hex').slice(0, 24)}`;
}

/** Where a deployment stands after a reconcile pass. */
export interface ReconcileResult {
  counts: TargetCounts;
  status: DeploymentStatus;
  /** Targets pending or in flight. */
  open: number;
  /** Open targets that have a command (dispatched, not finished). */
  dispatchedOpen: number;
  /** Pending targets without a command (what dispatch may pick). */
  undispatched: number;
}

/**
 * One reconcile pass in one transaction: folds the status, progress and error of each open target's
 * command into the target (`completed` of an uninstall is `uninstalled`; an unknown intermediate status
 * counts as `installing`), fails dispatched targets past their deadline (`timeout`, their open command
 * closed as failed), then derives and stores the deployment's status.
 * @returns null when the deployment is gone.
 */
export async function reconcileDeployment(pool: Pool, siteId: string, deploymentId: string): Promise<ReconcileResult | null> {
  return withTx(pool, async (tx) => {
    const { rows: exists } = await tx.query('SELECT 1 FROM classic_deployments WHERE site_id = $1 AND deployment_id = $2', [
      siteId,
      deploymentId,
    ]);
    if (exists.length === 0) return null;
    await tx.query(
      `UPDATE classic_deployment_targets AS t
          SET status = CASE
                WHEN c.status = 'completed' THEN CASE WHEN t.action = 'uninstall' THEN 'uninstalled' ELSE 'completed' END
                WHEN c.status IN ('failed', 'cancelled') THEN c.status
                WHEN c.status IN ('closing_processes', 'downloading', 'installing') THEN c.status
                ELSE 'installing' END,
              progress = COALESCE(c.progress, t.progress),
              error = CASE WHEN c.status IN ('failed', 'cancelled') THEN c.error ELSE NULL END,
              finished_at = CASE WHEN c.status IN ('completed', 'failed', 'cancelled') THEN COALESCE(c.completed_at, now()) ELSE NULL END,
              updated_at = now()
         FROM commands AS c
        WHERE t.site_id = $1 AND t.deployment_id = $2 AND t.command_id IS NOT NULL
          AND t.status IN ('pending', 'closing_processes', 'downloading', 'installing')
          AND c.site_id = t.site_id AND c.machine_id = t.machine_id AND c.command_id = t.command_id
          AND c.status <> 'pending'
          AND (c.status <> t.status OR c.progress IS DISTINCT FROM t.progress)`,
      [siteId, deploymentId],
    );
    const late = await tx.query<{ machine_id: string; command_id: string }>(
      `UPDATE classic_deployment_targets SET status = 'failed', error = 'timeout', finished_at = now(), updated_at = now()
        WHERE site_id = $1 AND deployment_id = $2 AND command_id IS NOT NULL AND deadline_at < now()
          AND status IN ('pending', 'closing_processes', 'downloading', 'installing')
        RETURNING machine_id, command_id`,
      [siteId, deploymentId],
    );
    if (late.rows.length > 0) {
      await tx.query(
        `UPDATE commands SET status = 'failed', error = 'timeout', completed_at = now(), updated_at = now()
          WHERE site_id = $1 AND completed_at IS NULL AND (machine_id, command_id) IN (SELECT * FROM UNNEST($2::text[], $3::text[]))`,
        [siteId, late.rows.map((r) => r.machine_id), late.rows.map((r) => r.command_id)],
      );
    }
    const { rows } = await tx.query<{ status: TargetStatus; dispatched: boolean; n: number }>(
      `SELECT status, command_id IS NOT NULL AS dispatched, count(*)::INT AS n FROM classic_deployment_targets
        WHERE site_id = $1 AND deployment_id = $2 GROUP BY status, command_id IS NOT NULL`,
      [siteId, deploymentId],
    );
    const counts = emptyTargetCounts();
    let dispatchedOpen = 0;
    let undispatched = 0;
    let everDispatched = false;
    for (const r of rows) {
      if (r.status in counts) counts[r.status] += r.n;
      const open = r.status === 'pending' || r.status === 'closing_processes' || r.status === 'downloading' || r.status === 'installing';
      if (r.dispatched) everDispatched = true;
      if (open && r.dispatched) dispatchedOpen += r.n;
      if (r.status === 'pending' && !r.dispatched) undispatched += r.n;
    }
    const status = await storeDerivedStatus(tx, siteId, deploymentId, counts, everDispatched);
    const open = counts.pending + counts.closing_processes + counts.downloading + counts.installing;
    return { counts, status, open, dispatchedOpen, undispatched };
  });
}

async function storeDerivedStatus(
  tx: Queryable,
  siteId: string,
  deploymentId: string,
  given?: TargetCounts,
  dispatched?: boolean,
): Promise<DeploymentStatus> {
  let counts = given;
  let anyDispatched = dispatched;
  if (!counts) {
    const { rows } = await tx.query<{ status: TargetStatus; n: number; d: number }>(
      `SELECT status, count(*)::INT AS n, count(command_id)::INT AS d FROM classic_deployment_targets
        WHERE site_id = $1 AND deployment_id = $2 GROUP BY status`,
      [siteId, deploymentId],
    );
    counts = emptyTargetCounts();
    anyDispatched = false;
    for (const r of rows) {
      if (r.status in counts) counts[r.status] = r.n;
      if (r.d > 0 || r.status !== 'pending') anyDispatched = true;
    }
  }
  const status = deriveDeploymentStatus(counts, { dispatched: anyDispatched ?? false });
  const terminal = status !== 'pending' && status !== 'in_progress';
  await tx.query(
    `UPDATE classic_deployments SET status = $3, updated_at = CASE WHEN status = $3 THEN updated_at ELSE now() END,
            completed_at = CASE WHEN $4 THEN COALESCE(completed_at, now()) ELSE NULL END
      WHERE site_id = $1 AND deployment_id = $2`,
    [siteId, deploymentId, status, terminal],
  );
  return status;
}

/**
 * Queues commands for up to `slots` undispatched pending targets, in position order: a deterministic
 * command id per (target, action, attempt), `expires_at` = now + the command's deadline, and the target's
 * `deadline_at` (installer timeout + TARGET_DEADLINE_MARGIN_MS). Machines that are not enrolled any more
 * fail at once (`machine_removed`). The commands carry `origin` (trace context, request id) for the agent's logs.
 * @returns how many targets were dispatched.
 */
export async function dispatchTargets(
  pool: Pool,
  d: DeploymentRow,
  slots: number,
  defaultTimeoutSeconds?: number,
  origin: CommandOrigin = {},
): Promise<number> {
  if (slots <= 0) return 0;
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ machine_id: string; attempts: number; action: TargetAction; enrolled: boolean }>(
      `SELECT t.machine_id, t.attempts, t.action, (m.machine_id IS NOT NULL) AS enrolled
         FROM classic_deployment_targets AS t
         LEFT JOIN machines AS m ON m.site_id = t.site_id AND m.machine_id = t.machine_id
        WHERE t.site_id = $1 AND t.deployment_id = $2 AND t.status = 'pending' AND t.command_id IS NULL
        ORDER BY t.position LIMIT $3`,
      [d.site_id, d.deployment_id, slots],
    );
    if (rows.length === 0) return 0;
    const gone = rows.filter((r) => !r.enrolled).map((r) => r.machine_id);
    if (gone.length > 0) {
      await tx.query(
        `UPDATE classic_deployment_targets SET status = 'failed', error = 'machine_removed', finished_at = now(), updated_at = now()
          WHERE site_id = $1 AND deployment_id = $2 AND machine_id = ANY($3::text[])`,
        [d.site_id, d.deployment_id, gone],
      );
    }
    const go = rows.filter((r) => r.enrolled);
    if (go.length === 0) return 0;
    const timeoutSeconds = d.timeout_seconds ?? defaultTimeoutSeconds ?? DEFAULT_INSTALL_TIMEOUT_SECONDS;
    const ttlMs = timeoutSeconds * 1000 + TARGET_DEADLINE_MARGIN_MS;
    const attempts = go.map((r) => r.attempts + 1);
    const commandIds = go.map((r, i) => classicCommandId(d.deployment_id, r.machine_id, r.action, attempts[i]));
    const types = go.map((r) => (r.action === 'uninstall' ? CLASSIC_UNINSTALL : CLASSIC_INSTALL));
    const base: Omit<ClassicCommandParams, 'attempt'> = {
      deploymentId: d.deployment_id,
      installer_url: d.installer_url,
      installer_name: d.installer_name,
      silent_flags: d.silent_flags,
      verify_path: d.verify_path,
      sha256: d.sha256,
      close_processes: d.close_processes,
      suppress_projects: d.suppress_projects,
      timeout_seconds: timeoutSeconds,
    };
    await tx.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, deployment_id, created_by, expires_at,
                             traceparent, request_id)
       SELECT $1, u.machine_id, u.command_id, u.type, 'pending', $3::jsonb || jsonb_build_object('attempt', u.attempt), $2, $4,
              now() + $5::float8 * INTERVAL '1 millisecond', $10::text, $11::text
         FROM UNNEST($6::text[], $7::text[], $8::text[], $9::int[]) AS u (machine_id, command_id, type, attempt)
       ON CONFLICT (site_id, machine_id, command_id) DO NOTHING`,
      [
        d.site_id,
        d.deployment_id,
        JSON.stringify(base),
        d.created_by,
        ttlMs,
        go.map((r) => r.machine_id),
        commandIds,
        types,
        attempts,
        origin.traceparent ?? null,
        origin.requestId ?? null,
      ],
    );
    const upd = await tx.query(
      `UPDATE classic_deployment_targets AS t
          SET command_id = u.command_id, attempts = u.attempt, dispatched_at = now(), updated_at = now(),
              deadline_at = now() + $5::float8 * INTERVAL '1 millisecond'
         FROM UNNEST($3::text[], $4::text[], $6::int[]) AS u (machine_id, command_id, attempt)
        WHERE t.site_id = $1 AND t.deployment_id = $2 AND t.machine_id = u.machine_id AND t.status = 'pending' AND t.command_id IS NULL`,
      [d.site_id, d.deployment_id, go.map((r) => r.machine_id), commandIds, ttlMs, attempts],
    );
    return upd.rowCount ?? 0;
  });
}

// ---------------------------------------------------------------------------------------------------
// Installer templates

/** A stored installer template. */
export interface TemplateRow {
  site_id: string;
  template_id: string;
  name: string;
  installer_name: string;
  installer_url: string;
  silent_flags: string;
  verify_path: string | null;
  close_processes: string[];
  timeout_seconds: number | null;
  created_by: string;
  created_at: Date;
  updated_at: Date;
  position_at: string;
}

const TEMPLATE_COLUMNS = `site_id, template_id, name, installer_name, installer_url, silent_flags, verify_path, close_processes, timeout_seconds,
  created_by, created_at, updated_at, created_at::text AS position_at`;

/** Template fields as stored (snake_case, the wire names). */
export interface TemplateFields {
  name: string;
  installer_name: string;
  installer_url: string;
  silent_flags: string;
  verify_path: string | null;
  close_processes: string[];
  timeout_seconds: number | null;
}

/** Inserts a template; 'duplicate' when the site already has one of that name. */
export async function insertTemplate(
  q: Queryable,
  siteId: string,
  templateId: string,
  f: TemplateFields,
  createdBy: string,
): Promise<TemplateRow | 'duplicate'> {
  const { rows } = await q.query<TemplateRow>(
    `INSERT INTO installer_templates (site_id, template_id, name, installer_name, installer_url, silent_flags, verify_path, close_processes,
                                      timeout_seconds, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
     ON CONFLICT (site_id, name) DO NOTHING
     RETURNING ${TEMPLATE_COLUMNS}`,
    [
      siteId,
      templateId,
      f.name,
      f.installer_name,
      f.installer_url,
      f.silent_flags,
      f.verify_path,
      JSON.stringify(f.close_processes),
      f.timeout_seconds,
      createdBy,
    ],
  );
  return rows[0] ?? 'duplicate';
}

/** One template, or null. */
export async function getTemplate(q: Queryable, siteId: string, templateId: string): Promise<TemplateRow | null> {
  const { rows } = await q.query<TemplateRow>(
    `SELECT ${TEMPLATE_COLUMNS} FROM installer_templates WHERE site_id = $1 AND template_id = $2`,
    [siteId, templateId],
  );
  return rows[0] ?? null;
}

/** A page of the site's templates, newest first. */
export async function listTemplates(
  q: Queryable,
  siteId: string,
  opts: { limit: number; after?: [string, string] },
): Promise<{ rows: TemplateRow[]; more: boolean }> {
  return newestFirstPage<TemplateRow>(q, {
    select: `SELECT ${TEMPLATE_COLUMNS} FROM installer_templates`,
    idColumn: 'template_id',
    where: 'site_id = $1',
    args: [siteId],
    limit: opts.limit,
    after: opts.after,
  });
}

/** Updates the given fields; null when the template is gone, 'duplicate' when the new name is taken. */
export async function updateTemplate(
  q: Queryable,
  siteId: string,
  templateId: string,
  f: Partial<TemplateFields>,
): Promise<TemplateRow | null | 'duplicate'> {
  const args: unknown[] = [siteId, templateId];
  const sets = updateSets(f, args, ['close_processes']);
  try {
    const { rows } = await q.query<TemplateRow>(
      `UPDATE installer_templates SET ${[...sets, 'updated_at = now()'].join(', ')} WHERE site_id = $1 AND template_id = $2
       RETURNING ${TEMPLATE_COLUMNS}`,
      args,
    );
    return rows[0] ?? null;
  } catch (err) {
    if ((err as { code?: string }).code === '23505') return 'duplicate';
    throw err;
  }
}

/** Deletes a template (deployments made from it keep their own copy of its fields). False when absent. */
export async function deleteTemplate(q: Queryable, siteId: string, templateId: string): Promise<boolean> {
  const r = await q.query('DELETE FROM installer_templates WHERE site_id = $1 AND template_id = $2', [siteId, templateId]);
  return (r.rowCount ?? 0) > 0;
}

/**
 * Deployments still `pending`, created at least `olderThanMs` ago (database clock), none of whose targets
 * was ever dispatched, oldest first, at most `limit`: the candidates for a create whose API process died
 * between committing the rows and starting the workflow (services/classic-deployments.ts
 * `dropLostDeploymentStarts` asks Temporal which have no workflow). Reads the partial index of migration 029.
 */
export async function unstartedDeployments(
  q: Queryable,
  olderThanMs: number,
  limit: number,
): Promise<{ siteId: string; deploymentId: string; workflowId: string }[]> {
  const { rows } = await q.query<{ site_id: string; deployment_id: string; workflow_id: string }>(
    `SELECT d.site_id, d.deployment_id, d.workflow_id FROM classic_deployments AS d
      WHERE d.status = 'pending' AND d.created_at <= now() - $1::float8 * INTERVAL '1 millisecond'
        AND NOT EXISTS (SELECT 1 FROM classic_deployment_targets AS t
                         WHERE t.site_id = d.site_id AND t.deployment_id = d.deployment_id
                           AND (t.command_id IS NOT NULL OR t.status <> 'pending' OR t.attempts > 0))
      ORDER BY d.created_at, d.deployment_id LIMIT $2`,
    [olderThanMs, limit],
  );
  return rows.map((r) => ({ siteId: r.site_id, deploymentId: r.deployment_id, workflowId: r.workflow_id }));
}
