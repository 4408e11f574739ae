/** Small pure helpers for digests and ids (docs/contract.md "Chunk reference", "Version id"). */
import * as crypto from 'node:crypto';
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

/** Lowercase bare SHA-256 hex, exactly 64 chars. */
export const SHA256_HEX = /^[0-9a-f]{64}$/;

export function isSha256Hex(s: unknown): s is string {
  return typeof s === 'string' && SHA256_HEX.test(s);
}

/**
 * SHA-256 of a string (UTF-8) or bytes, as lowercase hex. The one-shot `crypto.hash` (no Hash object per call:
 * about a third of `createHash(…).update(…).digest(…)`'s time on short inputs such as the API key every
 * request carries); Node before 20.12 (package.json allows 20) has no `crypto.hash` and takes the Hash object.
 */
export function sha256Hex(data: string | Buffer | Uint8Array): string {
  return oneShot ? oneShot('sha256', data, 'hex') : createHash('sha256').update(data).digest('hex');
}

const oneShot = (crypto as { hash?: typeof crypto.hash }).hash;

/** Random url-safe token: `bytes` random bytes, base64url (no padding). 32 bytes give 43 chars. */
export function randomToken(bytes = 32): string {
  return randomBytes(bytes).toString('base64url');
}

/** A prefixed random id, e.g. `newId('rol')` → `rol_3f9c…` (24 hex chars). */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(12).toString('hex')}`;
}

/** Constant-time equality of two hex strings (false when lengths differ). */
export function hexEqual(a: string, b: string): boolean {
  const ba = Buffer.from(a, 'hex');
  const bb = Buffer.from(b, 'hex');
  return ba.length === bb.length && ba.length > 0 && timingSafeEqual(ba, bb);
}
