-- Rollout control (docs/decisions/rollout-control.md): policies with several waves, manual
-- gates, pause/resume/abort, rollback rollouts, stage-then-activate. Additive only: every new column is
-- nullable or has a default, so rows written before this change keep working (their waves are the
-- names 'canary' and 'fleet'; their state is derived from stage and active).

-- Control state beside the spec's stage: running | paused | awaiting_promotion | waiting_window |
-- completed | failed | aborted | rolled_back (NULL on old rows: running while active, else the stage).
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS state TEXT;
-- Sequence number of the last state write (the workflow numbers its writes; an older write never wins).
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS state_seq INT NOT NULL DEFAULT 0;
-- The rollout's own transition log: [{seq, at, action, state, by, wave, detail}], oldest first.
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS history JSONB NOT NULL DEFAULT '[]';
-- Planned waves [{name, size}] in order (NULL on old rows: canary then fleet).
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS waves JSONB;
-- Index of the wave the workflow last dispatched (NULL before the first).
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS current_wave INT;
-- A rollback rollout names the rollout it undoes; the undone rollout names its rollback.
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS rollback_of TEXT;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS rolled_back_by TEXT;
CREATE INDEX IF NOT EXISTS rollouts_by_roost_stage ON rollouts (site_id, roost_id, stage, created_at);

-- Per machine: the version it reported committed when the rollout was created (what a rollback
-- returns it to), the version this machine is sent (NULL: the rollout's version; set on rollback
-- rollouts, whose machines go back to different versions), and its own deadline (first dispatch +
-- the wave timeout). status gains `staged` (staged sync done, waiting for activation) and
-- `activating` (roost_activate queued).
ALTER TABLE rollout_machines ADD COLUMN IF NOT EXISTS previous_version_id TEXT;
ALTER TABLE rollout_machines ADD COLUMN IF NOT EXISTS target_version_id TEXT;
ALTER TABLE rollout_machines ADD COLUMN IF NOT EXISTS deadline_at TIMESTAMPTZ;
ALTER TABLE rollout_machines ADD COLUMN IF NOT EXISTS staged_at TIMESTAMPTZ;
