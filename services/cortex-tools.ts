/**
 * The fleet assistant's tools (docs/decisions/cortex.md "Tools"): what a model may call while answering a
 * conversation send (`POST /api/cortex/conversations/{conversationId}`). Every tool
 *
 * - reads through the service's own functions, bound to the conversation's site (no tool takes a siteId:
 *   a model, or text injected into fleet data, cannot point one at another site);
 * - is offered to the model only when the caller's key could make the matching API read (`offered`), and
 *   re-checks the exact requirement of the ids it was given before it runs (`needs`), with the same scope
 *   rules as the routes (domain/scopes.ts; site scopes cover the site's roosts and machines);
 * - never changes anything: the `propose_*` tools answer with the exact API request the client may send
 *   to do it (and the dry-run result where the API has one), and are offered only to keys that could send it.
 *
 * Results are JSON, bounded to MAX_RESULT_CHARS (lists are cut with a `truncated` count).
 */
import { type Static, type TObject, Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { ApiError } from '../domain/errors';
import { MACHINE_ID_RE, ROOST_ID_RE } from '../domain/schemas';
import { type Permission, type Requirement, type Resource, type Scope, scopesAllow } from '../domain/scopes';
import { DEPLOYMENT_ID_RE, DEPLOYMENT_STATUSES } from '../domain/classic';
import { listSiteAudit } from './audit';
import { deploymentDetail, listSiteDeployments } from './classic-deployments';
import type { ServiceDeps } from './deps';
import { lastSiteEventSeq, siteEventsAfter } from './events';
import { deploymentsOfMachine, listSiteMachines, machineDetail, USER_COMMAND_TYPES } from './machines';
import { deployRollout, getRolloutDetail, listRolloutPage } from './rollouts';
import { getRoost, listRoosts } from './roosts';
import { diffVersions, getVersion, listVersions } from './versions';

/** Longest JSON text of one tool result handed to the model. */
export const MAX_RESULT_CHARS = 12_000;
/** Most list entries a tool returns. */
const MAX_LISTED = 50;

/** Who is asking and where: the conversation's site (and machine), the caller's user id and key scopes. */
export interface ToolContext {
  deps: ServiceDeps;
  siteId: string;
  /** The machine a narrowed conversation is about (default of machine tools), else null. */
  machineId: string | null;
  userId: string;
  /** The key's scopes; null when the credential has no scope list (legacy key, session, ID token). */
  scopes: Scope[] | null;
}

/** One tool: its model-facing name, description and TypeBox input, who may have it, and what it does. */
export interface FleetTool<S extends TObject = TObject> {
  name: string;
  description: string;
  input: S;
  /** `read`: returns fleet state; `plan`: proposes an API request the client confirms. */
  kind: 'read' | 'plan';
  /** True when the caller could use the tool for at least some id (else it is not offered at all). */
  offered(ctx: ToolContext): boolean;
  /** What the call needs for these arguments (any one suffices). */
  needs(ctx: ToolContext, input: Static<S>): Requirement[];
  run(ctx: ToolContext, input: Static<S>): Promise<unknown>;
}

/** True when the credential is unrestricted or a scope grants `permission` on `resource` for any id. */
function grantsSome(ctx: ToolContext, resource: Resource, permission: Permission): boolean {
  if (ctx.scopes === null) return true;
  return ctx.scopes.some((s) => s.resource === resource && s.permissions.includes(permission));
}

function allows(ctx: ToolContext, anyOf: Requirement[]): boolean {
  return ctx.scopes === null || scopesAllow(ctx.scopes, anyOf);
}

const site = (ctx: ToolContext, permission: Permission): Requirement => ({ resource: 'site', id: ctx.siteId, permission });
const machineNeeds = (ctx: ToolContext, machineId: string, permission: Permission): Requirement[] => [
  { resource: 'machine', id: machineId, permission },
  site(ctx, permission),
];
const roostNeeds = (ctx: ToolContext, roostId: string, permission: Permission): Requirement[] => [
  { resource: 'roost', id: roostId, permission },
  site(ctx, permission),
];
/** Offered when the site scope or a scope of `resource` (any id) grants `permission`. */
const someOf = (resource: Resource, permission: Permission) => (ctx: ToolContext) =>
  grantsSome(ctx, resource, permission) || allows(ctx, [site(ctx, permission)]);

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : null);

/** Cuts a list to MAX_LISTED entries, saying how many were left out. */
function listed<T>(items: T[], max = MAX_LISTED): { items: T[]; truncated: number } {
  return { items: items.slice(0, max), truncated: Math.max(0, items.length - max) };
}

const MachineIdArg = Type.String({ pattern: MACHINE_ID_RE.source, description: 'machine id' });
const OptionalMachineIdArg = Type.Optional(
  Type.String({ pattern: MACHINE_ID_RE.source, description: 'machine id (default: the machine of this conversation)' }),
);
const RoostIdArg = Type.String({ pattern: ROOST_ID_RE.source, description: 'roost id (rst_…)' });
const VersionRefArg = (d: string) => Type.String({ minLength: 1, maxLength: 80, description: d });

/** The machine a machine tool is about: its argument, else the conversation's machine. */
function machineOf(ctx: ToolContext, input: { machineId?: string }): string {
  const id = input.machineId ?? ctx.machineId;
  if (!id) throw new ApiError('validation_failed', 'machineId is required (this conversation is not about one machine)');
  return id;
}

/** Metrics snapshot reduced to what answers questions (CPU, memory, disks), never the whole document. */
function metricsSummary(metrics: Record<string, unknown> | null): Record<string, unknown> | null {
  if (!metrics) return null;
  const pick = ['timestamp', 'cpus', 'memory', 'disks', 'primary', 'displayDriftCount'];
  const out: Record<string, unknown> = {};
  for (const k of pick) if (metrics[k] !== undefined) out[k] = metrics[k];
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Read tools

const listMachinesTool: FleetTool = {
  name: 'list_machines',
  description: "Lists the site's machines with online state, last heartbeat, agent version and flags (rebooting, cortexEnabled).",
  input: Type.Object({ onlineOnly: Type.Optional(Type.Boolean({ description: 'only machines online now' })) }),
  kind: 'read',
  offered: (ctx) => allows(ctx, [site(ctx, 'read'), { resource: 'machine', id: '*', permission: 'read' }]),
  needs: (ctx) => [site(ctx, 'read'), { resource: 'machine', id: '*', permission: 'read' }],
  async run(ctx, input: { onlineOnly?: boolean }) {
    const page = await listSiteMachines(ctx.deps, { siteId: ctx.siteId, after: undefined, pageSize: 200 });
    const all = page.machines.filter((m) => !input.onlineOnly || m.live);
    const { items, truncated } = listed(all);
    return {
      total: all.length + (page.next ? 1 : 0),
      moreThanListed: page.next !== undefined || truncated > 0,
      online: all.filter((m) => m.live).length,
      machines: items.map((m) => ({
        machineId: m.machine_id,
        hostname: m.hostname,
        online: m.live,
        lastHeartbeat: iso(m.last_heartbeat),
        agentVersion: m.agent_version,
        cortexEnabled: m.cortex_enabled !== false,
        rebooting: m.rebooting,
        shuttingDown: m.shutting_down,
      })),
    };
  },
};

const getMachineTool: FleetTool = {
  name: 'get_machine',
  description:
    'One machine: online state, host info, metrics snapshot (CPU, memory, disks), process count and, per roost, the intended version beside the version it reports.',
  input: Type.Object({ machineId: OptionalMachineIdArg }),
  kind: 'read',
  offered: someOf('machine', 'read'),
  needs: (ctx, input: { machineId?: string }) => machineNeeds(ctx, machineOf(ctx, input), 'read'),
  async run(ctx, input: { machineId?: string }) {
    const ref = { siteId: ctx.siteId, machineId: machineOf(ctx, input) };
    const m = await machineDetail(ctx.deps, ref);
    const deployments = await deploymentsOfMachine(ctx.deps, ref);
    return {
      machineId: m.machine_id,
      hostname: m.hostname,
      online: m.live,
      lastHeartbeat: iso(m.last_heartbeat),
      agentVersion: m.agent_version,
      timezone: m.machine_timezone_iana ?? m.machine_timezone,
      cortexEnabled: m.cortex_enabled !== false,
      rebooting: m.rebooting,
      shuttingDown: m.shutting_down,
      info: m.info,
      metrics: metricsSummary(m.metrics),
      processCount: Array.isArray(m.processes) ? m.processes.length : 0,
      roosts: deployments.map((d) => ({
        roostId: d.roost_id,
        name: d.name,
        currentVersionNumber: d.current_version_number,
        reportedVersionNumber: d.reported_version_number,
        status: d.status,
        inSync: d.inSync,
        error: d.error,
      })),
    };
  },
};

const listRoostsTool: FleetTool = {
  name: 'list_roosts',
  description: "Lists the site's roosts (file bundles) with their current version number, file count, size and targets.",
  input: Type.Object({}),
  kind: 'read',
  offered: (ctx) => allows(ctx, [site(ctx, 'read'), { resource: 'roost', id: '*', permission: 'read' }]),
  needs: (ctx) => [site(ctx, 'read'), { resource: 'roost', id: '*', permission: 'read' }],
  async run(ctx) {
    const page = await listRoosts(ctx.deps, { siteId: ctx.siteId, pageSize: MAX_LISTED, tokenParam: 'page_token' });
    return {
      moreThanListed: page.next !== undefined,
      roosts: page.roosts.map((r) => ({
        roostId: r.roost_id,
        name: r.name,
        currentVersionNumber: r.current?.version_number ?? null,
        currentVersionId: r.current_version_id,
        totalFiles: r.current?.total_files ?? 0,
        totalSize: r.current?.total_size ?? 0,
        targets: listed(r.targets, 20),
        updatedAt: iso(r.updated_at),
      })),
    };
  },
};

const getRoostTool: FleetTool = {
  name: 'get_roost',
  description: 'One roost: current and previous version, targets, extract path and its latest versions (number, description, size).',
  input: Type.Object({ roostId: RoostIdArg }),
  kind: 'read',
  offered: someOf('roost', 'read'),
  needs: (ctx, input: { roostId: string }) => roostNeeds(ctx, input.roostId, 'read'),
  async run(ctx, input: { roostId: string }) {
    const r = await getRoost(ctx.deps, { siteId: ctx.siteId, roostId: input.roostId });
    const versions = await listVersions(ctx.deps, { siteId: ctx.siteId, roostId: input.roostId, pageSize: 5 });
    return {
      roostId: r.roost_id,
      name: r.name,
      extractPath: r.extract_path,
      targets: listed(r.targets),
      currentVersionId: r.current_version_id,
      currentVersionNumber: r.current?.version_number ?? null,
      previousVersionId: r.previous_version_id,
      latestVersions: versions.versions.map((v) => ({
        versionId: v.version_id,
        versionNumber: v.version_number,
        description: v.description,
        totalFiles: v.total_files,
        totalSize: v.total_size,
        createdAt: iso(v.created_at),
      })),
    };
  },
};

const diffVersionsTool: FleetTool = {
  name: 'diff_versions',
  description: 'File-level diff of two versions of a roost: added, removed and changed files with sizes.',
  input: Type.Object({
    roostId: RoostIdArg,
    versionRef: VersionRefArg('target version: id, number (3, v3) or alias (current, previous, first)'),
    against: VersionRefArg('base version, same forms'),
  }),
  kind: 'read',
  offered: someOf('roost', 'read'),
  needs: (ctx, input: { roostId: string }) => roostNeeds(ctx, input.roostId, 'read'),
  async run(ctx, input: { roostId: string; versionRef: string; against: string }) {
    const d = await diffVersions(ctx.deps, { siteId: ctx.siteId, roostId: input.roostId, ref: input.versionRef, against: input.against });
    return {
      fromVersionId: d.fromVersionId,
      toVersionId: d.toVersionId,
      summary: d.diff.summary,
      added: listed(d.diff.added.map((f) => ({ path: f.path, size: f.size }))),
      removed: listed(d.diff.removed.map((f) => ({ path: f.path, size: f.size }))),
      modified: listed(d.diff.modified.map((f) => ({ path: f.path, fromSize: f.fromSize, toSize: f.toSize }))),
    };
  },
};

const listRolloutsTool: FleetTool = {
  name: 'list_rollouts',
  description: "A roost's rollouts, newest first: stage, state, version, machine counts (succeeded, failed, pending).",
  input: Type.Object({ roostId: RoostIdArg }),
  kind: 'read',
  offered: someOf('roost', 'read'),
  needs: (ctx, input: { roostId: string }) => roostNeeds(ctx, input.roostId, 'read'),
  async run(ctx, input: { roostId: string }) {
    const page = await listRolloutPage(ctx.deps, { siteId: ctx.siteId, roostId: input.roostId, limit: 10 });
    return {
      rollouts: page.rollouts.map((o) => ({
        rolloutId: o.rollout.rolloutId,
        versionId: o.rollout.versionId,
        stage: o.rollout.stage,
        state: o.rollout.state,
        abortReason: o.rollout.abortReason,
        createdAt: iso(o.rollout.createdAt),
        completedAt: iso(o.rollout.completedAt),
        counts: o.counts,
      })),
      moreThanListed: page.next !== undefined,
    };
  },
};

const getRolloutTool: FleetTool = {
  name: 'get_rollout',
  description: 'One rollout of a roost with its counts per wave and the state of each machine (status, error).',
  input: Type.Object({ roostId: RoostIdArg, rolloutId: Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$', description: 'rollout id' }) }),
  kind: 'read',
  offered: someOf('roost', 'read'),
  needs: (ctx, input: { roostId: string }) => roostNeeds(ctx, input.roostId, 'read'),
  async run(ctx, input: { roostId: string; rolloutId: string }) {
    const d = await getRolloutDetail(ctx.deps, {
      siteId: ctx.siteId,
      roostId: input.roostId,
      rolloutId: input.rolloutId,
      limit: MAX_LISTED,
    });
    return {
      rolloutId: d.rollout.rolloutId,
      versionId: d.rollout.versionId,
      stage: d.rollout.stage,
      state: d.rollout.state,
      abortReason: d.rollout.abortReason,
      counts: d.counts,
      countsByWave: Object.fromEntries(d.countsByWave),
      machines: d.machines,
      moreMachines: d.nextMachine !== undefined,
    };
  },
};

const recentAuditTool: FleetTool = {
  name: 'recent_audit',
  description: "The site's latest audit records (who did what, newest first), optionally of one kind.",
  input: Type.Object({ kind: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9_.: /-]{1,100}$', description: 'exact record kind' })) }),
  kind: 'read',
  offered: (ctx) => allows(ctx, [site(ctx, 'read')]),
  needs: (ctx) => [site(ctx, 'read')],
  async run(ctx, input: { kind?: string }) {
    const page = await listSiteAudit(ctx.deps, ctx.siteId, { limit: 20, kind: input.kind });
    return { records: page.records.map((r) => ({ kind: r.kind, actor: r.actor, occurredAt: r.occurredAt, attributes: r.attributes })) };
  },
};

const recentEventsTool: FleetTool = {
  name: 'recent_events',
  description: "The site's latest events (machine online/offline, versions published, deployments, quota), newest last.",
  input: Type.Object({}),
  kind: 'read',
  offered: (ctx) => allows(ctx, [site(ctx, 'read')]),
  needs: (ctx) => [site(ctx, 'read')],
  async run(ctx) {
    const last = await lastSiteEventSeq(ctx.deps, ctx.siteId);
    const events = await siteEventsAfter(ctx.deps, ctx.siteId, Math.max(0, last - 20), { limit: 20 });
    return { events: events.map((e) => ({ event: e.type, occurredAt: iso(e.occurredAt), data: e.data })) };
  },
};

const DeploymentIdArg = Type.String({ pattern: DEPLOYMENT_ID_RE.source, description: 'classic deployment id (dep_…)' });

const listClassicDeploymentsTool: FleetTool = {
  name: 'list_classic_deployments',
  description: "The site's classic installer deployments, newest first: name, installer, status and target counts.",
  input: Type.Object({
    status: Type.Optional(
      Type.Union(
        DEPLOYMENT_STATUSES.map((x) => Type.Literal(x)),
        { description: 'only deployments in this status' },
      ),
    ),
  }),
  kind: 'read',
  offered: (ctx) => allows(ctx, [site(ctx, 'read')]),
  needs: (ctx) => [site(ctx, 'read')],
  async run(ctx, input: { status?: (typeof DEPLOYMENT_STATUSES)[number] }) {
    const page = await listSiteDeployments(ctx.deps, { siteId: ctx.siteId, pageSize: 20, status: input.status });
    return {
      moreThanListed: page.next !== undefined,
      deployments: page.deployments.map(({ row, counts }) => ({
        deploymentId: row.deployment_id,
        name: row.name,
        installerName: row.installer_name,
        status: row.status,
        counts,
        createdAt: iso(row.created_at),
        completedAt: iso(row.completed_at),
      })),
    };
  },
};

const getClassicDeploymentTool: FleetTool = {
  name: 'get_classic_deployment',
  description: 'One classic installer deployment with the status, progress and error of each target machine.',
  input: Type.Object({ deploymentId: DeploymentIdArg }),
  kind: 'read',
  offered: (ctx) => allows(ctx, [site(ctx, 'read')]),
  needs: (ctx) => [site(ctx, 'read')],
  async run(ctx, input: { deploymentId: string }) {
    const d = await deploymentDetail(ctx.deps, { siteId: ctx.siteId, deploymentId: input.deploymentId });
    return {
      deploymentId: d.row.deployment_id,
      name: d.row.name,
      installerName: d.row.installer_name,
      status: d.row.status,
      counts: d.counts,
      targets: listed(
        d.targets.map((t) => ({ machineId: t.machine_id, action: t.action, status: t.status, progress: t.progress, error: t.error })),
      ),
    };
  },
};

// ---------------------------------------------------------------------------------------------------
// Plan tools: the request to send, never sent

/** An API request the client may send itself to do what was asked (nothing was changed). */
export interface ProposedRequest {
  method: 'POST';
  path: string;
  headers: Record<string, string>;
  body: Record<string, unknown>;
  note: string;
}

const IDEMPOTENCY_NOTE = '<a fresh Idempotency-Key>';

const proposeDeployTool: FleetTool = {
  name: 'propose_roost_deploy',
  description:
    'Plans a roost deploy without doing it: runs the deploy as a dry run (canary and fleet waves, bytes each machine would download) and returns the exact request the user can send to deploy.',
  input: Type.Object({
    roostId: RoostIdArg,
    versionId: Type.Optional(Type.String({ minLength: 1, maxLength: 80, description: 'concrete version id (default: current)' })),
    machines: Type.Optional(Type.Array(MachineIdArg, { minItems: 1, maxItems: 1000, description: 'default: the roost targets' })),
  }),
  kind: 'plan',
  offered: someOf('roost', 'deploy'),
  needs: (ctx, input: { roostId: string }) => roostNeeds(ctx, input.roostId, 'deploy'),
  async run(ctx, input: { roostId: string; versionId?: string; machines?: string[] }) {
    const body = {
      siteId: ctx.siteId,
      ...(input.versionId ? { versionId: input.versionId } : {}),
      ...(input.machines ? { machines: input.machines } : {}),
    };
    const d = await deployRollout(ctx.deps, { ...body, roostId: input.roostId, userId: ctx.userId, dryRun: true });
    const request: ProposedRequest = {
      method: 'POST',
      path: `/api/roosts/${input.roostId}/deploy`,
      headers: { 'Idempotency-Key': IDEMPOTENCY_NOTE },
      body,
      note: 'not sent: the user confirms by sending this request',
    };
    return {
      request,
      dryRun: {
        alreadyRunning: d.alreadyRunning,
        versionId: d.rollout.versionId,
        canary: listed(d.rollout.canary),
        fleet: listed(d.rollout.fleet),
        waves: d.rollout.waves?.map((w) => ({ name: w.name, size: w.size })),
        delta: d.delta ? { totals: d.delta.totals, byCurrentVersion: d.delta.byCurrentVersion } : undefined,
      },
    };
  },
};

const proposeRollbackTool: FleetTool = {
  name: 'propose_roost_rollback',
  description:
    "Plans moving a roost's current pointer back (default: to the previous version) without doing it: returns the current and target versions and the exact request to send.",
  input: Type.Object({
    roostId: RoostIdArg,
    targetVersion: Type.Optional(VersionRefArg('version to go back to: id, number or alias (default previous)')),
  }),
  kind: 'plan',
  offered: someOf('roost', 'rollback'),
  needs: (ctx, input: { roostId: string }) => roostNeeds(ctx, input.roostId, 'rollback'),
  async run(ctx, input: { roostId: string; targetVersion?: string }) {
    const target = input.targetVersion ?? 'previous';
    const r = await getRoost(ctx.deps, { siteId: ctx.siteId, roostId: input.roostId });
    const to = await getVersion(ctx.deps, { siteId: ctx.siteId, roostId: input.roostId, ref: target });
    const request: ProposedRequest = {
      method: 'POST',
      path: `/api/roosts/${input.roostId}/rollback`,
      headers: { 'Idempotency-Key': IDEMPOTENCY_NOTE },
      body: { siteId: ctx.siteId, targetVersion: target },
      note:
        to.version.version_id === r.current_version_id
          ? 'the target is the current version: the API would answer 400 rollback_no_op'
          : 'not sent: the user confirms by sending this request',
    };
    return {
      request,
      currentVersionId: r.current_version_id,
      currentVersionNumber: r.current?.version_number ?? null,
      targetVersionId: to.version.version_id,
      targetVersionNumber: to.version.version_number,
    };
  },
};

const proposeCommandTool: FleetTool = {
  name: 'propose_machine_command',
  description: 'Plans a reboot, shutdown or screenshot of a machine without doing it: returns the exact request to send.',
  input: Type.Object({
    machineId: OptionalMachineIdArg,
    type: Type.Union(
      USER_COMMAND_TYPES.map((t) => Type.Literal(t)),
      { description: USER_COMMAND_TYPES.join(', ') },
    ),
  }),
  kind: 'plan',
  offered: someOf('machine', 'write'),
  needs: (ctx, input: { machineId?: string }) => machineNeeds(ctx, machineOf(ctx, input), 'write'),
  async run(ctx, input: { machineId?: string; type: string }) {
    const machineId = machineOf(ctx, input);
    const m = await machineDetail(ctx.deps, { siteId: ctx.siteId, machineId });
    const request: ProposedRequest = {
      method: 'POST',
      path: `/api/sites/${ctx.siteId}/machines/${machineId}/commands`,
      headers: { 'Idempotency-Key': IDEMPOTENCY_NOTE },
      body: { type: input.type },
      note: m.live
        ? 'not sent: the user confirms by sending this request'
        : 'the machine is offline now: the API would answer 409 machine_offline',
    };
    return { request, online: m.live };
  },
};

const proposeClassicActionTool: FleetTool = {
  name: 'propose_classic_deployment_action',
  description:
    'Plans a retry (failed targets), cancel (pending targets) or uninstall (every target) of a classic deployment without doing it: returns the exact request to send.',
  input: Type.Object({
    deploymentId: DeploymentIdArg,
    action: Type.Union([Type.Literal('retry'), Type.Literal('cancel'), Type.Literal('uninstall')]),
  }),
  kind: 'plan',
  // retry and cancel need site write, uninstall site admin (docs/contract.md Authentication 6).
  offered: (ctx) => allows(ctx, [site(ctx, 'write'), site(ctx, 'admin')]),
  needs: (ctx, input: { action: string }) => [site(ctx, input.action === 'uninstall' ? 'admin' : 'write')],
  async run(ctx, input: { deploymentId: string; action: string }) {
    const d = await deploymentDetail(ctx.deps, { siteId: ctx.siteId, deploymentId: input.deploymentId });
    const request: ProposedRequest = {
      method: 'POST',
      path: `/api/sites/${ctx.siteId}/deployments/${input.deploymentId}/${input.action}`,
      headers: { 'Idempotency-Key': IDEMPOTENCY_NOTE },
      body: {},
      note: 'not sent: the user confirms by sending this request',
    };
    return { request, status: d.row.status, counts: d.counts };
  },
};

/** Every tool, read tools first. */
export const FLEET_TOOLS: FleetTool[] = [
  listMachinesTool,
  getMachineTool,
  listRoostsTool,
  getRoostTool,
  diffVersionsTool,
  listRolloutsTool,
  getRolloutTool,
  listClassicDeploymentsTool,
  getClassicDeploymentTool,
  recentAuditTool,
  recentEventsTool,
  proposeDeployTool,
  proposeRollbackTool,
  proposeCommandTool,
  proposeClassicActionTool,
];

/** The tools offered to a caller: those whose `offered` holds for the context. */
export function offeredTools(ctx: ToolContext): FleetTool[] {
  return FLEET_TOOLS.filter((t) => t.offered(ctx));
}

/** JSON text of a result, bounded to MAX_RESULT_CHARS (a longer result is replaced by a notice and its start). */
export function boundedResult(value: unknown): unknown {
  const text = JSON.stringify(value ?? null);
  if (text.length <= MAX_RESULT_CHARS) return value ?? null;
  return { truncated: true, note: `the result was ${text.length} characters; its start follows`, start: text.slice(0, MAX_RESULT_CHARS) };
}

/**
 * Runs one call of `tool` for the caller: validates the arguments against its schema (unknown arguments
 * are refused), checks the exact requirement for these ids, then runs it and bounds the result.
 * @throws Error naming the invalid arguments, the missing scope, or the client-type failure (`not_found:
 *   machine not found`); the AI SDK hands the message to the model as the tool's error.
 */
export async function callTool(ctx: ToolContext, tool: FleetTool, input: unknown): Promise<unknown> {
  const extra = input !== null && typeof input === 'object' ? Object.keys(input).filter((k) => !(k in tool.input.properties)) : [];
  if (extra.length) throw new Error(`invalid arguments for ${tool.name}: unknown ${extra.join(', ')}`);
  if (!Value.Check(tool.input, input)) {
    const first = [...Value.Errors(tool.input, input)][0];
    throw new Error(`invalid arguments for ${tool.name}: ${first ? `${first.path || '/'} ${first.message}` : 'schema mismatch'}`);
  }
  const args = input as Static<typeof tool.input>;
  try {
    const needs = tool.needs(ctx, args);
    if (!allows(ctx, needs)) {
      const r = needs[0];
      throw new Error(`refused: the caller's key lacks ${r.resource}=${r.id}:${r.permission}`);
    }
    return boundedResult(await tool.run(ctx, args));
  } catch (err) {
    // The model reads the failure as the tool's error text (and may say so); nothing else happens.
    if (err instanceof ApiError && err.status < 500) throw new Error(`${err.code}: ${err.detail}`);
    throw err;
  }
}
