/**
 * Per-site Ed25519 signing keys and version signatures (docs/decisions/signed-manifests.md); the rows are
 * db/signing-keys.ts.
 *
 * - A site's key is created on first need (`activeSigningKey`), race-safe: every contender generates a
 *   key pair and INSERTs it with `ON CONFLICT DO NOTHING` (the partial unique index allows one active key
 *   per site), then everyone reads the winner. The private key (PKCS#8 DER) is sealed at rest with
 *   domain/seal.ts under the service secret key, aad `signing-key:<siteId>:<keyId>`; the public key is
 *   stored plain (base64url raw, the JWK `x`).
 * - A key is served (`listSigningKeys`) only when its sealed private key opens and derives the stored
 *   public key: a row written by someone holding only the database (no secret key) is never served, so
 *   agents can refresh their key set from the service without trusting the database alone.
 * - Versions are signed at publish (the publish service stores the signature with the version); versions
 *   published before signing existed are signed on first read (`ensureVersionSignatures`, idempotent:
 *   `UPDATE … WHERE signature IS NULL`; Ed25519 is deterministic).
 *
 * Every statement names `site_id`.
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, type KeyObject } from 'node:crypto';
import { openSealed, seal } from '../domain/seal';
import { type SigningJwk, signingKeyId, signVersion, toJwk } from '../domain/signature';
import type { Queryable } from '../db/pool';
import {
  activeSigningKeyRow,
  insertActiveSigningKey,
  type SigningKeyRow as KeyRow,
  storeMissingSignatures,
  unretiredSigningKeyRows,
} from '../db/signing-keys';

/** How long a process keeps a site's opened active key (ms); rotation becomes visible after this. */
export const KEY_CACHE_MS = 60_000;

/** The active key of a site, opened. */
export interface ActiveSigningKey {
  siteId: string;
  keyId: string;
  /** base64url raw public key (JWK x). */
  publicKey: string;
  privateKey: KeyObject;
}

/** The seal key of a configuration (config/secrets.ts); re-exported for the callers of this module. */
export { sealKeyOf } from '../config/secrets';

function aad(siteId: string, keyId: string): string {
  return `signing-key:${siteId}:${keyId}`;
}

/**
 * Opens a stored key and checks that its private half derives the stored public half.
 * @returns the private key, or null when the row does not open under `sealKey` or does not match.
 */
function openRow(sealKey: Buffer, siteId: string, row: KeyRow): KeyObject | null {
  try {
    const der = openSealed(sealKey, row.private_key_sealed, aad(siteId, row.key_id));
    const privateKey = createPrivateKey({ key: der, format: 'der', type: 'pkcs8' });
    const x = createPublicKey(privateKey).export({ format: 'jwk' }).x;
    if (x !== row.public_key || signingKeyId(Buffer.from(x, 'base64url')) !== row.key_id) return null;
    return privateKey;
  } catch {
    return null;
  }
}

/** Rows already checked by `openRow` (sealed value → result), so serving keys stays cheap for a fleet enrolling. */
const checked = new Map<string, boolean>();
function opens(sealKey: Buffer, siteId: string, row: KeyRow): boolean {
  const k = `${sealKey.toString('hex').slice(0, 16)}\n${siteId}\n${row.key_id}\n${row.public_key}\n${row.private_key_sealed}`;
  let ok = checked.get(k);
  if (ok === undefined) {
    ok = openRow(sealKey, siteId, row) !== null;
    if (checked.size > 10_000) checked.clear();
    checked.set(k, ok);
  }
  return ok;
}

const activeCache = new Map<string, { key: ActiveSigningKey; at: number }>();

/**
 * The site's active signing key, created on first need (concurrent first calls agree on one key).
 * @throws Error when the stored active key does not open under `sealKey` (wrong ROOST_SECRET_KEY).
 */
export async function activeSigningKey(db: Queryable, sealKey: Buffer, siteId: string): Promise<ActiveSigningKey> {
  const cached = activeCache.get(siteId);
  if (cached && Date.now() - cached.at < KEY_CACHE_MS) return cached.key;
  const read = () => activeSigningKeyRow(db, siteId);
  let row = await read();
  if (!row) {
    const { publicKey, privateKey } = generateKeyPairSync('ed25519');
    const x = publicKey.export({ format: 'jwk' }).x as string;
    const keyId = signingKeyId(Buffer.from(x, 'base64url'));
    const sealed = seal(sealKey, privateKey.export({ format: 'der', type: 'pkcs8' }), aad(siteId, keyId));
    await insertActiveSigningKey(db, siteId, keyId, x, sealed);
    row = await read();
    if (!row) throw new Error(`signing key of site ${siteId} could not be created`);
  }
  const privateKey = openRow(sealKey, siteId, row);
  if (!privateKey) throw new Error(`the active signing key ${row.key_id} of site ${siteId} does not open with this service's secret key`);
  const key = { siteId, keyId: row.key_id, publicKey: row.public_key, privateKey };
  activeCache.set(siteId, { key, at: Date.now() });
  return key;
}

/** A served public key with its bookkeeping. */
export interface SigningKeyInfo {
  jwk: SigningJwk;
  active: boolean;
  createdAt: Date;
}

/**
 * The site's public signing keys that verify versions (not retired, and whose sealed private key opens
 * and matches), active first. Creates the site's first key when it has none, so an enrolling agent
 * always gets a key to pin.
 */
export async function listSigningKeys(db: Queryable, sealKey: Buffer, siteId: string): Promise<SigningKeyInfo[]> {
  await activeSigningKey(db, sealKey, siteId);
  const rows = await unretiredSigningKeyRows(db, siteId);
  return rows
    .filter((r) => opens(sealKey, siteId, r))
    .map((r) => ({ jwk: toJwk(r.public_key), active: r.active, createdAt: r.created_at }));
}

/** The JWKs of `listSigningKeys`. */
export async function signingJwks(db: Queryable, sealKey: Buffer, siteId: string): Promise<SigningJwk[]> {
  return (await listSigningKeys(db, sealKey, siteId)).map((k) => k.jwk);
}

/** Signs a version with the site's active key: `{ signature, keyId }` (signature base64url). */
export async function signVersionFor(
  db: Queryable,
  sealKey: Buffer,
  siteId: string,
  roostId: string,
  versionId: string,
): Promise<{ signature: string; keyId: string }> {
  const key = await activeSigningKey(db, sealKey, siteId);
  return { signature: signVersion(key.privateKey, siteId, roostId, versionId), keyId: key.keyId };
}

/** The signature columns of a version row (db/roosts.ts VersionRow has them). */
export interface SignableRow {
  roost_id: string;
  version_id: string;
  signature: string | null;
  signing_key_id: string | null;
}

/**
 * Signs the rows of one site that have no signature yet (versions published before signing existed),
 * stores the signatures (`WHERE signature IS NULL`, so a concurrent signer's value is kept) and fills
 * them into the rows in place. One UPDATE for any number of rows; nothing when all are signed.
 */
export async function ensureVersionSignatures<T extends SignableRow>(
  db: Queryable,
  sealKey: Buffer,
  siteId: string,
  rows: T[],
): Promise<T[]> {
  const unsigned = rows.filter((r) => !r.signature || !r.signing_key_id);
  if (unsigned.length === 0) return rows;
  const key = await activeSigningKey(db, sealKey, siteId);
  const sigs = unsigned.map((r) => signVersion(key.privateKey, siteId, r.roost_id, r.version_id));
  const stored = await storeMissingSignatures(
    db,
    siteId,
    key.keyId,
    unsigned.map((r, i) => ({ roostId: r.roost_id, versionId: r.version_id, signature: sigs[i] })),
  );
  const byKey = new Map(stored.map((s) => [`${s.roost_id}\n${s.version_id}`, s]));
  unsigned.forEach((r, i) => {
    const s = byKey.get(`${r.roost_id}\n${r.version_id}`);
    r.signature = s?.signature ?? sigs[i];
    r.signing_key_id = s?.signing_key_id ?? key.keyId;
  });
  return rows;
}
