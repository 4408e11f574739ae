-- The long-poll check (services/agent.ts CommandWaiters, db/machines.ts machinesWithDeliverable) asks
-- every 250 ms which of up to 5,000 waiting machines of a site have a deliverable command. Through
-- commands_by_status (site_id, machine_id, status) that was one index probe per waiting machine, on an
-- index holding every command ever sent; this partial index holds only pending commands, so the check
-- reads what is pending, whatever the fleet size and history (docs/benchmarks.md "10,000 machines").
-- Partial indexes exist in CockroachDB too (same syntax).
CREATE INDEX IF NOT EXISTS commands_pending ON commands (site_id, machine_id) WHERE status = 'pending';
