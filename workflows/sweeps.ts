/**
 * The background sweeps (docs/decisions/sweeps.md). Each is a short workflow
 * started by a Temporal Schedule (worker/background.ts `ensureSweepSchedules`): it runs batches of an
 * idempotent activity (activities/sweeps.ts) until a batch reports no more work or `maxBatches` is
 * reached, and returns the counts. Deterministic code only: activities imported by type, explicit
 * timeouts and heartbeats, payloads of counts and cursors.
 *
 * - `heartbeatStalenessSweepWorkflow`: machines with a stale heartbeat → offline + `machine.offline`.
 * - `chunkGcSweepWorkflow`: phase 1 condemns unreferenced chunks past the grace (row → tombstone), phase 2
 *   deletes the blobs of tombstones past the safety window + `chunk.garbage_collected`.
 * - `chunkVerifySweepWorkflow`: re-hashes a sample of stored chunks + `chunk.verify_failed`.
 * - `keyExpirySweepWorkflow`: expired keys → `api_key.expired` once per key.
 *
 * Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import { proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';
import type { ChunkCursor } from '../domain/sweeps';

/** Input of every sweep run (the schedule passes values from configuration). */
export interface SweepInput {
  /** Rows per activity call (default 100; chunk verification default 16). */
  batchSize?: number;
  /** Most activity calls per phase in one run (default 50). */
  maxBatches?: number;
}

/** Counts of one sweep run. */
export interface SweepOutcome {
  batches: number;
  processed: number;
  emitted: number;
}

/** Counts of one chunk GC run. */
export interface ChunkGcOutcome {
  batches: number;
  scanned: number;
  condemned: number;
  reclaimed: number;
  restored: number;
  deferred: number;
}

const DEFAULT_BATCH = 100;
const DEFAULT_VERIFY_BATCH = 16;
const DEFAULT_MAX_BATCHES = 50;

const acts = proxyActivities<Activities>({
  startToCloseTimeout: '5 minutes',
  heartbeatTimeout: '1 minute',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute', maximumAttempts: 5 },
});

function limits(input: SweepInput | undefined, batch = DEFAULT_BATCH): { batchSize: number; maxBatches: number } {
  return { batchSize: input?.batchSize ?? batch, maxBatches: input?.maxBatches ?? DEFAULT_MAX_BATCHES };
}

/** Runs `batch` until it reports no more work or `maxBatches` calls were made. */
async function drain(
  batch: () => Promise<{ processed: number; emitted: number; more: boolean }>,
  maxBatches: number,
): Promise<SweepOutcome> {
  const out: SweepOutcome = { batches: 0, processed: 0, emitted: 0 };
  while (out.batches < maxBatches) {
    const r = await batch();
    out.batches++;
    out.processed += r.processed;
    out.emitted += r.emitted;
    if (!r.more) break;
  }
  return out;
}

/** Heartbeat staleness sweep: flags machines with a stale heartbeat offline (`machine.offline`). */
export async function heartbeatStalenessSweepWorkflow(input?: SweepInput): Promise<SweepOutcome> {
  const { batchSize, maxBatches } = limits(input);
  return drain(() => acts.sweepStaleMachines({ batchSize }), maxBatches);
}

/** Key expiry sweep: announces expired keys (`api_key.expired`, once per key). */
export async function keyExpirySweepWorkflow(input?: SweepInput): Promise<SweepOutcome> {
  const { batchSize, maxBatches } = limits(input);
  return drain(() => acts.announceExpiredKeys({ batchSize }), maxBatches);
}

/**
 * Chunk verification sweep: re-hashes at most batchSize × maxBatches chunks, never-verified and
 * oldest-verified first, skipping those verified since this run started (`chunk.verify_failed`).
 */
export async function chunkVerifySweepWorkflow(input?: SweepInput): Promise<SweepOutcome> {
  const { batchSize, maxBatches } = limits(input, DEFAULT_VERIFY_BATCH);
  const notVerifiedSince = Date.now(); // workflow time: deterministic on replay
  return drain(() => acts.verifyChunkSample({ batchSize, notVerifiedSince }), maxBatches);
}

/**
 * Chunk garbage collection: phase 1 scans the chunks in (site, hash) order and condemns the
 * collectable ones; phase 2 reclaims the tombstones past the safety window (`chunk.garbage_collected`).
 */
export async function chunkGcSweepWorkflow(input?: SweepInput): Promise<ChunkGcOutcome> {
  const { batchSize, maxBatches } = limits(input);
  const out: ChunkGcOutcome = { batches: 0, scanned: 0, condemned: 0, reclaimed: 0, restored: 0, deferred: 0 };
  let after: ChunkCursor | undefined;
  for (let i = 0; i < maxBatches; i++) {
    const r = await acts.condemnUnreferencedChunks({ batchSize, after });
    out.batches++;
    out.scanned += r.scanned;
    out.condemned += r.condemned;
    if (!r.next) break;
    after = r.next;
  }
  for (let i = 0; i < maxBatches; i++) {
    const r = await acts.reclaimCondemnedChunks({ batchSize });
    out.batches++;
    out.reclaimed += r.reclaimed;
    out.restored += r.restored;
    out.deferred += r.deferred;
    if (!r.more) break;
  }
  return out;
}
