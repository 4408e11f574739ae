/**
 * Classic installer deployments (site scoped; docs/contract.md "Classic installer deployments",
 * docs/decisions/classic-deployments.md). The use cases are services/classic-deployments.ts; the fan-out is
 * workflows/classic-deployment.ts. NOT roost deploys: `POST /api/roosts/{roostId}/deploy` is api/routes/deploy.ts.
 *
 *   POST   /api/sites/{siteId}/deployments                              create a fan-out (site write)
 *   GET    /api/sites/{siteId}/deployments                              list, newest first (site read; 1..100, default 25)
 *   GET    /api/sites/{siteId}/deployments/{deploymentId}               detail with per-target status (site read)
 *   POST   /api/sites/{siteId}/deployments/{deploymentId}/retry         requeue failed targets (site write)
 *   POST   /api/sites/{siteId}/deployments/{deploymentId}/cancel        pull pending targets (site write)
 *   POST   /api/sites/{siteId}/deployments/{deploymentId}/uninstall     uninstall on every target (site admin)
 *   DELETE /api/sites/{siteId}/deployments/{deploymentId}               delete a terminal record (site write)
 *
 * Every mutation requires Idempotency-Key. Capabilities: DEPLOYMENT_MANAGE; uninstall UNINSTALL_TRIGGER.
 */
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import {
  DEFAULT_INSTALL_TIMEOUT_SECONDS,
  DEPLOYMENT_ID_RE,
  DEPLOYMENT_STATUSES,
  MAX_INSTALL_TIMEOUT_SECONDS,
  SHA256_RE,
  TARGET_STATUSES,
  type TargetCounts,
  targetResult,
} from '../../domain/classic';
import {
  DateTime,
  FileName,
  HttpsUrl,
  MachinePath,
  MachineId,
  Nullable,
  PageTokens,
  pagingQuery,
  Problem,
  SiteId,
  isCreatedAtPosition,
  problems,
} from '../../domain/schemas';
import {
  type DeploymentRow,
  type TargetRow,
  controlDeployment,
  createDeployment,
  deleteDeployment,
  deploymentDetail,
  listSiteDeployments,
} from '../../services/classic-deployments';
import { authorizeSite, siteRequirement } from '../plugins/auth';
import { parsePaging } from '../pagination';
import { enforceCapability } from '../ratelimit/limits';

/** `GET /api/sites/{siteId}/deployments` page size (docs/contract.md Limits: 1..100, default 25). */
const DEPLOYMENT_PAGE = { defaultSize: 25, maxSize: 100 };

const DeploymentId = Type.String({ pattern: DEPLOYMENT_ID_RE.source, description: 'deployment id (dep_…)' });
const SiteParams = Type.Object({ siteId: SiteId });
const DeploymentParams = Type.Object({ siteId: SiteId, deploymentId: DeploymentId });
// Project names or paths to suppress: no control characters (the validator refuses them, 400 validation_failed).
const NO_CONTROL_CHARACTERS = '^[^\\u0000-\\u001f\\u007f]*$';
const Names = (what: string) =>
  Type.Array(Type.String({ minLength: 1, maxLength: 255, pattern: NO_CONTROL_CHARACTERS }), { maxItems: 100, description: what });

const createFields = {
  name: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'display name (required unless template_id gives it)' })),
  installer_url: Type.Optional(HttpsUrl('HTTPS URL of the installer')),
  installer_name: Type.Optional(FileName('installer file name (e.g. setup.msi)')),
  silent_flags: Type.Optional(Type.String({ maxLength: 2000, description: 'flags passed to the installer (may be empty)' })),
  // No maxItems: a list longer than the site's deployQuota is 413 over_quota whatever its length (docs/contract.md
  // "Classic installer deployments"); the 1 MiB body limit bounds it.
  machines: Type.Array(MachineId, {
    minItems: 1,
    description: "machine ids of the site; at most the site's deployQuota (default 100; 413 over_quota above it)",
  }),
  verify_path: Type.Optional(Nullable(MachinePath('absolute path that must exist after install'))),
  sha256: Type.Optional(Type.String({ pattern: SHA256_RE.source, description: '64 hex: the installer is verified before anything runs' })),
  close_processes: Type.Optional(Type.Array(FileName('executable closed before install (e.g. app.exe)'), { maxItems: 100 })),
  suppress_projects: Type.Optional(Names('project names or paths to suppress during install')),
  parallel_install: Type.Optional(Type.Boolean({ description: 'install on targets concurrently (bounded); default serial' })),
  timeout_seconds: Type.Optional(
    Nullable(
      Type.Integer({
        minimum: 1,
        maximum: MAX_INSTALL_TIMEOUT_SECONDS,
        description: `installer run time limit on the machine (default: the template's, else ${DEFAULT_INSTALL_TIMEOUT_SECONDS})`,
      }),
    ),
  ),
  template_id: Type.Optional(
    Type.String({ pattern: DEPLOYMENT_ID_RE.source, description: 'installer template whose fields are defaults (explicit fields win)' }),
  ),
};
/** Fields a deployment needs, given directly or through `template_id` (checked in the service: 400 naming each missing one). */
const REQUIRED_WITHOUT_TEMPLATE = ['name', 'installer_url', 'installer_name', 'silent_flags'];
const CreateBody = Type.Object(createFields, {
  additionalProperties: false,
  'x-roost-document': Type.Object(createFields, {
    additionalProperties: false,
    anyOf: [{ required: REQUIRED_WITHOUT_TEMPLATE }, { required: ['template_id'] }],
    description: `${REQUIRED_WITHOUT_TEMPLATE.join(', ')} are required unless template_id names a template that gives them`,
  }),
});

const Counts = Type.Object(Object.fromEntries(TARGET_STATUSES.map((s) => [s, Type.Integer()])));

const Target = Type.Object({
  machineId: Type.String(),
  status: Type.String({ description: TARGET_STATUSES.join(', ') }),
  result: Type.String({ description: 'per-target view: success, failed, pending, cancelled' }),
  action: Type.String({ description: 'install or uninstall: what the current attempt does' }),
  progress: Nullable(Type.Number({ description: 'percent, 0..100' })),
  error: Type.Optional(Nullable(Type.String())),
  attempts: Type.Integer(),
  commandId: Nullable(Type.String()),
  updatedAt: DateTime,
  finishedAt: Nullable(DateTime),
});

/** A classic deployment record (the Classic deployment table's snake_case names, plus ids and counts). */
export const DeploymentRecord = Type.Object({
  deploymentId: Type.String(),
  siteId: Type.String(),
  name: Type.String(),
  installer_name: Type.String(),
  installer_url: Type.String(),
  silent_flags: Type.String(),
  verify_path: Nullable(Type.String()),
  sha256: Nullable(Type.String()),
  close_processes: Type.Array(Type.String()),
  suppress_projects: Type.Array(Type.String()),
  parallel_install: Type.Boolean(),
  timeout_seconds: Nullable(Type.Integer()),
  template_id: Nullable(Type.String()),
  status: Type.String({ description: DEPLOYMENT_STATUSES.join(', ') }),
  counts: Counts,
  createdBy: Type.String(),
  createdAt: DateTime,
  updatedAt: DateTime,
  completedAt: Nullable(DateTime),
});
type DeploymentRecord = Static<typeof DeploymentRecord>;

const DeploymentDetail = Type.Composite([DeploymentRecord, Type.Object({ targets: Type.Array(Target), workflowUrl: Type.String() })]);

const ControlAnswer = Type.Object({
  deploymentId: Type.String(),
  action: Type.String(),
  affected: Type.Integer({ description: 'targets the action changed' }),
  status: Type.String({ description: 'the deployment status after the action' }),
});

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);

function record(r: DeploymentRow, counts: TargetCounts): DeploymentRecord {
  return {
    deploymentId: r.deployment_id,
    siteId: r.site_id,
    name: r.name,
    installer_name: r.installer_name,
    installer_url: r.installer_url,
    silent_flags: r.silent_flags,
    verify_path: r.verify_path,
    sha256: r.sha256,
    close_processes: r.close_processes,
    suppress_projects: r.suppress_projects,
    parallel_install: r.parallel_install,
    timeout_seconds: r.timeout_seconds,
    template_id: r.template_id,
    status: r.status,
    counts,
    createdBy: r.created_by,
    createdAt: r.created_at.toISOString(),
    updatedAt: r.updated_at.toISOString(),
    completedAt: iso(r.completed_at),
  };
}

function target(t: TargetRow) {
  return {
    machineId: t.machine_id,
    status: t.status,
    result: targetResult(t.status),
    action: t.action,
    progress: t.progress,
    ...(t.error ? { error: t.error } : {}),
    attempts: t.attempts,
    commandId: t.command_id,
    updatedAt: t.updated_at.toISOString(),
    finishedAt: iso(t.finished_at),
  };
}

const countsOf = (targets: TargetRow[]): TargetCounts => {
  const c = Object.fromEntries(TARGET_STATUSES.map((s) => [s, 0])) as TargetCounts;
  for (const t of targets) c[t.status]++;
  return c;
};

const read = (siteId: string) => siteRequirement(siteId, 'read');
const write = (siteId: string) => siteRequirement(siteId, 'write');
const admin = (siteId: string) => siteRequirement(siteId, 'admin');

const classicDeploymentRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const tags = ['classic-deployments'];

  app.post(
    '/api/sites/:siteId/deployments',
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Create a classic installer deployment (fan-out to machines; not a roost deploy)',
        params: SiteParams,
        body: CreateBody,
        response: { 201: DeploymentDetail, ...problems(409, 413, 422, 503) },
      },
    },
    async (request, reply) => {
      const { siteId } = request.params;
      const user = await authorizeSite(request, siteId, write(siteId));
      await enforceCapability(request, 'DEPLOYMENT_MANAGE', siteId);
      const created = await createDeployment(app.deps, { ...request.body, siteId, userId: user.userId });
      reply.header('X-Roost-Workflow-Url', created.workflowUrl);
      return reply.code(201).send({
        ...record(created.deployment, countsOf(created.targets)),
        targets: created.targets.map(target),
        workflowUrl: created.workflowUrl,
      });
    },
  );

  app.get(
    '/api/sites/:siteId/deployments',
    {
      schema: {
        tags,
        summary: 'List classic deployments, newest first',
        params: SiteParams,
        querystring: Type.Object({
          ...pagingQuery(DEPLOYMENT_PAGE),
          status: Type.Optional(
            Type.Union(
              DEPLOYMENT_STATUSES.map((s) => Type.Literal(s)),
              { description: 'only deployments in this status' },
            ),
          ),
        }),
        response: { 200: Type.Object({ deployments: Type.Array(DeploymentRecord), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      const paging = parsePaging(request, { ...DEPLOYMENT_PAGE, accept: isCreatedAtPosition });
      await authorizeSite(request, siteId, read(siteId));
      const page = await listSiteDeployments(app.deps, {
        siteId,
        pageSize: paging.pageSize,
        after: paging.after,
        status: request.query.status,
      });
      return { deployments: page.deployments.map((d) => record(d.row, d.counts)), ...paging.tokens(page.next) };
    },
  );

  app.get(
    '/api/sites/:siteId/deployments/:deploymentId',
    {
      schema: {
        tags,
        summary: 'A classic deployment with per-target status, progress and error',
        params: DeploymentParams,
        response: { 200: DeploymentDetail, ...problems() },
      },
    },
    async (request) => {
      const { siteId, deploymentId } = request.params;
      await authorizeSite(request, siteId, read(siteId));
      const d = await deploymentDetail(app.deps, { siteId, deploymentId });
      return { ...record(d.row, d.counts), targets: d.targets.map(target), workflowUrl: d.workflowUrl };
    },
  );

  const control = (action: 'retry' | 'cancel' | 'uninstall', summary: string) =>
    app.post(
      `/api/sites/:siteId/deployments/:deploymentId/${action}`,
      {
        config: { idempotency: 'required' },
        schema: { tags, summary, params: DeploymentParams, response: { 200: ControlAnswer, ...problems(409, 422, 503) } },
      },
      async (request) => {
        const { siteId, deploymentId } = request.params;
        const user = await authorizeSite(request, siteId, action === 'uninstall' ? admin(siteId) : write(siteId));
        await enforceCapability(request, action === 'uninstall' ? 'UNINSTALL_TRIGGER' : 'DEPLOYMENT_MANAGE', siteId);
        return controlDeployment(app.deps, {
          siteId,
          deploymentId,
          action,
          userId: user.userId,
          // Required on this route: the same key (same user, deployment, action) is the same Temporal update.
          idempotencyKey: String(request.headers['idempotency-key']),
        });
      },
    );
  control('retry', 'Requeue the failed targets (succeeded and in-flight targets are untouched)');
  control('cancel', 'Pull the pending targets (in-flight installs continue)');
  control('uninstall', 'Queue an uninstall on every target (site admin)');

  app.delete(
    '/api/sites/:siteId/deployments/:deploymentId',
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Delete a terminal classic deployment record (uninstalls nothing)',
        params: DeploymentParams,
        response: { 200: Type.Object({ deploymentId: Type.String(), deleted: Type.Literal(true) }), ...problems(409, 422), 409: Problem },
      },
    },
    async (request) => {
      const { siteId, deploymentId } = request.params;
      await authorizeSite(request, siteId, write(siteId));
      await enforceCapability(request, 'DEPLOYMENT_MANAGE', siteId);
      return deleteDeployment(app.deps, { siteId, deploymentId });
    },
  );
};

export default classicDeploymentRoutes;
