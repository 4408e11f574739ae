/**
 * Identity and service metadata: `GET /api/version` (unauthenticated), `GET /api/openapi.json`, `GET /healthz`
 * (liveness), `GET /readyz` (readiness: database, blob storage, Temporal, migrations; docs/observability.md),
 * `GET /api/whoami` (services/identity.ts; docs/decisions/whoami.md).
 */
import { rateLimitHint } from '../ratelimit/limits';
import { Type } from '@sinclair/typebox';
import { Problem } from '../../domain/schemas';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { checkReadiness, whoamiFacts } from '../../services/identity';
import { CURRENT_API_VERSION, SUPPORTED_API_VERSIONS } from '../plugins/api-version';
import { requireUser } from '../plugins/auth';

/** Registers the metadata routes. */
const metaRoutes: FastifyPluginAsyncTypebox = async (app) => {
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
    // The document's type is @fastify/swagger's; the schema above only names its `openapi` field.
    async () => app.swagger() as unknown as { openapi: string },
  );

  app.get(
    '/healthz',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['meta'],
        summary: 'Liveness: 200 while this process serves requests; asks no dependency (readiness is GET /readyz)',
        response: { 200: Type.Object({ ok: Type.Literal(true) }) },
      },
    },
    async () => ({ ok: true as const }),
  );

  app.get(
    '/readyz',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['meta'],
        summary:
          'Readiness: 200 when the database, blob storage and Temporal answer and every migration of this build is applied; else 503 service_unavailable with the same fields',
        response: {
          200: Type.Object({
            ok: Type.Literal(true),
            dependencies: Type.Object(
              {
                database: Type.Literal('up'),
                blobStorage: Type.Literal('up'),
                temporal: Type.Literal('up'),
              },
              { description: 'each dependency of the API; a 503 problem carries the same map with `down` entries' },
            ),
            migrations: Type.Literal('applied', {
              description: 'a 503 problem says `pending` (with `pendingMigrations`) or `unknown` (database down)',
            }),
          }),
          503: Problem,
        },
      },
    },
    async () => {
      await checkReadiness(app.deps);
      return {
        ok: true as const,
        dependencies: { database: 'up' as const, blobStorage: 'up' as const, temporal: 'up' as const },
        migrations: 'applied' as const,
      };
    },
  );

  app.get(
    '/api/whoami',
    {
      schema: {
        tags: ['meta'],
        summary: 'The resolved identity of the credential',
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
      const { primarySiteId, quota } = await whoamiFacts(app.deps, user);
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
        // The enforced `api` bucket, as a per-minute figure (a hint; the RateLimit-* headers carry the counter).
        rateLimit: rateLimitHint(app.rateLimits.settings, quota?.tier ?? 'standard'),
        quota,
        primarySiteId,
      };
    },
  );
};

export default metaRoutes;
