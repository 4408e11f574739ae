/**
 * Rules of the agent-installer catalog (`/api/installer…`; docs/decisions/installer-catalog.md). Pure.
 *
 * Versions are semver `X.Y.Z` (three decimal numbers, no leading zeros, no pre-release or build parts),
 * each part at most 9 digits so it fits an INT column and sorts numerically.
 */

/** A catalog version as the wire carries it: `X.Y.Z`. */
export const INSTALLER_VERSION_RE = /^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})$/;

/** Fewest active (not soft-deleted) versions the catalog keeps (docs/contract.md Limits). */
export const MIN_ACTIVE_INSTALLER_VERSIONS = 2;

/** Longest release notes, characters. */
export const MAX_RELEASE_NOTES = 10_000;

/** The three numbers of a semver `X.Y.Z`. */
export type Semver = [number, number, number];

/** The numbers of `version`, or null when it is not a catalog version (`1.2`, `1.2.3-beta`, `01.2.3`). */
export function parseInstallerVersion(version: string): Semver | null {
  const m = INSTALLER_VERSION_RE.exec(version);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : null;
}

/** Negative, zero or positive as `a` is older than, equal to or newer than `b` (semver order). */
export function compareSemver(a: Semver, b: Semver): number {
  return a[0] - b[0] || a[1] - b[1] || a[2] - b[2];
}

/**
 * True when the catalog's `latest` is newer than the agent's `current` version. An agent version that is
 * not `X.Y.Z` (a development build such as `0.1.0-reference`) is compared by its `X.Y.Z` prefix when it
 * has one, and is never offered an update otherwise.
 */
export function isNewerInstaller(latest: string, current: string): boolean {
  const l = parseInstallerVersion(latest);
  const c = parseInstallerVersion(current) ?? parseInstallerVersion(/^(\d+\.\d+\.\d+)/.exec(current)?.[1] ?? '');
  return l !== null && c !== null && compareSemver(l, c) > 0;
}
