/**
 * Rollout use cases: deploy (`POST /api/roosts/{roostId}/deploy`), the rollout list and detail
 * (`GET /api/roosts/{roostId}/rollouts[/{rolloutId}]`), the control actions
 * (`POST /api/roosts/{roostId}/rollouts/{rolloutId}/{pause|resume|promote|abort}`) and the rollback of a
 * rollout (`POST /api/roosts/{roostId}/rollouts/{rolloutId}/rollback`). Each spans the database
 * (db/rollouts.ts, db/roosts.ts), blob storage (the version body) and Temporal (workflows/client.ts);
 * docs/decisions/deploy-request.md, docs/decisions/rollout-control.md.
 *
 * Functions take `ServiceDeps` (or a Pick of it) and a plain input, never a request; client-caused
 * failures are `ApiError`s. Authorisation and capability limits stay in the routes.
 */
import { ApiError, serviceUnavailable } from '../domain/errors';
import { LOST_START_AFTER_MS } from '../domain/outage';
import { newId } from '../domain/hex';
import { parseVersionRef, type VersionRef } from '../domain/versionRef';
import type { Rollout, RolloutMachine, RolloutMachineStatus, RolloutStage, WaveCounts, WavePlan } from '../domain/rollout';
import { type RolloutPolicy, planWaves, policyFromSpec, validatePolicy, waveNames } from '../domain/rollout-policy';
import { sumCounts } from '../domain/rollout';
import { getRoost, getVersion, resolveVersionIn, type RoostRow, type VersionRow, requireRoost } from '../db/roosts';
import { badVersionChunks } from '../db/chunks';
import { MAX_MISSING_CHUNKS } from '../domain/version';
import {
  type DeltaPlan,
  type RolloutListPosition,
  countsByRollout,
  countsByWave,
  createRollbackRollout,
  deltaPlan,
  failUnstartedRollout,
  findActiveRollout,
  activeRolloutsOfRoost,
  activeRolloutsOfDeletedRoosts,
  getRollout,
  insertRolloutUnlessActive,
  isActiveRolloutRace,
  listRolloutMachines,
  listRollouts,
  unknownMachines,
  unstartedRollouts,
} from '../db/rollouts';
import { type BlobStore, versionUrlOf } from '../storage/blob';
import {
  type RolloutControl,
  RolloutControlRefused,
  NoWorker,
  controlUpdateId,
  rolloutControlApplied,
  controlRollout,
  describeWorkflow,
  rolloutWorkflowId,
  startRolloutWorkflow,
  workflowUiUrl,
} from '../workflows/client';
import type { ServiceDeps } from './deps';

export type { RolloutControl, RolloutListPosition };

/** scheduleAt at most this far ahead counts as "now" (more than 60 seconds ahead is scheduled). */
export const SCHEDULE_THRESHOLD_MS = 60_000;
/** Latest accepted scheduleAt, relative to now (docs/decisions/deploy-request.md). */
export const SCHEDULE_MAX_AHEAD_MS = 365 * 24 * 60 * 60 * 1000;
/** Unknown machine ids named in a validation problem (the count is always given). */
export const MAX_UNKNOWN_LISTED = 100;

/** Where a use case reports failures it recovers from or turns into a 503 (Fastify's `request.log` fits). */
export interface RolloutLog {
  warn(obj: Record<string, unknown>, msg: string): void;
  error(obj: Record<string, unknown>, msg: string): void;
}

const silent: RolloutLog = { warn: () => undefined, error: () => undefined };

// ---------------------------------------------------------------------------------------------------
// Deploy

/** A deploy request, as validated by the route's schema (`policy` is checked here). */
export interface DeployInput {
  siteId: string;
  roostId: string;
  /** The deploying user (rollouts.created_by). */
  userId: string;
  /** Concrete version id (64 hex or legacy `vrs_<hex>`); default: the roost's current version. */
  versionId?: string;
  /** Machine ids (duplicates ignored); default: the roost's targets. */
  machines?: string[];
  /** ISO 8601 date-time with offset. */
  scheduleAt?: string;
  dryRun?: boolean;
  /** The raw `policy` object (domain/rollout-policy.ts validatePolicy). */
  policy?: unknown;
  log?: RolloutLog;
}

/** The rollout a deploy answers with: a stored rollout, or the plan of a new one. */
export type DeployedRollout = Pick<
  Rollout,
  'rolloutId' | 'versionId' | 'siteId' | 'roostId' | 'stage' | 'canary' | 'fleet' | 'extractRoot' | 'scheduleAt'
> & { waves?: WavePlan[]; policy?: RolloutPolicy };

/** What a deploy did. */
export interface DeployResult {
  rollout: DeployedRollout;
  /** Stable URL of the version body. */
  versionUrl: string;
  /** A non-terminal rollout of the same version existed: `rollout` is that one. */
  alreadyRunning: boolean;
  dryRun: boolean;
  /** The answer carries `waves` and `policy`: a deploy that sent a policy, or a dry run planning a new rollout. */
  withPlan: boolean;
  /** Dry run of a new rollout: what each machine would download (bytes, chunks). */
  delta?: DeltaPlan & { versionId: string };
  /** Temporal Web UI of the rollout's workflow (not on dry runs). */
  workflowUrl?: string;
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

/** scheduleAt → the stored schedule (null when past or within 60 s of `now`, epoch ms). @throws validation_failed. */
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

/** True when the version body blob exists. @throws 503 service_unavailable when blob storage fails. */
async function bodyStored(blob: BlobStore, v: VersionRow, log: RolloutLog): Promise<boolean> {
  try {
    return await blob.container('versions').getBlobClient(v.blob_name).exists();
  } catch (err) {
    log.error({ err }, 'version body check failed');
    throw serviceUnavailable('blob storage is unavailable; retry later');
  }
}

/** The version a deploy sends: `ref`'s, else the roost's current one. @throws 404/409 as the deploy route documents. */
async function deployVersion(deps: Pick<ServiceDeps, 'db'>, roost: RoostRow, ref: VersionRef | undefined): Promise<VersionRow> {
  if (ref) return resolveVersionIn(deps.db, roost, ref, 'versionId');
  const v = roost.current_version_id === null ? null : await getVersion(deps.db, roost.site_id, roost.roost_id, roost.current_version_id);
  if (!v) throw new ApiError('conflict', 'the roost has no current version; publish one or send versionId');
  return v;
}

/**
 * Plans a rollout of a version to machines, stores it and starts its workflow (or, with `dryRun`, only
 * plans it and adds the delta plan). A non-terminal rollout of the same (site, roost, version) is answered
 * as it is with `alreadyRunning` (its workflow re-attached with USE_EXISTING, which also heals a lost
 * start); a concurrent deploy of the same version is retried into that answer.
 * @throws ApiError validation_failed (versionId, scheduleAt, policy keyed by dotted path, unknown machines),
 *   not_found (roost), version_not_found, conflict (roost deleted, no current version, version body
 *   missing, chunks marked bad by verification: `badChunks`, up to 20; no targets, roost targets not enrolled), service_unavailable (blob storage, or the workflow
 *   could not start: the new rollout is then marked failed).
 */
export async function deployRollout(deps: ServiceDeps, input: DeployInput): Promise<DeployResult> {
  const { db, blob, temporal, cfg } = deps;
  const log = input.log ?? silent;
  const { siteId, roostId } = input;
  const ref = input.versionId !== undefined ? parseConcreteVersionId(input.versionId) : undefined;
  const scheduleAt = parseScheduleAt(input.scheduleAt, Date.now());
  const dryRun = input.dryRun === true;
  const withPolicy = input.policy !== undefined;
  const checked = validatePolicy(input.policy);
  if (checked.errors) {
    const first = Object.entries(checked.errors)[0];
    throw new ApiError('validation_failed', `${first[0]} ${first[1][0]}`, { extras: { param: 'policy', errors: checked.errors } });
  }

  const roost = await getRoost(db, siteId, roostId, { includeDeleted: true });
  if (!roost) throw new ApiError('not_found', 'roost not found', { extras: { param: 'roostId' } });
  if (roost.deleted_at !== null) throw new ApiError('conflict', 'the roost is deleted; deploy is not possible');
  const version = await deployVersion(deps, roost, ref);
  if (!(await bodyStored(blob, version, log)))
    throw new ApiError('conflict', `version ${version.version_id} has no stored body (no versionUrl); it cannot be deployed`);
  // Chunks whose stored bytes verification found wrong are never shipped (docs/decisions/chunk-integrity.md).
  const bad = await badVersionChunks(db, { siteId, roostId, versionId: version.version_id }, MAX_MISSING_CHUNKS);
  if (bad.length > 0)
    throw new ApiError(
      'conflict',
      `version ${version.version_id} references chunks whose stored bytes do not match their digest (first: ${bad[0]}); push the tree again to upload them, then deploy`,
      { extras: { badChunks: bad } },
    );
  const versionUrl = versionUrlOf(blob, version);

  const machines = input.machines ? [...new Set(input.machines)] : roost.targets;
  if (machines.length === 0) throw new ApiError('conflict', 'the roost has no targets; send machines');
  const unknown = await unknownMachines(db, siteId, machines);
  if (unknown.length > 0) throw unknownMachinesError(unknown, !input.machines);

  const rolloutId = newId('rol');
  const waveMachines = planWaves(rolloutId, machines, checked.spec);
  const names = waveNames(waveMachines.length);
  const workflowId = rolloutWorkflowId(siteId, roostId, version.version_id);
  const policy = policyFromSpec(checked.spec, cfg.ROOST_ROLLOUT_POLL_MS);
  const planned: DeployedRollout = {
    rolloutId,
    versionId: version.version_id,
    siteId,
    roostId,
    stage: 'canary',
    canary: waveMachines[0] ?? [],
    fleet: waveMachines.slice(1).flat(),
    extractRoot: roost.extract_path,
    scheduleAt,
    waves: waveMachines.map((w, i) => ({ name: names[i], size: w.length })),
    policy,
  };
  const answer = { versionUrl, dryRun };

  if (dryRun) {
    const existing = await findActiveRollout(db, siteId, roostId, version.version_id);
    // An existing rollout is reported as it is (its record only); a new plan carries waves, policy and the delta plan.
    if (existing) return { ...answer, rollout: existing, alreadyRunning: true, withPlan: withPolicy };
    const delta = await deltaPlan(db, siteId, roostId, version.version_id, machines);
    return { ...answer, rollout: planned, alreadyRunning: false, withPlan: true, delta: { versionId: version.version_id, ...delta } };
  }

  let stored: { rollout: DeployedRollout; alreadyRunning: boolean } | undefined;
  for (let attempt = 0; !stored; attempt++) {
    try {
      const existing = await insertRolloutUnlessActive(db, {
        siteId,
        rolloutId,
        roostId,
        versionId: version.version_id,
        canary: planned.canary,
        fleet: planned.fleet,
        extractRoot: roost.extract_path,
        policy,
        scheduleAt,
        workflowId,
        createdBy: input.userId,
        waves: waveMachines,
        waveNames: names,
      });
      stored = existing ? { rollout: existing, alreadyRunning: true } : { rollout: planned, alreadyRunning: false };
    } catch (err) {
      // A concurrent deploy of the same version won the rollouts_one_active index: read it next time.
      if (isActiveRolloutRace(err) && attempt < 2) continue;
      throw err;
    }
  }

  let workflowUrl: string;
  try {
    const started = await startRolloutWorkflow(temporal, cfg, {
      siteId,
      roostId,
      versionId: version.version_id,
      rolloutId: stored.rollout.rolloutId,
    });
    workflowUrl = started.url;
  } catch (err) {
    if (!stored.alreadyRunning) {
      log.error({ err, workflowId }, 'rollout workflow start failed');
      await failUnstartedRollout(db, siteId, rolloutId, 'workflow_start_failed');
      throw serviceUnavailable('the rollout could not be started (workflow service unavailable); retry later');
    }
    // The stored rollout stays authoritative; its workflow is re-attached on the next deploy call.
    log.warn({ err, workflowId }, 'could not re-attach the running rollout workflow');
    workflowUrl = workflowUiUrl(cfg, workflowId);
  }
  return { ...answer, ...stored, withPlan: withPolicy, workflowUrl };
}

// ---------------------------------------------------------------------------------------------------
// Rollouts as resources

/** A rollout with its machine counts and the Temporal Web UI of its workflow. */
export interface RolloutOverview {
  rollout: Rollout;
  /** Counts over every wave (every field present). */
  counts: WaveCounts;
  workflowUrl: string;
}

function overview(cfg: ServiceDeps['cfg'], rollout: Rollout, counts: WaveCounts | undefined): RolloutOverview {
  return { rollout, counts: sumCounts(counts ? [counts] : []), workflowUrl: workflowUiUrl(cfg, rollout.workflowId) };
}

/** The rollout of this site and roost. @throws 404 not_found (missing, or of another roost). */
async function requireRollout(deps: Pick<ServiceDeps, 'db'>, siteId: string, roostId: string, rolloutId: string): Promise<Rollout> {
  const r = await getRollout(deps.db, siteId, rolloutId);
  if (!r || r.roostId !== roostId) throw new ApiError('not_found', 'rollout not found', { extras: { param: 'rolloutId' } });
  return r;
}

async function overviewOf(deps: Pick<ServiceDeps, 'db' | 'cfg'>, r: Rollout): Promise<RolloutOverview> {
  return overview(deps.cfg, r, (await countsByRollout(deps.db, r.siteId, [r.rolloutId])).get(r.rolloutId));
}

/**
 * One page of a roost's rollouts, newest first (by created_at, then rollout id), optionally of one stage.
 * `next` is the position after the page, undefined on the last page.
 */
export async function listRolloutPage(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: { siteId: string; roostId: string; limit: number; after?: RolloutListPosition; stage?: RolloutStage },
): Promise<{ rollouts: RolloutOverview[]; next?: RolloutListPosition }> {
  // Like every roost route: a roost of another site, or a deleted one, is 404 not_found (not an empty list).
  await requireRoost(deps.db, input.siteId, input.roostId);
  const page = await listRollouts(deps.db, input.siteId, input.roostId, { limit: input.limit, after: input.after, stage: input.stage });
  const counts = await countsByRollout(
    deps.db,
    input.siteId,
    page.rows.map((r) => r.rolloutId),
  );
  const last = page.rows[page.rows.length - 1];
  return {
    rollouts: page.rows.map((r) => overview(deps.cfg, r, counts.get(r.rolloutId))),
    next: page.more && last ? { t: last.createdAt.toISOString(), id: last.rolloutId } : undefined,
  };
}

/** A rollout with its counts per wave name and one page of its machines (ordered by machine id). */
export interface RolloutDetail extends RolloutOverview {
  countsByWave: Map<string, WaveCounts>;
  machines: RolloutMachine[];
  /** Machine id after which the next page starts; undefined on the last page. */
  nextMachine?: string;
}

/**
 * The rollout `rolloutId` of the roost with its counts and one page of its machines after machine id
 * `after`, optionally filtered by status and wave name.
 * @throws ApiError not_found (missing, or of another roost).
 */
export async function getRolloutDetail(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: {
    siteId: string;
    roostId: string;
    rolloutId: string;
    limit: number;
    after?: string;
    status?: RolloutMachineStatus;
    wave?: string;
  },
): Promise<RolloutDetail> {
  const { siteId, rolloutId } = input;
  await requireRoost(deps.db, siteId, input.roostId);
  const r = await requireRollout(deps, siteId, input.roostId, rolloutId);
  const byWave = await countsByWave(deps.db, siteId, rolloutId, null);
  const page = await listRolloutMachines(deps.db, siteId, rolloutId, {
    limit: input.limit,
    after: input.after,
    status: input.status,
    wave: input.wave,
  });
  const last = page.rows[page.rows.length - 1];
  return {
    ...overview(deps.cfg, r, sumCounts(byWave.values())),
    countsByWave: byWave,
    machines: page.rows,
    nextMachine: page.more && last ? last.machineId : undefined,
  };
}

// ---------------------------------------------------------------------------------------------------
// Control and rollback

/** A control action on a rollout: who asks, and why (optional, kept in the rollout history). */
export interface ControlInput {
  siteId: string;
  roostId: string;
  rolloutId: string;
  action: RolloutControl;
  by: string;
  reason?: string;
  log?: RolloutLog;
  /**
   * The request's Idempotency-Key: the Temporal update id derives from it (workflows/client.ts
   * `controlUpdateId`), so a retry of a control that timed out waiting for a worker gets that update's
   * outcome instead of sending a second one.
   */
  idempotencyKey?: string;
}

/**
 * Sends the control update `action` to the rollout's running workflow and answers the rollout as stored
 * after it.
 * @throws ApiError not_found (rollout), conflict (the rollout has ended, or the workflow refused: extras
 *   `state` and `stage`), service_unavailable (workflow service unavailable; no worker polls the task queue,
 *   so nothing was sent; or no worker accepted the update within CONTROL_UPDATE_WAIT_MS).
 */
export async function controlRolloutAction(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'temporal'>,
  input: ControlInput,
): Promise<RolloutOverview> {
  const { siteId, roostId, rolloutId, action } = input;
  // Like every roost route: the rollouts of a deleted roost are 404 (deleting it aborted them: `abortRoostRollouts`).
  await requireRoost(deps.db, siteId, roostId);
  const r = await requireRollout(deps, siteId, roostId, rolloutId);
  const updateId = input.idempotencyKey ? controlUpdateId(input.by, rolloutId, action, input.idempotencyKey) : undefined;
  try {
    if (!r.active) {
      // The retry of a control (same Idempotency-Key) whose update a worker applied after its 503, and
      // which ended the rollout (abort): that update's outcome, not a refusal. Best effort: when Temporal
      // cannot say, the stored state answers (409) as it did before.
      const applied = updateId ? await rolloutControlApplied(deps.temporal, r.workflowId, updateId).catch(() => false) : false;
      if (applied) return overviewOf(deps, r);
      throw new ApiError('conflict', `the rollout has ended (stage ${r.stage}, state ${r.state}); ${action} is not possible`, {
        extras: { state: r.state, stage: r.stage },
      });
    }
    await controlRollout(
      deps.temporal,
      r.workflowId,
      r.rolloutId,
      action,
      { by: input.by, ...(input.reason ? { reason: input.reason } : {}) },
      updateId ? { updateId } : {},
    );
  } catch (err) {
    if (err instanceof ApiError) throw err;
    if (err instanceof NoWorker) {
      throw serviceUnavailable(err.detail('rollouts', action));
    }
    if (err instanceof RolloutControlRefused) {
      const now = await requireRollout(deps, siteId, roostId, rolloutId);
      throw new ApiError('conflict', `${action} refused: ${err.message}`, { extras: { state: now.state, stage: now.stage } });
    }
    (input.log ?? silent).error({ err }, 'rollout control failed');
    throw serviceUnavailable('the workflow service is unavailable; retry later');
  }
  return overviewOf(deps, await requireRollout(deps, siteId, roostId, rolloutId));
}

/**
 * Aborts every non-terminal rollout of a roost that was just deleted (`DELETE /api/roosts/{roostId}`), through
 * each workflow's abort update, so a rollout waiting for promotion, a window or its schedule ends instead of
 * waiting unseen (its routes are 404 once the roost is deleted). Best effort: a rollout whose abort cannot be
 * sent now (no worker, Temporal unavailable) is logged and left; it fails `roost_deleted` when its next wave
 * starts, and a repeated delete tries it again. Returns the ids aborted.
 */
export async function abortRoostRollouts(
  deps: Pick<ServiceDeps, 'db' | 'temporal'>,
  input: { siteId: string; roostId: string; by: string; log?: RolloutLog },
): Promise<string[]> {
  const aborted: string[] = [];
  for (const r of await activeRolloutsOfRoost(deps.db, input.siteId, input.roostId)) {
    try {
      if (await abortForDeletedRoost(deps, r, input.by)) aborted.push(r.rolloutId);
    } catch (err) {
      (input.log ?? silent).warn({ err, rolloutId: r.rolloutId }, 'rollout of a deleted roost not aborted');
    }
  }
  return aborted;
}

/**
 * Sends the abort of a rollout whose roost was deleted; false when there was nothing to abort (the workflow
 * closed, or it refused: it is ending). @throws NoWorker and Temporal client errors
 */
async function abortForDeletedRoost(deps: Pick<ServiceDeps, 'temporal'>, r: Rollout, by: string): Promise<boolean> {
  try {
    await controlRollout(deps.temporal, r.workflowId, r.rolloutId, 'abort', { by, reason: 'the roost was deleted' });
    return true;
  } catch (err) {
    if (err instanceof RolloutControlRefused) return false;
    throw err;
  }
}

/** Who the API's pass names as the sender of an abort it sends for a deleted roost (`abortDeletedRoostRollouts`). */
export const DELETED_ROOST_ABORT_BY = 'system';

/**
 * Aborts the rollouts still running for roosts deleted at least `deletedBeforeMs` ago (default one minute):
 * a `DELETE /api/roosts/{roostId}` aborts them itself, best effort, so one sent during a Temporal outage left
 * a rollout waiting for a promotion nobody can send (its routes are 404). Run by the API's periodic pass
 * (api/lost-starts.ts); the abort's `by` is DELETED_ROOST_ABORT_BY. Returns the rollout ids aborted.
 * @throws NoWorker, Temporal client errors (the rest of the pass is left for the next)
 */
export async function abortDeletedRoostRollouts(
  deps: Pick<ServiceDeps, 'db' | 'temporal'>,
  opts: { deletedBeforeMs?: number; limit?: number; log?: RolloutLog } = {},
): Promise<string[]> {
  const aborted: string[] = [];
  for (const r of await activeRolloutsOfDeletedRoosts(deps.db, opts.deletedBeforeMs ?? 60_000, opts.limit ?? 100)) {
    if (!(await abortForDeletedRoost(deps, r, DELETED_ROOST_ABORT_BY))) continue;
    (opts.log ?? silent).warn({ siteId: r.siteId, rolloutId: r.rolloutId }, 'rollout of a deleted roost aborted by the periodic pass');
    aborted.push(r.rolloutId);
  }
  return aborted;
}

/** Why a rollback is refused, as the problem detail says it. */
const ROLLBACK_REFUSED: Record<string, string> = {
  not_found: 'rollout not found',
  not_terminal: 'the rollout is still running; abort it first',
  completed: 'the rollout completed; deploy the version you want instead',
  already_rolled_back: 'the rollout was already rolled back',
  is_rollback: 'a rollback rollout cannot be rolled back; deploy the version you want instead',
  nothing_to_roll_back: 'no machine of the rollout switched to its version from a previous one',
  version_busy: 'another rollout of the previous version is running',
};

/**
 * Rolls back a failed or aborted rollout: its switched machines return to their previous versions as a
 * new rollout in one wave (db/rollouts.ts createRollbackRollout), whose workflow is started here.
 * Answers the new rollout and `runUrl`, the Web UI link of the run just started.
 * @throws ApiError not_found (rollout), conflict (already rolled back, still running, completed, is a
 *   rollback, nothing to roll back, previous version busy; extras `reason` or `rollbackRolloutId`),
 *   service_unavailable (the rollback's workflow could not start: it is then marked failed).
 */
export async function rollbackRollout(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'temporal'>,
  input: { siteId: string; roostId: string; rolloutId: string; by: string; log?: RolloutLog },
): Promise<RolloutOverview & { runUrl: string }> {
  const { siteId, roostId, rolloutId } = input;
  await requireRoost(deps.db, siteId, roostId);
  const r = await requireRollout(deps, siteId, roostId, rolloutId);
  if (r.rolledBackBy)
    throw new ApiError('conflict', 'the rollout was already rolled back', { extras: { rollbackRolloutId: r.rolledBackBy } });
  const out = await createRollbackRollout(deps.db, siteId, rolloutId, input.by);
  if (typeof out === 'string') {
    if (out === 'not_found') throw new ApiError('not_found', ROLLBACK_REFUSED[out], { extras: { param: 'rolloutId' } });
    throw new ApiError('conflict', ROLLBACK_REFUSED[out], { extras: { reason: out } });
  }
  // A concurrent request (or the workflow's automatic rollback) created it first: the same answer as
  // when it is found above.
  if (!out.created)
    throw new ApiError('conflict', 'the rollout was already rolled back', { extras: { rollbackRolloutId: out.rollout.rolloutId } });
  const rb = out.rollout;
  let runUrl: string;
  try {
    const started = await startRolloutWorkflow(deps.temporal, deps.cfg, {
      siteId,
      roostId,
      versionId: rb.versionId,
      rolloutId: rb.rolloutId,
      workflowId: rb.workflowId,
    });
    runUrl = started.url;
  } catch (err) {
    (input.log ?? silent).error({ err }, 'rollback workflow start failed');
    await failUnstartedRollout(deps.db, siteId, rb.rolloutId, 'workflow_start_failed');
    throw serviceUnavailable('the rollback could not be started (workflow service unavailable); retry later');
  }
  return { ...(await overviewOf(deps, rb)), runUrl };
}

/**
 * Fails (`workflow_start_failed`, as the deploy itself does when the start fails) each active rollout whose
 * workflow was never started: its API process died between committing the row and starting the workflow
 * (a kill while Temporal was down). Such a rollout would otherwise stay `running` with nothing behind it,
 * refusing pause and abort. Candidates come from db/rollouts.ts `unstartedRollouts` (older than
 * LOST_START_AFTER_MS, nothing dispatched); a candidate whose workflow id has a run for this rollout (memo
 * `rolloutId`; a scheduled rollout waiting, say) is left alone. Idempotent; run periodically by the API
 * (api/plugins/lost-starts.ts). Returns the rollout ids failed.
 * @throws Temporal client errors when Temporal cannot answer (nothing is changed for the rest of the pass)
 */
export async function failLostRolloutStarts(
  deps: Pick<ServiceDeps, 'db' | 'temporal'>,
  opts: { olderThanMs?: number; limit?: number; log?: RolloutLog } = {},
): Promise<string[]> {
  const failed: string[] = [];
  for (const r of await unstartedRollouts(deps.db, opts.olderThanMs ?? LOST_START_AFTER_MS, opts.limit ?? 100)) {
    const run = await describeWorkflow(deps.temporal, r.workflowId);
    if (run && run.memo?.rolloutId === r.rolloutId) continue;
    await failUnstartedRollout(deps.db, r.siteId, r.rolloutId, 'workflow_start_failed');
    (opts.log ?? silent).warn(
      { siteId: r.siteId, rolloutId: r.rolloutId, workflowId: r.workflowId },
      'rollout whose workflow never started marked failed',
    );
    failed.push(r.rolloutId);
  }
  return failed;
}
