/**
 * Version refs (docs/contract.md "Version id and version refs"): stable 64-hex id, legacy `vrs_<hex>`,
 * version number (`3`, `#3`, `v3`, `V3`), or alias (`current`, `previous`, `first`).
 * Anything else is `version_ref_malformed`.
 */
import { ApiError } from './errors';

export type VersionRef =
  | { kind: 'id'; id: string }
  | { kind: 'idPrefix'; prefix: string }
  | { kind: 'number'; number: number }
  | { kind: 'alias'; alias: 'current' | 'previous' | 'first' };

/**
 * Parses a ref. Legacy `vrs_<hex>`: 64 hex is the stable id; 8..63 hex is a unique id prefix.
 * @throws ApiError version_ref_malformed
 */
export function parseVersionRef(raw: unknown, param = 'versionRef'): VersionRef {
  if (typeof raw !== 'string') throw malformed(param, String(raw));
  const ref = raw.trim();
  if (/^[0-9a-f]{64}$/.test(ref)) return { kind: 'id', id: ref };
  const legacy = /^vrs_([0-9a-f]{8,64})$/.exec(ref);
  if (legacy) return legacy[1].length === 64 ? { kind: 'id', id: legacy[1] } : { kind: 'idPrefix', prefix: legacy[1] };
  const num = /^(?:#|v|V)?([1-9][0-9]{0,9})$/.exec(ref);
  if (num) {
    const n = Number(num[1]);
    if (Number.isSafeInteger(n) && n <= 2147483647) return { kind: 'number', number: n };
  }
  if (ref === 'current' || ref === 'previous' || ref === 'first') return { kind: 'alias', alias: ref };
  throw malformed(param, ref);
}

function malformed(param: string, ref: string): ApiError {
  return new ApiError('version_ref_malformed', `"${ref.slice(0, 80)}" is not a version id, number or alias`, { extras: { param } });
}
