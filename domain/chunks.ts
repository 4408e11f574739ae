/**
 * Chunk referrers as `GET /api/chunks/{digest}/referrers` lists them (docs/decisions/chunk-referrers.md):
 * the entry shape and the keyset position its page tokens carry. Pure: no I/O.
 */
import { type Static, Type } from '@sinclair/typebox';
import { Nullable } from './schemas';

/** One referrer of a chunk: a mount entry or a version that lists it; fields that do not apply are null. */
export const ReferrerEntry = Type.Object({
  entryId: Type.String(),
  source: Type.String({ description: 'mount | version' }),
  roostId: Nullable(Type.String()),
  fromRoostId: Nullable(Type.String()),
  toRoostId: Nullable(Type.String()),
  versionId: Nullable(Type.String()),
  versionNumber: Nullable(Type.Integer()),
  fileCount: Nullable(Type.Integer()),
  pathCount: Nullable(Type.Integer()),
  totalBytes: Nullable(Type.Integer()),
  referencedAt: Type.String(),
  createdAt: Type.String(),
  createdBy: Type.String(),
  mountedAt: Nullable(Type.String()),
  mountedBy: Nullable(Type.String()),
});
export type ReferrerEntry = Static<typeof ReferrerEntry>;

/**
 * Keyset position of the referrer list: (roost key, source, number key, text key). Entries are ordered by
 * referring roost, then source (`mount` before `version`), then version number, then entry/version id.
 */
export type ReferrerPosition = [string, string, number, string];

/** True for a well-formed decoded page position. */
export function isReferrerPosition(v: unknown): v is ReferrerPosition {
  return (
    Array.isArray(v) &&
    v.length === 4 &&
    typeof v[0] === 'string' &&
    typeof v[1] === 'string' &&
    Number.isSafeInteger(v[2]) &&
    typeof v[3] === 'string'
  );
}

/**
 * Workflow id of the verification of a version's chunks started by publish (workflows/verify.ts):
 * `verify:<siteId>:<roostId>:<versionId>`. Callers use it through workflows/client.ts.
 */
export function versionVerifyWorkflowId(siteId: string, roostId: string, versionId: string): string {
  return `verify:${siteId}:${roostId}:${versionId}`;
}
