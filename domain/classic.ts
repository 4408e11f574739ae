/**
 * Classic installer deployments (`/api/sites/{siteId}/deployments`; docs/decisions/classic-deployments.md):
 * the other deploy surface beside roost rollouts (`POST /api/roosts/{roostId}/deploy`, domain/rollout.ts).
 * A classic deployment fans an installer executable out to machines; it never touches roosts, versions or
 * chunks, and roost code never touches it.
 *
 * Here: the state sets, how a deployment's status derives from its targets, the command the agent runs
 * per target (`classic_install` / `classic_uninstall` and its params), deterministic ids, and the workflow
 * id. Pure: workflow code imports these types, so nothing here reaches for Node APIs at module load.
 */

/** Status of a classic deployment, derived from its targets. */
export const DEPLOYMENT_STATUSES = ['pending', 'in_progress', 'completed', 'failed', 'partial', 'cancelled', 'uninstalled'] as const;
export type DeploymentStatus = (typeof DEPLOYMENT_STATUSES)[number];

/** Statuses of a deployment that nothing moves any more (delete is allowed only in these). */
export const TERMINAL_DEPLOYMENT_STATUSES: readonly DeploymentStatus[] = ['completed', 'failed', 'partial', 'cancelled', 'uninstalled'];

/** Status of one target (machine) of a deployment. */
export const TARGET_STATUSES = [
  'pending',
  'closing_processes',
  'downloading',
  'installing',
  'completed',
  'failed',
  'cancelled',
  'uninstalled',
] as const;
export type TargetStatus = (typeof TARGET_STATUSES)[number];

/** Target statuses while the agent works on it (between pending and a terminal status). */
export const IN_FLIGHT_TARGET_STATUSES: readonly TargetStatus[] = ['closing_processes', 'downloading', 'installing'];
/** Target statuses nothing moves except retry (failed) or uninstall. */
export const TERMINAL_TARGET_STATUSES: readonly TargetStatus[] = ['completed', 'failed', 'cancelled', 'uninstalled'];

/** What a target's current command does. */
export type TargetAction = 'install' | 'uninstall';

/** The per-target view of the deployment detail (docs/contract.md): success, failed, pending, cancelled. */
export type TargetResult = 'success' | 'failed' | 'pending' | 'cancelled';

/** The per-target view of a target status. */
export function targetResult(status: TargetStatus): TargetResult {
  switch (status) {
    case 'completed':
    case 'uninstalled':
      return 'success';
    case 'failed':
      return 'failed';
    case 'cancelled':
      return 'cancelled';
    default:
      return 'pending';
  }
}

/** How many targets of a deployment are in each status. */
export type TargetCounts = Record<TargetStatus, number>;

/** All-zero TargetCounts. */
export function emptyTargetCounts(): TargetCounts {
  return Object.fromEntries(TARGET_STATUSES.map((s) => [s, 0])) as TargetCounts;
}

/**
 * A deployment's status from its target counts (docs/decisions/classic-deployments.md):
 * - any target pending or in flight: `pending` while nothing was dispatched yet, else `in_progress`;
 * - otherwise (every target terminal): `cancelled` when a cancel pulled targets; `uninstalled` when every
 *   target is uninstalled; `completed` when every target is completed; `failed` when none succeeded;
 *   `partial` when some succeeded and some failed.
 */
export function deriveDeploymentStatus(c: TargetCounts, opts: { dispatched: boolean }): DeploymentStatus {
  const open = c.pending + c.closing_processes + c.downloading + c.installing;
  if (open > 0) return opts.dispatched || open < total(c) ? 'in_progress' : 'pending';
  const n = total(c);
  if (c.cancelled > 0) return 'cancelled';
  if (n > 0 && c.uninstalled === n) return 'uninstalled';
  if (c.completed === n) return 'completed';
  if (c.completed + c.uninstalled === 0) return 'failed';
  return 'partial';
}

function total(c: TargetCounts): number {
  return TARGET_STATUSES.reduce((a, s) => a + c[s], 0);
}

/** Command types of classic deployments (queued by the deployment workflow, never by users). */
export const CLASSIC_INSTALL = 'classic_install';
export const CLASSIC_UNINSTALL = 'classic_uninstall';

/**
 * Params of a `classic_install` / `classic_uninstall` command (docs/agent-protocol.md "Classic installs"):
 * everything the agent needs, so it never reads the deployment itself.
 */
export interface ClassicCommandParams {
  deploymentId: string;
  installer_url: string;
  installer_name: string;
  silent_flags: string;
  verify_path: string | null;
  /** 64 lowercase hex; null: not verified. */
  sha256: string | null;
  close_processes: string[];
  suppress_projects: string[];
  /** Installer run time limit (seconds). */
  timeout_seconds: number;
  attempt: number;
}

/** Installer run time limit when neither the deployment nor its template sets one (seconds). */
export const DEFAULT_INSTALL_TIMEOUT_SECONDS = 1800;
/** Largest `timeout_seconds` a deployment or template may set (seconds: 6 hours). */
export const MAX_INSTALL_TIMEOUT_SECONDS = 21_600;
/**
 * Time a dispatched target gets on top of its installer timeout before the workflow fails it as `timeout`
 * (download, closing processes, reporting; ms).
 */
export const TARGET_DEADLINE_MARGIN_MS = 10 * 60 * 1000;
/** Default and ceiling of concurrent installs of a `parallel_install` deployment. */
export const DEFAULT_PARALLELISM = 50;

/** Default site deployQuota: most targets one classic deployment may have (sites.deploy_quota; docs/contract.md "Site"). */
export const DEFAULT_DEPLOY_QUOTA = 100;
/**
 * The largest deployQuota a site may be given (`POST|PATCH /api/sites`): every target list a site may send
 * then fits the 1 MiB request body (10,000 machine ids of up to 64 characters). A longer list than the
 * site's quota is 413 over_quota however long it is.
 */
export const MAX_DEPLOY_QUOTA = 10_000;

/** A 64-hex SHA-256 digest (either case on input; stored lowercase). */
export const SHA256_RE = /^[0-9a-fA-F]{64}$/;

/** Deployment ids (`dep_<24 hex>`), template ids (`itp_<24 hex>`), process ids (`prc_<24 hex>`). */
export const DEPLOYMENT_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;

/** Workflow id of a classic deployment: `classic-deployment:<siteId>:<deploymentId>` (one workflow per deployment). */
export function classicDeploymentWorkflowId(siteId: string, deploymentId: string): string {
  return `classic-deployment:${siteId}:${deploymentId}`;
}

/** Input of the classic deployment workflow: ids only. */
export interface ClassicRef {
  siteId: string;
  deploymentId: string;
}

/** A control action of `POST /api/sites/{siteId}/deployments/{deploymentId}/{retry|cancel|uninstall}`. */
export type ClassicAction = 'retry' | 'cancel' | 'uninstall';

/**
 * What a control action did (`affected` targets, the status after it), or why it was refused (nothing
 * changed); `code` 'deployment_in_flight' when an uninstall met a deployment that has not ended (absent on
 * every other refusal, and in histories recorded before it existed).
 */
export type ClassicActionResult =
  { action: ClassicAction; affected: number; status: DeploymentStatus } | { refused: string; code?: 'deployment_in_flight' };
