/**
 * Classic installer deployments and installer templates, service side (api/routes/classic-deployments.ts,
 * api/routes/installer-templates.ts; docs/decisions/classic-deployments.md). The other deploy surface is
 * roost rollouts (services/rollouts.ts): nothing here reads roosts, versions or chunks.
 *
 * Create validates (HTTPS installer URL, sha256, machines of the site, the site's deployQuota), stores the
 * deployment with its targets and starts its workflow (workflows/client.ts startClassicDeploymentWorkflow).
 * retry, cancel and uninstall go to the workflow as updates (update-with-start on a finished deployment);
 * delete removes a terminal deployment's record. SQL: db/classic-deployments.ts.
 */
import { ApiError, serviceUnavailable } from '../domain/errors';
import { newId } from '../domain/hex';
import {
  DEFAULT_INSTALL_TIMEOUT_SECONDS,
  type DeploymentStatus,
  SHA256_RE,
  TERMINAL_DEPLOYMENT_STATUSES,
  type TargetCounts,
  classicDeploymentWorkflowId,
} from '../domain/classic';
import { absolutePathProblem, fileNameProblem } from '../domain/paths';
import { LOST_START_AFTER_MS } from '../domain/outage';
import {
  type DeploymentRow,
  type TargetRow,
  type TemplateFields,
  type TemplateRow,
  countsByDeployment,
  deleteDeployment as deleteDeploymentRow,
  deleteTemplate as deleteTemplateRow,
  getDeployment,
  getTemplate,
  insertDeployment,
  insertTemplate,
  listDeployments,
  listTargets,
  listTemplates,
  siteDeployQuota,
  unknownMachines,
  unstartedDeployments,
  updateTemplate as updateTemplateRow,
} from '../db/classic-deployments';
import {
  type ClassicAction,
  ClassicControlRefused,
  NoWorker,
  classicControlOutcome,
  controlClassicDeployment,
  controlUpdateId,
  describeWorkflow,
  startClassicDeploymentWorkflow,
  workflowUiUrl,
} from '../workflows/client';
import type { ServiceDeps } from './deps';

export type { DeploymentRow, TargetRow, TemplateRow };

function invalid(field: string, message: string): ApiError {
  return new ApiError('validation_failed', `${field} ${message}`, { extras: { param: field, errors: { [field]: [message] } } });
}

/** Checks an installer URL: absolute HTTPS with a host. @throws ApiError validation_failed naming `field`. */
export function checkInstallerUrl(url: string, field = 'installer_url'): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw invalid(field, 'must be an absolute https:// URL');
  }
  if (u.protocol !== 'https:' || !u.hostname) throw invalid(field, 'must be an absolute https:// URL');
  if (u.username || u.password) throw invalid(field, 'must not carry credentials');
  return u.toString();
}

function checkFields(f: Partial<TemplateFields>): void {
  if (f.installer_url !== undefined) f.installer_url = checkInstallerUrl(f.installer_url);
  if (f.installer_name !== undefined) {
    const why = fileNameProblem(f.installer_name);
    if (why) throw invalid('installer_name', why);
  }
  if (f.verify_path !== undefined && f.verify_path !== null) {
    const why = absolutePathProblem(f.verify_path);
    if (why) throw invalid('verify_path', why);
  }
  f.close_processes?.forEach((p, i) => {
    const why = fileNameProblem(p);
    if (why) throw invalid(`close_processes.${i}`, why);
  });
}

// ---------------------------------------------------------------------------------------------------
// Deployments

/** The body of `POST /api/sites/{siteId}/deployments` (wire names) plus who asks. */
export interface CreateDeploymentInput {
  siteId: string;
  userId: string;
  name?: string;
  installer_url?: string;
  installer_name?: string;
  silent_flags?: string;
  machines: string[];
  verify_path?: string | null;
  sha256?: string;
  close_processes?: string[];
  suppress_projects?: string[];
  parallel_install?: boolean;
  timeout_seconds?: number | null;
  template_id?: string;
}

/** A created deployment and the Web UI link of its workflow. */
export interface CreatedDeployment {
  deployment: DeploymentRow;
  targets: TargetRow[];
  workflowUrl: string;
}

/**
 * Creates a deployment and starts its workflow. With `template_id`, the template's fields are defaults and
 * the body's fields win.
 * @throws ApiError validation_failed (missing or bad fields after template defaults; duplicate machines;
 *   unknown or foreign machines, listed in `unknownMachines`), not_found (template), over_quota (413, more
 *   targets than the site's deployQuota; `quota.max_targets`, `quota.requested`); the workflow start's
 *   errors (a deployment whose workflow could not start is removed again).
 */
export async function createDeployment(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'temporal'>,
  input: CreateDeploymentInput,
): Promise<CreatedDeployment> {
  const { siteId } = input;
  let tpl: TemplateRow | null = null;
  if (input.template_id !== undefined) {
    tpl = await getTemplate(deps.db, siteId, input.template_id);
    if (!tpl) throw new ApiError('not_found', 'installer template not found', { extras: { param: 'template_id' } });
  }
  const f = {
    name: input.name ?? tpl?.name,
    installer_url: input.installer_url ?? tpl?.installer_url,
    installer_name: input.installer_name ?? tpl?.installer_name,
    silent_flags: input.silent_flags ?? tpl?.silent_flags,
    verify_path: input.verify_path !== undefined ? input.verify_path : (tpl?.verify_path ?? null),
    close_processes: input.close_processes ?? tpl?.close_processes ?? [],
    timeout_seconds: input.timeout_seconds !== undefined ? input.timeout_seconds : (tpl?.timeout_seconds ?? null),
  };
  const missing = (['name', 'installer_url', 'installer_name', 'silent_flags'] as const).filter((k) => f[k] === undefined);
  if (missing.length > 0) {
    throw new ApiError('validation_failed', `missing required field(s): ${missing.join(', ')}`, {
      extras: { param: missing[0], errors: Object.fromEntries(missing.map((k) => [k, ['is required (directly or through template_id)']])) },
    });
  }
  const fields = f as TemplateFields;
  checkFields(fields);
  if (input.sha256 !== undefined && !SHA256_RE.test(input.sha256)) throw invalid('sha256', 'must be 64 hexadecimal characters');
  const seen = new Set<string>();
  const dupes = input.machines.filter((m) => (seen.has(m) ? true : (seen.add(m), false)));
  if (dupes.length > 0) throw invalid('machines', `lists machine(s) more than once: ${[...new Set(dupes)].slice(0, 20).join(', ')}`);

  const quota = await siteDeployQuota(deps.db, siteId);
  if (input.machines.length > quota) {
    throw new ApiError('over_quota', `${input.machines.length} targets exceed the site's deployQuota of ${quota}`, {
      extras: { quota: { max_targets: quota, requested: input.machines.length } },
    });
  }
  const unknown = await unknownMachines(deps.db, siteId, input.machines);
  if (unknown.length > 0) {
    const listed = unknown.slice(0, 100);
    throw new ApiError('validation_failed', `machines not enrolled in this site: ${listed.slice(0, 20).join(', ')}`, {
      extras: {
        param: 'machines',
        unknownMachines: listed,
        errors: { machines: [`unknown machine(s): ${listed.slice(0, 20).join(', ')}`] },
      },
    });
  }

  const deploymentId = newId('dep');
  const workflowId = classicDeploymentWorkflowId(siteId, deploymentId);
  const deployment = await insertDeployment(deps.db, {
    siteId,
    deploymentId,
    name: fields.name,
    installerUrl: fields.installer_url,
    installerName: fields.installer_name,
    silentFlags: fields.silent_flags,
    verifyPath: fields.verify_path,
    sha256: input.sha256?.toLowerCase() ?? null,
    closeProcesses: fields.close_processes,
    suppressProjects: input.suppress_projects ?? [],
    parallelInstall: input.parallel_install ?? false,
    timeoutSeconds: fields.timeout_seconds,
    templateId: tpl?.template_id ?? null,
    workflowId,
    createdBy: input.userId,
    machines: input.machines,
  });
  let started;
  try {
    started = await startClassicDeploymentWorkflow(deps.temporal, deps.cfg, { siteId, deploymentId });
  } catch (err) {
    await deleteDeploymentRow(deps.db, siteId, deploymentId, ['pending']).catch(() => undefined);
    throw err;
  }
  return { deployment, targets: await listTargets(deps.db, siteId, deploymentId), workflowUrl: started.url };
}

/** A page of the site's deployments (newest first) with their target counts. */
export async function listSiteDeployments(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; pageSize: number; after?: [string, string]; status?: DeploymentStatus },
): Promise<{ deployments: { row: DeploymentRow; counts: TargetCounts }[]; next: [string, string] | undefined }> {
  const page = await listDeployments(deps.db, input.siteId, { limit: input.pageSize, after: input.after, status: input.status });
  const counts = await countsByDeployment(
    deps.db,
    input.siteId,
    page.rows.map((r) => r.deployment_id),
  );
  const last = page.rows[page.rows.length - 1];
  return {
    deployments: page.rows.map((row) => ({ row, counts: counts.get(row.deployment_id)! })),
    next: page.more && last ? [last.position_at, last.deployment_id] : undefined,
  };
}

/** A deployment with its targets and counts, and the Web UI link of its workflow. @throws ApiError not_found. */
export async function deploymentDetail(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: { siteId: string; deploymentId: string },
): Promise<{ row: DeploymentRow; targets: TargetRow[]; counts: TargetCounts; workflowUrl: string }> {
  const row = await getDeployment(deps.db, input.siteId, input.deploymentId);
  if (!row) throw new ApiError('not_found', 'deployment not found');
  const targets = await listTargets(deps.db, input.siteId, input.deploymentId);
  const counts = (await countsByDeployment(deps.db, input.siteId, [input.deploymentId])).get(input.deploymentId)!;
  return { row, targets, counts, workflowUrl: workflowUiUrl(deps.cfg, row.workflow_id) };
}

/** What a control action answers: how many targets it changed and the deployment's status after it. */
export interface ControlOutcome {
  deploymentId: string;
  action: ClassicAction;
  affected: number;
  status: DeploymentStatus;
}

/**
 * retry | cancel | uninstall through the deployment's workflow (update, or update-with-start on a
 * finished deployment). Checked first against the stored targets, so a refused action starts nothing.
 * `idempotencyKey` (the request's) names the Temporal update (workflows/client.ts `controlUpdateId`): a
 * retry after a 503 whose update a worker applied later answers that update's outcome, even though the
 * targets no longer allow the action.
 * @throws ApiError not_found; conflict (409: nothing to retry or cancel, or the workflow refused);
 *   deployment_in_flight (409: uninstall of a deployment that has not ended); service_unavailable (503: no
 *   worker polls the task queue, so nothing was sent; or none accepted the update within CONTROL_UPDATE_WAIT_MS).
 */
export async function controlDeployment(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'temporal'>,
  input: { siteId: string; deploymentId: string; action: ClassicAction; userId: string; idempotencyKey?: string },
): Promise<ControlOutcome> {
  const { siteId, deploymentId, action } = input;
  const row = await getDeployment(deps.db, siteId, deploymentId);
  if (!row) throw new ApiError('not_found', 'deployment not found');
  const updateId = input.idempotencyKey ? controlUpdateId(input.userId, deploymentId, action, input.idempotencyKey) : undefined;
  const answer = (r: { affected: number; status: DeploymentStatus }): ControlOutcome => ({
    deploymentId,
    action,
    affected: r.affected,
    status: r.status,
  });
  try {
    const refusal = controlRefusal(action, row.status, (await countsByDeployment(deps.db, siteId, [deploymentId])).get(deploymentId)!);
    if (refusal) {
      // Best effort: when Temporal cannot say, the stored targets answer as they did before.
      const earlier = updateId
        ? await classicControlOutcome(deps.temporal, { siteId, deploymentId }, updateId).catch((err: unknown) => {
            if (err instanceof ClassicControlRefused) throw err;
            return undefined;
          })
        : undefined;
      if (earlier) return answer(earlier);
      throw refusal;
    }
    return answer(
      await controlClassicDeployment(deps.temporal, deps.cfg, { siteId, deploymentId }, action, { by: input.userId }, { updateId }),
    );
  } catch (err) {
    if (err instanceof ClassicControlRefused) throw new ApiError(err.code ?? 'conflict', err.message);
    if (err instanceof NoWorker) {
      throw serviceUnavailable(err.detail('deployments', action));
    }
    throw err;
  }
}

/** Why the stored targets refuse `action` (409 conflict or deployment_in_flight); undefined when they allow it. */
function controlRefusal(
  action: ClassicAction,
  status: DeploymentStatus,
  counts: { failed: number; pending: number },
): ApiError | undefined {
  if (action === 'retry' && counts.failed === 0) return new ApiError('conflict', 'the deployment has no failed targets to retry');
  if (action === 'cancel' && counts.pending === 0) return new ApiError('conflict', 'the deployment has no pending targets to cancel');
  if (action === 'uninstall' && !TERMINAL_DEPLOYMENT_STATUSES.includes(status)) {
    return new ApiError('deployment_in_flight', `the deployment is ${status}; uninstall it once it has ended (or cancel it first)`);
  }
  return undefined;
}

/**
 * Deletes a terminal deployment's record (it uninstalls nothing).
 * @throws ApiError not_found; deployment_in_flight (409) when it has not ended.
 */
export async function deleteDeployment(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; deploymentId: string },
): Promise<{ deploymentId: string; deleted: true }> {
  const r = await deleteDeploymentRow(deps.db, input.siteId, input.deploymentId, TERMINAL_DEPLOYMENT_STATUSES);
  if (r === 'not_found') throw new ApiError('not_found', 'deployment not found');
  if (r === 'in_flight') throw new ApiError('deployment_in_flight', 'the deployment has not ended; cancel it or wait for it to end');
  return { deploymentId: input.deploymentId, deleted: true };
}

// ---------------------------------------------------------------------------------------------------
// Installer templates

/** Creates a template. @throws ApiError validation_failed (bad fields), conflict (409: the site has one of that name). */
export async function createTemplate(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; userId: string; fields: TemplateFields },
): Promise<TemplateRow> {
  const f = { ...input.fields };
  checkFields(f);
  const row = await insertTemplate(deps.db, input.siteId, newId('itp'), f, input.userId);
  if (row === 'duplicate')
    throw new ApiError('conflict', `an installer template named "${f.name}" exists in this site`, { extras: { param: 'name' } });
  return row;
}

/** A page of the site's templates (newest first). */
export async function listSiteTemplates(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; pageSize: number; after?: [string, string] },
): Promise<{ templates: TemplateRow[]; next: [string, string] | undefined }> {
  const page = await listTemplates(deps.db, input.siteId, { limit: input.pageSize, after: input.after });
  const last = page.rows[page.rows.length - 1];
  return { templates: page.rows, next: page.more && last ? [last.position_at, last.template_id] : undefined };
}

/** One template. @throws ApiError not_found. */
export async function templateDetail(deps: Pick<ServiceDeps, 'db'>, input: { siteId: string; templateId: string }): Promise<TemplateRow> {
  const row = await getTemplate(deps.db, input.siteId, input.templateId);
  if (!row) throw new ApiError('not_found', 'installer template not found');
  return row;
}

/** Updates a template's given fields. @throws ApiError validation_failed (no field, bad fields), not_found, conflict (name taken). */
export async function updateTemplate(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; templateId: string; fields: Partial<TemplateFields> },
): Promise<TemplateRow> {
  const f: Partial<TemplateFields> = {};
  for (const k of [
    'name',
    'installer_name',
    'installer_url',
    'silent_flags',
    'verify_path',
    'close_processes',
    'timeout_seconds',
  ] as const) {
    if (input.fields[k] !== undefined) (f as Record<string, unknown>)[k] = input.fields[k];
  }
  if (Object.keys(f).length === 0) throw invalid('body', 'must change at least one field');
  checkFields(f);
  const row = await updateTemplateRow(deps.db, input.siteId, input.templateId, f);
  if (row === null) throw new ApiError('not_found', 'installer template not found');
  if (row === 'duplicate')
    throw new ApiError('conflict', `an installer template named "${f.name}" exists in this site`, { extras: { param: 'name' } });
  return row;
}

/** Deletes a template (deployments made from it keep their fields). @throws ApiError not_found. */
export async function deleteTemplate(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; templateId: string },
): Promise<{ templateId: string; deleted: true }> {
  if (!(await deleteTemplateRow(deps.db, input.siteId, input.templateId))) throw new ApiError('not_found', 'installer template not found');
  return { templateId: input.templateId, deleted: true };
}

/** Default installer run time limit shown when a deployment sets none (seconds). */
export const DEFAULT_TIMEOUT_SECONDS = DEFAULT_INSTALL_TIMEOUT_SECONDS;

/**
 * Deletes each `pending` deployment whose workflow was never started, as the create itself does when the
 * start fails: its API process died between committing the rows and starting the workflow (a kill while
 * Temporal was down), so nothing would ever install it. Candidates come from db/classic-deployments.ts
 * `unstartedDeployments` (older than `olderThanMs`, default LOST_START_AFTER_MS, no target dispatched); one whose
 * workflow exists is left alone. Idempotent; run periodically by the API (api/plugins/lost-starts.ts).
 * Returns the deployment ids deleted.
 * @throws Temporal client errors when Temporal cannot answer
 */
export async function dropLostDeploymentStarts(
  deps: Pick<ServiceDeps, 'db' | 'temporal'>,
  opts: { olderThanMs?: number; limit?: number; log?: { warn(obj: object, msg: string): void } } = {},
): Promise<string[]> {
  const dropped: string[] = [];
  for (const d of await unstartedDeployments(deps.db, opts.olderThanMs ?? LOST_START_AFTER_MS, opts.limit ?? 100)) {
    if (await describeWorkflow(deps.temporal, d.workflowId)) continue;
    if ((await deleteDeploymentRow(deps.db, d.siteId, d.deploymentId, ['pending'])) !== 'deleted') continue;
    opts.log?.warn({ siteId: d.siteId, deploymentId: d.deploymentId }, 'deployment whose workflow never started deleted');
    dropped.push(d.deploymentId);
  }
  return dropped;
}
