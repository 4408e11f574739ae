-- Roost schema, version 1. Portable to CockroachDB: TEXT/JSONB/BIGINT/TIMESTAMPTZ, application-made ids,
-- no sequences, triggers, LISTEN/NOTIFY or advisory locks. site_id leads every key of site-scoped data.

CREATE TABLE IF NOT EXISTS users (
  uid TEXT PRIMARY KEY,
  email TEXT NOT NULL UNIQUE,
  role TEXT NOT NULL DEFAULT 'member',            -- member | admin | superadmin
  first_name TEXT,
  last_name TEXT,
  deleted BOOLEAN NOT NULL DEFAULT false,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS sites (
  site_id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  owner_uid TEXT NOT NULL REFERENCES users (uid),
  timezone TEXT NOT NULL DEFAULT 'UTC',
  tier TEXT NOT NULL DEFAULT 'standard',
  roost_enabled BOOLEAN NOT NULL DEFAULT true,
  deploy_quota INT NOT NULL DEFAULT 100,
  enrolment_secret_hash TEXT,                     -- SHA-256 hex of the site's agent enrolment secret
  created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS site_members (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  uid TEXT NOT NULL REFERENCES users (uid),
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, uid)
);
CREATE INDEX IF NOT EXISTS site_members_by_uid ON site_members (uid);

CREATE TABLE IF NOT EXISTS api_keys (
  key_id TEXT PRIMARY KEY,
  uid TEXT NOT NULL REFERENCES users (uid),
  name TEXT NOT NULL,
  key_prefix TEXT NOT NULL,
  key_hash TEXT NOT NULL UNIQUE,                  -- SHA-256 hex of the raw key; the raw key is never stored
  scopes JSONB NOT NULL DEFAULT '[]',
  environment TEXT NOT NULL DEFAULT 'live',       -- live | test
  is_legacy BOOLEAN NOT NULL DEFAULT false,
  primary_site_id TEXT,
  status TEXT NOT NULL DEFAULT 'active',          -- active | rotated | revoked (expired/retired are derived)
  expires_at BIGINT,                              -- epoch ms
  grace_until BIGINT,                             -- epoch ms, set on rotation
  last_used_at BIGINT,                            -- epoch ms
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  revoked_at TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS api_keys_by_uid ON api_keys (uid);

CREATE TABLE IF NOT EXISTS roosts (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  roost_id TEXT NOT NULL,
  name TEXT NOT NULL,
  targets JSONB NOT NULL DEFAULT '[]',
  extract_path TEXT NOT NULL DEFAULT '',
  version_counter INT NOT NULL DEFAULT 0,
  current_version_id TEXT,
  previous_version_id TEXT,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  created_by TEXT NOT NULL,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  deleted_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, roost_id)
);

CREATE TABLE IF NOT EXISTS roost_versions (
  site_id TEXT NOT NULL,
  roost_id TEXT NOT NULL,
  version_id TEXT NOT NULL,
  version_number INT NOT NULL,
  description TEXT,
  blob_name TEXT NOT NULL,                        -- version body blob in the versions container
  total_size BIGINT NOT NULL,
  total_files INT NOT NULL,
  parent_version_id TEXT,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  created_by TEXT NOT NULL,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, roost_id, version_id),
  UNIQUE (site_id, roost_id, version_number),
  FOREIGN KEY (site_id, roost_id) REFERENCES roosts (site_id, roost_id)
);

-- Chunks a site holds. state: present once its stored size was checked at publish (or it was recorded
-- by the server itself). Chunks are per site: two sites never share rows.
CREATE TABLE IF NOT EXISTS chunks (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  hash TEXT NOT NULL,
  size BIGINT NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  verified_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, hash)
);

-- Which versions reference which chunks (referrers, garbage collection, delta plans).
CREATE TABLE IF NOT EXISTS version_chunks (
  site_id TEXT NOT NULL,
  hash TEXT NOT NULL,
  roost_id TEXT NOT NULL,
  version_id TEXT NOT NULL,
  size BIGINT NOT NULL,
  PRIMARY KEY (site_id, hash, roost_id, version_id)
);
CREATE INDEX IF NOT EXISTS version_chunks_by_version ON version_chunks (site_id, roost_id, version_id);

-- Cross-roost mounts and other referrer entries (docs/contract.md "Chunk referrer entry").
CREATE TABLE IF NOT EXISTS chunk_referrers (
  site_id TEXT NOT NULL,
  hash TEXT NOT NULL,
  entry_id TEXT NOT NULL,                         -- deterministic per (digest, siteId, from, to) for mounts
  source TEXT NOT NULL,                           -- mount
  roost_id TEXT,
  from_roost_id TEXT,
  to_roost_id TEXT,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  created_by TEXT NOT NULL,
  PRIMARY KEY (site_id, hash, entry_id)
);

CREATE TABLE IF NOT EXISTS machines (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  machine_id TEXT NOT NULL,
  hostname TEXT,
  agent_token_hash TEXT UNIQUE,                   -- SHA-256 hex of the sat_ agent token
  agent_version TEXT,
  online BOOLEAN NOT NULL DEFAULT false,
  last_heartbeat TIMESTAMPTZ,
  machine_timezone TEXT,
  machine_timezone_iana TEXT,
  info JSONB NOT NULL DEFAULT '{}',               -- host info reported by the agent
  metrics JSONB,                                  -- schemaVersion 2 metrics snapshot
  processes JSONB NOT NULL DEFAULT '[]',          -- live process list
  capabilities JSONB NOT NULL DEFAULT '{}',
  enrolled_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, machine_id)
);

-- Per machine, per roost: what the agent reports (docs/contract.md "Roost target state").
CREATE TABLE IF NOT EXISTS roost_target_states (
  site_id TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  roost_id TEXT NOT NULL,
  reported_version_id TEXT,
  status TEXT NOT NULL,                           -- pending | downloading | assembling | committed | failed | cancelled
  error TEXT,
  chunks_fetched INT NOT NULL DEFAULT 0,
  chunks_total INT NOT NULL DEFAULT 0,
  chunks_dedup INT NOT NULL DEFAULT 0,
  files_total INT NOT NULL DEFAULT 0,
  files_assembled INT NOT NULL DEFAULT 0,
  files_skipped INT NOT NULL DEFAULT 0,
  bytes_fetched BIGINT NOT NULL DEFAULT 0,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, machine_id, roost_id)
);

CREATE TABLE IF NOT EXISTS commands (
  site_id TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  command_id TEXT NOT NULL,
  type TEXT NOT NULL,                             -- reboot_machine | shutdown_machine | capture_screenshot | sync_pull | restart_process
  status TEXT NOT NULL DEFAULT 'pending',         -- pending | <intermediate> | completed | failed | cancelled
  params JSONB NOT NULL DEFAULT '{}',
  result TEXT,                                    -- success | cancelled
  error TEXT,
  progress DOUBLE PRECISION,
  rollout_id TEXT,
  deployment_id TEXT,
  audit_correlation_id TEXT,
  created_by TEXT,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  expires_at TIMESTAMPTZ,
  delivered_at TIMESTAMPTZ,
  completed_at TIMESTAMPTZ,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, machine_id, command_id)
);
CREATE INDEX IF NOT EXISTS commands_by_status ON commands (site_id, machine_id, status);

CREATE TABLE IF NOT EXISTS rollouts (
  site_id TEXT NOT NULL,
  rollout_id TEXT NOT NULL,
  roost_id TEXT NOT NULL,
  version_id TEXT NOT NULL,
  stage TEXT NOT NULL,                            -- canary | started | completed | failed
  active BOOLEAN NOT NULL DEFAULT true,           -- false once terminal
  canary JSONB NOT NULL,                          -- machine ids of the canary wave
  fleet JSONB NOT NULL,                           -- machine ids of the fleet wave
  extract_root TEXT NOT NULL,
  policy JSONB NOT NULL DEFAULT '{}',
  schedule_at TIMESTAMPTZ,
  workflow_id TEXT NOT NULL,
  abort_reason TEXT,
  succeeded INT NOT NULL DEFAULT 0,
  failed INT NOT NULL DEFAULT 0,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  created_by TEXT NOT NULL,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  completed_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, rollout_id)
);
-- At most one non-terminal rollout per (site, roost, version): the alreadyRunning rule.
CREATE UNIQUE INDEX IF NOT EXISTS rollouts_one_active ON rollouts (site_id, roost_id, version_id) WHERE active;
CREATE INDEX IF NOT EXISTS rollouts_by_roost ON rollouts (site_id, roost_id, created_at);

-- Per machine state within a rollout. status: pending | dispatched | succeeded | failed | cancelled.
CREATE TABLE IF NOT EXISTS rollout_machines (
  site_id TEXT NOT NULL,
  rollout_id TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  wave TEXT NOT NULL,                             -- canary | fleet
  status TEXT NOT NULL DEFAULT 'pending',
  attempts INT NOT NULL DEFAULT 0,
  command_id TEXT,
  last_error TEXT,
  bytes_fetched BIGINT NOT NULL DEFAULT 0,
  dispatched_at TIMESTAMPTZ,
  finished_at TIMESTAMPTZ,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, rollout_id, machine_id)
);
CREATE INDEX IF NOT EXISTS rollout_machines_by_wave ON rollout_machines (site_id, rollout_id, wave, status);

-- Outbox: every event row commits with the state change that causes it (docs/architecture.md "Events").
CREATE TABLE IF NOT EXISTS events (
  event_id TEXT PRIMARY KEY,
  site_id TEXT NOT NULL,
  type TEXT NOT NULL,
  data JSONB NOT NULL,
  occurred_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS events_by_site ON events (site_id, occurred_at);

-- Idempotency-Key replay cache (docs/contract.md Conventions). key_hash covers user, key environment, key id,
-- method, path and the Idempotency-Key value; request_hash covers query string and body.
CREATE TABLE IF NOT EXISTS idempotency_keys (
  key_hash TEXT PRIMARY KEY,
  request_hash TEXT NOT NULL,
  state TEXT NOT NULL,                            -- in_progress | done
  response_status INT,
  response_headers JSONB,
  response_body TEXT,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  expires_at TIMESTAMPTZ NOT NULL
);
