/**
 * Background workflows of a deployment (docs/decisions/sweeps.md, docs/decisions/webhook-relay.md):
 * `ensureBackgroundWorkflows` starts, idempotently, the long-running workflows and creates the Temporal
 * Schedules that must exist once per task queue. Safe to call on every worker start (ids are fixed per task
 * queue; what exists is left alone).
 *
 * Sweeps (docs/decisions/sweeps.md): one Schedule per sweep, id `roost-sweep-<name>-<taskQueue>`, every
 * ROOST_SWEEP_*_INTERVAL_SECONDS, overlap SKIP (a run still going when the next is due is skipped).
 *
 * Event relay (docs/decisions/webhooks.md): one long-running `eventRelayWorkflow` per task queue, id
 * `event-relay:<taskQueue>`, continuing as new every ROOST_WEBHOOK_RELAY_RUN_SECONDS.
 */
import { type Client, ScheduleAlreadyRunning, ScheduleOverlapPolicy } from '@temporalio/client';
import type { Config } from '../config/env';
import type { SweepInput } from '../workflows/sweeps';

/** Options of `ensureBackgroundWorkflows`. */
export interface BackgroundOptions {
  /** Task queue the workflows run on (default cfg.ROOST_TASK_QUEUE); also part of every id. */
  taskQueue?: string;
}

/** One sweep schedule: its name, workflow type, interval (seconds) and run input. */
export interface SweepScheduleSpec {
  name: 'heartbeat-staleness' | 'chunk-gc' | 'chunk-verify' | 'key-expiry' | 'conversation-purge';
  workflowType: string;
  everySeconds: number;
  input: SweepInput;
}

/** Rows per verification batch (a chunk is up to 4 MiB: 16 chunks ≤ 64 MiB read per activity call). */
const VERIFY_BATCH = 16;

/** The sweep schedules configuration asks for (intervals and the verification sample from `cfg`). */
export function sweepSchedules(cfg: Config): SweepScheduleSpec[] {
  return [
    {
      name: 'heartbeat-staleness',
      workflowType: 'heartbeatStalenessSweepWorkflow',
      everySeconds: cfg.ROOST_SWEEP_STALENESS_INTERVAL_SECONDS,
      input: { batchSize: 100, maxBatches: 50 },
    },
    {
      name: 'chunk-gc',
      workflowType: 'chunkGcSweepWorkflow',
      everySeconds: cfg.ROOST_SWEEP_CHUNK_GC_INTERVAL_SECONDS,
      input: { batchSize: 500, maxBatches: 200 },
    },
    {
      name: 'chunk-verify',
      workflowType: 'chunkVerifySweepWorkflow',
      everySeconds: cfg.ROOST_SWEEP_CHUNK_VERIFY_INTERVAL_SECONDS,
      input: {
        batchSize: Math.min(VERIFY_BATCH, cfg.ROOST_SWEEP_CHUNK_VERIFY_SAMPLE),
        maxBatches: Math.ceil(cfg.ROOST_SWEEP_CHUNK_VERIFY_SAMPLE / VERIFY_BATCH),
      },
    },
    {
      name: 'key-expiry',
      workflowType: 'keyExpirySweepWorkflow',
      everySeconds: cfg.ROOST_SWEEP_KEY_EXPIRY_INTERVAL_SECONDS,
      input: { batchSize: 100, maxBatches: 50 },
    },
    {
      name: 'conversation-purge',
      workflowType: 'conversationPurgeSweepWorkflow',
      everySeconds: cfg.ROOST_SWEEP_CONVERSATION_PURGE_INTERVAL_SECONDS,
      input: { batchSize: 100, maxBatches: 50 },
    },
  ];
}

/** Id of a sweep's Schedule on a task queue (also the prefix of the workflow ids it starts). */
export function sweepScheduleId(name: SweepScheduleSpec['name'], taskQueue: string): string {
  return `roost-sweep-${name}-${taskQueue}`;
}

/**
 * Creates each sweep Schedule that does not exist yet on the task queue; an existing one is left as it
 * is (change an interval with `client.schedule.getHandle(id).update`). Returns the schedule ids and
 * whether this call created each.
 * @throws when Temporal is unreachable.
 */
export async function ensureSweepSchedules(
  client: Client,
  cfg: Config,
  opts: BackgroundOptions = {},
): Promise<{ scheduleId: string; created: boolean }[]> {
  const taskQueue = opts.taskQueue ?? cfg.ROOST_TASK_QUEUE;
  const out: { scheduleId: string; created: boolean }[] = [];
  for (const s of sweepSchedules(cfg)) {
    const scheduleId = sweepScheduleId(s.name, taskQueue);
    try {
      await client.schedule.create({
        scheduleId,
        spec: { intervals: [{ every: `${s.everySeconds}s` }] },
        action: {
          type: 'startWorkflow',
          workflowType: s.workflowType,
          workflowId: scheduleId,
          taskQueue,
          args: [s.input],
          // A run never outlives a few intervals; a stuck one must not block the schedule (overlap SKIP).
          workflowExecutionTimeout: `${Math.max(600, s.everySeconds * 4)}s`,
        },
        policies: { overlap: ScheduleOverlapPolicy.SKIP, catchupWindow: `${Math.max(60, s.everySeconds)}s` },
        memo: { purpose: `roost ${s.name} sweep` },
      });
      out.push({ scheduleId, created: true });
    } catch (err) {
      if (!(err instanceof ScheduleAlreadyRunning)) throw err;
      out.push({ scheduleId, created: false });
    }
  }
  return out;
}

/**
 * Starts (idempotently) every background workflow and schedule of the task queue `opts.taskQueue`
 * (default cfg.ROOST_TASK_QUEUE). Call once per worker start; the lead wires it into worker/main.ts.
 */
export async function ensureBackgroundWorkflows(client: Client, cfg: Config, opts: BackgroundOptions = {}): Promise<void> {
  await ensureSweepSchedules(client, cfg, opts);
  await ensureEventRelay(client, cfg, opts);
}

/** Id of the event relay workflow of a task queue: `event-relay:<taskQueue>`. */
export function eventRelayWorkflowId(taskQueue: string): string {
  return `event-relay:${taskQueue}`;
}

/**
 * Starts the event relay (webhook fan-out, workflows/events.ts) of the task queue unless it runs already
 * (conflict policy USE_EXISTING; a terminated or failed relay is started again). Returns its workflow id.
 * @throws when Temporal is unreachable.
 */
export async function ensureEventRelay(client: Client, cfg: Config, opts: BackgroundOptions = {}): Promise<string> {
  const taskQueue = opts.taskQueue ?? cfg.ROOST_TASK_QUEUE;
  const workflowId = eventRelayWorkflowId(taskQueue);
  await client.workflow.start('eventRelayWorkflow', {
    taskQueue,
    workflowId,
    args: [],
    workflowIdConflictPolicy: 'USE_EXISTING',
    workflowIdReusePolicy: 'ALLOW_DUPLICATE',
    memo: { purpose: 'roost event relay (webhook fan-out)' },
  });
  return workflowId;
}
