/**
 * API key rules (docs/contract.md "API key and scope", "Authentication" 3 and 8, "Limits"). Pure:
 * the key format, its display prefix, lifetimes, and the list-view status derived from the stored state.
 *
 * Stored state (`api_keys.status`) is one of active, rotated, revoked; the list view adds the derived
 * states expired (expiresAt passed) and retired (rotated and its 24 h grace ended).
 */
import { randomBytes } from 'node:crypto';

export const KEY_ENVIRONMENTS = ['live', 'test'] as const;
export type KeyEnvironment = (typeof KEY_ENVIRONMENTS)[number];

/** Every status the list view shows. */
export const KEY_STATUSES = ['active', 'rotated', 'expired', 'retired', 'revoked'] as const;
export type KeyStatus = (typeof KEY_STATUSES)[number];

/** What `api_keys.status` stores. */
export type StoredKeyStatus = 'active' | 'rotated' | 'revoked';

/** `svk_live_` or `svk_test_` followed by 43 base64url characters (32 random bytes). */
export const API_KEY_RE = /^svk_(live|test)_[A-Za-z0-9_-]{43}$/;

/** Length of the display prefix kept in `keyPrefix` (docs/contract.md: about the first 12 characters). */
export const KEY_PREFIX_LENGTH = 12;

export const DAY_MS = 24 * 60 * 60 * 1000;
export const DEFAULT_LIFETIME_DAYS = 90;
export const MIN_LIFETIME_DAYS = 1;
export const MAX_LIFETIME_DAYS = 365;
/** How long a rotated key keeps working (docs/contract.md: 24 hours). */
export const ROTATION_GRACE_MS = DAY_MS;

/** Presets of key creation (docs/contract.md "API key and scope"); mutually exclusive with an explicit scope list. */
export const KEY_PRESETS = ['readonly', 'publisher', 'operator', 'admin'] as const;
export type KeyPreset = (typeof KEY_PRESETS)[number];

/** A fresh raw key for `environment`: `svk_<env>_` + base64url(32 random bytes). Shown once, never stored. */
export function generateApiKey(environment: KeyEnvironment): string {
  return `svk_${environment}_${randomBytes(32).toString('base64url')}`;
}

/** True when `raw` has the key format (says nothing about whether the key exists). */
export function isApiKeyFormat(raw: string): boolean {
  return API_KEY_RE.test(raw);
}

/** The display prefix of a raw key (its first 12 characters, e.g. `svk_live_AbC`). */
export function keyPrefix(raw: string): string {
  return raw.slice(0, KEY_PREFIX_LENGTH);
}

/** The environment a raw key names, from its prefix. @throws Error when the format is wrong. */
export function keyEnvironmentOf(raw: string): KeyEnvironment {
  const m = API_KEY_RE.exec(raw);
  if (!m) throw new Error('not an API key');
  return m[1] as KeyEnvironment;
}

/** Expiry (epoch ms) of a key issued at `issuedAt` (epoch ms) with a lifetime of `days` whole days. */
export function expiresAtFor(issuedAt: number, days: number): number {
  return issuedAt + days * DAY_MS;
}

/** True when `days` is a whole number of days within 1..365. */
export function isValidLifetime(days: number): boolean {
  return Number.isInteger(days) && days >= MIN_LIFETIME_DAYS && days <= MAX_LIFETIME_DAYS;
}

/** The stored fields the derived status depends on (epoch ms, null when unset). */
export interface KeyStateFields {
  status: StoredKeyStatus | string;
  expiresAt: number | null;
  graceUntil: number | null;
}

/**
 * The list-view status at `now` (epoch ms): revoked stays revoked; a rotated key is `rotated` while its
 * grace lasts and `retired` after (a rotated key without a grace end is retired); otherwise a key whose
 * expiresAt has passed is `expired` (also during a rotation grace), else `active`.
 */
export function deriveKeyStatus(k: KeyStateFields, now: number): KeyStatus {
  if (k.status === 'revoked') return 'revoked';
  if (k.status === 'rotated' && (k.graceUntil === null || k.graceUntil <= now)) return 'retired';
  if (k.expiresAt !== null && k.expiresAt <= now) return 'expired';
  return k.status === 'rotated' ? 'rotated' : 'active';
}

/**
 * Why a presented key cannot authenticate at `now`, or null when it can (docs/contract.md "Authentication" 10):
 * revoked and retired keys are `unauthorized`; an expired key is `token_expired`.
 */
export function keyRejection(k: KeyStateFields, now: number): null | { code: 'unauthorized' | 'token_expired'; detail: string } {
  switch (deriveKeyStatus(k, now)) {
    case 'revoked':
      return { code: 'unauthorized', detail: 'this API key was revoked' };
    case 'retired':
      return { code: 'unauthorized', detail: 'this API key was rotated and its 24 h grace period has ended' };
    case 'expired':
      return { code: 'token_expired', detail: 'this API key has expired' };
    default:
      return null;
  }
}

/** True when a key in this state may be rotated: only active and expired keys (rotating renews them). */
export function isRotatable(status: KeyStatus): boolean {
  return status === 'active' || status === 'expired';
}

/**
 * Which sites a key's environment may act on (docs/decisions/test-keys.md): a key acts only on sites of
 * its own environment, `svk_test_` keys on sandbox ('test') sites and `svk_live_` keys on live sites.
 * Sessions and ID tokens are not keys and act on both.
 */
export function keyMayActOnSiteEnvironment(keyEnvironment: KeyEnvironment, siteEnvironment: KeyEnvironment): boolean {
  return keyEnvironment === siteEnvironment;
}

/**
 * The site environments a credential may act on (`keyMayActOnSiteEnvironment`): the key's own, or both for
 * sessions and ID tokens (`keyEnvironment` undefined). Lists of sites (`GET /api/sites`) filter by it.
 */
export function siteEnvironmentsFor(keyEnvironment: KeyEnvironment | undefined): KeyEnvironment[] {
  return KEY_ENVIRONMENTS.filter((env) => keyEnvironment === undefined || keyMayActOnSiteEnvironment(keyEnvironment, env));
}

/**
 * Whether a key's environment may change platform-wide state (users and their site memberships, the agent
 * installer catalog): the platform has no sandbox copy, so only `svk_live_` keys may (docs/decisions/test-keys.md).
 * Reads are open to both; a `svk_test_` key may still create sandbox sites (`siteEnvironmentFor`).
 */
export function keyMayChangePlatform(keyEnvironment: KeyEnvironment): boolean {
  return keyEnvironment === 'live';
}

/**
 * The environment of a site created with `requested` (undefined when the body names none) by a credential
 * whose key environment is `keyEnvironment` (undefined for sessions and ID tokens): the request's, else the
 * key's, else live. Null when a `svk_test_` key asks for a live site (refused: a test key never creates live
 * data). A live key may create sandbox sites, as `roost admin bootstrap --sandbox` does.
 */
export function siteEnvironmentFor(
  keyEnvironment: KeyEnvironment | undefined,
  requested: KeyEnvironment | undefined,
): KeyEnvironment | null {
  const env = requested ?? keyEnvironment ?? 'live';
  return keyEnvironment === 'test' && env !== 'test' ? null : env;
}
