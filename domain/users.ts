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

let zones: Set<string> | undefined;

/**
 * True for an IANA time zone name this runtime knows (`Europe/Berlin`, `UTC`, `Etc/GMT+5`), compared
 * exactly as the IANA database spells it (case-sensitive): the ICU zone list, plus any name the
 * runtime's DateTimeFormat resolves to itself. Offsets (`+02:00`) and abbreviations (`CET` aside) are not zones.
 */
export function isIanaTimeZone(name: string): boolean {
  if (name.length === 0 || name.length > 64) return false;
  zones ??= new Set(['UTC', ...Intl.supportedValuesOf('timeZone')]);
  if (zones.has(name)) return true;
  try {
    return new Intl.DateTimeFormat('en-US', { timeZone: name }).resolvedOptions().timeZone === name;
  } catch {
    return false;
  }
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
