/** Identity and service metadata: GET /api/version (unauthenticated), GET /api/whoami, the OpenAPI document. */
import type { FastifyInstance } from 'fastify';
import { Type } from '@sinclair/typebox';
import { CURRENT_API_VERSION, SUPPORTED_API_VERSIONS } from '../plugins/api-version';
import { requireUser } from '../plugins/auth';
import { quotaSnapshot, quotaTiers } from '../../db/quota';

export default async function metaRoutes(app: FastifyInstance): Promise<void> {
  app.get(
    '/api/version',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['meta'],
        summary: 'API dates this server supports (unauthenticated)',
        response: {
          200: Type.Object({
            current: Type.String({ description: "the server's current API date (YYYY-MM-DD)" }),
            supported: Type.Array(Type.String(), { description: 'supported API dates, oldest first' }),
          }),
        },
      },
    },
    async () => ({ current: CURRENT_API_VERSION, supported: [...SUPPORTED_API_VERSIONS] }),
  );

  app.get(
    '/api/openapi.json',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['meta'],
        summary: 'This OpenAPI 3.1 document (the reference page renders it at /docs)',
        response: { 200: Type.Object({ openapi: Type.String() }, { additionalProperties: true, description: 'OpenAPI 3.1 document' }) },
      },
    },
    async () => app.swagger(),
  );

  app.get(
    '/healthz',
    {
      config: { auth: 'none' },
      schema: { tags: ['meta'], summary: 'Liveness and database reachability', response: { 200: Type.Object({ ok: Type.Literal(true) }) } },
    },
    async () => {
      await app.deps.db.query('SELECT 1');
      return { ok: true as const };
    },
  );

  app.get(
    '/api/whoami',
    {
      schema: {
        tags: ['meta'],
        summary: 'The resolved identity of the credential (SPEC.md Authentication 9)',
        response: {
          200: Type.Object(
            {
              userId: Type.String(),
              email: Type.String(),
              role: Type.String(),
              key: Type.Unknown({
                description: 'keyId, name, keyPrefix, scopes, environment, expiresAt, lastUsedAt, isLegacy; null for a session or ID token',
              }),
              rateLimit: Type.Unknown({ description: 'tier, limitPerMinute, note (a hint, not the enforced counter)' }),
              quota: Type.Unknown({ description: 'siteId, tier, usedBytes, pendingBytes, limitBytes' }),
              primarySiteId: Type.Union([Type.String(), Type.Null()]),
            },
            { additionalProperties: true },
          ),
        },
      },
    },
    async (request) => {
      const user = requireUser(request);
      // The key's primary site while the user can still act on it, else the user's first site by id.
      const { rows } = await app.deps.db.query<{ site_id: string }>(
        `SELECT site_id FROM (
         SELECT s.site_id, 0 AS pref FROM sites s
          WHERE s.site_id = $2::text
            AND ($3 OR s.owner_uid = $1 OR EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = s.site_id AND m.uid = $1))
         UNION ALL SELECT site_id, 1 AS pref FROM sites WHERE owner_uid = $1
         UNION ALL SELECT site_id, 1 AS pref FROM site_members WHERE uid = $1
       ) c ORDER BY pref, site_id LIMIT 1`,
        [user.userId, user.key?.primarySiteId ?? null, user.role === 'superadmin'],
      );
      const primarySiteId = rows[0]?.site_id ?? null;
      const quota = primarySiteId ? await quotaSnapshot(app.deps.db, primarySiteId, quotaTiers(app.deps.cfg)) : null;
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
        quota,
        primarySiteId,
      };
    },
  );
}
