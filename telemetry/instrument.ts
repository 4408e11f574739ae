/**
 * Imported first by the entry points (api/server.ts, worker/main.ts, cli/main.ts) so that tracing, when
 * OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, starts before `http` and
 * `pg` are loaded and their instrumentations can wrap them (docs/observability.md "Traces"). Does nothing
 * otherwise.
 */
import { startTracing, tracingWanted } from './tracing';

if (tracingWanted(process.env)) startTracing(process.env);
