-- Hash-chained audit log per site (docs/contract.md "Audit record", "Audit log"; db/audit.ts, domain/audit.ts,
-- docs/decisions/audit-chain.md).

-- One record per audited action. `hash` is the record id: SHA-256 of the canonical content
-- (kind, actor, occurredAt, attributes, previousHash, siteId). `seq` is the record's position in its
-- site's chain (1 = genesis), assigned from audit_heads in the appending transaction: it orders the
-- log and pages it. The unique index on (site_id, previous_hash) makes every record the predecessor of
-- at most one other record, so the chain cannot fork.
CREATE TABLE IF NOT EXISTS audit_records (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  hash TEXT NOT NULL,
  seq INT8 NOT NULL,
  kind TEXT NOT NULL,
  actor TEXT NOT NULL,
  occurred_at TIMESTAMPTZ NOT NULL,
  attributes JSONB NOT NULL,
  previous_hash TEXT,
  PRIMARY KEY (site_id, hash)
);
CREATE UNIQUE INDEX IF NOT EXISTS audit_records_by_seq ON audit_records (site_id, seq);
CREATE UNIQUE INDEX IF NOT EXISTS audit_records_by_previous ON audit_records (site_id, previous_hash);
CREATE INDEX IF NOT EXISTS audit_records_by_kind ON audit_records (site_id, kind, seq);
CREATE INDEX IF NOT EXISTS audit_records_by_actor ON audit_records (site_id, actor, seq);

-- The head of each site's chain: read (FOR UPDATE) and advanced in the appending SERIALIZABLE
-- transaction, so concurrent appenders serialise on this row (losers retry on 40001).
CREATE TABLE IF NOT EXISTS audit_heads (
  site_id TEXT PRIMARY KEY REFERENCES sites (site_id),
  head_hash TEXT,
  head_seq INT8 NOT NULL DEFAULT 0
);

-- Memory of API-key use per site and client address (api_key_used sampling and the api_key.used event;
-- docs/decisions/audit-key-use.md). Times are epoch milliseconds.
CREATE TABLE IF NOT EXISTS audit_key_addresses (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  key_id TEXT NOT NULL,
  ip TEXT NOT NULL,
  first_used_at BIGINT NOT NULL,
  last_sampled_at BIGINT NOT NULL,
  PRIMARY KEY (site_id, key_id, ip)
);
