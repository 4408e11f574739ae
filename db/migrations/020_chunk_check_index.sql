-- `POST /api/chunks/check` reads hash, size, verified_at and verify_failed_digest of up to 1,000 chunks of
-- one site (db/chunks.ts chunkRows). With only the primary key (site_id, hash) PostgreSQL fetches each
-- present row from the heap; this covering index lets it answer from the index alone (an index-only
-- scan, no heap fetches; docs/benchmarks.md "chunks/check"). INCLUDE is CockroachDB's alias of STORING;
-- there the primary index already holds every column, so the index only costs its writes.
CREATE INDEX IF NOT EXISTS chunks_check ON chunks (site_id, hash) INCLUDE (size, verified_at, verify_failed_digest);
