/**
 * Request metrics of the API (docs/observability.md "API"): per route template, method and status class a
 * request counter and a latency histogram; 429 refusals by the bucket or capability that refused; replays
 * of the idempotency store; and, for as long as the app is open, its PostgreSQL pool (connections and
 * 40001 retries), its event-stream connections and the rollouts by stage and state (read at scrape). Everything is hook-based: routes and other plugins do
 * not know about it. The series live in the process registry (telemetry/metrics.ts).
 */
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import {
  collectProcessMetrics,
  httpDuration,
  httpRequests,
  idempotencyReplays,
  observePool,
  observeRollouts,
  observeStreamConnections,
  rateLimitRefusals,
} from '../../telemetry/metrics';
import { rolloutCounts } from '../../services/observability';
import { eventHubOf } from '../routes/events';

/** Label of a request without a matched route (404s, refused request heads): never the raw URL. */
export const UNMATCHED_ROUTE = 'unmatched';

/** The route template of a request (`/api/roosts/:roostId`), or UNMATCHED_ROUTE. */
export function routeLabel(request: FastifyRequest): string {
  return request.routeOptions.url ?? UNMATCHED_ROUTE;
}

/** `2xx`, `4xx`, … of a status code. */
export function statusClass(status: number): string {
  return `${Math.floor(status / 100)}xx`;
}

/** The counter that refused a 429 answer: the request's refused decision, else the reason header. */
function refusingBucket(request: FastifyRequest, reply: FastifyReply): string {
  const d = request.rateLimitDecision;
  if (d && !d.allowed) return d.scope;
  const reason = reply.getHeader('roost-rate-limited-reason');
  return typeof reason === 'string' ? reason : 'unknown';
}

export default fp(async function metricsPlugin(app: FastifyInstance) {
  collectProcessMetrics();
  app.addHook('onResponse', async (request, reply) => {
    const route = routeLabel(request);
    const labels = { method: request.method, route, status_class: statusClass(reply.statusCode) };
    httpRequests.inc(labels);
    httpDuration.observe(labels, reply.elapsedTime / 1000);
    if (reply.statusCode === 429) rateLimitRefusals.inc({ bucket: refusingBucket(request, reply) });
    if (reply.getHeader('idempotent-replayed') === 'true') idempotencyReplays.inc({ route });
  });
  const stops: (() => void)[] = [];
  app.addHook('onReady', async () => {
    stops.push(observePool(app.deps.db, 'api'));
    stops.push(observeRollouts(() => rolloutCounts(app.deps)));
    const hub = eventHubOf(app.deps);
    if (hub) stops.push(observeStreamConnections(() => (hub.closed ? 0 : hub.clientCount)));
  });
  app.addHook('onClose', async () => {
    for (const stop of stops.splice(0)) stop();
  });
});
