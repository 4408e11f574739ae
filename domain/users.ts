/**
 * Rules of users and sites (docs/decisions/users.md, docs/decisions/sites.md). Pure.
 */
import type { UserRole } from './principal';

/** Every user role, least to most privileged. */
export const USER_ROLES: readonly UserRole[] = ['member', 'admin', 'superadmin'];

/** An email address as sign-up accepts it: one `@`, no spaces, a dot in the domain, at most 254 characters. */
export const EMAIL_RE = /^(?=.{3,254}$)[^\s@]+@[^\s@]+\.[^\s@]+$/;

/** Site tiers (the quota tiers of db/quota.ts). */
export const SITE_TIERS = ['free', 'standard', 'pro', 'enterprise'] as const;

/**
 * The shape of an IANA zone name: `/`-separated parts, each starting with a capital letter, as every name
 * of the tz database does (`Europe/Berlin`, `America/Argentina/Buenos_Aires`, `Etc/GMT+5`, `US/Eastern`, `GMT`).
 * Refuses offsets (`+05:30`), which newer runtimes accept as zones, and lower-case spellings (`europe/berlin`).
 */
const IANA_NAME_RE = /^[A-Z][A-Za-z0-9_+-]*(?:\/[A-Z][A-Za-z0-9_+-]*)*$/;
/** Names accepted so far (the checks construct a DateTimeFormat); capped so refused case variants cannot grow it. */
const knownZones = new Set<string>();
const KNOWN_ZONES_MAX = 2048;

/**
 * True for an IANA time zone name this runtime's ICU database knows, canonical or alias (`Europe/Berlin`,
 * `Asia/Kolkata` and its older `Asia/Calcutta`, `Europe/Kyiv`, `Etc/UTC`, `GMT`, `US/Eastern`, `Etc/GMT+5`):
 * any name `Intl.DateTimeFormat` accepts, spelled as the tz database spells it. Offsets (`+02:00`), unknown
 * names and spellings that differ from the runtime's only in letter case (`EUROPE/BERLIN`) are not zones.
 * One rule for site time zones (services/sites.ts, `roost admin bootstrap`) and for reading them back
 * (rollout maintenance windows, the agent's process schedules). The name is not canonicalised: callers
 * store it as given.
 */
export function isIanaTimeZone(name: string): boolean {
  if (knownZones.has(name)) return true;
  if (name.length === 0 || name.length > 64 || !IANA_NAME_RE.test(name)) return false;
  let resolved: string;
  try {
    // Throws RangeError for a name the runtime does not know; resolves aliases to ICU's canonical name.
    resolved = new Intl.DateTimeFormat('en-US', { timeZone: name }).resolvedOptions().timeZone;
  } catch {
    return false;
  }
  if (resolved !== name && resolved.toLowerCase() === name.toLowerCase()) return false;
  if (knownZones.size < KNOWN_ZONES_MAX) knownZones.add(name);
  return true;
}

/** Why a successor cannot inherit a deleted user's sites, or null when it can (`DELETE /api/users/{uid}`). */
export function successorProblem(
  uid: string,
  successor: { uid: string; role: UserRole; deleted: boolean } | undefined,
): 'not_found' | 'self' | 'deleted' | 'role' | null {
  if (!successor) return 'not_found';
  if (successor.uid === uid) return 'self';
  if (successor.deleted) return 'deleted';
  if (successor.role !== 'admin' && successor.role !== 'superadmin') return 'role';
  return null;
}
