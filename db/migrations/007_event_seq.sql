-- Event sequencing (docs/architecture.md "Events": commit order is not id order on CockroachDB).
-- An outbox row is written with seq NULL in the transaction of its state change. A sequencer
-- (db/events.ts sequenceEvents: the event relay workflow and every API process serving the stream)
-- later gives each committed row the next per-site number, in the order it observes them. A row can
-- only be numbered once it is committed and visible, so a reader that follows `seq` never skips an
-- event that commits late: it simply gets a later number. Consumers (stream, webhook fan-out) read by
-- seq and keep their own cursor.
ALTER TABLE events ADD COLUMN IF NOT EXISTS seq INT8;
CREATE UNIQUE INDEX IF NOT EXISTS events_by_site_seq ON events (site_id, seq);
CREATE INDEX IF NOT EXISTS events_unsequenced ON events (site_id, occurred_at) WHERE seq IS NULL;

-- The last number given per site.
CREATE TABLE IF NOT EXISTS event_sequences (
  site_id TEXT PRIMARY KEY,
  last_seq INT8 NOT NULL
);
