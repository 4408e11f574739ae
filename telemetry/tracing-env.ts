/**
 * The tracing settings, readable before anything else loads (telemetry/instrument.ts): kept apart from
 * telemetry/tracing.ts so that checking them does not load the OpenTelemetry SDK.
 */

/** The settings tracing reads (the standard OpenTelemetry variables). */
export interface TracingEnv {
  OTEL_EXPORTER_OTLP_ENDPOINT?: string;
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?: string;
  OTEL_EXPORTER_OTLP_PROTOCOL?: string;
  OTEL_SERVICE_NAME?: string;
}

/** Whether the settings ask for tracing (an OTLP endpoint is set). */
export function tracingWanted(env: TracingEnv): boolean {
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
}
