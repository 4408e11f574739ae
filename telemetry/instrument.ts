/**
 * Imported first by the entry points (api/server.ts, worker/main.ts, cli/main.ts) so that tracing, when
 * OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, starts before `http` and
 * `pg` are loaded and their instrumentations can wrap them (docs/observability.md "Traces"). Does nothing
 * otherwise, and then does not even load the OpenTelemetry SDK (about a second of start-up that every
 * `roost` command would pay).
 */
import type * as TracingModule from './tracing';
import { tracingWanted } from './tracing-env';

if (tracingWanted(process.env)) {
  // require, not import: the SDK loads only when wanted (the entry points run as CommonJS).
  (require('./tracing') as typeof TracingModule).startTracing(process.env);
}
