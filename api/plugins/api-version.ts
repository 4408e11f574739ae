/**
 * `Roost-Version` (docs/contract.md "Versioning"), checked on every request (an `onRequest` hook at the root, so
 * it also runs for unknown routes, unauthenticated routes and the reference page, and before
 * authentication, validation and Idempotency-Key handling). A request may name an API date; an
 * unsupported one (anything not in SUPPORTED_API_VERSIONS, including malformed or repeated headers)
 * gets 400 unsupported_version with `sent` and `supported` (oldest first). Absent header: the request is
 * served at the current date (docs/decisions/api-versioning.md). Every response, errors included,
 * carries `Roost-Version`: the date the request was served at (the current date for a rejected one).
 */
import fp from 'fastify-plugin';
import type { FastifyInstance } from 'fastify';
import { ApiError } from '../../domain/errors';

/** Supported API dates, oldest first; the last is current. */
export const SUPPORTED_API_VERSIONS = ['2026-11-01'] as const;
export const CURRENT_API_VERSION = SUPPORTED_API_VERSIONS[SUPPORTED_API_VERSIONS.length - 1];

/** True when `value` is exactly one of the supported API dates. */
export function isSupportedApiVersion(value: string): boolean {
  return (SUPPORTED_API_VERSIONS as readonly string[]).includes(value);
}

export default fp(async function apiVersionPlugin(app: FastifyInstance) {
  app.addHook('onRequest', async (request, reply) => {
    reply.header('Roost-Version', CURRENT_API_VERSION);
    const sent = request.headers['roost-version'];
    if (sent === undefined) return;
    const value = Array.isArray(sent) ? sent.join(', ') : sent;
    if (!isSupportedApiVersion(value)) {
      throw new ApiError(
        'unsupported_version',
        `Roost-Version ${value.slice(0, 64)} is not supported; send one of ${SUPPORTED_API_VERSIONS.join(', ')} or omit the header`,
        {
          extras: { param: 'Roost-Version', sent: value, supported: [...SUPPORTED_API_VERSIONS] },
        },
      );
    }
    reply.header('Roost-Version', value);
  });
});
