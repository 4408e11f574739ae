-- Identity (docs/contract.md "Authentication"): first-party sessions and the API key lifecycle columns.
-- docs/decisions/sessions.md, docs/decisions/api-key-lifecycle.md.

-- First-party sessions: an opaque `sst_` token obtained by exchanging an ID token. Only the SHA-256 of the
-- token is stored. Times are epoch milliseconds, like api_keys.
CREATE TABLE IF NOT EXISTS sessions (
  session_id TEXT PRIMARY KEY,
  uid TEXT NOT NULL REFERENCES users (uid),
  token_hash TEXT NOT NULL UNIQUE,                -- SHA-256 hex of the raw sst_ token
  issuer TEXT NOT NULL,                           -- iss of the ID token that was exchanged
  subject TEXT NOT NULL,                          -- sub of that ID token
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  last_used_at BIGINT,
  revoked_at BIGINT,
  user_agent TEXT,
  ip TEXT
);
CREATE INDEX IF NOT EXISTS sessions_by_uid ON sessions (uid);

-- Key lifecycle: the lifetime a key was issued with (a rotation issues its successor with the same),
-- when it was rotated and by which key it was replaced, and who created it (the owner, or the superadmin
-- who created it through /api/account/api-keys).
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS lifetime_days INT;
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS rotated_at BIGINT;
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS replaced_by TEXT;
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS rotated_from TEXT;
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS created_by TEXT;
CREATE INDEX IF NOT EXISTS api_keys_by_created ON api_keys (created_at, key_id);
