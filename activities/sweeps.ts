/**
 * Activities of the background sweeps (workflows/sweeps.ts; docs/decisions/sweeps.md). Each call does a
 * bounded batch (at most `batchSize` rows, clamped to MAX_SWEEP_BATCH), heartbeats per item, and is
 * idempotent: every state change re-checks its condition inside its own transaction (db/sweeps.ts), so a
 * retry or a concurrent run emits nothing twice. Payloads carry counts and cursors, never row lists.
 * Settings (staleness, grace, safety window) come from the worker's configuration.
 */
import { Context } from '@temporalio/activity';
import type { ActivityDeps } from './deps';
import { chunkBlobName } from '../storage/blob';
import type { ChunkCursor } from '../domain/sweeps';
import { verifyChunk } from './verify';
import {
  announceKeyExpiry,
  chunksToVerify,
  condemnChunk,
  decideTombstone,
  dueTombstones,
  findStaleMachines,
  finishReclaim,
  markMachineOffline,
  scanCollectableChunks,
  unannouncedExpiredKeys,
} from '../db/sweeps';

/** Largest batch one activity call handles. */
export const MAX_SWEEP_BATCH = 1000;

/** Input of a batch: how many rows to take. */
export interface BatchInput {
  batchSize: number;
}

/** Result of a batch: rows handled, events recorded, and whether a full batch suggests more work. */
export interface BatchResult {
  processed: number;
  emitted: number;
  more: boolean;
}

/** A condemn batch: where to start scanning (undefined: from the first chunk). */
export interface CondemnInput extends BatchInput {
  after?: ChunkCursor;
}

/** A condemn batch's result: `next` is where the next batch starts, undefined when the scan is done. */
export interface CondemnResult {
  scanned: number;
  condemned: number;
  next?: ChunkCursor;
}

/** A reclaim batch's result (counts per TombstoneDecision). */
export interface ReclaimResult {
  reclaimed: number;
  restored: number;
  deferred: number;
  more: boolean;
}

/** A verify batch: chunks verified at or after `notVerifiedSince` (epoch ms, the run's start) are skipped. */
export interface VerifyInput extends BatchInput {
  notVerifiedSince: number;
}

function clamp(n: number): number {
  return Math.max(1, Math.min(MAX_SWEEP_BATCH, Math.floor(n) || 1));
}

function heartbeat(details?: unknown): void {
  try {
    Context.current().heartbeat(details);
  } catch {
    /* called outside an activity (direct use): nothing to heartbeat */
  }
}

/** Builds the sweep activities over their dependencies (`createActivities` merges them). */
export function createSweepActivities({ db, blob, cfg }: ActivityDeps) {
  return {
    /**
     * Heartbeat staleness: flags up to `batchSize` machines offline whose heartbeat is older than
     * ROOST_HEARTBEAT_STALE_SECONDS, each with `machine.offline`.
     */
    async sweepStaleMachines(input: BatchInput): Promise<BatchResult> {
      const size = clamp(input.batchSize);
      const stale = await findStaleMachines(db, cfg.ROOST_HEARTBEAT_STALE_SECONDS, size);
      let emitted = 0;
      for (const m of stale) {
        if (await markMachineOffline(db, m.siteId, m.id, cfg.ROOST_HEARTBEAT_STALE_SECONDS)) emitted++;
        heartbeat(emitted);
      }
      return { processed: stale.length, emitted, more: stale.length === size };
    },

    /**
     * Chunk GC phase 1: scans `batchSize` chunk rows after `after` and condemns the collectable ones
     * (no referrer past ROOST_CHUNK_GC_GRACE_SECONDS): row removed, tombstone written, blob kept.
     */
    async condemnUnreferencedChunks(input: CondemnInput): Promise<CondemnResult> {
      const size = clamp(input.batchSize);
      const grace = cfg.ROOST_CHUNK_GC_GRACE_SECONDS;
      const { scanned, collectable, next } = await scanCollectableChunks(db, grace, size, input.after);
      let condemned = 0;
      for (const c of collectable) {
        if (await condemnChunk(db, c.siteId, c.id, grace)) condemned++;
        heartbeat(condemned);
      }
      return { scanned, condemned, next };
    },

    /**
     * Chunk GC phase 2: for up to `batchSize` tombstones older than ROOST_CHUNK_GC_SAFETY_SECONDS,
     * restores the chunks a referrer came back for, and deletes the blob of the others, recording
     * `chunk.garbage_collected` once each.
     */
    async reclaimCondemnedChunks(input: BatchInput): Promise<ReclaimResult> {
      const size = clamp(input.batchSize);
      const due = await dueTombstones(db, cfg.ROOST_CHUNK_GC_SAFETY_SECONDS, size);
      const out: ReclaimResult = { reclaimed: 0, restored: 0, deferred: 0, more: false };
      for (const t of due) {
        const decision = await decideTombstone(db, t.siteId, t.hash);
        if (decision === 'reclaim') {
          await blob.delete('chunks', chunkBlobName(t.siteId, t.hash));
          if (await finishReclaim(db, t.siteId, t.hash)) out.reclaimed++;
        } else if (decision === 'restored' || decision === 'adopted') out.restored++;
        else if (decision === 'deferred') out.deferred++;
        heartbeat(out);
      }
      out.more = due.length === size && out.deferred === 0;
      return out;
    },

    /**
     * Chunk verification: re-hashes (streaming) up to `batchSize` chunks not verified since the run
     * started, oldest verification first, recording `chunk.verify_failed` once per bad bytes and
     * quarantining them (activities/verify.ts verifyChunk).
     */
    async verifyChunkSample(input: VerifyInput): Promise<BatchResult> {
      const size = clamp(input.batchSize);
      const chunks = await chunksToVerify(db, input.notVerifiedSince, size);
      let emitted = 0;
      for (const c of chunks) {
        if ((await verifyChunk({ db, blob }, c.siteId, c.hash)).emitted) emitted++;
        heartbeat(emitted);
      }
      return { processed: chunks.length, emitted, more: chunks.length === size };
    },

    /** Key expiry: announces up to `batchSize` expired active keys, `api_key.expired` once per key. */
    async announceExpiredKeys(input: BatchInput): Promise<BatchResult> {
      const size = clamp(input.batchSize);
      const now = Date.now();
      const keys = await unannouncedExpiredKeys(db, now, size);
      let emitted = 0;
      for (const keyId of keys) {
        emitted += await announceKeyExpiry(db, keyId, now);
        heartbeat(emitted);
      }
      return { processed: keys.length, emitted, more: keys.length === size };
    },
  };
}
