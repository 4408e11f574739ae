-- The agent-installer catalog (`/api/installer…`, services/installers.ts, docs/decisions/installer-catalog.md).
-- Platform-wide: no site_id. One row per semver version, from its upload reservation on:
--   state 'uploading' (step 1 reserved it; the bytes go straight to blob storage), 'active' (finalised:
--   the finalise workflow re-hashed the stored bytes and they matched), 'deleted' (soft delete).
-- A version is never reused, whatever its state.
CREATE TABLE IF NOT EXISTS installer_versions (
  version TEXT PRIMARY KEY,                       -- X.Y.Z
  major INT NOT NULL,
  minor INT NOT NULL,
  patch INT NOT NULL,
  state TEXT NOT NULL DEFAULT 'uploading',        -- uploading | active | deleted
  sha256 TEXT NOT NULL,                           -- declared at step 1; verified against the stored bytes at finalise
  release_notes TEXT,
  blob_name TEXT NOT NULL,                        -- in the installers container
  size_bytes BIGINT,                              -- measured at finalise
  upload_key_hash TEXT NOT NULL,                  -- SHA-256 of step 1's Idempotency-Key (finalise must carry the same key)
  upload_expires_at TIMESTAMPTZ NOT NULL,         -- the upload URL's expiry; an unfinalised reservation past it may be taken over
  created_by TEXT NOT NULL,                       -- actor of step 1 (user:<uid> or apiKey:<keyId>)
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  finalized_by TEXT,
  finalized_at TIMESTAMPTZ,
  deleted_by TEXT,
  deleted_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX IF NOT EXISTS installer_versions_by_semver ON installer_versions (major, minor, patch);

-- The latest pointer: at most one row (`id` is always 1). Absent until a version is first made latest.
CREATE TABLE IF NOT EXISTS installer_latest (
  id INT PRIMARY KEY CHECK (id = 1),
  version TEXT NOT NULL REFERENCES installer_versions (version),
  updated_by TEXT NOT NULL,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
