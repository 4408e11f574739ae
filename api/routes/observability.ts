/**
 * Operator endpoints (docs/observability.md): `GET /metrics`, the process's Prometheus metrics in the text
 * exposition format. On the API listener it answers only when ROOST_METRICS_TOKEN is set, to a request
 * carrying `Authorization: Bearer <ROOST_METRICS_TOKEN>` (401 otherwise); unset, it is 404 and the separate
 * listener of ROOST_METRICS_PORT (telemetry/metrics.ts startMetricsListener) is the way to scrape.
 */
import { timingSafeEqual } from 'node:crypto';
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import type { FastifyRequest } from 'fastify';
import { ApiError } from '../../domain/errors';
import { Problem } from '../../domain/schemas';
import { metricsText } from '../../telemetry/metrics';

/** Whether the request carries `Authorization: Bearer <token>` (constant-time comparison). */
function carriesToken(request: FastifyRequest, token: string): boolean {
  const header = request.headers.authorization ?? '';
  const m = /^Bearer (.+)$/i.exec(header);
  if (!m) return false;
  const given = Buffer.from(m[1]);
  const want = Buffer.from(token);
  return given.length === want.length && timingSafeEqual(given, want);
}

/** Registers `GET /metrics`. */
const observabilityRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/metrics',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['meta'],
        summary: 'Prometheus metrics of this process (needs ROOST_METRICS_TOKEN as a bearer token; 404 when unset)',
        response: {
          200: {
            description: 'Prometheus text exposition format 0.0.4',
            content: { 'text/plain': { schema: Type.String() } },
          },
          401: { ...Problem, description: 'ROOST_METRICS_TOKEN is set and the request does not carry it' },
          404: { ...Problem, description: 'metrics are not served on this listener (ROOST_METRICS_TOKEN unset)' },
        },
      },
    },
    async (request, reply) => {
      const token = app.deps.cfg.ROOST_METRICS_TOKEN;
      if (!token)
        throw new ApiError('not_found', 'metrics are not served on this listener (set ROOST_METRICS_TOKEN or ROOST_METRICS_PORT)');
      if (!carriesToken(request, token))
        throw new ApiError('unauthorized', 'GET /metrics needs Authorization: Bearer <ROOST_METRICS_TOKEN>');
      const { contentType, body } = await metricsText();
      return reply.type(contentType).send(body);
    },
  );
};

export default observabilityRoutes;
