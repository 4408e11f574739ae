-- The API's pass over deployments whose workflow start was lost (db/classic-deployments.ts
-- unstartedDeployments) reads the pending deployments of every site; this partial index holds only those,
-- so the pass does not read the table's history. Partial indexes exist in CockroachDB too (same syntax).
-- (Active rollouts are already in the partial index rollouts_one_active.)
CREATE INDEX IF NOT EXISTS classic_deployments_pending ON classic_deployments (created_at) WHERE status = 'pending';
