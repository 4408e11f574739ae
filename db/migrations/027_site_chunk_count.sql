-- How many `chunks` rows each site has, kept beside its used bytes by the same statements (db/quota.ts
-- `withUsage`). The chunk lookup's choice between listing storage and reading single blobs
-- (services/chunks.ts listingIsCheaper) counted the site's rows on every call with 64 or more unrecorded
-- chunks: every early confirmation and the publish of a cold push, a scan of the site's rows each.
ALTER TABLE site_usage ADD COLUMN IF NOT EXISTS chunk_count BIGINT NOT NULL DEFAULT 0;
UPDATE site_usage SET chunk_count = (SELECT count(*) FROM chunks c WHERE c.site_id = site_usage.site_id);
