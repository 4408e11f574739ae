/**
 * Rate limits on every route (docs/contract.md "Limits"). After authentication, a request is counted in its
 * route's wrapper bucket (`config.rateLimit`; default `api`, keyed by API key id, else IP; agent-token
 * requests and `auth: 'none'` routes are not counted unless the route names a bucket). An exhausted
 * bucket gives 429 rate_limited with `retryAfter`, `Retry-After` and `Roost-Rate-Limited-Reason`.
 * Every counted response carries `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds)
 * and the same values as `X-RateLimit-*`, from the most restrictive decision of the request (wrapper
 * bucket or a capability bucket counted by `enforceCapability`).
 *
 * Decorates the app with `rateLimits` (api/ratelimit/limits.ts). Register after the auth plugin.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { WrapperBucket } from '../ratelimit/buckets';
import { bucketIdentifier, noteDecision, RateLimits, rateLimitedError, rateLimitHeaders } from '../ratelimit/limits';

/** Quiet period between two logged store failures, ms. */
const STORE_ERROR_LOG_INTERVAL_MS = 30_000;

/** The wrapper bucket that applies to a request, or undefined when none does. */
export function routeBucket(request: FastifyRequest): WrapperBucket | undefined {
  // An unknown URL (Fastify's 404 handler) is refused before the limiter (docs/decisions/rate-limit-buckets.md).
  if (request.is404) return undefined;
  const config = request.routeOptions.config;
  const named = config?.rateLimit;
  if (named === false) return undefined;
  if (named !== undefined) return named;
  if ((config?.auth ?? 'user') === 'none') return undefined;
  if (request.principal?.kind !== 'user') return undefined;
  return 'api';
}

export default fp(async function rateLimitPlugin(app: FastifyInstance) {
  let lastLogged = 0;
  const limits = await RateLimits.create(app.deps.cfg, {
    onStoreError: (err) => {
      const now = Date.now();
      if (now - lastLogged < STORE_ERROR_LOG_INTERVAL_MS) return;
      lastLogged = now;
      app.log.warn({ err: err.message }, 'rate-limit store unavailable; the per-process fallback limit applies');
    },
  });
  app.decorate('rateLimits', limits);
  app.addHook('onClose', async () => limits.close());

  app.addHook('preValidation', async (request) => {
    const bucket = routeBucket(request);
    if (!bucket) return;
    const d = await limits.bucket(bucket, bucketIdentifier(limits.settings.buckets[bucket].subject, request));
    noteDecision(request, d);
    if (!d.allowed) throw rateLimitedError(d);
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const d = request.rateLimitDecision;
    if (d) for (const [k, v] of Object.entries(rateLimitHeaders(d))) reply.header(k, v);
    return payload;
  });
});
