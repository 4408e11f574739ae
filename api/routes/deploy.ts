/**
 * Roost deploy: `POST /api/roosts/{roostId}/deploy` plans a canary-then-fleet rollout of a version to
 * machines, stores it and starts its workflow (the deploy use case is services/rollouts.ts deployRollout;
 * the workflow is workflows/rollout.ts). Idempotency-Key required; scope roost deploy (or site deploy);
 * capability DISTRIBUTION_MANAGE. docs/decisions/deploy-request.md.
 *
 * - 202 rollout record (stage `canary`, alreadyRunning false, dryRun false), header
 *   `X-Roost-Workflow-Url` (Temporal Web UI of the run).
 * - A non-terminal rollout of the same (site, roost, version) exists: 202 with its fields and
 *   alreadyRunning true (its workflow is re-attached with USE_EXISTING, which also heals a lost start).
 * - dryRun: the same planning fields with dryRun true; nothing written, no workflow.
 * - scheduleAt more than 60 s ahead: stored (`scheduleAt` in the record) and fired by the workflow's
 *   durable timer; past or near-future values deploy now.
 * - policy (domain/rollout-policy.ts; docs/decisions/rollout-control.md): waves, thresholds, gates,
 *   windows, activation; the record then carries `waves` and `policy`, and a dry run adds `delta` (what
 *   each machine would download).
 * Errors: 400 validation_failed (body, policy keyed by dotted path, machine ids, unknown machines listed in
 * `unknownMachines`), 404 not_found (site hidden, roost missing), 404 version_not_found, 409 conflict (roost
 * deleted, no current version, version body missing, roost targets not enrolled), 503 service_unavailable
 * (workflow could not start; the rollout is marked failed and nothing is left running).
 */
import { type FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { MAX_ROLLOUT_MACHINES } from '../../domain/rollout';
import { POLICY_SCHEMA, policyView } from '../../domain/rollout-policy';
import { ConcreteVersionId, DateTime, MachineId, Nullable, problems, RoostId, SiteId } from '../../domain/schemas';
import { type DeployResult, deployRollout } from '../../services/rollouts';
import { authorizeSite, roostRequirement } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';

const Params = Type.Object({ roostId: RoostId });

const DeployBody = Type.Object(
  {
    siteId: SiteId,
    versionId: Type.Optional(
      Type.String({
        ...ConcreteVersionId,
        maxLength: 100,
        description: 'concrete version id (64 hex, or legacy vrs_<hex>); default: the current version',
      }),
    ),
    machines: Type.Optional(
      Type.Array(MachineId, {
        minItems: 1,
        maxItems: MAX_ROLLOUT_MACHINES,
        description: 'enrolled machine ids of the site; default: the roost targets',
      }),
    ),
    scheduleAt: Type.Optional(Type.String({ format: 'date-time', description: 'ISO 8601 with offset; more than 60 s ahead is scheduled' })),
    dryRun: Type.Optional(
      Type.Boolean({ description: 'plan only: nothing is written, no workflow starts; the answer carries the delta plan' }),
    ),
    // validatePolicy checks the policy with errors keyed by dotted path (policy.waves.1…); the document states
    // its exact shape (domain/rollout-policy.ts POLICY_SCHEMA).
    policy: Type.Optional(Type.Object({}, { additionalProperties: true, 'x-roost-document': POLICY_SCHEMA })),
  },
  { additionalProperties: false },
);

/** Most machines listed one by one in a dry run's delta plan (totals and groups cover all). */
export const DELTA_MACHINES_LISTED = 1000;

/** A rollout's policy in its wire form (domain/rollout-policy.ts policyView). */
const Threshold = Type.Union([Type.Object({ count: Type.Integer() }), Type.Object({ fraction: Type.Number() })]);
export const PolicyRecord = Type.Object({
  canary: Nullable(Type.Union([Type.Object({ count: Type.Integer() }), Type.Object({ percent: Type.Number() })])),
  waves: Type.Array(Type.Number()),
  bakeSeconds: Type.Number(),
  successThreshold: Nullable(Threshold),
  failureThreshold: Threshold,
  requirePromotion: Type.String(),
  retries: Type.Integer(),
  retryBackoffSeconds: Type.Number(),
  waveTimeoutSeconds: Type.Number(),
  maintenanceWindow: Nullable(Type.Object({ days: Type.Array(Type.String()), start: Type.String(), end: Type.String() })),
  autoRollback: Type.Boolean(),
  activation: Type.String(),
});

/** Planned waves: stored name and machine count, in order. */
export const WavesRecord = Type.Array(Type.Object({ index: Type.Integer(), name: Type.String(), size: Type.Integer() }));

const DeltaRecord = Type.Object({
  versionId: Type.String(),
  machines: Type.Array(
    Type.Object({ machineId: Type.String(), currentVersionId: Nullable(Type.String()), bytes: Type.Number(), chunks: Type.Integer() }),
  ),
  machinesListed: Type.Integer(),
  truncated: Type.Boolean(),
  byCurrentVersion: Type.Array(
    Type.Object({ currentVersionId: Nullable(Type.String()), machines: Type.Integer(), bytes: Type.Number(), chunks: Type.Integer() }),
  ),
  totals: Type.Object({ machines: Type.Integer(), bytes: Type.Number(), chunks: Type.Integer() }),
});

/** The rollout record of `POST /api/roosts/{roostId}/deploy` plus `scheduleAt` (null when deploying now). */
export const RolloutRecord = Type.Object({
  rolloutId: Type.String(),
  versionId: Type.String(),
  siteId: Type.String(),
  roostId: Type.String(),
  stage: Type.Union([Type.Literal('canary'), Type.Literal('started'), Type.Literal('completed'), Type.Literal('failed')]),
  canary: Type.Array(Type.String()),
  fleet: Type.Array(Type.String()),
  extractRoot: Type.String(),
  versionUrl: Type.String(),
  alreadyRunning: Type.Boolean(),
  dryRun: Type.Boolean(),
  scheduleAt: Nullable(DateTime),
  waves: Type.Optional(WavesRecord),
  policy: Type.Optional(PolicyRecord),
  delta: Type.Optional(DeltaRecord),
});
export type RolloutRecord = Static<typeof RolloutRecord>;

/**
 * The wire record. `waves` and `policy` are added when `withPlan` (a deploy that sent a policy, or a dry
 * run planning a new rollout): a plain deploy answers exactly the contract's fields.
 */
function record(d: DeployResult): RolloutRecord {
  const r = d.rollout;
  return {
    rolloutId: r.rolloutId,
    versionId: r.versionId,
    siteId: r.siteId,
    roostId: r.roostId,
    stage: r.stage,
    canary: r.canary,
    fleet: r.fleet,
    extractRoot: r.extractRoot,
    versionUrl: d.versionUrl,
    alreadyRunning: d.alreadyRunning,
    dryRun: d.dryRun,
    scheduleAt: r.scheduleAt ? r.scheduleAt.toISOString() : null,
    ...(d.withPlan && r.waves ? { waves: r.waves.map((w, index) => ({ index, name: w.name, size: w.size })) } : {}),
    ...(d.withPlan && r.policy ? { policy: policyView(r.policy) } : {}),
    ...(d.delta
      ? {
          delta: {
            versionId: d.delta.versionId,
            machines: d.delta.machines.slice(0, DELTA_MACHINES_LISTED),
            machinesListed: Math.min(DELTA_MACHINES_LISTED, d.delta.machines.length),
            truncated: d.delta.machines.length > DELTA_MACHINES_LISTED,
            byCurrentVersion: d.delta.byCurrentVersion,
            totals: d.delta.totals,
          },
        }
      : {}),
  };
}

/** The deploy route. */
const deployRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.post(
    '/api/roosts/:roostId/deploy',
    {
      config: { idempotency: 'required' },
      schema: {
        summary: 'Deploy a version to machines as a canary-then-fleet rollout',
        tags: ['versions'],
        params: Params,
        body: DeployBody,
        response: { 202: RolloutRecord, ...problems(409, 422, 503) },
      },
    },
    async (request, reply) => {
      const { roostId } = request.params;
      const b = request.body;
      const user = await authorizeSite(request, b.siteId, roostRequirement(b.siteId, roostId, 'deploy'));
      await enforceCapability(request, 'DISTRIBUTION_MANAGE', b.siteId);
      const result = await deployRollout(app.deps, { ...b, roostId, userId: user.userId, log: request.log });
      if (result.workflowUrl) reply.header('X-Roost-Workflow-Url', result.workflowUrl);
      return reply.code(202).send(record(result));
    },
  );
};

export default deployRoutes;
