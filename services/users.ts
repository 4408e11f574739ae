/**
 * The Users routes (`/api/users…`, platform scope, superadmins only; docs/decisions/users.md): list, get,
 * promote, demote (the active-superadmin floor), assign-sites (atomic union), remove-sites (with the
 * user's pending commands there cancelled) and delete (the cascade is workflows/user-delete.ts, started
 * here). Membership changes append an audit record to each site they touch, in the transaction of the
 * change. SQL: db/users.ts, db/sites.ts, db/machines.ts.
 */
import { appendAuditRecords } from '../db/audit';
import { cancelUserCommands } from '../db/machines';
import { withTx } from '../db/pool';
import { ownedSiteIds } from '../db/sites';
import {
  addMemberships,
  countActiveSuperadmins,
  type DeletionRow,
  existingSiteIds,
  getDeletion,
  getUserRow,
  listUserRows,
  lockUser,
  markDeleted,
  ownedAmong,
  removeMemberships,
  setRole,
  type UserPosition,
  type UserRow,
} from '../db/users';
import { AUDIT_KIND_MEMBER_ADDED, AUDIT_KIND_MEMBER_REMOVED } from '../domain/audit';
import { ApiError } from '../domain/errors';
import type { UserRole } from '../domain/principal';
import { isCreatedAtPosition } from '../domain/schemas';
import { successorProblem } from '../domain/users';
import { startUserDeleteWorkflow, userDeleteWorkflowId, workflowUiUrl } from '../workflows/client';
import type { ServiceDeps } from './deps';

export type { DeletionRow, UserPosition, UserRow } from '../db/users';

/** Audit kinds of membership changes (appended to each site touched); defined in domain/audit.ts. */
export { AUDIT_KIND_MEMBER_ADDED, AUDIT_KIND_MEMBER_REMOVED };

/** Attempts of a transaction that appends to site audit chains (they contend on each site's head row). */
const AUDITED_TX_ATTEMPTS = 25;

/** True for a users-list position this server issues (`[created_at, uid]`). */
export const isUserPosition: (p: unknown) => p is UserPosition = isCreatedAtPosition;

function notFound(): ApiError {
  return new ApiError('not_found', 'user not found');
}

/**
 * A page of users, oldest first; `next` is the position after the last row when more follow.
 * `siteId` filters by membership or ownership; deleted users only with `includeDeleted`.
 */
export async function listUsers(
  deps: Pick<ServiceDeps, 'db'>,
  q: { role?: UserRole; siteId?: string; includeDeleted: boolean; after?: UserPosition; pageSize: number },
): Promise<{ rows: UserRow[]; next: UserPosition | undefined }> {
  const got = await listUserRows(deps.db, { ...q, limit: q.pageSize + 1 });
  const page = got.slice(0, q.pageSize);
  return { rows: page.map((r) => r.row), next: got.length > q.pageSize ? page[page.length - 1].position : undefined };
}

/**
 * One user (deleted ones too) with its delete cascade's progress, or null deletion when never deleted.
 * @throws ApiError not_found
 */
export async function getUser(deps: Pick<ServiceDeps, 'db'>, uid: string): Promise<{ user: UserRow; deletion: DeletionRow | null }> {
  const user = await getUserRow(deps.db, uid);
  if (!user) throw notFound();
  return { user, deletion: user.deleted ? ((await getDeletion(deps.db, uid)) ?? null) : null };
}

/** The answer of promote and demote. */
export interface RoleChange {
  uid: string;
  previousRole: UserRole;
  role: UserRole;
  changed: boolean;
}

const RANK: Record<UserRole, number> = { member: 0, admin: 1, superadmin: 2 };

/**
 * Raises the user's role to `role` (admin or superadmin). A user already at or above it keeps their
 * role (`changed: false`): promote never lowers a role (demote does).
 * @throws ApiError not_found (unknown uid), conflict (409: the user is deleted)
 */
export async function promoteUser(
  deps: Pick<ServiceDeps, 'db'>,
  input: { uid: string; role: 'admin' | 'superadmin'; beforeChange?: () => Promise<void> },
): Promise<RoleChange> {
  await input.beforeChange?.();
  return withTx(deps.db, async (tx) => {
    const u = await lockUser(tx, input.uid);
    if (!u) throw notFound();
    if (u.deleted) throw new ApiError('conflict', 'this user is deleted; a deleted user keeps the role they had');
    if (RANK[u.role] >= RANK[input.role]) return { uid: u.uid, previousRole: u.role, role: u.role, changed: false };
    await setRole(tx, u.uid, input.role);
    return { uid: u.uid, previousRole: u.role, role: input.role, changed: true };
  });
}

/**
 * Lowers the user's role to member. Refuses a user who owns sites (a site's owner must be an admin or a
 * superadmin, the rule site create and PATCH enforce): move the sites first. Refuses to leave fewer active superadmins than the floor
 * (ROOST_SUPERADMIN_FLOOR, default 1): the count and the change are one SERIALIZABLE transaction, so of
 * two concurrent demotes that would each leave the floor, one commits and the other is retried, sees
 * the new count and is refused.
 * @throws ApiError not_found, conflict (deleted user; 409 with `ownedSiteIds` for an owner),
 *   last_superadmin (409, with `floor` and `activeSuperadmins`)
 */
export async function demoteUser(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: { uid: string; beforeChange?: () => Promise<void> },
): Promise<RoleChange> {
  await input.beforeChange?.();
  return withTx(deps.db, async (tx) => {
    const u = await lockUser(tx, input.uid);
    if (!u) throw notFound();
    if (u.deleted) throw new ApiError('conflict', 'this user is deleted; a deleted user keeps the role they had');
    if (u.role === 'member') return { uid: u.uid, previousRole: u.role, role: u.role, changed: false };
    const owned = await ownedSiteIds(tx, u.uid);
    if (owned.length) {
      throw new ApiError(
        'conflict',
        `the user owns ${owned.join(', ')}; a site's owner must be an admin or a superadmin: transfer ownership (PATCH /api/sites/{siteId} ownerUid) first`,
        { extras: { ownedSiteIds: owned } },
      );
    }
    if (u.role === 'superadmin') await checkFloor(tx, deps.cfg.ROOST_SUPERADMIN_FLOOR, 'demoting');
    await setRole(tx, u.uid, 'member');
    return { uid: u.uid, previousRole: u.role, role: 'member', changed: true };
  });
}

/** Throws 409 last_superadmin when removing one active superadmin would go below `floor`. */
async function checkFloor(tx: Parameters<typeof countActiveSuperadmins>[0], floor: number, what: string): Promise<void> {
  const active = await countActiveSuperadmins(tx);
  if (active - 1 < floor) {
    throw new ApiError(
      'last_superadmin',
      `${what} this superadmin would leave ${active - 1} active superadmins; at least ${floor} must remain`,
      {
        extras: { floor, activeSuperadmins: active },
      },
    );
  }
}

function unknownSites(ids: string[]): ApiError {
  return new ApiError('unknown_site', `unknown site ids: ${ids.join(', ')}`, { extras: { unknownSiteIds: ids } });
}

/**
 * Makes the user a member of every site of `siteIds` at once (a union with the sites it has): all or
 * nothing. Appends `site_member_added` to each newly joined site's audit log in the same transaction.
 * @returns every site the user is a member of now, and those added by this call (ascending)
 * @throws ApiError not_found, conflict (deleted user), unknown_site (400, `unknownSiteIds`; nothing changes)
 */
export async function assignSites(
  deps: Pick<ServiceDeps, 'db'>,
  input: { uid: string; siteIds: string[]; actor: string; beforeChange?: () => Promise<void> },
): Promise<{ uid: string; siteIds: string[]; addedSiteIds: string[] }> {
  const wanted = [...new Set(input.siteIds)].sort();
  await input.beforeChange?.();
  return withTx(
    deps.db,
    async (tx) => {
      const u = await lockUser(tx, input.uid);
      if (!u) throw notFound();
      if (u.deleted) throw new ApiError('conflict', 'this user is deleted; sites cannot be assigned to it');
      const known = await existingSiteIds(tx, wanted);
      const unknown = wanted.filter((s) => !known.has(s));
      if (unknown.length) throw unknownSites(unknown);
      const added = await addMemberships(tx, u.uid, wanted);
      for (const siteId of added) {
        await appendAuditRecords(tx, siteId, [{ kind: AUDIT_KIND_MEMBER_ADDED, actor: input.actor, attributes: { siteId, uid: u.uid } }]);
      }
      const now = await getUserRow(tx, u.uid);
      return { uid: u.uid, siteIds: now?.site_ids ?? [], addedSiteIds: added };
    },
    { attempts: AUDITED_TX_ATTEMPTS },
  );
}

/**
 * Ends the user's membership of `siteIds` and cancels the pending commands the user queued on them,
 * in one transaction, with `site_member_removed` on each site left. Sites the user was not a member of
 * are left alone (not in `removedSiteIds`); the commands there are still cancelled. The owner of a site
 * cannot be removed from it (transfer the site first: `PATCH /api/sites/{siteId}` ownerUid).
 * @throws ApiError not_found, unknown_site (400), conflict (409 with `ownedSiteIds`)
 */
export async function removeSites(
  deps: Pick<ServiceDeps, 'db'>,
  input: { uid: string; siteIds: string[]; actor: string; beforeChange?: () => Promise<void> },
): Promise<{ uid: string; removedSiteIds: string[]; cancelledCommandCount: number }> {
  const wanted = [...new Set(input.siteIds)].sort();
  await input.beforeChange?.();
  return withTx(
    deps.db,
    async (tx) => {
      const u = await lockUser(tx, input.uid);
      if (!u) throw notFound();
      const known = await existingSiteIds(tx, wanted);
      const unknown = wanted.filter((s) => !known.has(s));
      if (unknown.length) throw unknownSites(unknown);
      const owned = await ownedAmong(tx, u.uid, wanted);
      if (owned.length) {
        throw new ApiError('conflict', `the user owns ${owned.join(', ')}; transfer ownership (PATCH /api/sites/{siteId} ownerUid) first`, {
          extras: { ownedSiteIds: owned },
        });
      }
      const removed = await removeMemberships(tx, u.uid, wanted);
      const cancelled = await cancelUserCommands(tx, u.uid, wanted, 'cancelled: the user who queued it left the site');
      for (const siteId of removed) {
        await appendAuditRecords(tx, siteId, [{ kind: AUDIT_KIND_MEMBER_REMOVED, actor: input.actor, attributes: { siteId, uid: u.uid } }]);
      }
      return { uid: u.uid, removedSiteIds: removed, cancelledCommandCount: cancelled };
    },
    { attempts: AUDITED_TX_ATTEMPTS },
  );
}

/** The answer of `DELETE /api/users/{uid}`. */
export interface DeleteAnswer {
  uid: string;
  alreadyDeleted: boolean;
  /** null for a user deleted before deletions were recorded (no cascade to run). */
  deletion: DeletionRow | null;
  workflowUrl: string | null;
}

/**
 * Soft-deletes the user (credentials refused from the next request) and writes the cascade's row in one
 * transaction, then starts the cascade (workflows/user-delete.ts). A repeat answers `alreadyDeleted` and
 * starts the cascade again when it has not completed (a lost start; the steps do nothing twice).
 * Rules, checked before anything changes: the successor must be another active admin or superadmin
 * (400 successor_invalid, `reason` not_found | self | deleted | role); a user who owns sites needs a
 * successor (409 orphan_sites, `ownedSiteIds`); the last superadmins stay (409 last_superadmin).
 * @throws ApiError not_found, successor_invalid, orphan_sites, last_superadmin
 */
export async function deleteUser(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'temporal'>,
  input: { uid: string; successorUid?: string; actor: string; beforeChange?: () => Promise<void> },
): Promise<DeleteAnswer> {
  const workflowId = userDeleteWorkflowId(input.uid);
  const existing = await getUserRow(deps.db, input.uid);
  if (!existing) throw notFound();
  if (!existing.deleted) await input.beforeChange?.();
  const first = await withTx(deps.db, async (tx) => {
    const u = await lockUser(tx, input.uid);
    if (!u) throw notFound();
    if (u.deleted) return false;
    if (input.successorUid !== undefined) {
      const reason = successorProblem(u.uid, await lockUser(tx, input.successorUid));
      if (reason) {
        throw new ApiError('successor_invalid', successorDetail(reason), { extras: { reason, successorUid: input.successorUid } });
      }
    }
    const owned = await ownedSiteIds(tx, u.uid);
    if (owned.length && input.successorUid === undefined) {
      throw new ApiError(
        'orphan_sites',
        `the user owns ${owned.length} site(s); name a successorUid (an admin or superadmin) to inherit them`,
        {
          extras: { ownedSiteIds: owned },
        },
      );
    }
    if (u.role === 'superadmin') await checkFloor(tx, deps.cfg.ROOST_SUPERADMIN_FLOOR, 'deleting');
    await markDeleted(tx, { uid: u.uid, successorUid: input.successorUid ?? null, requestedBy: input.actor, workflowId });
    return true;
  });
  let deletion = await getDeletion(deps.db, input.uid);
  if (!deletion) return { uid: input.uid, alreadyDeleted: true, deletion: null, workflowUrl: null };
  let url = workflowUiUrl(deps.cfg, workflowId);
  if (deletion.status !== 'completed') {
    url = (await startUserDeleteWorkflow(deps.temporal, deps.cfg, input.uid)).url;
    deletion = (await getDeletion(deps.db, input.uid)) ?? deletion;
  }
  return { uid: input.uid, alreadyDeleted: !first, deletion, workflowUrl: url };
}

function successorDetail(reason: 'not_found' | 'self' | 'deleted' | 'role'): string {
  switch (reason) {
    case 'not_found':
      return 'successorUid names no user';
    case 'self':
      return 'a user cannot be their own successor';
    case 'deleted':
      return 'the successor is deleted';
    case 'role':
      return 'the successor must be an admin or a superadmin';
  }
}
