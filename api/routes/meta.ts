/** Identity and service metadata: GET /api/version (unauthenticated), GET /api/whoami, the OpenAPI document. */
import type { FastifyInstance } from 'fastify';
import { Type } from '@sinclair/typebox';
import { CURRENT_API_VERSION, SUPPORTED_API_VERSIONS } from '../plugins/api-version';
import { requireUser } from '../plugins/auth';

export default async function metaRoutes(app: FastifyInstance): Promise<void> {
  app.get(
    '/api/version',
    {
      config: { auth: 'none' },
      schema: { response: { 200: Type.Object({ current: Type.String(), supported: Type.Array(Type.String()) }) } },
    },
    async () => ({ current: CURRENT_API_VERSION, supported: [...SUPPORTED_API_VERSIONS] }),
  );

  app.get('/api/openapi.json', { config: { auth: 'none' }, schema: { hide: true } }, async () => app.swagger());

  app.get('/healthz', { config: { auth: 'none' }, schema: { hide: true } }, async () => {
    await app.deps.db.query('SELECT 1');
    return { ok: true };
  });

  app.get('/api/whoami', {}, async (request) => {
    const user = requireUser(request);
    const { rows } = await app.deps.db.query<{ site_id: string }>(
      `SELECT site_id FROM sites WHERE owner_uid = $1
       UNION SELECT site_id FROM site_members WHERE uid = $1 ORDER BY 1 LIMIT 1`,
      [user.userId],
    );
    const primarySiteId = user.key?.primarySiteId ?? rows[0]?.site_id ?? null;
    return {
      userId: user.userId,
      email: user.email,
      role: user.role,
      key: user.key
        ? {
            keyId: user.key.keyId,
            name: user.key.name,
            keyPrefix: user.key.keyPrefix,
            scopes: user.key.scopes,
            environment: user.key.environment,
            expiresAt: user.key.expiresAt,
            lastUsedAt: user.key.lastUsedAt,
            isLegacy: user.key.isLegacy,
          }
        : null,
      rateLimit: { tier: 'standard', limitPerMinute: 300, note: 'hint only; not the enforced counter' },
      quota: null,
      primarySiteId,
    };
  });
}
