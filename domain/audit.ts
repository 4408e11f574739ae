/**
 * Audit record hashing and verification (docs/contract.md "Audit record", "Audit log"). Pure: no I/O.
 *
 * A record's canonical content is the object
 *   { kind, actor, occurredAt, attributes, previousHash, siteId }
 * where `occurredAt` is an ISO 8601 UTC string with milliseconds (`2026-11-22T01:44:39.123Z`, what
 * `Date.prototype.toISOString` gives) and `previousHash` is null for the genesis record of a site. Its
 * hash (the record id) is the SHA-256 hex of the RFC 8785 (JCS) canonical JSON of that object, computed
 * with the maintained `canonicalize` package (as the version id is). docs/decisions/audit-chain.md.
 */
import { canonicalJson } from './version';
import { isSha256Hex, sha256Hex } from './hex';

/** Kinds of docs/contract.md "Audit record"; mutation kinds are named per route (api/plugins/audit.ts). */
export const AUDIT_KIND_API_KEY_USED = 'api_key_used';
export const AUDIT_KIND_SIGNED_URL_ISSUED = 'signed_url_issued';
/**
 * Membership changes (docs/decisions/users.md "Audit and events"), appended to each site touched: by
 * assign-sites and remove-sites, and by ownership (a site's new owner becomes a member).
 */
export const AUDIT_KIND_MEMBER_ADDED = 'site_member_added';
export const AUDIT_KIND_MEMBER_REMOVED = 'site_member_removed';

/** The hashed content of a record. */
export interface AuditContent {
  kind: string;
  /** `apiKey:<keyId>` or `user:<uid>`. */
  actor: string;
  /** ISO 8601 UTC with milliseconds. */
  occurredAt: string;
  /** JSON object; never secrets or raw keys. */
  attributes: Record<string, unknown>;
  /** Hash of the site's previous record; null for the genesis record. */
  previousHash: string | null;
  siteId: string;
}

/** A record as stored: its content plus the hash claimed for it. */
export interface AuditRecord extends AuditContent {
  hash: string;
}

/** Verification report of one record (docs/contract.md "Audit record"). */
export interface VerificationReport {
  /** The record's content hashes to its claimed hash. */
  hashValid: boolean;
  /** Genesis: no predecessor named and none supplied. Otherwise: the predecessor is present, of the same site, and its content hashes to `previousHash`. */
  linkageValid: boolean;
  /** `previousHash` is null. */
  isGenesis: boolean;
  /** A record with hash `previousHash` exists in the site's log. */
  predecessorPresent: boolean;
  /**
   * null when ok; else the first failure: `hash_mismatch` (content does not hash to the claimed hash),
   * `predecessor_missing` (no record of the site has hash `previousHash`), `predecessor_mismatch` (the
   * supplied predecessor is another record or another site's), `predecessor_tampered` (the
   * predecessor's content no longer hashes to `previousHash`), `genesis_has_predecessor`.
   */
  reason: string | null;
  /** hashValid and linkageValid. */
  ok: boolean;
}

/** Actor string of an API key (docs/contract.md: `apiKey:<keyId>`). */
export function apiKeyActor(keyId: string): string {
  return `apiKey:${keyId}`;
}

/** Actor string of a user acting through a session or ID token (docs/contract.md: `user:<uid>`). */
export function userActor(uid: string): string {
  return `user:${uid}`;
}

/** `occurredAt` in its canonical form (ISO 8601 UTC, milliseconds) from a Date, epoch ms or ISO string. Throws RangeError on an invalid time. */
export function canonicalTime(t: Date | number | string): string {
  const d = t instanceof Date ? t : new Date(t);
  return d.toISOString();
}

/** Only the hashed fields of a record, in canonical form. */
export function auditContent(r: AuditContent): AuditContent {
  return {
    kind: r.kind,
    actor: r.actor,
    occurredAt: canonicalTime(r.occurredAt),
    attributes: r.attributes,
    previousHash: r.previousHash ?? null,
    siteId: r.siteId,
  };
}

/** SHA-256 hex of the RFC 8785 canonical JSON of the record's content. Throws TypeError on attributes JSON cannot carry. */
export function auditHash(r: AuditContent): string {
  return sha256Hex(canonicalJson(auditContent(r)));
}

/** The record of `content` with its hash. */
export function sealAuditRecord(content: AuditContent): AuditRecord {
  const c = auditContent(content);
  return { ...c, hash: auditHash(c) };
}

function hashes(r: AuditContent): string | null {
  try {
    return auditHash(r);
  } catch {
    return null;
  }
}

/**
 * Verifies one record against its predecessor (the site's record whose hash is `record.previousHash`,
 * or null when there is none). `ok` is true only when the content hashes to the claimed hash and the
 * record either is the genesis record or links to a present predecessor whose own content hashes to
 * `previousHash` (docs/contract.md "Audit record").
 */
export function verifyRecord(record: AuditRecord, predecessor: AuditRecord | null): VerificationReport {
  const hashValid = isSha256Hex(record.hash) && hashes(record) === record.hash;
  const isGenesis = record.previousHash === null || record.previousHash === undefined;
  const predecessorPresent = predecessor !== null;
  let linkReason: string | null = null;
  if (isGenesis) {
    if (predecessorPresent) linkReason = 'genesis_has_predecessor';
  } else if (!predecessor) {
    linkReason = 'predecessor_missing';
  } else if (predecessor.hash !== record.previousHash || predecessor.siteId !== record.siteId) {
    linkReason = 'predecessor_mismatch';
  } else if (hashes(predecessor) !== record.previousHash) {
    linkReason = 'predecessor_tampered';
  }
  const linkageValid = linkReason === null;
  const reason = !hashValid ? 'hash_mismatch' : linkReason;
  return { hashValid, linkageValid, isGenesis, predecessorPresent, reason, ok: hashValid && linkageValid };
}

/** Digest of a set of chunk hashes (signed_url_issued attributes): SHA-256 hex of the distinct hashes sorted and joined by `\n`. */
export function hashSetDigest(hs: readonly string[]): string {
  return sha256Hex([...new Set(hs)].sort().join('\n'));
}
