-- A rollout's reconciliation (db/rollouts.ts reconcileWaves) looks, every pass, for dispatched machines
-- whose target state reports their version failed or cancelled. Asked per machine, that was one probe of
-- roost_target_states for each of a wave's dispatched machines (9,900 at 10,000 machines) on every pass,
-- although almost none fail. This partial index holds only the failed and cancelled states, so the pass
-- reads those once and looks the dispatched machines up in them (docs/benchmarks.md "The long-poll check").
-- Partial indexes exist in CockroachDB too (same syntax).
CREATE INDEX IF NOT EXISTS roost_target_states_failed ON roost_target_states (site_id, roost_id, machine_id) WHERE status IN ('failed', 'cancelled');
-- Likewise the rollout's failed or cancelled sync commands: without this index PostgreSQL answered that
-- part of the pass by reading every failed command of every site (index commands_by_creator on status).
CREATE INDEX IF NOT EXISTS commands_rollout_failed ON commands (site_id, rollout_id) WHERE rollout_id IS NOT NULL AND status IN ('failed', 'cancelled');
