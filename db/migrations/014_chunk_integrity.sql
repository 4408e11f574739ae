-- Chunk integrity (docs/decisions/chunk-integrity.md): the chunks whose stored bytes verification found
-- wrong, per site. `POST /api/roosts/{roostId}/deploy` refuses a version that references one
-- (db/chunks.ts badVersionChunks); almost no chunk is ever marked, so the index stays tiny.
CREATE INDEX IF NOT EXISTS chunks_marked_bad ON chunks (site_id, hash) WHERE verify_failed_digest IS NOT NULL;
