-- Storage quotas (docs/contract.md "Quota snapshot", Events quota.warning / quota.exceeded; db/quota.ts).
-- Used bytes are the sizes of the chunks a site holds (the chunks table); these tables add the pending
-- upload reservations and the memory of which quota thresholds already fired in a billing period.

-- One row per chunk hash a site asked upload URLs for and does not hold yet: CHUNK_SIZE bytes reserved
-- until the chunk is recorded at publish (row deleted) or the URL expires (expires_at passed; swept lazily).
CREATE TABLE IF NOT EXISTS upload_reservations (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  hash TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, hash)
);

-- Quota thresholds fired per site and billing period (UTC calendar month 'YYYY-MM'): percent 50 and 80
-- (quota.warning) and 100 (quota.exceeded). The primary key makes each fire once per period.
CREATE TABLE IF NOT EXISTS quota_thresholds (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  period TEXT NOT NULL,
  percent INT NOT NULL,
  event_id TEXT NOT NULL,
  fired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, period, percent)
);
