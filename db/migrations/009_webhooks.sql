-- Webhook subscriptions, deliveries and attempts (docs/contract.md "Webhook subscription", "Events" › Delivery;
-- db/webhooks.ts; docs/decisions/webhooks.md). Portable to CockroachDB: text ids, no sequences.

-- A subscription. Secrets are sealed (domain/seal.ts, AES-256-GCM) with associated data
-- `webhook:<siteId>:<webhookId>`; during a rotation's grace window the previous secret signs too.
CREATE TABLE IF NOT EXISTS webhooks (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  webhook_id TEXT NOT NULL,
  url TEXT NOT NULL,
  name TEXT NOT NULL,
  events TEXT[] NOT NULL,
  enabled BOOLEAN NOT NULL DEFAULT true,
  paused BOOLEAN NOT NULL DEFAULT false,
  secret_sealed TEXT NOT NULL,
  previous_secret_sealed TEXT,
  previous_secret_expires_at TIMESTAMPTZ,
  secret_rotated_at TIMESTAMPTZ,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  created_by TEXT NOT NULL,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  last_triggered_at TIMESTAMPTZ,
  last_status TEXT,
  last_response_code INT,
  fail_count INT NOT NULL DEFAULT 0,
  PRIMARY KEY (site_id, webhook_id)
);
CREATE INDEX IF NOT EXISTS webhooks_by_created ON webhooks (site_id, created_at, webhook_id);

-- One delivery per (subscription, event): the unique key makes fan-out idempotent when two relays (or a
-- retried relay activity) see the same event. `payload` holds the exact body bytes sent on every attempt.
CREATE TABLE IF NOT EXISTS webhook_deliveries (
  site_id TEXT NOT NULL,
  delivery_id TEXT NOT NULL,
  webhook_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  payload TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',          -- pending | succeeded | failed
  attempts INT NOT NULL DEFAULT 0,
  last_error TEXT,
  next_attempt_at TIMESTAMPTZ,
  dispatched_at TIMESTAMPTZ,                       -- when a delivery workflow was started for it
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  completed_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, delivery_id),
  UNIQUE (webhook_id, event_id)
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_by_webhook ON webhook_deliveries (site_id, webhook_id, created_at, delivery_id);
CREATE INDEX IF NOT EXISTS webhook_deliveries_undispatched ON webhook_deliveries (created_at) WHERE dispatched_at IS NULL;

-- Every HTTP attempt of a delivery, numbered 1, 2, … across delivery runs (manual retries append).
CREATE TABLE IF NOT EXISTS webhook_attempts (
  site_id TEXT NOT NULL,
  delivery_id TEXT NOT NULL,
  attempt_no INT NOT NULL,
  started_at TIMESTAMPTZ NOT NULL,
  latency_ms INT NOT NULL,
  response_code INT,
  error TEXT,
  PRIMARY KEY (site_id, delivery_id, attempt_no)
);

-- Fan-out cursor per site: the last event seq (db/events.ts sequenceEvents) turned into deliveries.
CREATE TABLE IF NOT EXISTS webhook_cursors (
  site_id TEXT PRIMARY KEY,
  last_seq INT8 NOT NULL
);
