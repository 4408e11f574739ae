/**
 * Storage quota of a site (`GET /api/sites/{siteId}/quota`; docs/decisions/storage-quota.md). Accounting
 * and enforcement are SQL in db/quota.ts; this module applies the tier limits of the configuration.
 */
import { type QuotaSnapshot, type QuotaTiers, quotaSnapshot, quotaTiers } from '../db/quota';
import type { ServiceDeps } from './deps';

export type { QuotaSnapshot } from '../db/quota';

/**
 * The tier limits (tier → bytes) of a configuration (ROOST_QUOTA_TIERS over the defaults), parsed once.
 * Call it at start-up so an invalid setting fails the boot.
 * @throws Error naming ROOST_QUOTA_TIERS when it is not a JSON object of tier → non-negative integer bytes.
 */
export function tiersOf(cfg: ServiceDeps['cfg']): QuotaTiers {
  return quotaTiers(cfg);
}

/**
 * The quota snapshot of a site (sizes in bytes: used, pending reservations, limit of its tier). Does
 * not check access.
 * @throws ApiError not_found when the site does not exist; Error when ROOST_QUOTA_TIERS is invalid.
 */
export function siteQuota(deps: Pick<ServiceDeps, 'db' | 'cfg'>, siteId: string): Promise<QuotaSnapshot> {
  return quotaSnapshot(deps.db, siteId, quotaTiers(deps.cfg));
}
