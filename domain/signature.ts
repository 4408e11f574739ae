/**
 * Version signatures (docs/decisions/signed-manifests.md; docs/agent-protocol.md "Signed versions"):
 * the pure, dependency-free half shared by the service (db/signing-keys.ts signs) and the reference agent
 * (verifies). Ed25519 via node:crypto.
 *
 * What is signed is the UTF-8 message `roost-version-v1:<siteId>:<roostId>:<versionId>`: the version id
 * is SHA-256 of the canonical body (RFC 8785), so it commits to every file, size and chunk digest; the
 * domain prefix keeps the signature from meaning anything else, and site and roost bind it to where it
 * was published (a version of another site or roost does not verify).
 *
 * Keys travel as JWK (RFC 8037): `{ kty: 'OKP', crv: 'Ed25519', x: <base64url raw 32-byte key>, kid,
 * alg: 'EdDSA', use: 'sig' }`; signatures as base64url of the 64 raw bytes.
 */
import { createHash, createPublicKey, type KeyObject, sign, verify } from 'node:crypto';

/** Domain-separation prefix of the signed message (bump the version to change what is signed). */
export const SIGNATURE_DOMAIN = 'roost-version-v1';

/** A public signing key as served (JWK, RFC 8037). */
export interface SigningJwk {
  kty: 'OKP';
  crv: 'Ed25519';
  /** base64url of the raw 32-byte public key. */
  x: string;
  /** Key id: `sk_` + 24 hex of SHA-256(raw public key). */
  kid: string;
  alg: 'EdDSA';
  use: 'sig';
}

/** The exact bytes signed for a version. */
export function versionSigningMessage(siteId: string, roostId: string, versionId: string): Buffer {
  return Buffer.from(`${SIGNATURE_DOMAIN}:${siteId}:${roostId}:${versionId}`, 'utf8');
}

/** Key id of a raw Ed25519 public key (a thumbprint, so two processes racing to create a key never disagree about an id). */
export function signingKeyId(rawPublicKey: Buffer): string {
  return `sk_${createHash('sha256').update(rawPublicKey).digest('hex').slice(0, 24)}`;
}

/** The JWK of a raw public key given as base64url. */
export function toJwk(x: string): SigningJwk {
  return { kty: 'OKP', crv: 'Ed25519', x, kid: signingKeyId(Buffer.from(x, 'base64url')), alg: 'EdDSA', use: 'sig' };
}

/** Signs a version with an Ed25519 private key; returns base64url of the 64-byte signature. */
export function signVersion(privateKey: KeyObject, siteId: string, roostId: string, versionId: string): string {
  return sign(null, versionSigningMessage(siteId, roostId, versionId), privateKey).toString('base64url');
}

/** A JWK is a well-formed Ed25519 public key whose kid is its thumbprint. */
export function isValidJwk(k: unknown): k is SigningJwk {
  const j = k as SigningJwk;
  if (!j || j.kty !== 'OKP' || j.crv !== 'Ed25519' || typeof j.x !== 'string' || typeof j.kid !== 'string') return false;
  if (!/^[A-Za-z0-9_-]{43}$/.test(j.x)) return false;
  return signingKeyId(Buffer.from(j.x, 'base64url')) === j.kid;
}

/**
 * True when `signature` (base64url) is a valid Ed25519 signature of the version by the key `jwk`.
 * Never throws: malformed keys or signatures are simply invalid.
 */
export function verifyVersionSignature(jwk: SigningJwk, siteId: string, roostId: string, versionId: string, signature: string): boolean {
  try {
    if (!isValidJwk(jwk) || !/^[A-Za-z0-9_-]{86}$/.test(signature)) return false;
    const key = createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: jwk.x }, format: 'jwk' });
    return verify(null, versionSigningMessage(siteId, roostId, versionId), key, Buffer.from(signature, 'base64url'));
  } catch {
    return false;
  }
}
