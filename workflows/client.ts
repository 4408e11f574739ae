/**
 * The Temporal client side of roost workflows, beside the workflows it drives: workflow ids derived from
 * business keys, the search attributes workflows start with, the starters, and the control updates sent by
 * their definitions (imported from workflows/rollout.ts, never by string name). Services
 * (services/rollouts.ts), launchers and tests use this module; workflow code never imports it.
 *
 * A rollout's workflow id is derived from (site, roost, version) and the workflow is started with the
 * USE_EXISTING conflict policy, so a second start for the same version attaches to the running workflow
 * instead of starting another (`alreadyRunning` of `POST /api/roosts/{roostId}/deploy`;
 * docs/decisions/rollout-workflow-ids.md). Errors are classified by their classes and failure types, never
 * by message text.
 */
import {
  type Client,
  type Connection,
  WithStartWorkflowOperation,
  WorkflowNotFoundError,
  WorkflowUpdateFailedError,
  WorkflowUpdateRPCTimeoutOrCancelledError,
} from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import { sha256Hex } from '../domain/hex';
import { temporal as temporalProto } from '@temporalio/proto';
import type { Config } from '../config/env';
import { versionVerifyWorkflowId } from '../domain/chunks';
import { rollbackWorkflowId, rolloutWorkflowId } from '../domain/rollout';
import { type ClassicAction, type ClassicActionResult, classicDeploymentWorkflowId } from '../domain/classic';
import {
  CLASSIC_CONFLICT,
  CLASSIC_IN_FLIGHT,
  type ClassicControlArgs,
  cancelUpdate,
  classicDeploymentWorkflow,
  retryUpdate,
  uninstallUpdate,
} from './classic-deployment';
import {
  CONTROL_CONFLICT,
  type ControlArgs,
  type ControlResult,
  type RolloutRuntime,
  abortUpdate,
  pauseUpdate,
  promoteUpdate,
  resumeUpdate,
  rolloutWorkflow,
  statusQuery,
} from './rollout';
import {
  ROOST_SEARCH_ATTRIBUTES,
  ROOST_SEARCH_ATTRIBUTE_KEYS,
  RoostRoostId,
  RoostSiteId,
  RoostInstallerVersion,
  RoostUserId,
  RoostVersionId,
  classicDeploymentSearchAttributes,
  rolloutSearchAttributes,
} from './search-attributes';
import { type InstallerFinalizeOutcome, installerFinalizeWorkflow } from './installer-finalize';
import { type UserDeleteOutcome, userDeleteWorkflow } from './user-delete';
import { type VersionVerifyInput, versionVerifyWorkflow } from './verify';

export {
  classicDeploymentWorkflowId,
  rollbackWorkflowId,
  rolloutWorkflowId,
  versionVerifyWorkflowId,
  ROOST_SEARCH_ATTRIBUTES,
  ROOST_SEARCH_ATTRIBUTE_KEYS,
};
export type { ClassicAction, ClassicActionResult, ClassicControlArgs };
export type { ControlArgs, ControlResult, InstallerFinalizeOutcome, RolloutRuntime, UserDeleteOutcome };

/** Temporal Web UI page of a workflow run (history view); the latest run when `runId` is omitted. */
export function workflowUiUrl(cfg: Pick<Config, 'temporalUiUrl' | 'TEMPORAL_NAMESPACE'>, workflowId: string, runId?: string): string {
  const base = `${cfg.temporalUiUrl.replace(/\/+$/, '')}/namespaces/${encodeURIComponent(cfg.TEMPORAL_NAMESPACE)}/workflows/${encodeURIComponent(workflowId)}`;
  return runId ? `${base}/${encodeURIComponent(runId)}/history` : base;
}

/** The ids and business keys of a rollout to start. */
export interface RolloutStartRequest {
  siteId: string;
  roostId: string;
  versionId: string;
  rolloutId: string;
  /** Workflow id to use (default `rolloutWorkflowId`; rollback rollouts use `rollbackWorkflowId`). */
  workflowId?: string;
}

/** A started (or already running) rollout workflow. */
export interface StartedWorkflow {
  workflowId: string;
  runId: string;
  /** Web UI link to the run. */
  url: string;
}

/** Raised when the rollout's workflow id stays held by a run of a different (finished) rollout. */
export class WorkflowIdBusyError extends Error {
  constructor(readonly workflowId: string) {
    super(`workflow ${workflowId} is still held by a previous rollout's run`);
    this.name = 'WorkflowIdBusyError';
  }
}

/**
 * Starts `rolloutWorkflow` (input ids only; memo `rolloutId`; search attributes RoostSiteId, RoostRoostId,
 * RoostVersionId, RoostStage=canary) on `taskQueue` (default cfg.ROOST_TASK_QUEUE) with
 * WorkflowIdConflictPolicy USE_EXISTING. Safe to call again for the same rollout: it attaches to the
 * running workflow. When the id is still held by the run of an earlier rollout of the same version (which
 * finished in the database and is returning), waits up to `waitMs` (default 2 s) for that run to close and
 * tries again (three tries in all).
 * @throws WorkflowIdBusyError when the earlier run does not close in time; Temporal client errors when the
 *   service is unavailable.
 */
export async function startRolloutWorkflow(
  client: Client,
  cfg: Pick<Config, 'ROOST_TASK_QUEUE' | 'temporalUiUrl' | 'TEMPORAL_NAMESPACE'>,
  r: RolloutStartRequest,
  opts: { taskQueue?: string; waitMs?: number } = {},
): Promise<StartedWorkflow> {
  const workflowId = r.workflowId ?? rolloutWorkflowId(r.siteId, r.roostId, r.versionId);
  const waitMs = opts.waitMs ?? 2_000;
  for (let attempt = 0; attempt < 3; attempt++) {
    const handle = await client.workflow.start(rolloutWorkflow, {
      taskQueue: opts.taskQueue ?? cfg.ROOST_TASK_QUEUE,
      workflowId,
      args: [{ siteId: r.siteId, rolloutId: r.rolloutId }],
      workflowIdConflictPolicy: 'USE_EXISTING',
      memo: { rolloutId: r.rolloutId },
      typedSearchAttributes: rolloutSearchAttributes({ siteId: r.siteId, roostId: r.roostId, versionId: r.versionId, stage: 'canary' }),
    });
    const runId = handle.firstExecutionRunId;
    const desc = await handle.describe();
    if (desc.memo?.rolloutId === r.rolloutId) {
      return { workflowId, runId, url: workflowUiUrl(cfg, workflowId, runId) };
    }
    // The id belongs to another rollout's run that is finishing: wait for it to close, then start ours.
    if (attempt === 2) break;
    const previous = client.workflow.getHandle(workflowId, runId);
    await Promise.race([previous.result().catch(() => undefined), delay(waitMs)]);
  }
  throw new WorkflowIdBusyError(workflowId);
}

/**
 * Starts `versionVerifyWorkflow` for a newly published version (workflow id `versionVerifyWorkflowId`,
 * search attributes RoostSiteId, RoostRoostId, RoostVersionId) on cfg.ROOST_TASK_QUEUE, with
 * WorkflowIdConflictPolicy USE_EXISTING: a second start while it runs attaches to it; one after it
 * finished runs again (only chunks still unverified cost anything).
 * @throws Temporal client errors when the service is unavailable.
 */
export async function startVersionVerification(
  client: Client,
  cfg: Pick<Config, 'ROOST_TASK_QUEUE' | 'temporalUiUrl' | 'TEMPORAL_NAMESPACE'>,
  v: VersionVerifyInput,
): Promise<StartedWorkflow> {
  const workflowId = versionVerifyWorkflowId(v.siteId, v.roostId, v.versionId);
  const handle = await client.workflow.start(versionVerifyWorkflow, {
    taskQueue: cfg.ROOST_TASK_QUEUE,
    workflowId,
    args: [{ siteId: v.siteId, roostId: v.roostId, versionId: v.versionId }],
    workflowIdConflictPolicy: 'USE_EXISTING',
    typedSearchAttributes: [
      { key: RoostSiteId, value: v.siteId },
      { key: RoostRoostId, value: v.roostId },
      { key: RoostVersionId, value: v.versionId },
    ],
  });
  return { workflowId, runId: handle.firstExecutionRunId, url: workflowUiUrl(cfg, workflowId, handle.firstExecutionRunId) };
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

/** Status of a workflow run, or null when no workflow has that id. */
export interface WorkflowStatusView {
  workflowId: string;
  runId: string;
  /** Temporal's execution status name (RUNNING, COMPLETED, FAILED, …). */
  status: string;
  historyLength: number;
  memo: Record<string, unknown> | undefined;
}

/** Describes the latest run of `workflowId` (null when none exists). @throws Temporal client errors otherwise. */
export async function describeWorkflow(client: Client, workflowId: string): Promise<WorkflowStatusView | null> {
  try {
    const d = await client.workflow.getHandle(workflowId).describe();
    return { workflowId, runId: d.runId, status: d.status.name, historyLength: d.historyLength, memo: d.memo };
  } catch (err) {
    if (err instanceof WorkflowNotFoundError) return null;
    throw err;
  }
}

/** Control actions of a running rollout, each sent as the update of the same name (workflows/rollout.ts). */
export type RolloutControl = 'pause' | 'resume' | 'promote' | 'abort';

/** The update definition of each control action. */
const CONTROL_UPDATES = { pause: pauseUpdate, resume: resumeUpdate, promote: promoteUpdate, abort: abortUpdate } as const;

/** Why a control update was refused. */
export class RolloutControlRefused extends Error {
  constructor(
    message: string,
    /** `conflict`: the workflow's validator refused; `closed`: no running workflow for the rollout. */
    readonly reason: 'conflict' | 'closed',
  ) {
    super(message);
    this.name = 'RolloutControlRefused';
  }
}

const NO_RUNNING_WORKFLOW = 'the rollout has no running workflow';

/**
 * How long (ms) a control update waits for a rollout whose workflow has just started: it registers its
 * control handlers once its plan is loaded (workflows/rollout.ts `controlledRollout`), and an update that
 * reaches it before is rejected as having no handler, not as a refusal.
 */
export const CONTROL_HANDLERS_WAIT_MS = 15_000;

/**
 * The Temporal update id of a control request: a rollout's (`POST …/rollouts/{rolloutId}/{action}`) or a
 * classic deployment's (`POST …/deployments/{deploymentId}/{action}`). The same user, subject, action and
 * Idempotency-Key give the same id, so a retry of a control whose first attempt timed out waiting for a
 * worker gets that update's outcome rather than a second update (`controlRollout`,
 * `controlClassicDeployment`, `classicControlOutcome`). `control-` + 32 hex of SHA-256.
 */
export function controlUpdateId(userId: string, subjectId: string, action: string, idempotencyKey: string): string {
  return `control-${sha256Hex(JSON.stringify([userId, subjectId, action, idempotencyKey])).slice(0, 32)}`;
}

/** How long (ms) a control update waits for a worker to accept it before the API answers 503. */
export const CONTROL_UPDATE_WAIT_MS = 15_000;
/** A workflow poller seen on the task queue within this many ms counts as a running worker (a long poll lasts ≤ ~70 s). */
export const WORKER_POLLER_FRESH_MS = 90_000;

/**
 * No worker takes a control update (a rollout's or a classic deployment's). `none`: no worker polled the task queue within
 * WORKER_POLLER_FRESH_MS, so nothing was sent. `timeout`: the update was sent and no worker accepted it within
 * CONTROL_UPDATE_WAIT_MS; it is applied when a worker takes it.
 */
export class NoWorker extends Error {
  constructor(
    readonly reason: 'none' | 'timeout',
    taskQueue: string,
  ) {
    super(
      reason === 'none'
        ? `no worker polls task queue ${taskQueue}: nothing was sent`
        : `no worker accepted the update within ${CONTROL_UPDATE_WAIT_MS} ms`,
    );
    this.name = 'NoWorker';
  }

  /**
   * The 503's detail for control `action` of `family` (`rollouts`, `deployments`): nothing sent, retry once a
   * worker runs; or sent and applied when a worker takes it, so retry with the same Idempotency-Key.
   */
  detail(family: string, action: string): string {
    return this.reason === 'none'
      ? `no worker is running for ${family}, so ${action} was not sent; retry once a worker runs`
      : `no worker took ${action} within ${CONTROL_UPDATE_WAIT_MS / 1000} s; it is applied when a worker takes it: retry with the same Idempotency-Key for its outcome`;
  }
}

/** Whether a worker has polled `taskQueue` for workflow tasks within WORKER_POLLER_FRESH_MS (DescribeTaskQueue). */
async function workerPolling(client: Client, taskQueue: string): Promise<boolean> {
  const res = await client.workflowService.describeTaskQueue({
    namespace: client.options.namespace,
    taskQueue: { name: taskQueue, kind: temporalProto.api.enums.v1.TaskQueueKind.TASK_QUEUE_KIND_NORMAL },
    taskQueueType: temporalProto.api.enums.v1.TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
  });
  const now = Date.now();
  return (res.pollers ?? []).some((p) => {
    const t = p.lastAccessTime;
    const ms = t ? Number(t.seconds ?? 0) * 1000 + Math.floor((t.nanos ?? 0) / 1e6) : 0;
    return now - ms <= WORKER_POLLER_FRESH_MS;
  });
}

/** gRPC status codes read from Temporal's service errors. */
const GRPC_DEADLINE_EXCEEDED = 4;
const GRPC_NOT_FOUND = 5;

/** The gRPC status code anywhere in `err`'s cause chain (a service error carries `code` and `metadata`); undefined when none. */
function grpcCode(err: unknown): number | undefined {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined, i = 0; e && i < 5; e = e.cause as typeof e, i++) {
    if (typeof e.code === 'number' && 'metadata' in e) return e.code;
  }
  return undefined;
}

/**
 * Runs the update call `fn` bounded by CONTROL_UPDATE_WAIT_MS (only a worker accepts an update: a worker lost
 * after the poller check is then a clear failure, not a request held open; the update stays with the
 * workflow and is applied when a worker takes it).
 * @throws NoWorker `timeout` when the bound ended the call: a gRPC DEADLINE_EXCEEDED in the cause chain, the
 *   SDK's WorkflowUpdateRPCTimeoutOrCancelledError, or any failure that arrives once the bound has passed
 *   (under load the server's answer to the expiring call can race the client's deadline: the server logged
 *   a 15.0 s UpdateWorkflowExecution while the client saw an error other than DEADLINE_EXCEEDED); the
 *   call's own error otherwise.
 */
async function boundedUpdate<T>(client: Client, fn: () => Promise<T>): Promise<T> {
  const until = Date.now() + CONTROL_UPDATE_WAIT_MS;
  try {
    return await client.connection.withDeadline(until, fn);
  } catch (err) {
    if (updateCallTimedOut(err, until, Date.now())) throw new NoWorker('timeout', '');
    throw err;
  }
}

/**
 * Whether the failure `err` of an update call bounded at `until` (epoch ms), seen at `now` (epoch ms), is the
 * bound ending it (`boundedUpdate`).
 */
export function updateCallTimedOut(err: unknown, until: number, now: number): boolean {
  return err instanceof WorkflowUpdateRPCTimeoutOrCancelledError || grpcCode(err) === GRPC_DEADLINE_EXCEEDED || now >= until;
}

/** The rejection of an update that reached the workflow before it registered a handler for it. */
function beforeHandlers(err: unknown): boolean {
  return err instanceof WorkflowUpdateFailedError && /No registered handler for update/.test(err.cause?.message ?? '');
}

/**
 * Sends control update `action` to the running rollout workflow `workflowId` (the run whose memo names
 * `rolloutId`) and returns its answer.
 * An update that arrives before the workflow registered its handlers (right after the deploy) is sent
 * again, backing off from 50 ms to 1 s, for up to CONTROL_HANDLERS_WAIT_MS.
 * @throws RolloutControlRefused (`conflict` when the validator refused, with its message, or the update
 *   failed otherwise; `closed` when the workflow is not running or belongs to another rollout); Temporal
 *   client errors otherwise (service unavailable, update call timed out), and an Error when the handlers
 *   were still not registered at the end of the wait (the caller answers it as unavailable: retry later).
 */
export async function controlRollout(
  client: Client,
  workflowId: string,
  rolloutId: string,
  action: RolloutControl,
  args: ControlArgs,
  opts: { updateId?: string } = {},
): Promise<ControlResult> {
  const handle = client.workflow.getHandle(workflowId);
  const deadline = Date.now() + CONTROL_HANDLERS_WAIT_MS;
  for (let backoff = 50; ; backoff = Math.min(backoff * 2, 1000)) {
    try {
      const d = await handle.describe();
      if (d.status.name !== 'RUNNING' || d.memo?.rolloutId !== rolloutId) throw new RolloutControlRefused(NO_RUNNING_WORKFLOW, 'closed');
      if (!(await workerPolling(client, d.taskQueue))) throw new NoWorker('none', d.taskQueue);
      // Bounded (a retry with the same updateId gets the outcome of the update handed over, instead of
      // applying it again).
      return await boundedUpdate(client, () =>
        handle.executeUpdate(CONTROL_UPDATES[action], { args: [args], ...(opts.updateId ? { updateId: opts.updateId } : {}) }),
      );
    } catch (err) {
      if (err instanceof NoWorker) throw err;
      if (!beforeHandlers(err)) throw controlFailure(err);
      if (Date.now() + backoff > deadline)
        throw new Error(`the rollout's workflow did not take control updates within ${CONTROL_HANDLERS_WAIT_MS} ms`);
      await new Promise((r) => setTimeout(r, backoff));
    }
  }
}

/** What a failed control update means for the caller (controlRollout). */
function controlFailure(err: unknown): unknown {
  if (err instanceof RolloutControlRefused) return err;
  // The workflow closed before the update was admitted: the service answers NOT_FOUND.
  if (err instanceof WorkflowNotFoundError) return new RolloutControlRefused(NO_RUNNING_WORKFLOW, 'closed');
  if (err instanceof WorkflowUpdateFailedError) {
    const cause = err.cause;
    if (cause instanceof ApplicationFailure && cause.type === CONTROL_CONFLICT) return new RolloutControlRefused(cause.message, 'conflict');
    return new RolloutControlRefused(cause?.message ?? 'the update failed', 'conflict');
  }
  return err;
}

/** The `status` query of a running rollout workflow: its control state and what it waits for. */
export async function rolloutRuntime(client: Client, workflowId: string): Promise<RolloutRuntime> {
  return client.workflow.getHandle(workflowId).query(statusQuery);
}

// ---------------------------------------------------------------------------------------------------
// Classic deployments (workflows/classic-deployment.ts): not roost rollouts; nothing above is shared.

/**
 * Starts `classicDeploymentWorkflow` for a deployment (input ids only; memo `deploymentId`; search
 * attributes RoostSiteId, RoostDeploymentId, RoostDeploymentStatus=pending) with WorkflowIdConflictPolicy
 * USE_EXISTING: a repeated start attaches to the running workflow.
 * @throws Temporal client errors when the service is unavailable.
 */
export async function startClassicDeploymentWorkflow(
  client: Client,
  cfg: Pick<Config, 'ROOST_TASK_QUEUE' | 'temporalUiUrl' | 'TEMPORAL_NAMESPACE'>,
  r: { siteId: string; deploymentId: string },
): Promise<StartedWorkflow> {
  const workflowId = classicDeploymentWorkflowId(r.siteId, r.deploymentId);
  const handle = await client.workflow.start(classicDeploymentWorkflow, classicStartOptions(cfg, r, workflowId));
  return { workflowId, runId: handle.firstExecutionRunId, url: workflowUiUrl(cfg, workflowId, handle.firstExecutionRunId) };
}

function classicStartOptions(cfg: Pick<Config, 'ROOST_TASK_QUEUE'>, r: { siteId: string; deploymentId: string }, workflowId: string) {
  return {
    taskQueue: cfg.ROOST_TASK_QUEUE,
    workflowId,
    args: [{ siteId: r.siteId, deploymentId: r.deploymentId }] as [{ siteId: string; deploymentId: string }],
    workflowIdConflictPolicy: 'USE_EXISTING' as const,
    memo: { deploymentId: r.deploymentId },
    typedSearchAttributes: classicDeploymentSearchAttributes({ siteId: r.siteId, deploymentId: r.deploymentId, status: 'pending' }),
  };
}

/**
 * Why a classic deployment control action was refused (the workflow's handler said so; nothing changed);
 * `code` 'deployment_in_flight' when an uninstall met a deployment that has not ended.
 */
export class ClassicControlRefused extends Error {
  constructor(
    message: string,
    readonly code?: 'deployment_in_flight',
  ) {
    super(message);
    this.name = 'ClassicControlRefused';
  }
}

const CLASSIC_UPDATES = { retry: retryUpdate, cancel: cancelUpdate, uninstall: uninstallUpdate } as const;

/**
 * Sends control update `action` to the deployment's workflow through update-with-start: the running
 * workflow gets the update; a finished deployment gets a new run (USE_EXISTING, same workflow id) that
 * applies it first. Returns the handler's answer. With `updateId` (workflows/client.ts `controlUpdateId`)
 * a second call with the same id gets the first one's outcome from the running workflow.
 * @throws ClassicControlRefused when the handler refused (nothing changed); NoWorker `none` when no worker
 *   polled the task queue within WORKER_POLLER_FRESH_MS (nothing sent), `timeout` when the update was sent
 *   and no worker accepted it within CONTROL_UPDATE_WAIT_MS (it is applied when a worker takes it);
 *   Temporal client errors otherwise.
 */
export async function controlClassicDeployment(
  client: Client,
  cfg: Pick<Config, 'ROOST_TASK_QUEUE'>,
  r: { siteId: string; deploymentId: string },
  action: ClassicAction,
  args: ClassicControlArgs,
  opts: { updateId?: string } = {},
): Promise<Exclude<ClassicActionResult, { refused: string }>> {
  const workflowId = classicDeploymentWorkflowId(r.siteId, r.deploymentId);
  // With no worker the update would wait for one with the request held open: send nothing then.
  if (!(await workerPolling(client, cfg.ROOST_TASK_QUEUE))) throw new NoWorker('none', cfg.ROOST_TASK_QUEUE);
  for (let attempt = 0; ; attempt++) {
    const op = new WithStartWorkflowOperation(classicDeploymentWorkflow, classicStartOptions(cfg, r, workflowId));
    try {
      // Bounded like a rollout's control (`controlRollout`).
      const out = await boundedUpdate(client, () =>
        client.workflow.executeUpdateWithStart(CLASSIC_UPDATES[action], {
          args: [args],
          startWorkflowOperation: op,
          ...(opts.updateId ? { updateId: opts.updateId } : {}),
        }),
      );
      return classicAnswer(out);
    } catch (err) {
      if (err instanceof WorkflowUpdateFailedError) {
        const refused = classicRefusal(err);
        if (refused) throw refused;
        // The run completed between admission and handling: the next attempt starts a new run.
        if (attempt < 2) continue;
        throw new ClassicControlRefused(err.cause?.message ?? 'the update failed');
      }
      throw err;
    }
  }
}

/**
 * The result of update `updateId` sent earlier to workflow `workflowId` (its current run), when that run
 * knows it: a control retried after a 503 whose update a worker applied later. undefined when it does not
 * (no such update, no such workflow).
 * @throws NoWorker `timeout` when the update still waits for a worker after CONTROL_UPDATE_WAIT_MS;
 *   WorkflowUpdateFailedError when it failed; Temporal client errors otherwise.
 */
export async function earlierUpdateOutcome<R>(client: Client, workflowId: string, updateId: string): Promise<R | undefined> {
  const handle = client.workflow.getHandle(workflowId);
  try {
    return await boundedUpdate(client, () => handle.getUpdateHandle<R>(updateId).result());
  } catch (err) {
    if (err instanceof WorkflowNotFoundError || grpcCode(err) === GRPC_NOT_FOUND) return undefined;
    throw err;
  }
}

/**
 * The outcome of the classic control update `updateId` sent earlier to the deployment's workflow
 * (`earlierUpdateOutcome`); undefined when it knows none.
 * @throws ClassicControlRefused when that update was refused; NoWorker `timeout`; Temporal client errors.
 */
export async function classicControlOutcome(
  client: Client,
  r: { siteId: string; deploymentId: string },
  updateId: string,
): Promise<Exclude<ClassicActionResult, { refused: string }> | undefined> {
  try {
    const out = await earlierUpdateOutcome<ClassicActionResult>(client, classicDeploymentWorkflowId(r.siteId, r.deploymentId), updateId);
    return out === undefined ? undefined : classicAnswer(out);
  } catch (err) {
    if (err instanceof WorkflowUpdateFailedError)
      throw classicRefusal(err) ?? new ClassicControlRefused(err.cause?.message ?? 'the update failed');
    throw err;
  }
}

/**
 * Whether the rollout control update `updateId` was sent earlier to the rollout's workflow and applied
 * (`earlierUpdateOutcome`): a retry after a 503 of an abort (or a promote that finished the rollout) a
 * worker applied later.
 * @throws RolloutControlRefused when that update was refused; NoWorker `timeout`; Temporal client errors.
 */
export async function rolloutControlApplied(client: Client, workflowId: string, updateId: string): Promise<boolean> {
  try {
    return (await earlierUpdateOutcome<ControlResult>(client, workflowId, updateId)) !== undefined;
  } catch (err) {
    if (err instanceof WorkflowUpdateFailedError) throw controlFailure(err);
    throw err;
  }
}

/** The handler's answer, or ClassicControlRefused when it refused. */
function classicAnswer(out: ClassicActionResult): Exclude<ClassicActionResult, { refused: string }> {
  if ('refused' in out) throw new ClassicControlRefused(out.refused, out.code);
  return out;
}

/** The refusal a failed classic update carries (its validator's conflict or in-flight failure); undefined for other failures. */
function classicRefusal(err: WorkflowUpdateFailedError): ClassicControlRefused | undefined {
  const cause = err.cause;
  if (cause instanceof ApplicationFailure && cause.type === CLASSIC_CONFLICT) return new ClassicControlRefused(cause.message);
  if (cause instanceof ApplicationFailure && cause.type === CLASSIC_IN_FLIGHT)
    return new ClassicControlRefused(cause.message, 'deployment_in_flight');
  return undefined;
}

/**
 * Resolves when the Temporal frontend answers `GetSystemInfo` within `timeoutMs` (`GET /readyz`). Give it
 * a connection without the SDK's retry interceptor (services/deps.ts `temporalProbe`): with it, an
 * UNAVAILABLE answer schedules a retry that outlives the deadline.
 * @throws the client's error (gRPC UNAVAILABLE or DEADLINE_EXCEEDED) when it does not.
 */
export async function pingTemporal(connection: Connection, timeoutMs: number): Promise<void> {
  await connection.withDeadline(Date.now() + timeoutMs, () => connection.workflowService.getSystemInfo({}));
}

// ---------------------------------------------------------------------------------------------------
// The user-delete cascade (workflows/user-delete.ts)

/** Workflow id of the delete cascade of `uid`. */
export function userDeleteWorkflowId(uid: string): string {
  return `user-delete:${uid}`;
}

/**
 * Starts `userDeleteWorkflow` for `uid` (search attribute RoostUserId) with WorkflowIdConflictPolicy
 * USE_EXISTING: a second start while it runs attaches to it, a start after it finished runs it again
 * (every step finds its result recorded and does nothing).
 * @throws Temporal client errors when the service is unavailable.
 */
export async function startUserDeleteWorkflow(
  client: Client,
  cfg: Pick<Config, 'ROOST_TASK_QUEUE' | 'temporalUiUrl' | 'TEMPORAL_NAMESPACE'>,
  uid: string,
): Promise<StartedWorkflow> {
  const workflowId = userDeleteWorkflowId(uid);
  const handle = await client.workflow.start(userDeleteWorkflow, {
    taskQueue: cfg.ROOST_TASK_QUEUE,
    workflowId,
    args: [{ uid }],
    workflowIdConflictPolicy: 'USE_EXISTING',
    typedSearchAttributes: [{ key: RoostUserId, value: uid }],
  });
  return { workflowId, runId: handle.firstExecutionRunId, url: workflowUiUrl(cfg, workflowId, handle.firstExecutionRunId) };
}

// ---------------------------------------------------------------------------------------------------
// Installer finalise (workflows/installer-finalize.ts)

/** Workflow id of the finalise of catalog version `version`. */
export function installerFinalizeWorkflowId(version: string): string {
  return `installer-finalize:${version}`;
}

/**
 * Starts `installerFinalizeWorkflow` for `version` (search attribute RoostInstallerVersion) with
 * WorkflowIdConflictPolicy USE_EXISTING (a repeated finalise attaches to a running one; after one ended, a
 * new run starts) and waits up to `waitMs` for its outcome.
 * @returns the outcome, or null when it did not end within `waitMs` (it keeps running).
 * @throws Temporal client errors when the service is unavailable, or the workflow's failure.
 */
export async function runInstallerFinalize(
  client: Client,
  cfg: Pick<Config, 'ROOST_TASK_QUEUE'>,
  input: { version: string; setAsLatest: boolean; actor: string },
  waitMs: number,
): Promise<InstallerFinalizeOutcome | null> {
  const handle = await client.workflow.start(installerFinalizeWorkflow, {
    taskQueue: cfg.ROOST_TASK_QUEUE,
    workflowId: installerFinalizeWorkflowId(input.version),
    args: [input],
    workflowIdConflictPolicy: 'USE_EXISTING',
    typedSearchAttributes: [{ key: RoostInstallerVersion, value: input.version }],
  });
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), waitMs);
  });
  try {
    return await Promise.race([handle.result(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
