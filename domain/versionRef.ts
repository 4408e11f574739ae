/**
 * Version refs (docs/contract.md "Version id and version refs"): stable 64-hex id, legacy `vrs_<hex>`,
 * version number (`3`, `#3`, `v3`, `V3`; 1..2147483647), or alias (`current`, `previous`, `first`).
 * Anything else is `version_ref_malformed`.
 */
import { ApiError } from './errors';

/** Decimal 1..2147483647 (a version number is a PostgreSQL integer) without leading zeros, as a regular expression. */
const NUMBER_1_TO_INT32 =
  '(?:[1-9][0-9]{0,8}|1[0-9]{9}|20[0-9]{8}|21[0-3][0-9]{7}|214[0-6][0-9]{6}|2147[0-3][0-9]{5}|21474[0-7][0-9]{4}|' +
  '214748[0-2][0-9]{3}|2147483[0-5][0-9]{2}|21474836[0-3][0-9]|214748364[0-7])';
/** Every ref parseVersionRef accepts (the `pattern` of version refs in the OpenAPI document). */
export const VERSION_REF_RE = new RegExp(`^(?:[0-9a-f]{64}|vrs_[0-9a-f]{8,64}|[#vV]?${NUMBER_1_TO_INT32}|current|previous|first)$`);
/** A concrete version id: 64 lowercase hex, or legacy `vrs_<hex>` (8..64 hex, a unique prefix below 64). */
export const CONCRETE_VERSION_ID_RE = /^(?:[0-9a-f]{64}|vrs_[0-9a-f]{8,64})$/;

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
  if (typeof raw !== 'string' || !VERSION_REF_RE.test(raw)) throw malformed(param, String(raw));
  const ref = raw;
  if (/^[0-9a-f]{64}$/.test(ref)) return { kind: 'id', id: ref };
  const legacy = /^vrs_([0-9a-f]{8,64})$/.exec(ref);
  if (legacy) return legacy[1].length === 64 ? { kind: 'id', id: legacy[1] } : { kind: 'idPrefix', prefix: legacy[1] };
  const num = /^(?:#|v|V)?([1-9][0-9]*)$/.exec(ref);
  if (num) return { kind: 'number', number: Number(num[1]) };
  if (ref === 'current' || ref === 'previous' || ref === 'first') return { kind: 'alias', alias: ref };
  throw malformed(param, ref);
}

function malformed(param: string, ref: string): ApiError {
  return new ApiError('version_ref_malformed', `"${ref.slice(0, 80)}" is not a version id, number or alias`, { extras: { param } });
}
