/**
 * Roost deploy (SPEC.md "Roost versions, rollback, deploy", deploy row; "Rollout"): POST
 * /api/roosts/{roostId}/deploy plans a canary-then-fleet rollout of a version to machines, stores it and
 * starts its workflow (workflows/rollout.ts). Idempotency-Key required; scope roost deploy (or site
 * deploy).
 *
 * - 202 rollout record (stage `canary`, alreadyRunning false, dryRun false), header
 *   `X-Roost-Workflow-Url` (Temporal Web UI of the run).
 * - A non-terminal rollout of the same (site, roost, version) exists: 202 with its fields and
 *   alreadyRunning true (its workflow is re-attached with USE_EXISTING, which also heals a lost start).
 * - dryRun: the same planning fields with dryRun true; nothing written, no workflow.
 * - scheduleAt more than 60 s ahead: stored (`scheduleAt` in the record) and fired by the workflow's
 *   durable timer; past or near-future values deploy now.
 * - policy (issue #5, domain/rollout-policy.ts): waves, thresholds, gates, windows, activation; the record
 *   then carries `waves` and `policy`, and a dry run adds `delta` (what each machine would download).
 * Errors: 400 validation_failed (body, policy keyed by dotted path, machine ids, unknown machines listed in `unknownMachines`),
 * 404 not_found (site hidden, roost missing), 404 version_not_found, 409 conflict (roost deleted, no
 * current version, version body missing, roost targets not enrolled), 503 service_unavailable (workflow
 * could not start; the rollout is marked failed and nothing is left running).
 */
import type { FastifyInstance } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import { ApiError } from '../../domain/errors';
import { newId } from '../../domain/hex';
import { parseVersionRef, type VersionRef } from '../../domain/versionRef';
import { withTx } from '../../db/pool';
import { getRoost, getVersion, resolveVersionIn, type RoostRow, versionUrlOf, type VersionRow } from '../../db/roosts';

import {
  MAX_ROLLOUT_MACHINES,
  type Rollout,
  deltaPlan,
  failUnstartedRollout,
  findActiveRollout,
  insertRollout,
  policyFromSpec,
  unknownMachines,
} from '../../db/rollouts';
import { planWaves, policyView, validatePolicy, waveNames, type PolicySpec } from '../../domain/rollout-policy';
import { rolloutWorkflowId, startRolloutWorkflow, workflowUiUrl } from '../temporal';
import { authorizeSite, roostRequirement } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';
import { RoostParams } from './roosts';
import { DateTime, MachineId, Nullable, problems, SiteId } from '../../domain/schemas';

/** scheduleAt at most this far ahead counts as "now" (SPEC.md: more than 60 seconds is scheduled). */
export const SCHEDULE_THRESHOLD_MS = 60_000;
/** Latest accepted scheduleAt, relative to now (docs/decisions/deploy-request.md). */
export const SCHEDULE_MAX_AHEAD_MS = 365 * 24 * 60 * 60 * 1000;
/** Unknown machine ids named in a validation problem (the count is always given). */
export const MAX_UNKNOWN_LISTED = 100;

const DeployBody = Type.Object(
  {
    siteId: SiteId,
    versionId: Type.Optional(
      Type.String({
        minLength: 1,
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
    policy: Type.Optional(
      Type.Object(
        {},
        {
          additionalProperties: true,
          description:
            'rollout policy (all optional): canary {count}|{percent}, waves (cumulative %, last 100), bakeSeconds, successThreshold and failureThreshold ' +
            "({count}|{fraction}), requirePromotion ('none'|'canary'|'everyWave'), retries, retryBackoffSeconds, waveTimeoutSeconds, maintenanceWindow " +
            "{days, start, end} in the site's timezone, autoRollback, activation ('immediate'|'wave'|'fleet'). docs/decisions/rollout-control.md",
        },
      ),
    ),
  },
  { additionalProperties: false },
);
type DeployBody = Static<typeof DeployBody>;

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

/** The rollout record of SPEC.md "Rollout" plus `scheduleAt` (null when deploying now). */
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

type RecordSource = Pick<
  Rollout,
  'rolloutId' | 'versionId' | 'siteId' | 'roostId' | 'stage' | 'canary' | 'fleet' | 'extractRoot' | 'scheduleAt'
> & {
  waves?: { name: string; size: number }[];
  policy?: Partial<PolicySpec>;
};

/**
 * The wire record. `waves` and `policy` are added when `withPlan` (a deploy that sent a policy, or a dry
 * run planning a new rollout): a plain deploy answers exactly the spec's fields, as before issue #5.
 */
function record(r: RecordSource, versionUrl: string, alreadyRunning: boolean, dryRun: boolean, withPlan = false): RolloutRecord {
  return {
    rolloutId: r.rolloutId,
    versionId: r.versionId,
    siteId: r.siteId,
    roostId: r.roostId,
    stage: r.stage,
    canary: r.canary,
    fleet: r.fleet,
    extractRoot: r.extractRoot,
    versionUrl,
    alreadyRunning,
    dryRun,
    scheduleAt: r.scheduleAt ? r.scheduleAt.toISOString() : null,
    ...(withPlan && r.waves ? { waves: r.waves.map((w, index) => ({ index, name: w.name, size: w.size })) } : {}),
    ...(withPlan && r.policy ? { policy: policyView(r.policy) } : {}),
  };
}

/** `versionId` must be a concrete id: 64 hex or legacy `vrs_<hex>` (numbers and aliases are refused). */
function parseConcreteVersionId(raw: string): VersionRef {
  let ref: VersionRef | undefined;
  try {
    ref = parseVersionRef(raw, 'versionId');
  } catch {
    ref = undefined;
  }
  if (!ref || (ref.kind !== 'id' && ref.kind !== 'idPrefix')) {
    throw new ApiError('validation_failed', 'versionId must be a concrete version id (64 lowercase hex, or vrs_<hex>)', {
      extras: { param: 'versionId', errors: { versionId: ['must be a concrete version id (64 lowercase hex, or vrs_<hex>)'] } },
    });
  }
  return ref;
}

/** scheduleAt → the stored schedule (null when past or within 60 s). @throws validation_failed. */
function parseScheduleAt(raw: string | undefined, now: number): Date | null {
  if (raw === undefined) return null;
  const at = Date.parse(raw);
  const bad = (msg: string) =>
    new ApiError('validation_failed', `scheduleAt ${msg}`, { extras: { param: 'scheduleAt', errors: { scheduleAt: [msg] } } });
  if (!Number.isFinite(at)) throw bad('must be an ISO 8601 date-time with an offset');
  if (at - now > SCHEDULE_MAX_AHEAD_MS) throw bad('must be at most 365 days ahead');
  return at - now > SCHEDULE_THRESHOLD_MS ? new Date(at) : null;
}

function unknownMachinesError(unknown: string[], fromTargets: boolean): ApiError {
  const listed = unknown.slice(0, MAX_UNKNOWN_LISTED);
  const msg = `${unknown.length} machine id(s) are not enrolled machines of this site: ${listed.slice(0, 10).join(', ')}${unknown.length > 10 ? ', …' : ''}`;
  const extras = { param: 'machines', unknownMachines: listed, unknownCount: unknown.length };
  if (fromTargets) {
    return new ApiError('conflict', `the roost's targets include machines that are not enrolled; enrol them or send machines. ${msg}`, {
      extras,
    });
  }
  return new ApiError('validation_failed', msg, { extras: { ...extras, errors: { machines: [msg] } } });
}

/** The deploy route. */
export default async function deployRoutes(app: FastifyInstance): Promise<void> {
  const { db, blob, temporal, cfg } = app.deps;

  /** True when the version body blob exists. A storage failure is 503 service_unavailable. */
  async function bodyStored(v: VersionRow): Promise<boolean> {
    try {
      return await blob.container('versions').getBlobClient(v.blob_name).exists();
    } catch (err) {
      app.log.error({ err }, 'version body check failed');
      throw new ApiError('service_unavailable', 'blob storage is unavailable; retry later', { headers: { 'Retry-After': '5' } });
    }
  }

  /** The roost's current version. @throws 409 conflict when there is none. */
  async function currentVersion(roost: RoostRow): Promise<VersionRow> {
    const v = roost.current_version_id === null ? null : await getVersion(db, roost.site_id, roost.roost_id, roost.current_version_id);
    if (!v) throw new ApiError('conflict', 'the roost has no current version; publish one or send versionId');
    return v;
  }

  app.post<{ Params: Static<typeof RoostParams>; Body: DeployBody }>(
    '/api/roosts/:roostId/deploy',
    {
      config: { idempotency: 'required' },
      schema: {
        summary: 'Deploy a version to machines as a canary-then-fleet rollout',
        tags: ['versions'],
        params: RoostParams,
        body: DeployBody,
        response: { 202: RolloutRecord, ...problems(409, 422, 503) },
      },
    },
    async (request, reply) => {
      const { roostId } = request.params;
      const b = request.body;
      const siteId = b.siteId;
      const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'deploy'));
      await enforceCapability(request, 'DISTRIBUTION_MANAGE', siteId);
      const ref = b.versionId !== undefined ? parseConcreteVersionId(b.versionId) : undefined;
      const scheduleAt = parseScheduleAt(b.scheduleAt, Date.now());
      const dryRun = b.dryRun === true;
      const checked = validatePolicy(b.policy);
      if (checked.errors) {
        const first = Object.entries(checked.errors)[0];
        throw new ApiError('validation_failed', `${first[0]} ${first[1][0]}`, { extras: { param: 'policy', errors: checked.errors } });
      }
      const spec = checked.spec;

      const roost = await getRoost(db, siteId, roostId, { includeDeleted: true });
      if (!roost) throw new ApiError('not_found', 'roost not found', { extras: { param: 'roostId' } });
      if (roost.deleted_at !== null) throw new ApiError('conflict', 'the roost is deleted; deploy is not possible');
      const version = ref ? await resolveVersionIn(db, roost, ref, 'versionId') : await currentVersion(roost);
      if (!(await bodyStored(version)))
        throw new ApiError('conflict', `version ${version.version_id} has no stored body (no versionUrl); it cannot be deployed`);
      const versionUrl = versionUrlOf(blob, version);

      const machines = b.machines ? [...new Set(b.machines)] : roost.targets;
      if (machines.length === 0) throw new ApiError('conflict', 'the roost has no targets; send machines');
      const unknown = await unknownMachines(db, siteId, machines);
      if (unknown.length > 0) throw unknownMachinesError(unknown, !b.machines);

      const rolloutId = newId('rol');
      const waveMachines = planWaves(rolloutId, machines, spec);
      const names = waveNames(waveMachines.length);
      const waves = { canary: waveMachines[0] ?? [], fleet: waveMachines.slice(1).flat() };
      const workflowId = rolloutWorkflowId(siteId, roostId, version.version_id);
      const policy = policyFromSpec(spec, cfg.ROOST_ROLLOUT_POLL_MS);
      const planned = {
        rolloutId,
        versionId: version.version_id,
        siteId,
        roostId,
        stage: 'canary' as const,
        ...waves,
        extractRoot: roost.extract_path,
        scheduleAt,
        waves: waveMachines.map((w, i) => ({ name: names[i], size: w.length })),
        policy,
      };

      if (dryRun) {
        const existing = await findActiveRollout(db, siteId, roostId, version.version_id);
        // An existing rollout is reported as it is (its record only); a new plan carries waves, policy and the delta plan.
        if (existing) return reply.code(202).send(record(existing, versionUrl, true, true, b.policy !== undefined));
        const rec = record(planned, versionUrl, false, true, true);
        const delta = await deltaPlan(db, siteId, roostId, version.version_id, machines);
        rec.delta = {
          versionId: version.version_id,
          machines: delta.machines.slice(0, DELTA_MACHINES_LISTED),
          machinesListed: Math.min(DELTA_MACHINES_LISTED, delta.machines.length),
          truncated: delta.machines.length > DELTA_MACHINES_LISTED,
          byCurrentVersion: delta.byCurrentVersion,
          totals: delta.totals,
        };
        return reply.code(202).send(rec);
      }

      let outcome: { rollout: Rollout | typeof planned; alreadyRunning: boolean } | undefined;
      for (let attempt = 0; !outcome; attempt++) {
        try {
          outcome = await withTx(db, async (tx) => {
            const existing = await findActiveRollout(tx, siteId, roostId, version.version_id);
            if (existing) return { rollout: existing, alreadyRunning: true };
            await insertRollout(tx, { ...planned, waves: waveMachines, waveNames: names, policy, workflowId, createdBy: user.userId });
            return { rollout: planned, alreadyRunning: false };
          });
        } catch (err) {
          // A concurrent deploy of the same version won the rollouts_one_active index: read it next time.
          if ((err as { code?: string }).code === '23505' && attempt < 2) continue;
          throw err;
        }
      }

      const start = { siteId, roostId, versionId: version.version_id, rolloutId: outcome.rollout.rolloutId };
      try {
        const started = await startRolloutWorkflow(temporal, cfg, start);
        reply.header('X-Roost-Workflow-Url', started.url);
      } catch (err) {
        if (outcome.alreadyRunning) {
          // The stored rollout stays authoritative; its workflow is re-attached on the next deploy call.
          request.log.warn({ err, workflowId }, 'could not re-attach the running rollout workflow');
          reply.header('X-Roost-Workflow-Url', workflowUiUrl(cfg, workflowId));
        } else {
          request.log.error({ err, workflowId }, 'rollout workflow start failed');
          await failUnstartedRollout(db, siteId, rolloutId, 'workflow_start_failed');
          throw new ApiError('service_unavailable', 'the rollout could not be started (workflow service unavailable); retry later', {
            headers: { 'Retry-After': '5' },
          });
        }
      }
      return reply.code(202).send(record(outcome.rollout, versionUrl, outcome.alreadyRunning, false, b.policy !== undefined));
    },
  );
}
