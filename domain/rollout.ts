/**
 * Rollouts as the rest of the code sees them: the stored rollout, its stage and control state, its waves,
 * per-machine outcome counts and history entries, and the workflow ids derived from business keys
 * (docs/decisions/rollout-stages.md, docs/decisions/rollout-control.md, docs/decisions/rollout-workflow-ids.md).
 *
 * Pure: no I/O. Workflow code (workflows/rollout.ts) imports these types, so nothing here may reach for
 * Node APIs at module load.
 */
import type { RolloutPolicy } from './rollout-policy';

/** The stage of `POST /api/roosts/{roostId}/deploy` records: canary → started → completed | failed. */
export type RolloutStage = 'canary' | 'started' | 'completed' | 'failed';

/** Stages a rollout never leaves. */
export const TERMINAL_STAGES: readonly RolloutStage[] = ['completed', 'failed'];

/** Control state beside the stage (docs/decisions/rollout-control.md). */
export type RolloutState =
  'running' | 'paused' | 'awaiting_promotion' | 'waiting_window' | 'completed' | 'failed' | 'aborted' | 'rolled_back';

/**
 * Wave names of the fixed canary-then-fleet path of rollouts started before rollout control (the workflow
 * addresses waves by name there; rollouts with rollout control address them by index into `Rollout.waves`).
 */
export type Wave = 'canary' | 'fleet';

/** Most machines one deploy may target (`machines` of `POST /api/roosts/{roostId}/deploy`). */
export const MAX_ROLLOUT_MACHINES = 10_000;

/** One planned wave: its stored name (rollout_machines.wave) and machine count. */
export interface WavePlan {
  name: string;
  size: number;
}

/** One entry of a rollout's own transition log (rollouts.history). `at` is an ISO 8601 timestamp. */
export interface HistoryEntry {
  seq: number;
  at: string;
  action: string;
  state?: RolloutState;
  by?: string;
  wave?: number;
  detail?: Record<string, unknown>;
}

/** A rollout as stored. `canary`/`fleet` are machine ids in wave order. */
export interface Rollout {
  siteId: string;
  rolloutId: string;
  roostId: string;
  versionId: string;
  stage: RolloutStage;
  active: boolean;
  canary: string[];
  fleet: string[];
  extractRoot: string;
  policy: RolloutPolicy;
  scheduleAt: Date | null;
  workflowId: string;
  abortReason: string | null;
  succeeded: number;
  failed: number;
  createdAt: Date;
  createdBy: string;
  completedAt: Date | null;
  /** Control state (docs/decisions/rollout-control.md). */
  state: RolloutState;
  stateSeq: number;
  history: HistoryEntry[];
  /** Waves in order (rollouts stored before rollout control: canary then fleet). */
  waves: WavePlan[];
  currentWave: number | null;
  rollbackOf: string | null;
  rolledBackBy: string | null;
  updatedAt: Date;
}

/** Per-machine status of a rollout (rollout_machines.status; docs/decisions/rollout-machine-outcomes.md). */
export type RolloutMachineStatus = 'pending' | 'dispatched' | 'staged' | 'activating' | 'succeeded' | 'failed' | 'cancelled';

/** One machine of a rollout as stored. `bytesFetched` in bytes; `versionId` null: the rollout's version. */
export interface RolloutMachine {
  machineId: string;
  wave: string;
  status: RolloutMachineStatus;
  attempts: number;
  commandId: string | null;
  lastError: string | null;
  bytesFetched: number;
  previousVersionId: string | null;
  targetVersionId: string | null;
  dispatchedAt: Date | null;
  finishedAt: Date | null;
  stagedAt: Date | null;
  deadlineAt: Date | null;
  updatedAt: Date;
}

/** Per-machine outcome counts of a rollout or of one wave. */
export interface WaveCounts {
  total: number;
  pending: number;
  dispatched: number;
  succeeded: number;
  failed: number;
  cancelled: number;
  /** Of `failed`, how many failed because the wave timed out. */
  timedOut: number;
  /** Staged activation: staged and waiting for activation / roost_activate queued. */
  staged?: number;
  activating?: number;
}

/** Counts of nothing (every field 0, staged and activating included). */
export function emptyCounts(): WaveCounts {
  return { total: 0, pending: 0, dispatched: 0, succeeded: 0, failed: 0, cancelled: 0, timedOut: 0, staged: 0, activating: 0 };
}

/** Sum of the counts of several waves (every field present). */
export function sumCounts(list: Iterable<WaveCounts>): WaveCounts {
  const c = emptyCounts();
  for (const w of list) for (const k of Object.keys(c) as (keyof WaveCounts)[]) (c[k] as number) += w[k] ?? 0;
  return c;
}

/**
 * Workflow id of the rollout of `versionId` of a roost: `rollout:<siteId>:<roostId>:<versionId>` (the
 * dedupe key of deploys; docs/decisions/rollout-workflow-ids.md). Callers use it through workflows/client.ts.
 */
export function rolloutWorkflowId(siteId: string, roostId: string, versionId: string): string {
  return `rollout:${siteId}:${roostId}:${versionId}`;
}

/** Workflow id of the rollback of `rolloutId`: `rollback:<siteId>:<rolloutId>`. */
export function rollbackWorkflowId(siteId: string, rolloutId: string): string {
  return `rollback:${siteId}:${rolloutId}`;
}
