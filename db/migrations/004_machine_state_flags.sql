-- Machine fields of docs/contract.md "Machine" that 001 has no column for, reported by the agent's heartbeat
-- (docs/agent-protocol.md "Liveness"), and the stored artifact of a command (a screenshot PNG).
-- cortex_enabled is nullable: missing means enabled (docs/contract.md).
ALTER TABLE machines ADD COLUMN IF NOT EXISTS cortex_enabled BOOLEAN;
ALTER TABLE machines ADD COLUMN IF NOT EXISTS rebooting BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE machines ADD COLUMN IF NOT EXISTS shutting_down BOOLEAN NOT NULL DEFAULT false;
-- Blob name (screenshots container) of what a command produced; null when nothing was uploaded.
ALTER TABLE commands ADD COLUMN IF NOT EXISTS artifact_blob TEXT;
