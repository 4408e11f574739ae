/** Local secrets of the embedded default, kept under the data folder (created on first use, mode 0600). */
import fs from 'node:fs';
import path from 'node:path';
import { hkdfSync, randomBytes } from 'node:crypto';
import type { Config } from './env';

/** The bootstrap secret: ROOST_BOOTSTRAP_SECRET, else DATA/bootstrap-secret (generated once). */
export function bootstrapSecret(cfg: Config): string {
  if (cfg.ROOST_BOOTSTRAP_SECRET) return cfg.ROOST_BOOTSTRAP_SECRET;
  const file = path.join(cfg.ROOST_DATA_DIR, 'bootstrap-secret');
  if (!fs.existsSync(file)) {
    fs.mkdirSync(cfg.ROOST_DATA_DIR, { recursive: true });
    fs.writeFileSync(file, randomBytes(32).toString('base64url'), { mode: 0o600, flag: 'wx' });
  }
  return fs.readFileSync(file, 'utf8').trim();
}

/**
 * The 32-byte key that seals secrets at rest (domain/seal.ts): ROOST_SECRET_KEY (64 hex chars or base64
 * of 32 bytes), else DATA/secret-key (generated once, mode 0600). Throws when ROOST_SECRET_KEY is not 32
 * bytes.
 */
export function secretKey(cfg: Config): Buffer {
  if (cfg.ROOST_SECRET_KEY) {
    const v = cfg.ROOST_SECRET_KEY.trim();
    const key = /^[0-9a-fA-F]{64}$/.test(v) ? Buffer.from(v, 'hex') : Buffer.from(v, 'base64');
    if (key.length !== 32) throw new Error('ROOST_SECRET_KEY must be 32 bytes (64 hex characters or base64)');
    return key;
  }
  const file = path.join(cfg.ROOST_DATA_DIR, 'secret-key');
  if (!fs.existsSync(file)) {
    fs.mkdirSync(cfg.ROOST_DATA_DIR, { recursive: true });
    try {
      fs.writeFileSync(file, randomBytes(32).toString('hex'), { mode: 0o600, flag: 'wx' });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
  return Buffer.from(fs.readFileSync(file, 'utf8').trim(), 'hex');
}

const sealKeys = new WeakMap<object, Buffer>();

/**
 * The seal key of a configuration (`secretKey`), read once per configuration object: the one cache every
 * sealing user shares (signing keys, webhook secrets).
 * @throws like `secretKey`.
 */
export function sealKeyOf(cfg: Config): Buffer {
  let k = sealKeys.get(cfg);
  if (!k) sealKeys.set(cfg, (k = secretKey(cfg)));
  return k;
}

const derivedKeys = new WeakMap<object, Map<string, Buffer>>();

/**
 * A 32-byte key for one purpose (for example 'roost.page_token.v2': api/pagination.ts), derived with
 * HKDF-SHA-256 from the seal key (`sealKeyOf`, so every API process sharing ROOST_SECRET_KEY derives the
 * same key) and cached per configuration object and purpose. Purposes never share a key.
 * @throws like `secretKey`.
 */
export function derivedKeyOf(cfg: Config, purpose: string): Buffer {
  let byPurpose = derivedKeys.get(cfg);
  if (!byPurpose) derivedKeys.set(cfg, (byPurpose = new Map()));
  let k = byPurpose.get(purpose);
  if (!k) byPurpose.set(purpose, (k = Buffer.from(hkdfSync('sha256', sealKeyOf(cfg), Buffer.alloc(0), purpose, 32))));
  return k;
}
