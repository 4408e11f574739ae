/**
 * Storage quota of a site (the use case is services/quota.ts; docs/decisions/storage-quota.md):
 *
 *   GET /api/sites/{siteId}/quota   site read   → { siteId, tier, usedBytes, pendingBytes, limitBytes }
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { problems, SiteId } from '../../domain/schemas';
import { siteQuota, tiersOf } from '../../services/quota';
import { authorizeSite } from '../plugins/auth';

const QuotaParams = Type.Object({ siteId: SiteId });

/** The quota snapshot of a site (numbers in bytes). */
export const QuotaSnapshotSchema = Type.Object({
  siteId: Type.String(),
  tier: Type.String({ description: 'the site tier (plan) whose limit applies' }),
  usedBytes: Type.Integer({ description: 'summed sizes of the distinct chunks the site holds' }),
  pendingBytes: Type.Integer({ description: 'unexpired upload reservations not finalised by a publish' }),
  limitBytes: Type.Integer({ description: 'storage limit of the tier' }),
});

/** Registers the quota route. Parses the tier limits at start (invalid ROOST_QUOTA_TIERS fails the boot). */
const quotaRoutes: FastifyPluginAsyncTypebox = async (app) => {
  tiersOf(app.deps.cfg);

  app.get(
    '/api/sites/:siteId/quota',
    {
      schema: {
        summary: 'Storage quota snapshot of a site',
        tags: ['quota'],
        params: QuotaParams,
        response: { 200: QuotaSnapshotSchema, ...problems() },
      },
    },
    async (request): Promise<Static<typeof QuotaSnapshotSchema>> => {
      const { siteId } = request.params;
      await authorizeSite(request, siteId, [{ resource: 'site', id: siteId, permission: 'read' }]);
      return siteQuota(app.deps, siteId);
    },
  );
};

export default quotaRoutes;
