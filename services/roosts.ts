/**
 * Roost use cases: `POST /api/roosts`, `GET /api/roosts`, `GET/PATCH/DELETE /api/roosts/{roostId}`
 * (docs/decisions/roost-create-update-delete.md). The version pointer fields are moved only by publish
 * and rollback (services/versions.ts). Callers check access first; nothing here reads a request.
 */
import { ApiError } from '../domain/errors';
import { newId } from '../domain/hex';
import { badPageToken } from '../domain/paging';
import * as repo from '../db/roosts';
import { type BlobStore, versionUrlOf } from '../storage/blob';
import type { ServiceDeps } from './deps';
import { extractRootProblem } from '../domain/paths';

/** A roost with its current/previous version summaries and `versionUrl` (the current body's blob URL, null without a version). */
export type RoostDetail = repo.RoostView & { versionUrl: string | null };

/** The fields a client may set on a roost: display name (trimmed here), target machine ids, extract root. */
export interface RoostFields {
  name?: string;
  targets?: string[];
  extractPath?: string;
}

/**
 * The roost changes `fields` carries, name trimmed, absent fields left out.
 * @throws ApiError 400 validation_failed when a non-empty `extractPath` is unsafe on Windows (domain/paths.ts,
 *   docs/decisions/windows-paths.md); the message names the rule.
 */
export function roostChanges(fields: RoostFields): repo.RoostChanges {
  const c: repo.RoostChanges = {};
  if (fields.name !== undefined) c.name = fields.name.trim();
  if (fields.targets !== undefined) c.targets = fields.targets;
  if (fields.extractPath !== undefined) {
    const why = fields.extractPath === '' ? null : extractRootProblem(fields.extractPath);
    if (why) {
      throw new ApiError('validation_failed', `extractPath ${why}`, { extras: { param: 'extractPath', errors: { extractPath: [why] } } });
    }
    c.extractPath = fields.extractPath;
  }
  return c;
}

function detail(blob: BlobStore, v: repo.RoostView): RoostDetail {
  return { ...v, versionUrl: v.current ? versionUrlOf(blob, v.current) : null };
}

/**
 * One roost of the site with its version summaries.
 * @throws ApiError not_found (param roostId) when it is missing, or tombstoned unless `includeDeleted`.
 */
export async function getRoost(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: { siteId: string; roostId: string; includeDeleted?: boolean },
): Promise<RoostDetail> {
  const v = await repo.getRoostView(deps.db, input.siteId, input.roostId, input.includeDeleted === true);
  if (!v) throw new ApiError('not_found', 'roost not found', { extras: { param: 'roostId' } });
  return detail(deps.blob, v);
}

/**
 * Creates a roost with a server-made id (`rst_<24 hex>`), no version, `targets` default [] and
 * `extractPath` default ''. Returns the new roost.
 */
export async function createRoost(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: { siteId: string; name: string; targets?: string[]; extractPath?: string; createdBy: string },
): Promise<RoostDetail> {
  const c = roostChanges(input);
  const roostId = newId('rst');
  await repo.createRoost(deps.db, {
    siteId: input.siteId,
    roostId,
    name: c.name ?? '',
    targets: c.targets ?? [],
    extractPath: c.extractPath ?? '',
    createdBy: input.createdBy,
  });
  return getRoost(deps, { siteId: input.siteId, roostId });
}

/**
 * A page of the site's roosts, newest first: up to `pageSize` roosts after list position `after` (from a
 * page token), and the position of the last one when more follow.
 * @throws ApiError validation_failed (param `tokenParam`) when `after` carries a timestamp the database
 *   cannot read (a forged token).
 */
export async function listRoosts(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: { siteId: string; pageSize: number; after?: [string, string]; includeDeleted?: boolean; tokenParam: 'page_token' | 'cursor' },
): Promise<{ roosts: RoostDetail[]; next: [string, string] | undefined }> {
  const page = await repo
    .listRoosts(deps.db, input.siteId, { limit: input.pageSize, after: input.after, includeDeleted: input.includeDeleted === true })
    .catch((err: unknown) => {
      // A forged position with an impossible timestamp fails the cast (SQLSTATE class 22: data exception).
      if (input.after !== undefined && String((err as { code?: string }).code ?? '').startsWith('22')) {
        throw badPageToken(input.tokenParam);
      }
      throw err;
    });
  const last = page.rows[page.rows.length - 1];
  return { roosts: page.rows.map((r) => detail(deps.blob, r)), next: page.more && last ? last.position : undefined };
}

/**
 * Applies name/targets/extractPath changes to a live roost and returns it.
 * @throws ApiError validation_failed when none of the three is given; not_found when the roost is
 *   missing or tombstoned.
 */
export async function updateRoost(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: RoostFields & { siteId: string; roostId: string },
): Promise<RoostDetail> {
  const changes = roostChanges(input);
  if (!Object.keys(changes).length) {
    throw new ApiError('validation_failed', 'send at least one of name, targets, extractPath', {
      extras: { errors: { body: ['must contain at least one of name, targets, extractPath'] } },
    });
  }
  await repo.updateRoost(deps.db, input.siteId, input.roostId, changes);
  return getRoost(deps, input);
}

/**
 * Tombstones a roost (versions and blobs stay); repeating is harmless. Returns the tombstone time and
 * whether it was already deleted.
 * @throws ApiError not_found when the roost never existed.
 */
export function deleteRoost(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; roostId: string },
): Promise<{ deletedAt: Date; alreadyDeleted: boolean }> {
  return repo.softDeleteRoost(deps.db, input.siteId, input.roostId);
}
