/**
 * Sites and their membership: who may act on a site. A user may act on a site when they own it, are a
 * member of it (`site_members`), or are a superadmin (every site). This module holds that rule's SQL,
 * the only copy: authorisation (`authorizeSite`, api/plugins/auth.ts), the scope checks of new API keys
 * (db/keys.ts), `GET /api/whoami` and the operator bootstrap (db/bootstrap.ts) all call it.
 */
import { prepared, type Queryable } from './pool';

/** The user whose access is asked about. */
export interface SiteUser {
  uid: string;
  /** Only 'superadmin' matters here: a superadmin may act on every site. */
  role: string;
}

/**
 * The ids of sites `user` may act on, in ascending id order: among `opts.siteIds` when given (absent
 * sites are left out), else among every site; only sites of `opts.environments` when given. `opts.limit`
 * caps the rows (default: no cap).
 */
export async function accessibleSiteIds(
  q: Queryable,
  user: SiteUser,
  opts: { siteIds?: string[]; limit?: number; environments?: readonly ('live' | 'test')[] } = {},
): Promise<string[]> {
  if (opts.siteIds && opts.siteIds.length === 0) return [];
  const { rows } = await q.query<{ site_id: string }>(
    `SELECT s.site_id FROM sites s
      WHERE ($1::text[] IS NULL OR s.site_id = ANY($1::text[]))
        AND ($3 OR s.owner_uid = $2 OR EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = s.site_id AND m.uid = $2))
        AND ($5::text[] IS NULL OR s.environment = ANY($5::text[]))
      ORDER BY s.site_id LIMIT $4`,
    [opts.siteIds ?? null, user.uid, user.role === 'superadmin', opts.limit ?? null, opts.environments ?? null],
  );
  return rows.map((r) => r.site_id);
}

/** True when the site exists and `user` may act on it. */
export async function canActOnSite(q: Queryable, user: SiteUser, siteId: string): Promise<boolean> {
  return (await accessibleSiteIds(q, user, { siteIds: [siteId], limit: 1 })).length === 1;
}

/** What `authorizeSite` (api/plugins/auth.ts) needs to know of a site a user may act on. */
export interface SiteAccess {
  /** 'live', or 'test' for a sandbox site (docs/decisions/test-keys.md). */
  environment: 'live' | 'test';
  roost_enabled: boolean;
}

const SITE_ACCESS_SQL = `SELECT s.environment, s.roost_enabled FROM sites s WHERE s.site_id = $1 AND ${mayActCondition('s', '$2', '$3')}`;

/**
 * The site's environment and roostEnabled flag when the site exists and `user` may act on it (the rule of
 * `accessibleSiteIds`), else undefined: one statement where authorisation used to send three (membership,
 * environment, roostEnabled).
 */
export async function siteAccess(q: Queryable, user: SiteUser, siteId: string): Promise<SiteAccess | undefined> {
  // A named statement (db/pool.ts `prepared`): authorisation of every session or ID-token request sends it.
  const { rows } = await prepared<SiteAccess>(q, 'site_access', SITE_ACCESS_SQL, [siteId, user.uid, user.role === 'superadmin']);
  return rows[0];
}

/**
 * The rule "the user may act on site row `site`" as an SQL condition, for statements that read a site
 * together with something else (db/keys.ts `keyForAuth`): `uid` and `superadmin` are SQL expressions (a
 * parameter such as `$2`, or a column).
 */
export function mayActCondition(site: string, uid: string, superadmin: string): string {
  return `(${superadmin} OR ${site}.owner_uid = ${uid} OR EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = ${site}.site_id AND m.uid = ${uid}))`;
}

/** The environment of a site ('live', or 'test' for a sandbox site: docs/decisions/test-keys.md); undefined when absent. */
export async function siteEnvironment(q: Queryable, siteId: string): Promise<'live' | 'test' | undefined> {
  const { rows } = await q.query<{ environment: 'live' | 'test' }>('SELECT environment FROM sites WHERE site_id = $1', [siteId]);
  return rows[0]?.environment;
}

/** Makes `uid` a member of the site (nothing when already one); true when the membership is new. */
export async function addSiteMember(q: Queryable, siteId: string, uid: string): Promise<boolean> {
  const r = await q.query('INSERT INTO site_members (site_id, uid) VALUES ($1, $2) ON CONFLICT (site_id, uid) DO NOTHING', [siteId, uid]);
  return r.rowCount === 1;
}

// ---------------------------------------------------------------------------------------------------
// Site records (`/api/sites`, docs/decisions/sites.md)

/** A site as the site routes show it. */
export interface SiteRow {
  site_id: string;
  name: string;
  owner_uid: string;
  timezone: string;
  tier: string;
  roost_enabled: boolean;
  deploy_quota: number;
  /** 'live', or 'test' for a sandbox site (docs/decisions/test-keys.md). */
  environment: 'live' | 'test';
  created_at: Date;
}

const SITE_COLUMNS = 'site_id, name, owner_uid, timezone, tier, roost_enabled, deploy_quota, environment, created_at';

/** What a new site needs. */
export interface NewSite {
  siteId: string;
  name: string;
  ownerUid: string;
  timezone: string;
  tier: string;
  roostEnabled: boolean;
  deployQuota: number;
  environment: 'live' | 'test';
}

/**
 * Inserts a site and makes its owner a member, in the caller's transaction.
 * @returns the row, or undefined when a site of that name exists already (names are unique).
 */
export async function insertSite(tx: Queryable, s: NewSite): Promise<SiteRow | undefined> {
  const { rows } = await tx.query<SiteRow>(
    `INSERT INTO sites (site_id, name, owner_uid, timezone, tier, roost_enabled, deploy_quota, environment) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (name) DO NOTHING RETURNING ${SITE_COLUMNS}`,
    [s.siteId, s.name, s.ownerUid, s.timezone, s.tier, s.roostEnabled, s.deployQuota, s.environment],
  );
  if (rows[0]) await addSiteMember(tx, s.siteId, s.ownerUid);
  return rows[0];
}

/** One site by id, or undefined. `forUpdate` locks it in the caller's transaction. */
export async function getSiteRow(q: Queryable, siteId: string, forUpdate = false): Promise<SiteRow | undefined> {
  const { rows } = await q.query<SiteRow>(`SELECT ${SITE_COLUMNS} FROM sites WHERE site_id = $1${forUpdate ? ' FOR UPDATE' : ''}`, [
    siteId,
  ]);
  return rows[0];
}

/** One site by its (unique) name, or undefined. */
export async function siteByName(q: Queryable, name: string): Promise<SiteRow | undefined> {
  const { rows } = await q.query<SiteRow>(`SELECT ${SITE_COLUMNS} FROM sites WHERE name = $1`, [name]);
  return rows[0];
}

/** List position of sites: the last site id of a page. */
export type SitePosition = string;

/**
 * A page of the sites `user` may act on (every site for a superadmin), ascending by id, after `after`;
 * only sites of `environments` when given (a key acts on its own environment's sites only).
 */
export async function listSiteRows(
  q: Queryable,
  user: SiteUser,
  opts: { after?: SitePosition; limit: number; environments?: readonly ('live' | 'test')[] },
): Promise<SiteRow[]> {
  const { rows } = await q.query<SiteRow>(
    `SELECT ${SITE_COLUMNS} FROM sites s
      WHERE ($1 OR s.owner_uid = $2 OR EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = s.site_id AND m.uid = $2))
        AND ($3::text IS NULL OR s.site_id > $3)
        AND ($5::text[] IS NULL OR s.environment = ANY($5::text[]))
      ORDER BY s.site_id LIMIT $4`,
    [user.role === 'superadmin', user.uid, opts.after ?? null, opts.limit, opts.environments ?? null],
  );
  return rows;
}

/** Fields a site PATCH may change (absent: unchanged). */
export interface SitePatch {
  name?: string;
  timezone?: string;
  tier?: string;
  roostEnabled?: boolean;
  deployQuota?: number;
  ownerUid?: string;
}

/**
 * Applies `patch` to the site in the caller's transaction; a new owner also becomes a member.
 * @returns the updated row and whether the owner joined the site by it (was not a member before),
 *   undefined when the site is absent, or 'name_taken'.
 */
export async function updateSite(
  tx: Queryable,
  siteId: string,
  patch: SitePatch,
): Promise<{ row: SiteRow; ownerJoined: boolean } | 'name_taken' | undefined> {
  if (patch.name !== undefined) {
    const clash = await tx.query('SELECT 1 FROM sites WHERE name = $1 AND site_id <> $2', [patch.name, siteId]);
    if (clash.rows.length) return 'name_taken';
  }
  const { rows } = await tx.query<SiteRow>(
    `UPDATE sites SET name = coalesce($2, name), timezone = coalesce($3, timezone), tier = coalesce($4, tier),
            roost_enabled = coalesce($5, roost_enabled), deploy_quota = coalesce($6, deploy_quota), owner_uid = coalesce($7, owner_uid)
      WHERE site_id = $1 RETURNING ${SITE_COLUMNS}`,
    [
      siteId,
      patch.name ?? null,
      patch.timezone ?? null,
      patch.tier ?? null,
      patch.roostEnabled ?? null,
      patch.deployQuota ?? null,
      patch.ownerUid ?? null,
    ],
  );
  if (!rows[0]) return undefined;
  const ownerJoined = patch.ownerUid ? await addSiteMember(tx, siteId, patch.ownerUid) : false;
  return { row: rows[0], ownerJoined };
}

/** A member of a site as `GET /api/sites/{siteId}/members` lists it. */
export interface SiteMemberRow {
  uid: string;
  email: string;
  role: string;
  is_owner: boolean;
  joined_at: Date;
}

/** A page of the site's active members (owner included), ascending by uid, after `after`. */
export async function listSiteMembers(q: Queryable, siteId: string, opts: { after?: string; limit: number }): Promise<SiteMemberRow[]> {
  const { rows } = await q.query<SiteMemberRow>(
    `SELECT u.uid, u.email, u.role, (s.owner_uid = u.uid) AS is_owner, m.created_at AS joined_at
       FROM site_members m JOIN users u ON u.uid = m.uid JOIN sites s ON s.site_id = m.site_id
      WHERE m.site_id = $1 AND NOT u.deleted AND ($2::text IS NULL OR u.uid > $2)
      ORDER BY u.uid LIMIT $3`,
    [siteId, opts.after ?? null, opts.limit],
  );
  return rows;
}

/** Ids of the sites `uid` owns, ascending. */
export async function ownedSiteIds(q: Queryable, uid: string): Promise<string[]> {
  const { rows } = await q.query<{ site_id: string }>('SELECT site_id FROM sites WHERE owner_uid = $1 ORDER BY site_id', [uid]);
  return rows.map((r) => r.site_id);
}

/**
 * Moves every site `fromUid` owns to `toUid` (who becomes a member of each), in the caller's
 * transaction; returns the site ids moved, ascending (none when run again), and those of them `toUid`
 * joined by it (was not a member of before).
 */
export async function transferOwnedSites(tx: Queryable, fromUid: string, toUid: string): Promise<{ moved: string[]; joined: string[] }> {
  const { rows } = await tx.query<{ site_id: string }>('UPDATE sites SET owner_uid = $2 WHERE owner_uid = $1 RETURNING site_id', [
    fromUid,
    toUid,
  ]);
  const moved = rows.map((r) => r.site_id).sort();
  const joined: string[] = [];
  for (const siteId of moved) if (await addSiteMember(tx, siteId, toUid)) joined.push(siteId);
  return { moved, joined };
}

/** Whether the site's roost routes are enabled (`roostEnabled`); undefined when the site is absent. */
export async function siteRoostEnabled(q: Queryable, siteId: string): Promise<boolean | undefined> {
  const { rows } = await q.query<{ roost_enabled: boolean }>('SELECT roost_enabled FROM sites WHERE site_id = $1', [siteId]);
  return rows[0]?.roost_enabled;
}
