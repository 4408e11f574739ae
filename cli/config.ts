/**
 * The `roost` CLI's config file: defaults for the global options and the signed-in session that
 * `roost login` stores (the way `gh auth login` keeps its token). Location: `ROOST_CONFIG` when set,
 * else `config.json` in the platform's standard config folder (env-paths: `$XDG_CONFIG_HOME/roost` or
 * `~/.config/roost` on Linux, `%APPDATA%\roost\Config` on Windows, `~/Library/Preferences/roost` on macOS).
 * The file holds credentials, so it is written owner-only (0600 in a 0700 folder; on Windows the
 * per-user profile folder already restricts it). Precedence of every value: flag, then environment,
 * then this file, then the built-in default.
 */
import fs from 'node:fs';
import path from 'node:path';
import envPaths from 'env-paths';

/** A session obtained by `roost login` (`POST /api/auth/session`). */
export interface StoredSession {
  /** The opaque session token (`sst_…`), sent as `Authorization: Bearer`. */
  token: string;
  /** API base URL the session belongs to. */
  api: string;
  sessionId: string;
  userId: string;
  email: string;
  /** Epoch ms after which the API refuses the session. */
  expiresAt: number;
}

/** What the config file may hold. Unknown keys are kept as they are. */
export interface CliConfig {
  api?: string;
  site?: string;
  key?: string;
  session?: StoredSession;
  [extra: string]: unknown;
}

/** Keys `roost config set` accepts. */
export const SETTABLE_KEYS = ['api', 'site', 'key'] as const;
export type SettableKey = (typeof SETTABLE_KEYS)[number];

/** Absolute path of the config file (`ROOST_CONFIG` wins). */
export function configPath(): string {
  const override = process.env.ROOST_CONFIG;
  if (override) return path.resolve(override);
  return path.join(envPaths('roost', { suffix: '' }).config, 'config.json');
}

/** Reads the config file; `{}` when it does not exist. @throws Error when it exists but is not a JSON object. */
export function readConfig(file = configPath()): CliConfig {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw err;
  }
  const parsed: unknown = JSON.parse(text);
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error(`${file} is not a JSON object`);
  return parsed as CliConfig;
}

/** Writes the config file atomically, owner-only (0600; folder 0700). */
export function writeConfig(config: CliConfig, file = configPath()): void {
  fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, `${JSON.stringify(config, null, 2)}\n`, { mode: 0o600 });
  fs.chmodSync(tmp, 0o600);
  fs.renameSync(tmp, file);
}

/** Applies `change` to the stored config and writes it back; returns the new config. */
export function updateConfig(change: (c: CliConfig) => CliConfig, file = configPath()): CliConfig {
  const next = change(readConfig(file));
  writeConfig(next, file);
  return next;
}
