/** Local secrets of the embedded default, kept under the data folder (created on first use, mode 0600). */
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import type { Config } from '../config/env';

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
