-- Bytes of the distinct chunks each site holds (the quota's usedBytes, docs/decisions/storage-quota.md),
-- kept by every statement that adds or removes `chunks` rows, in the same statement (db/quota.ts
-- `withUsage`). The quota used to sum the site's `chunks` rows on every upload-urls call and every chunk
-- recording: a sequential scan of 250–275 ms at 1,000,000 chunks in one site, and under SERIALIZABLE a
-- read of the whole table that every concurrent chunk insert conflicted with.
CREATE TABLE IF NOT EXISTS site_usage (
  site_id TEXT PRIMARY KEY REFERENCES sites (site_id),
  used_bytes BIGINT NOT NULL DEFAULT 0
);
INSERT INTO site_usage (site_id, used_bytes)
SELECT site_id, CAST(SUM(size) AS BIGINT) FROM chunks GROUP BY site_id
ON CONFLICT (site_id) DO UPDATE SET used_bytes = excluded.used_bytes;
