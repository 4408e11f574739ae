/**
 * Builds the Fastify app (DESIGN.md "api/"): problem+json errors, request ids, API versioning,
 * authentication, idempotency, the OpenAPI document, and every route family. Stateless: N copies may run.
 */
import Fastify, { FastifyInstance } from 'fastify';
import { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { randomBytes } from 'node:crypto';
import type { AppDeps } from './context';
import problem from './plugins/problem';
import apiVersion from './plugins/api-version';
import auth from './plugins/auth';
import idempotency from './plugins/idempotency';
import { registerRoutes } from './routes';

export interface BuildOptions {
  logger?: boolean | { level: string };
}

/** Creates the app with its dependencies. Call `app.ready()` (or `listen`) before use. */
export async function buildApp(deps: AppDeps, opts: BuildOptions = {}): Promise<FastifyInstance> {
  const app = Fastify({
    logger: opts.logger ?? { level: deps.cfg.ROOST_LOG_LEVEL },
    bodyLimit: 1024 * 1024,
    // Agents hold keep-alive connections and long-polls; closing the app must not wait for them.
    forceCloseConnections: true,
    genReqId: () => `req_${randomBytes(10).toString('hex')}`,
    ajv: { customOptions: { coerceTypes: 'array', removeAdditional: false, useDefaults: true, allErrors: true } },
    routerOptions: { maxParamLength: 512 },
  }).withTypeProvider<TypeBoxTypeProvider>();

  app.decorate('deps', deps);
  app.addHook('onRequest', async (request, reply) => {
    reply.header('X-Request-Id', request.id);
  });
  await app.register(problem);
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: { title: 'Roost API', version: '2026-11-01', description: 'Fleet distribution and control service. See SPEC.md.' },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer: [] }],
    },
  });
  // The API reference page is public: its routes are marked before the UI plugin adds them.
  app.addHook('onRoute', (route) => {
    if (route.url.startsWith('/docs')) route.config = { ...(route.config ?? {}), auth: 'none' };
  });
  await app.register(swaggerUi, { routePrefix: '/docs' });
  await app.register(apiVersion);
  await app.register(auth);
  await app.register(idempotency);
  await registerRoutes(app);
  return app;
}
