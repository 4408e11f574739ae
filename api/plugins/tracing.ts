/**
 * Request spans (docs/observability.md "Traces"): with tracing on (telemetry/tracing.ts), @fastify/otel
 * opens one span per request named after its route template, continues an incoming W3C `traceparent`
 * (agents send the one of their sync), and runs the handler in that span's context, so the workflow starts
 * and queries of the request join its trace. Lifecycle hooks get no spans of their own (cost). Request
 * log lines carry the trace id. Nothing is registered while tracing is off.
 */
import fp from 'fastify-plugin';
import type { FastifyInstance } from 'fastify';
import { FastifyOtelInstrumentation } from '@fastify/otel';
import { activeTracing } from '../../telemetry/tracing';
import { routeLabel } from './metrics';

let instrumentation: FastifyOtelInstrumentation | undefined;

export default fp(async function tracingPlugin(app: FastifyInstance) {
  if (!activeTracing()) return;
  instrumentation ??= new FastifyOtelInstrumentation({
    instrumentHooks: false,
    recordExceptions: false,
    // `POST /api/roosts/:roostId/deploy` rather than `request`: the route template, never the raw URL.
    requestHook: (span, request) => span.updateName(`${request.method} ${routeLabel(request)}`),
  });
  await app.register(instrumentation.plugin());
});
