-- Background sweeps (docs/contract.md Event catalog: machine.offline, chunk.garbage_collected, chunk.verify_failed,
-- api_key.expired; Limits "chunk garbage-collection grace"). db/sweeps.ts, docs/decisions/sweeps.md.

-- Heartbeat staleness: machines still flagged online, oldest heartbeat first.
CREATE INDEX IF NOT EXISTS machines_online_by_heartbeat ON machines (last_heartbeat) WHERE online;

-- Chunk verification: the digest of the bad bytes last reported by `chunk.verify_failed` (NULL while the
-- stored bytes match the hash), so the same bad bytes are never reported twice; the literal `missing`
-- when the blob was gone. verified_at (001) orders the sample: never verified first, then oldest.
ALTER TABLE chunks ADD COLUMN IF NOT EXISTS verify_failed_digest TEXT;
ALTER TABLE chunks ADD COLUMN IF NOT EXISTS verify_failed_at TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS chunks_by_verified ON chunks (verified_at);

-- Chunk garbage collection, phase 1 of 2: a chunk with no referrers past the grace loses its `chunks`
-- row (quota usage drops, publish no longer counts it present) and gets a tombstone here. Phase 2, at
-- least ROOST_CHUNK_GC_SAFETY_SECONDS later, deletes the blob and records chunk.garbage_collected, or
-- drops the tombstone (restoring the row) when a referrer or a row reappeared meanwhile.
CREATE TABLE IF NOT EXISTS chunk_gc_tombstones (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  hash TEXT NOT NULL,
  size BIGINT NOT NULL,
  chunk_created_at TIMESTAMPTZ NOT NULL,
  condemned_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, hash)
);
CREATE INDEX IF NOT EXISTS chunk_gc_tombstones_by_time ON chunk_gc_tombstones (condemned_at);

-- Key expiry: when api_key.expired was recorded for the key (epoch ms, like the other api_keys times).
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS expiry_announced_at BIGINT;
-- Only active keys are announced (a revoked or rotated key is already unusable).
CREATE INDEX IF NOT EXISTS api_keys_unannounced_expiry ON api_keys (expires_at) WHERE expiry_announced_at IS NULL AND status = 'active';
