/**
 * `Roost-Version` (SPEC.md "Versioning"). A request may name an API date; an unsupported one gets
 * 400 unsupported_version with `sent` and `supported`. Absent header: the request is served at the
 * current date (docs/decisions/api-versioning.md). Every response names the date it was served at.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance } from 'fastify';
import { ApiError } from '../../domain/errors';

/** Supported API dates, oldest first; the last is current. */
export const SUPPORTED_API_VERSIONS = ['2026-11-01'] as const;
export const CURRENT_API_VERSION = SUPPORTED_API_VERSIONS[SUPPORTED_API_VERSIONS.length - 1];

export default fp(async function apiVersionPlugin(app: FastifyInstance) {
  app.addHook('onRequest', async (request, reply) => {
    const sent = request.headers['roost-version'];
    if (sent !== undefined) {
      const value = Array.isArray(sent) ? sent.join(',') : sent;
      if (!(SUPPORTED_API_VERSIONS as readonly string[]).includes(value)) {
        throw new ApiError('unsupported_version', `Roost-Version ${value} is not supported`, {
          extras: { sent: value, supported: [...SUPPORTED_API_VERSIONS] },
        });
      }
      reply.header('Roost-Version', value);
    } else reply.header('Roost-Version', CURRENT_API_VERSION);
  });
});
