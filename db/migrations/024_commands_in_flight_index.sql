-- The delivery window (services/agent.ts CommandWaiters, db/machines.ts machinesWithDeliverable) counts,
-- every 250 ms, a site's commands handed out and not finished: delivered_at set, completed_at not. This
-- partial index holds only those, so the count reads the commands in flight, not the site's history.
-- Partial indexes exist in CockroachDB too (same syntax).
CREATE INDEX IF NOT EXISTS commands_in_flight ON commands (site_id, delivered_at) WHERE completed_at IS NULL AND delivered_at IS NOT NULL;
