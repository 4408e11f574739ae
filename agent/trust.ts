/**
 * The site signing keys the reference agent trusts, and the signature check of a version before anything
 * of it is fetched (docs/agent-protocol.md "Signed versions"; docs/decisions/signed-manifests.md). Keys are
 * pinned from the enrolment answer or the saved state, and refreshed only from
 * `GET /api/agent/signing-keys`: a key named by a version answer is never trusted on its own.
 */
import { isValidJwk, type SigningJwk, verifyVersionSignature } from '../domain/signature';
import { SyncFailure } from './errors';

/** Error of a sync whose version signature is missing, by an unknown key, or does not verify. */
export const SIGNATURE_INVALID = 'signature_invalid';

/** Pinned site signing keys, by kid. */
export class KeyRing {
  private readonly byKid = new Map<string, SigningJwk>();

  /** Pins every valid Ed25519 JWK of `keys` (anything else is ignored). @returns how many kids were new. */
  pin(keys: unknown): number {
    if (!Array.isArray(keys)) return 0;
    const before = this.byKid.size;
    for (const k of keys) {
      if (isValidJwk(k)) this.byKid.set(k.kid, { kty: 'OKP', crv: 'Ed25519', x: k.x, kid: k.kid, alg: 'EdDSA', use: 'sig' });
    }
    return this.byKid.size - before;
  }

  /** The pinned keys. */
  get keys(): SigningJwk[] {
    return [...this.byKid.values()];
  }

  /** The pinned key of `kid`, if any. */
  get(kid: string): SigningJwk | undefined {
    return this.byKid.get(kid);
  }
}

/** What a signature check needs besides the ring: a refresh of the pinned keys and a place for warnings. */
export interface SignatureCheck {
  siteId: string;
  keys: KeyRing;
  /** GET /api/agent/signing-keys and pin what it returns (called at most once, for an unknown kid). */
  refresh: () => Promise<void>;
  warn: (message: string) => void;
}

/**
 * Checks a version's signature against the pinned keys, refreshing them once when the kid is unknown.
 * @throws SyncFailure `signature_invalid` when unsigned, signed by an unknown key, or the signature does
 *         not verify.
 */
export async function verifySignature(
  check: SignatureCheck,
  roostId: string,
  versionId: string,
  signature: string | undefined,
  kid: string | undefined,
): Promise<void> {
  if (typeof signature !== 'string' || typeof kid !== 'string') {
    check.warn(`version ${versionId} of ${roostId} is unsigned; refused`);
    throw new SyncFailure(SIGNATURE_INVALID);
  }
  if (!check.keys.get(kid)) await check.refresh();
  const key = check.keys.get(kid);
  if (!key) {
    check.warn(`version ${versionId} of ${roostId} is signed by unknown key ${kid}; refused`);
    throw new SyncFailure(SIGNATURE_INVALID);
  }
  if (!verifyVersionSignature(key, check.siteId, roostId, versionId, signature)) {
    check.warn(`version ${versionId} of ${roostId}: signature does not verify with ${kid}; refused`);
    throw new SyncFailure(SIGNATURE_INVALID);
  }
}
