/**
 * Sites (`/api/sites…`; docs/decisions/sites.md): create, read, list, PATCH (name, timezone, tier,
 * roostEnabled, deployQuota, ownerUid) and the member list. `roost admin bootstrap` makes its site through
 * the same repository insert (db/sites.ts `insertSite`). SQL: db/sites.ts.
 */
import { appendAuditRecords } from '../db/audit';
import { withTx } from '../db/pool';
import {
  getSiteRow,
  insertSite,
  listSiteMembers,
  listSiteRows,
  type SiteMemberRow,
  type SitePatch,
  type SiteRow,
  siteRoostEnabled,
  updateSite,
} from '../db/sites';
import { lockUser } from '../db/users';
import { AUDIT_KIND_MEMBER_ADDED } from '../domain/audit';
import { ApiError } from '../domain/errors';
import { newId } from '../domain/hex';
import type { UserPrincipal } from '../domain/principal';
import { siteEnvironmentsFor } from '../domain/keys';
import { scopesAllow } from '../domain/scopes';
import { isIanaTimeZone } from '../domain/users';
import { DEFAULT_DEPLOY_QUOTA } from '../domain/classic';
import type { ServiceDeps } from './deps';

export type { SiteMemberRow, SiteRow } from '../db/sites';

/** Attempts of a transaction that appends to a site's audit chain (it contends on the chain's head row). */
const AUDITED_TX_ATTEMPTS = 25;

/** What `POST /api/sites` takes (absent fields get their defaults). */
export interface SiteInput {
  name: string;
  ownerUid: string;
  timezone?: string;
  tier?: string;
  roostEnabled?: boolean;
  deployQuota?: number;
  environment?: 'live' | 'test';
}

function badField(param: string, message: string): ApiError {
  return new ApiError('validation_failed', `${param} ${message}`, { extras: { param, errors: { [param]: [message] } } });
}

/** Throws 400 unless `tz` is an IANA time zone name. */
function checkTimeZone(tz: string | undefined): void {
  if (tz !== undefined && !isIanaTimeZone(tz)) throw badField('timezone', 'must be an IANA time zone name (e.g. Europe/Berlin, UTC)');
}

/** Throws 400 unless `uid` names an active admin or superadmin (site owners are), in the caller's transaction. */
async function checkOwner(tx: Parameters<typeof lockUser>[0], uid: string): Promise<void> {
  const u = await lockUser(tx, uid);
  if (!u || u.deleted) throw badField('ownerUid', 'must name an active user');
  if (u.role !== 'admin' && u.role !== 'superadmin') throw badField('ownerUid', 'must name an admin or a superadmin');
}

/** The `site_member_added` record of a user who became a member of a site by owning it. */
function ownerJoined(siteId: string, uid: string, actor: string) {
  return { kind: AUDIT_KIND_MEMBER_ADDED, actor, attributes: { siteId, uid, reason: 'site_owner' } };
}

/**
 * Creates a site owned by `ownerUid` (who becomes a member: `site_member_added` on the new site's audit
 * log, in the same transaction, by `actor`).
 * @throws ApiError validation_failed (timezone, owner), conflict (409: the name is taken)
 */
export async function createSite(
  deps: Pick<ServiceDeps, 'db'>,
  input: SiteInput & { actor: string; beforeChange?: () => Promise<void> },
): Promise<SiteRow> {
  checkTimeZone(input.timezone);
  await input.beforeChange?.();
  return withTx(
    deps.db,
    async (tx) => {
      await checkOwner(tx, input.ownerUid);
      const row = await insertSite(tx, {
        siteId: newId('site'),
        name: input.name,
        ownerUid: input.ownerUid,
        timezone: input.timezone ?? 'UTC',
        tier: input.tier ?? 'standard',
        roostEnabled: input.roostEnabled ?? true,
        deployQuota: input.deployQuota ?? DEFAULT_DEPLOY_QUOTA,
        environment: input.environment ?? 'live',
      });
      if (!row) throw new ApiError('conflict', `a site named ${JSON.stringify(input.name)} exists already`);
      await appendAuditRecords(tx, row.site_id, [ownerJoined(row.site_id, input.ownerUid, input.actor)]);
      return row;
    },
    { attempts: AUDITED_TX_ATTEMPTS },
  );
}

/** One site. @throws ApiError not_found */
export async function getSite(deps: Pick<ServiceDeps, 'db'>, siteId: string): Promise<SiteRow> {
  const row = await getSiteRow(deps.db, siteId);
  if (!row) throw new ApiError('not_found', 'site not found');
  return row;
}

/**
 * A page of the sites `user` may act on (every site for a superadmin), ascending by id; with an API key,
 * only the sites of its environment (a `svk_test_` key sandbox sites, a `svk_live_` key live ones:
 * docs/decisions/test-keys.md) and of those only the ones its scopes grant site read on. Sessions and ID
 * tokens list both environments. `next` is the last id when more may follow.
 */
export async function listSites(
  deps: Pick<ServiceDeps, 'db'>,
  user: UserPrincipal,
  q: { after?: string; pageSize: number },
): Promise<{ rows: SiteRow[]; next: string | undefined }> {
  const rows = await listSiteRows(
    deps.db,
    { uid: user.userId, role: user.role },
    { after: q.after, limit: q.pageSize + 1, environments: siteEnvironmentsFor(user.key?.environment) },
  );
  const more = rows.length > q.pageSize;
  const page = rows.slice(0, q.pageSize);
  const key = user.key;
  const visible =
    key && !key.isLegacy ? page.filter((s) => scopesAllow(key.scopes, [{ resource: 'site', id: s.site_id, permission: 'read' }])) : page;
  return { rows: visible, next: more ? page[page.length - 1].site_id : undefined };
}

/** A changed setting of a site, as its `site_updated` audit record shows it. */
export interface SiteChange {
  from: string | number | boolean;
  to: string | number | boolean;
}

/** The settings a PATCH may change, by wire name, and how to read each from a row. None is a secret. */
const PATCHABLE: Record<keyof SitePatch, (s: SiteRow) => string | number | boolean> = {
  name: (s) => s.name,
  timezone: (s) => s.timezone,
  tier: (s) => s.tier,
  roostEnabled: (s) => s.roost_enabled,
  deployQuota: (s) => s.deploy_quota,
  ownerUid: (s) => s.owner_uid,
};

/** The settings that differ between `before` and `after`, by wire name (what a `site_updated` record shows). */
export function siteChanges(before: SiteRow, after: SiteRow): Partial<Record<keyof SitePatch, SiteChange>> {
  const changes: Partial<Record<keyof SitePatch, SiteChange>> = {};
  for (const [field, read] of Object.entries(PATCHABLE) as [keyof SitePatch, (s: SiteRow) => string | number | boolean][]) {
    if (read(before) !== read(after)) changes[field] = { from: read(before), to: read(after) };
  }
  return changes;
}

/**
 * Applies a PATCH. A new owner must be an active admin or superadmin and becomes a member; when they were
 * not one, `site_member_added` is appended to the site's audit log in the same transaction, by `actor`.
 * `onChanges` is told, inside the transaction (again on a retry), which settings changed from what to what,
 * for the request's `site_updated` record (api/plugins/audit.ts `auditDetails`).
 * @throws ApiError not_found, validation_failed, conflict (the name is taken)
 */
export async function patchSite(
  deps: Pick<ServiceDeps, 'db'>,
  siteId: string,
  patch: SitePatch & {
    actor: string;
    beforeChange?: () => Promise<void>;
    onChanges?: (changes: Partial<Record<keyof SitePatch, SiteChange>>) => void;
  },
): Promise<SiteRow> {
  checkTimeZone(patch.timezone);
  const { beforeChange, onChanges, actor, ...fields } = patch;
  await beforeChange?.();
  return withTx(
    deps.db,
    async (tx) => {
      const before = await getSiteRow(tx, siteId, true);
      if (!before) throw new ApiError('not_found', 'site not found');
      if (fields.ownerUid !== undefined) await checkOwner(tx, fields.ownerUid);
      const updated = await updateSite(tx, siteId, fields);
      if (updated === 'name_taken') throw new ApiError('conflict', `a site named ${JSON.stringify(fields.name)} exists already`);
      if (!updated) throw new ApiError('not_found', 'site not found');
      if (updated.ownerJoined) await appendAuditRecords(tx, siteId, [ownerJoined(siteId, updated.row.owner_uid, actor)]);
      onChanges?.(siteChanges(before, updated.row));
      return updated.row;
    },
    { attempts: AUDITED_TX_ATTEMPTS },
  );
}

/** A page of the site's active members (owner included), ascending by uid. */
export async function siteMembers(
  deps: Pick<ServiceDeps, 'db'>,
  siteId: string,
  q: { after?: string; pageSize: number },
): Promise<{ rows: SiteMemberRow[]; next: string | undefined }> {
  const rows = await listSiteMembers(deps.db, siteId, { after: q.after, limit: q.pageSize + 1 });
  const page = rows.slice(0, q.pageSize);
  return { rows: page, next: rows.length > q.pageSize ? page[page.length - 1].uid : undefined };
}

/**
 * Throws 403 forbidden unless `user` administers the site: its owner, or a member whose role is admin or
 * superadmin (superadmins administer every site).
 */
export async function requireSiteAdmin(deps: Pick<ServiceDeps, 'db'>, user: UserPrincipal, siteId: string): Promise<void> {
  if (user.role === 'superadmin' || user.role === 'admin') return;
  const site = await getSiteRow(deps.db, siteId);
  if (site?.owner_uid === user.userId) return;
  throw new ApiError('forbidden', "only the site's owner, its admins and superadmins may read its settings and members");
}

/** Throws 403 roost_disabled when the site's roostEnabled is false (the roost routes; docs/decisions/sites.md). */
export async function requireRoostEnabled(deps: Pick<ServiceDeps, 'db'>, siteId: string): Promise<void> {
  checkRoostEnabled(siteId, (await siteRoostEnabled(deps.db, siteId)) !== false);
}

/** `requireRoostEnabled` with the site's flag already read. @throws ApiError roost_disabled (403) when `enabled` is false. */
export function checkRoostEnabled(siteId: string, enabled: boolean): void {
  if (!enabled) {
    throw new ApiError(
      'roost_disabled',
      'roosts are disabled on this site (roostEnabled is false); a superadmin can enable them: PATCH /api/sites/{siteId}',
      {
        extras: { siteId },
      },
    );
  }
}
