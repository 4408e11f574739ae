-- Signed manifests (docs/decisions/signed-manifests.md).
-- Per-site Ed25519 signing keys: the private key sealed at rest (domain/seal.ts, aad
-- `signing-key:<siteId>:<keyId>`), the public key plain (raw 32 bytes, base64url). Several keys per site
-- may exist (rotation); at most one is active (the one new signatures use).
CREATE TABLE IF NOT EXISTS site_signing_keys (
  site_id TEXT NOT NULL,
  key_id TEXT NOT NULL,                           -- sk_<24 hex of SHA-256(raw public key)>
  algorithm TEXT NOT NULL DEFAULT 'Ed25519',
  public_key TEXT NOT NULL,                       -- raw public key, base64url (JWK "x")
  private_key_sealed TEXT NOT NULL,               -- PKCS#8 DER, sealed
  active BOOLEAN NOT NULL DEFAULT true,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  retired_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, key_id)
);
-- One active key per site: concurrent first uses race on this index (INSERT … ON CONFLICT DO NOTHING, then read).
CREATE UNIQUE INDEX IF NOT EXISTS site_signing_keys_one_active ON site_signing_keys (site_id) WHERE active;

-- The service's signature of each version (message `roost-version-v1:<siteId>:<roostId>:<versionId>`),
-- base64url, and the key that made it. NULL for versions published before this change: signed on first read.
ALTER TABLE roost_versions ADD COLUMN IF NOT EXISTS signature TEXT;
ALTER TABLE roost_versions ADD COLUMN IF NOT EXISTS signing_key_id TEXT;
