-- Audit records of mutations in the mutation's own transaction (docs/decisions/audit-recording.md): the
-- transaction that changes state also inserts the request's record here; after commit the API links it into
-- the site's chain (audit_records, audit_heads) and deletes it, and a record whose request died before that
-- is linked later by the API's periodic pass. Same shape as the events outbox: written in the transaction,
-- ordered after commit.
CREATE TABLE IF NOT EXISTS audit_outbox (
  outbox_id TEXT NOT NULL PRIMARY KEY,
  site_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  actor TEXT NOT NULL,
  attributes JSONB NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS audit_outbox_by_age ON audit_outbox (created_at);
