/**
 * Sites and their membership: who may act on a site. A user may act on a site when they own it, are a
 * member of it (`site_members`), or are a superadmin (every site). This module holds that rule's SQL,
 * the only copy: authorisation (`authorizeSite`, api/plugins/auth.ts), the scope checks of new API keys
 * (db/keys.ts), `GET /api/whoami` and the operator bootstrap (db/bootstrap.ts) all call it.
 */
import type { Queryable } from './pool';

/** The user whose access is asked about. */
export interface SiteUser {
  uid: string;
  /** Only 'superadmin' matters here: a superadmin may act on every site. */
  role: string;
}

/**
 * The ids of sites `user` may act on, in ascending id order: among `opts.siteIds` when given (absent
 * sites are left out), else among every site. `opts.limit` caps the rows (default: no cap).
 */
export async function accessibleSiteIds(
  q: Queryable,
  user: SiteUser,
  opts: { siteIds?: string[]; limit?: number } = {},
): Promise<string[]> {
  if (opts.siteIds && opts.siteIds.length === 0) return [];
  const { rows } = await q.query<{ site_id: string }>(
    `SELECT s.site_id FROM sites s
      WHERE ($1::text[] IS NULL OR s.site_id = ANY($1::text[]))
        AND ($3 OR s.owner_uid = $2 OR EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = s.site_id AND m.uid = $2))
      ORDER BY s.site_id LIMIT $4`,
    [opts.siteIds ?? null, user.uid, user.role === 'superadmin', opts.limit ?? null],
  );
  return rows.map((r) => r.site_id);
}

/** True when the site exists and `user` may act on it. */
export async function canActOnSite(q: Queryable, user: SiteUser, siteId: string): Promise<boolean> {
  return (await accessibleSiteIds(q, user, { siteIds: [siteId], limit: 1 })).length === 1;
}

/** The environment of a site ('live', or 'test' for a sandbox site: docs/decisions/test-keys.md); undefined when absent. */
export async function siteEnvironment(q: Queryable, siteId: string): Promise<'live' | 'test' | undefined> {
  const { rows } = await q.query<{ environment: 'live' | 'test' }>('SELECT environment FROM sites WHERE site_id = $1', [siteId]);
  return rows[0]?.environment;
}

/** Makes `uid` a member of the site (nothing when already one). */
export async function addSiteMember(q: Queryable, siteId: string, uid: string): Promise<void> {
  await q.query('INSERT INTO site_members (site_id, uid) VALUES ($1, $2) ON CONFLICT (site_id, uid) DO NOTHING', [siteId, uid]);
}

/** Answers when the database accepts a query (the liveness probe `GET /healthz`); throws when it does not. */
export async function pingDatabase(q: Queryable): Promise<void> {
  await q.query('SELECT 1');
}
