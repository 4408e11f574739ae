/**
 * The `site_signing_keys` table and the signature columns of `roost_versions` (migration 012): storage only.
 * Key generation, sealing and signing are services/signing.ts. Every statement names `site_id`.
 */
import type { Queryable } from './pool';

/** One stored signing key: public half plain (base64url raw, the JWK `x`), private half sealed. */
export interface SigningKeyRow {
  key_id: string;
  public_key: string;
  private_key_sealed: string;
  active: boolean;
  created_at: Date;
}

/** The site's active key row, or undefined. */
export async function activeSigningKeyRow(db: Queryable, siteId: string): Promise<SigningKeyRow | undefined> {
  const { rows } = await db.query<SigningKeyRow>(
    'SELECT key_id, public_key, private_key_sealed, active, created_at FROM site_signing_keys WHERE site_id = $1 AND active',
    [siteId],
  );
  return rows[0];
}

/**
 * Stores a new active key unless the site already has one (the partial unique index allows one active key
 * per site; a concurrent winner's row is kept).
 */
export async function insertActiveSigningKey(
  db: Queryable,
  siteId: string,
  keyId: string,
  publicKey: string,
  sealed: string,
): Promise<void> {
  await db.query(
    `INSERT INTO site_signing_keys (site_id, key_id, algorithm, public_key, private_key_sealed, active)
     VALUES ($1, $2, 'Ed25519', $3, $4, true) ON CONFLICT DO NOTHING`,
    [siteId, keyId, publicKey, sealed],
  );
}

/** The site's keys that are not retired, active first, newest first. */
export async function unretiredSigningKeyRows(db: Queryable, siteId: string): Promise<SigningKeyRow[]> {
  const { rows } = await db.query<SigningKeyRow>(
    `SELECT key_id, public_key, private_key_sealed, active, created_at FROM site_signing_keys
      WHERE site_id = $1 AND retired_at IS NULL ORDER BY active DESC, created_at DESC, key_id`,
    [siteId],
  );
  return rows;
}

/** A version's stored signature. */
export interface StoredSignature {
  roost_id: string;
  version_id: string;
  signature: string;
  signing_key_id: string;
}

/**
 * Stores signatures of versions that have none (`WHERE signature IS NULL`, so a concurrent signer's value is
 * kept), then reads back what is stored for them. One UPDATE and one SELECT for any number of versions.
 */
export async function storeMissingSignatures(
  db: Queryable,
  siteId: string,
  keyId: string,
  versions: { roostId: string; versionId: string; signature: string }[],
): Promise<StoredSignature[]> {
  const roostIds = versions.map((v) => v.roostId);
  const versionIds = versions.map((v) => v.versionId);
  await db.query(
    `UPDATE roost_versions AS v SET signature = u.signature, signing_key_id = $2
       FROM UNNEST($3::text[], $4::text[], $5::text[]) AS u (roost_id, version_id, signature)
      WHERE v.site_id = $1 AND v.roost_id = u.roost_id AND v.version_id = u.version_id AND v.signature IS NULL`,
    [siteId, keyId, roostIds, versionIds, versions.map((v) => v.signature)],
  );
  const { rows } = await db.query<StoredSignature>(
    `SELECT v.roost_id, v.version_id, v.signature, v.signing_key_id FROM roost_versions v
       JOIN UNNEST($2::text[], $3::text[]) AS u (roost_id, version_id) ON v.roost_id = u.roost_id AND v.version_id = u.version_id
      WHERE v.site_id = $1`,
    [siteId, roostIds, versionIds],
  );
  return rows;
}
