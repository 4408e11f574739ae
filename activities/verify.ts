/**
 * Server-side verification of stored chunk bytes (docs/decisions/chunk-integrity.md): re-hash a chunk blob
 * (streaming SHA-256, storage/blob.ts chunkDigest), record the verdict (db/sweeps.ts recordVerifyResult:
 * `verified_at`, the failure mark and `chunk.verify_failed` once per bad bytes) and quarantine bad bytes
 * (storage/blob.ts quarantineChunk) so a fresh create-only upload can store the chunk again. Used by the
 * verification sweep (activities/sweeps.ts) and by `verifyVersionChunks`, which the version verification
 * started by publish (workflows/verify.ts) and every rollout (workflows/rollout.ts) run before any
 * machine is sent the version.
 */
import { Context } from '@temporalio/activity';
import pLimit from 'p-limit';
import type { ActivityDeps } from './deps';
import { unverifiedVersionChunks } from '../db/chunks';
import { recordVerifyResult } from '../db/sweeps';

/** What re-hashing one chunk found: `sound` when its stored bytes hash to its digest; `emitted` when `chunk.verify_failed` was recorded now. */
export interface ChunkVerdict {
  sound: boolean;
  emitted: boolean;
}

/**
 * Re-hashes one stored chunk of `siteId` and records the verdict; bad bytes are quarantined. A missing
 * blob is unsound (reported once unless the chunk was already marked: its bytes were quarantined).
 * Idempotent. @throws blob storage and database errors (the caller's retry policy applies).
 */
export async function verifyChunk(deps: Pick<ActivityDeps, 'db' | 'blob'>, siteId: string, hash: string): Promise<ChunkVerdict> {
  const stored = await deps.blob.chunkDigest(siteId, hash);
  const emitted = await recordVerifyResult(deps.db, siteId, hash, stored ? stored.digest : null);
  if (stored && stored.digest !== hash) await deps.blob.quarantineChunk(siteId, hash, stored.etag, stored.digest);
  return { sound: stored?.digest === hash, emitted };
}

/** A version whose chunks to verify, and the order to walk them in (hash order, ascending or descending). */
export interface VerifyVersionInput {
  siteId: string;
  roostId: string;
  versionId: string;
  /**
   * Publish's verification walks ascending, a rollout's descending: when both run at once they meet in
   * the middle (each batch re-reads what is still unverified), instead of hashing every chunk twice.
   */
  order: 'asc' | 'desc';
}

/** What verifying a version found: chunks re-hashed now, and those whose stored bytes are wrong (count, first few). */
export interface VerifyVersionResult {
  verified: number;
  failed: number;
  failedChunks: string[];
}

/** Unverified chunks fetched per query, and re-hashed at once, by `verifyVersionChunks`. */
export const VERIFY_BATCH = 64;
export const VERIFY_CONCURRENCY = 8;
/** Bad chunks named in a result. */
export const MAX_FAILED_CHUNKS = 20;

function heartbeat(details: unknown): void {
  try {
    Context.current().heartbeat(details);
  } catch {
    /* called outside an activity (direct use): nothing to heartbeat */
  }
}

/** Builds the verification activities over their dependencies (`createActivities` merges them). */
export function createVerifyActivities({ db, blob }: Pick<ActivityDeps, 'db' | 'blob'>) {
  return {
    /**
     * Re-hashes every chunk of a version the service has not verified yet (streaming SHA-256 of the
     * stored blob), `VERIFY_CONCURRENCY` at a time, heartbeating per chunk. Sound bytes set verified_at;
     * bad bytes are marked, reported once (`chunk.verify_failed`) and quarantined (`verifyChunk`).
     * Already verified chunks cost nothing, so a retry or a second caller resumes where the work stands.
     */
    async verifyVersionChunks(input: VerifyVersionInput): Promise<VerifyVersionResult> {
      const limit = pLimit(VERIFY_CONCURRENCY);
      const out: VerifyVersionResult = { verified: 0, failed: 0, failedChunks: [] };
      let after: string | undefined;
      for (;;) {
        const batch = await unverifiedVersionChunks(db, input, { order: input.order, after, limit: VERIFY_BATCH });
        if (batch.length === 0) return out;
        await Promise.all(
          batch.map((hash) =>
            limit(async () => {
              const verdict = await verifyChunk({ db, blob }, input.siteId, hash);
              out.verified++;
              if (!verdict.sound) {
                out.failed++;
                if (out.failedChunks.length < MAX_FAILED_CHUNKS) out.failedChunks.push(hash);
              }
              heartbeat(out.verified);
            }),
          ),
        );
        after = batch[batch.length - 1];
      }
    },
  };
}

/** The verification activities by name (what workflows call through `proxyActivities<Activities>`). */
export type VerifyActivities = ReturnType<typeof createVerifyActivities>;
