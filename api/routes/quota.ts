/**
 * Storage quota of a site (SPEC.md "API keys, identity, version, quota", "Quota snapshot"):
 *
 *   GET /api/sites/{siteId}/quota   site read   → { siteId, tier, usedBytes, pendingBytes, limitBytes }
 *
 * Accounting and enforcement live in db/quota.ts; decisions in docs/decisions/storage-quota.md.
 */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { quotaSnapshot, quotaTiers } from '../../db/quota';
import { authorizeSite } from '../plugins/auth';
import { problems, SiteId } from '../../domain/schemas';

const QuotaParams = Type.Object({ siteId: SiteId });

/** SPEC.md "Quota snapshot" (numbers in bytes). */
export const QuotaSnapshotSchema = Type.Object({
  siteId: Type.String(),
  tier: Type.String({ description: 'the site tier (plan) whose limit applies' }),
  usedBytes: Type.Integer({ description: 'summed sizes of the distinct chunks the site holds' }),
  pendingBytes: Type.Integer({ description: 'unexpired upload reservations not finalised by a publish' }),
  limitBytes: Type.Integer({ description: 'storage limit of the tier' }),
});
type QuotaSnapshotBody = Static<typeof QuotaSnapshotSchema>;

/** Registers the quota route. Parses the tier limits at start (invalid ROOST_QUOTA_TIERS fails the boot). */
export default async function quotaRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<TypeBoxTypeProvider>();
  const tiers = quotaTiers(app.deps.cfg);

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
    async (request): Promise<QuotaSnapshotBody> => {
      const { siteId } = request.params;
      await authorizeSite(request, siteId, [{ resource: 'site', id: siteId, permission: 'read' }]);
      return quotaSnapshot(app.deps.db, siteId, tiers);
    },
  );
}
