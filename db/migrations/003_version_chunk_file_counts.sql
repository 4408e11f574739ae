-- Referrer figures per (version, chunk) (docs/contract.md "Chunk referrer entry": fileCount, pathCount).
-- Nullable: publish fills them when it records version_chunks; rows written without them report null.
-- docs/decisions/chunk-referrers.md.
ALTER TABLE version_chunks ADD COLUMN IF NOT EXISTS file_count INT;
