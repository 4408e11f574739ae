/**
 * Sealing secrets at rest (webhook secrets, services/webhooks.ts; per-site signing keys,
 * services/signing.ts; the key is config/secrets.ts `sealKeyOf`). AES-256-GCM with a random 96-bit nonce; the associated data binds a sealed value to its
 * owner (e.g. `webhook:<siteId>:<webhookId>`), so a sealed value copied to another row does not open.
 *
 * Sealed form: `v1.<nonce b64url>.<ciphertext b64url>.<tag b64url>` (ASCII, fits a TEXT column).
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

const PREFIX = 'v1';

/** Seals `plaintext` (UTF-8 string or bytes) with the 32-byte `key`, bound to `aad`. */
export function seal(key: Buffer, plaintext: string | Buffer, aad: string): string {
  if (key.length !== 32) throw new Error('seal: key must be 32 bytes');
  const nonce = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', key, nonce);
  cipher.setAAD(Buffer.from(aad, 'utf8'));
  const ct = Buffer.concat([cipher.update(typeof plaintext === 'string' ? Buffer.from(plaintext, 'utf8') : plaintext), cipher.final()]);
  return [PREFIX, nonce.toString('base64url'), ct.toString('base64url'), cipher.getAuthTag().toString('base64url')].join('.');
}

/**
 * Opens a value sealed by `seal` with the same key and `aad`; returns the plaintext bytes.
 * @throws Error when the form is unknown, or the key, aad or bytes do not match (authentication fails).
 */
export function openSealed(key: Buffer, sealed: string, aad: string): Buffer {
  const parts = sealed.split('.');
  if (parts.length !== 4 || parts[0] !== PREFIX) throw new Error('openSealed: not a sealed value');
  const [, nonce, ct, tag] = parts;
  const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(nonce, 'base64url'));
  decipher.setAAD(Buffer.from(aad, 'utf8'));
  decipher.setAuthTag(Buffer.from(tag, 'base64url'));
  return Buffer.concat([decipher.update(Buffer.from(ct, 'base64url')), decipher.final()]);
}
