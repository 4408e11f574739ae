/**
 * Version use cases of a roost: publish (`POST /api/roosts/{roostId}/versions`,
 * docs/decisions/version-publish.md), rollback of the current pointer (`POST /api/roosts/{roostId}/rollback`),
 * the reads (list, fetch, files, diff; docs/decisions/version-reads.md) and the description patch
 * (`PATCH /api/roosts/{roostId}/versions/{versionRef}`). Version refs follow docs/decisions/version-refs.md.
 * Callers check access first; nothing here reads a request.
 */
import { diffBodies, type VersionDiff } from '../domain/diff';
import { ApiError } from '../domain/errors';
import { sha256Hex } from '../domain/hex';
import {
  canonicalJson,
  chunkTable,
  type FileEntry,
  MAX_MISSING_CHUNKS,
  sizeConflictErrors,
  summarize,
  validateVersionBody,
  type VersionBody,
} from '../domain/version';
import { parseVersionRef } from '../domain/versionRef';
import { quotaTiers, recordChunks } from '../db/quota';
import * as repo from '../db/roosts';
import { versionBlobName, versionUrlOf } from '../storage/blob';
import { startVersionVerification } from '../workflows/client';
import { findMissingChunks } from './chunks';
import type { ServiceDeps } from './deps';
import { roostChanges, type RoostFields } from './roosts';
import { ensureVersionSignatures, sealKeyOf, signVersionFor } from './signing';
import { loadVersionBody } from './version-bodies';
import { noteChunksUploaded } from './observability';

/** A version row, signed (`signature`, `signing_key_id` set), with `versionUrl`, its body blob's plain URL. */
export type VersionDetail = repo.VersionRow & { versionUrl: string };
/** A roost's row (db/roosts.ts), as authentication may have read it already (api/plugins/auth.ts `roostReadFor`). */
export type RoostRow = repo.RoostRow;

type Deps = Pick<ServiceDeps, 'cfg' | 'db' | 'blob'>;

/** Where publish reports a failure it recovers from (Fastify's `request.log` fits). */
export interface PublishLog {
  warn(obj: Record<string, unknown>, msg: string): void;
}

/** Empty or absent description is stored as null. */
function normalizeDescription(d: string | null | undefined): string | null {
  return d === undefined || d === null || d === '' ? null : d;
}

/** Signs rows published before signing existed (on first read, in place) and adds their `versionUrl`. */
async function details(deps: Deps, siteId: string, rows: repo.VersionRow[]): Promise<VersionDetail[]> {
  const signed = await ensureVersionSignatures(deps.db, sealKeyOf(deps.cfg), siteId, rows);
  return signed.map((r) => ({ ...r, versionUrl: versionUrlOf(deps.blob, r) }));
}

function bodyOf(deps: Pick<ServiceDeps, 'blob'>, row: repo.VersionRow): Promise<VersionBody> {
  return loadVersionBody(deps, row.site_id, row.roost_id, row.version_id, row.blob_name);
}

// ---------------------------------------------------------------------------------------------------
// Publish and rollback

/** What `publish` is given: the request body's fields plus the acting user. */
export interface PublishRequest extends RoostFields {
  siteId: string;
  roostId: string;
  /** Acting user id (recorded as createdBy / triggeredBy). */
  userId: string;
  /** The version body as received (validated here). */
  version: unknown;
  description?: string | null;
  /** Guard: 64-hex id or `vrs_<64 hex>` of the expected current version; null expects none; absent: no guard. */
  expectedCurrentVersionId?: string | null;
  log?: PublishLog;
}

/**
 * Publishes a version body: validates it (dotted `version.*` errors), builds its chunk table, checks
 * the roost and the guard, checks that every referenced chunk is stored for the site with its size
 * (recording chunks found in blob storage, quota-checked), stores the body's canonical JSON, signs the
 * version and runs the publish transaction (db/roosts.ts publishVersion), then starts the version's chunk
 * verification (workflows/verify.ts; a failure to start is logged, the first rollout verifies instead).
 * A body whose id the roost already holds skips the chunk check and the blob write and moves the pointer to it.
 * Returns `outcome` ('created' → 201, 'moved' | 'unchanged' → 200) and the pointer ids.
 * @throws ApiError validation_failed (400: invalid body, a chunk with two sizes, a chunk stored with
 *   another size), not_found (404: roost), version_stale (412: guard), precondition_failed (412:
 *   `missingChunks` (first 20) and `missingCount`), quota_exceeded (402).
 */
export async function publish(deps: Deps & Pick<ServiceDeps, 'temporal'>, input: PublishRequest): Promise<repo.PublishResult> {
  const { siteId, roostId } = input;
  const bodyErrors = validateVersionBody(input.version, 'version');
  if (bodyErrors) {
    const first = Object.keys(bodyErrors)[0];
    throw new ApiError('validation_failed', `version body is invalid: ${first} ${bodyErrors[first][0]}`, {
      extras: { param: first, errors: bodyErrors },
    });
  }
  const version = input.version as VersionBody;
  const table = chunkTable(version);
  if (table.errors)
    throw new ApiError('validation_failed', 'version body references a chunk with two sizes', { extras: { errors: table.errors } });
  const guard = input.expectedCurrentVersionId;
  const expected = guard === undefined || guard === null ? guard : guard.replace(/^vrs_/, '');

  repo.checkExpectedCurrent(await repo.requireRoost(deps.db, siteId, roostId), expected);

  const canonical = canonicalJson(version);
  const versionId = sha256Hex(canonical);
  const blobName = versionBlobName(siteId, roostId, versionId);
  if (!(await repo.getVersion(deps.db, siteId, roostId, versionId))) {
    const { missing, conflicts } = await findMissingChunks(deps.db, deps.blob, siteId, table.refs, (found) =>
      recordChunks(deps.db, siteId, found, quotaTiers(deps.cfg)).then((added) => {
        noteChunksUploaded(added);
        return added;
      }),
    );
    if (conflicts.size) {
      throw new ApiError('validation_failed', 'version body references chunks with a size other than their stored size', {
        extras: { errors: sizeConflictErrors(version, conflicts) },
      });
    }
    if (missing.length) {
      throw new ApiError(
        'precondition_failed',
        `${missing.length} referenced chunk${missing.length > 1 ? 's are' : ' is'} not stored for this site; upload them, then publish again`,
        { extras: { missingChunks: missing.slice(0, MAX_MISSING_CHUNKS), missingCount: missing.length } },
      );
    }
    await deps.blob.put('versions', blobName, Buffer.from(canonical, 'utf8'), 'application/json');
  }

  const { totalSize, totalFiles } = summarize(version);
  const result = await repo.publishVersion(deps.db, {
    siteId,
    roostId,
    versionId,
    blobName,
    totalSize,
    totalFiles,
    chunks: table.refs,
    description: normalizeDescription(input.description),
    expectedCurrentVersionId: expected,
    changes: roostChanges(input),
    userId: input.userId,
    signature: await signVersionFor(deps.db, sealKeyOf(deps.cfg), siteId, roostId, versionId),
  });
  // The server re-hashes the chunks this version stores, in the background, before any rollout ships
  // them (docs/decisions/chunk-integrity.md). Not starting it costs no safety: every rollout verifies first.
  if (result.outcome === 'created' && table.refs.length > 0) {
    await startVersionVerification(deps.temporal, deps.cfg, { siteId, roostId, versionId }).catch((err: unknown) =>
      input.log?.warn({ err, versionId }, 'version verification not started (its first rollout verifies instead)'),
    );
  }
  return result;
}

/**
 * Moves the roost's current pointer back to an existing version (`target`: any version ref, default
 * `previous`); previous becomes the old current. Records `version.rolled_back`.
 * @throws ApiError version_ref_malformed (400, param targetVersion), not_found (roost),
 *   version_not_found, rollback_no_op (the target is already current).
 */
export async function rollback(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; roostId: string; target?: string; userId: string },
): Promise<repo.RollbackResult> {
  const ref = parseVersionRef(input.target ?? 'previous', 'targetVersion');
  return repo.rollbackRoost(deps.db, input.siteId, input.roostId, ref, input.userId);
}

// ---------------------------------------------------------------------------------------------------
// Reads

/**
 * A page of a live roost's versions, newest first: up to `pageSize` versions numbered below
 * `beforeNumber`, and the number of the last one when more follow.
 * @throws ApiError not_found when the roost is missing or tombstoned.
 */
export async function listVersions(
  deps: Deps,
  input: { siteId: string; roostId: string; pageSize: number; beforeNumber?: number },
): Promise<{ versions: VersionDetail[]; next: number | undefined }> {
  await repo.requireRoost(deps.db, input.siteId, input.roostId);
  const page = await repo.listVersions(deps.db, input.siteId, input.roostId, { limit: input.pageSize, beforeNumber: input.beforeNumber });
  const last = page.rows[page.rows.length - 1];
  return { versions: await details(deps, input.siteId, page.rows), next: page.more && last ? last.version_number : undefined };
}

/**
 * One version (by ref, param `versionRef`) with its stored body, exactly as published. `roost`: the roost's
 * live row when this request read it already (db/roosts.ts `resolveVersion` `readRoost`).
 * @throws ApiError version_ref_malformed, not_found (roost; 410 when the body blob is gone),
 *   version_not_found; internal_error (500) when the stored body no longer hashes to its id.
 */
export async function getVersion(
  deps: Deps,
  input: { siteId: string; roostId: string; ref: string; roost?: RoostRow },
): Promise<{ version: VersionDetail; body: VersionBody }> {
  const row = await repo.resolveVersion(deps.db, input.siteId, input.roostId, input.ref, 'versionRef', input.roost);
  const [version] = await details(deps, input.siteId, [row]);
  return { version, body: await bodyOf(deps, version) };
}

/** A file of a version as the files route lists it: path, size in bytes, chunks (hash, size in bytes). */
export type FileItem = Pick<FileEntry, 'path' | 'size'> & { chunks: { hash: string; size: number }[] };

/**
 * A page of a version's files in body order: those whose path starts with `prefix` ('' for all), from
 * index `offset`, at most `pageSize`. Returns the matching total and the next offset when more follow.
 * @throws like `getVersion`.
 */
export async function listFiles(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: { siteId: string; roostId: string; ref: string; prefix: string; offset: number; pageSize: number },
): Promise<{ versionId: string; total: number; files: FileItem[]; next: number | undefined }> {
  const row = await repo.resolveVersion(deps.db, input.siteId, input.roostId, input.ref, 'versionRef');
  const stored = await bodyOf(deps, row);
  const matching = input.prefix ? stored.files.filter((f) => f.path.startsWith(input.prefix)) : stored.files;
  const files = matching
    .slice(input.offset, input.offset + input.pageSize)
    .map((f) => ({ path: f.path, size: f.size, chunks: f.chunks.map((c) => ({ hash: c.hash, size: c.size })) }));
  const next = input.offset + files.length;
  return { versionId: row.version_id, total: matching.length, files, next: next < matching.length ? next : undefined };
}

/**
 * File-level diff of version `ref` (the target, param `versionRef`) against `against` (the base, param
 * `against`) in a live roost (domain/diff.ts diffBodies). Returns both version ids and the diff.
 * @throws like `getVersion`, for either ref.
 */
export async function diffVersions(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: { siteId: string; roostId: string; ref: string; against: string },
): Promise<{ toVersionId: string; fromVersionId: string; diff: VersionDiff }> {
  const targetRef = parseVersionRef(input.ref, 'versionRef');
  const baseRef = parseVersionRef(input.against, 'against');
  const roost = await repo.requireRoost(deps.db, input.siteId, input.roostId);
  const to = await repo.resolveVersionIn(deps.db, roost, targetRef, 'versionRef');
  const from = await repo.resolveVersionIn(deps.db, roost, baseRef, 'against');
  const [toBody, fromBody] = await Promise.all([bodyOf(deps, to), bodyOf(deps, from)]);
  return { toVersionId: to.version_id, fromVersionId: from.version_id, diff: diffBodies(fromBody, toBody) };
}

/**
 * Sets the description of version `ref` (null or '' clears it) and returns the updated version.
 * @throws ApiError version_ref_malformed, not_found (roost), version_not_found.
 */
export async function setDescription(
  deps: Deps,
  input: { siteId: string; roostId: string; ref: string; description: string | null },
): Promise<VersionDetail> {
  const ref = parseVersionRef(input.ref, 'versionRef');
  const row = await repo.updateVersionDescription(deps.db, input.siteId, input.roostId, ref, normalizeDescription(input.description));
  const [version] = await details(deps, input.siteId, [row]);
  return version;
}
