-- Users, sign-in and membership (docs/decisions/users.md, docs/decisions/user-sign-in.md).

-- When a user was soft-deleted (users.deleted stays the flag every credential check reads), and the
-- display name an ID token's `name` claim carried.
ALTER TABLE users ADD COLUMN IF NOT EXISTS deleted_at TIMESTAMPTZ;
ALTER TABLE users ADD COLUMN IF NOT EXISTS display_name TEXT;
CREATE INDEX IF NOT EXISTS users_by_created ON users (created_at, uid);

-- External identities: which Roost user an issuer's subject is. Written on a user's first sign-in (or on
-- the first sign-in that matched an existing user by email), read before the email on every later one,
-- so a changed email at the issuer keeps the same Roost user.
CREATE TABLE IF NOT EXISTS user_identities (
  issuer TEXT NOT NULL,
  subject TEXT NOT NULL,
  uid TEXT NOT NULL REFERENCES users (uid),
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (issuer, subject)
);
CREATE INDEX IF NOT EXISTS user_identities_by_uid ON user_identities (uid);

-- The user-delete cascade (`DELETE /api/users/{uid}`, workflows/user-delete.ts): one row per deleted
-- user, written with the soft delete; each step of the workflow records its result here in the
-- transaction that does the step, so a step run again after a worker restart finds it done.
CREATE TABLE IF NOT EXISTS user_deletions (
  uid TEXT PRIMARY KEY REFERENCES users (uid),
  successor_uid TEXT REFERENCES users (uid),
  requested_by TEXT NOT NULL,
  workflow_id TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'running',         -- running | completed
  keys_revoked INT,                               -- NULL until the step ran
  sessions_revoked INT,
  commands_cancelled INT,
  sites_transferred JSONB,                        -- site ids moved to the successor
  requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  completed_at TIMESTAMPTZ
);

-- Pending commands a user queued, found by user across sites (remove-sites and the delete cascade cancel them).
CREATE INDEX IF NOT EXISTS commands_by_creator ON commands (created_by, status);
