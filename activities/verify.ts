/**
 * Server-side verification of stored chunk bytes (docs/decisions/chunk-integrity.md): re-hash a chunk blob
 * (streaming SHA-256, storage/blob.ts chunkDigest), record the verdict (db/sweeps.ts recordVerifyResult:
 * `verified_at`, the failure mark and `chunk.verify_failed` once per bad bytes) and quarantine bad bytes
 * (storage/blob.ts quarantineChunk) so a fresh create-only upload can store the chunk again. Used by the
 * verification sweep (activities/sweeps.ts).
 */
import type { ActivityDeps } from './deps';
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
