/**
 * Tracing with OpenTelemetry (docs/observability.md "Traces"). Off unless OTEL_EXPORTER_OTLP_ENDPOINT or
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set: then the NodeSDK runs with a batch span processor exporting
 * over OTLP (OTEL_EXPORTER_OTLP_PROTOCOL `http/protobuf`, the default, or `http/json`; headers, timeouts and
 * the sampler from the standard OTEL_* variables), W3C `traceparent` propagation, and the HTTP and `pg`
 * instrumentations. The API adds the Fastify instrumentation (@fastify/otel) to its app, the Temporal
 * client and worker add @temporalio/interceptors-opentelemetry, so one deploy request is one trace: HTTP
 * span → StartWorkflow → RunWorkflow → StartActivity → RunActivity, and the agents' requests of a sync
 * join it through the `traceparent` they send.
 *
 * One tracing set-up per process: the first `startTracing` decides, later calls return it.
 */
import { context, propagation, trace, type SpanContext, TraceFlags } from '@opentelemetry/api';
import { NodeSDK } from '@opentelemetry/sdk-node';
import { BatchSpanProcessor, type ReadableSpan, type SpanProcessor } from '@opentelemetry/sdk-trace';
import { resourceFromAttributes, type Resource } from '@opentelemetry/resources';
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http';
import { PgInstrumentation } from '@opentelemetry/instrumentation-pg';
import { OTLPTraceExporter as OtlpJsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as OtlpProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { currentRequestId } from './logging';

import { type TracingEnv, tracingWanted } from './tracing-env';

export { type TracingEnv, tracingWanted };

/** The running tracing of the process. */
export interface Tracing {
  /** The processor spans end in; the worker hands Temporal's workflow spans to it too. */
  spanProcessor: SpanProcessor;
  resource: Resource;
  /** Exports what is buffered (tests, shutdown). */
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}

let current: Tracing | undefined;

/** The process's tracing, or undefined when it is off. */
export function activeTracing(): Tracing | undefined {
  return current;
}

/**
 * Starts tracing when `env` names an OTLP endpoint (or `opts.spanProcessor` is given: tests pass an
 * in-memory one) and returns it; undefined when tracing stays off. `serviceName` is the default of
 * OTEL_SERVICE_NAME.
 * @throws Error on an OTEL_EXPORTER_OTLP_PROTOCOL other than http/protobuf or http/json.
 */
export function startTracing(env: TracingEnv, opts: { serviceName?: string; spanProcessor?: SpanProcessor } = {}): Tracing | undefined {
  if (current) return current;
  if (!opts.spanProcessor && !tracingWanted(env)) return undefined;
  const serviceName = env.OTEL_SERVICE_NAME ?? opts.serviceName ?? 'roost';
  let spanProcessor = opts.spanProcessor;
  if (!spanProcessor) {
    const protocol = env.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf';
    // Endpoint, headers and timeout come from the OTEL_EXPORTER_OTLP_* variables the exporters read.
    if (protocol === 'http/json') spanProcessor = new BatchSpanProcessor({ exporter: new OtlpJsonExporter() });
    else if (protocol === 'http/protobuf') spanProcessor = new BatchSpanProcessor({ exporter: new OtlpProtoExporter() });
    else throw new Error(`OTEL_EXPORTER_OTLP_PROTOCOL ${protocol} is not supported (http/protobuf or http/json)`);
  }
  const resource = resourceFromAttributes({ 'service.name': serviceName });
  const sdk = new NodeSDK({
    serviceName,
    resource,
    autoDetectResources: false,
    spanProcessors: [spanProcessor],
    instrumentations: [new HttpInstrumentation(), new PgInstrumentation({ requireParentSpan: true })],
  });
  sdk.start();
  const processor = spanProcessor;
  current = {
    spanProcessor: processor,
    resource,
    forceFlush: () => processor.forceFlush(),
    async shutdown() {
      current = undefined;
      await sdk.shutdown();
    },
  };
  return current;
}

/** The W3C trace id of the active span, when tracing is on and a span is active (for log lines). */
export function activeTraceId(): string | undefined {
  const span = trace.getSpan(context.active());
  const id = span?.spanContext().traceId;
  return id && id !== '00000000000000000000000000000000' ? id : undefined;
}

/**
 * The W3C `traceparent` header value of the active span (`00-<trace id>-<span id>-<flags>`), when tracing is
 * on and a span is active: stored with a command so the agent's requests for it join this trace.
 */
export function activeTraceparent(): string | undefined {
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier);
  return carrier.traceparent;
}

/**
 * Where a command queued now comes from (db/machines.ts CommandOrigin): the active span's `traceparent`
 * (tracing on) and the request id of the running request or activity (telemetry/logging.ts log context).
 * Stored with the command; the agent sends the first back and logs both (docs/observability.md).
 */
export function commandOrigin(): { traceparent?: string; requestId?: string } {
  const traceparent = activeTraceparent();
  const requestId = currentRequestId();
  return { ...(traceparent ? { traceparent } : {}), ...(requestId ? { requestId } : {}) };
}

/** Span of Temporal's workflow sandbox (@temporalio/interceptors-opentelemetry, built on the 1.x SDK). */
interface WorkflowSpan {
  spanContext(): SpanContext;
  parentSpanId?: string;
  instrumentationLibrary?: { name: string; version?: string };
}

/**
 * A span processor taking the workflow spans Temporal's interceptors export from the workflow sandbox
 * (1.x SDK shape: `parentSpanId`, `instrumentationLibrary`) and handing them to `target` in the current
 * shape (`parentSpanContext`, `instrumentationScope`), so exporters keep their parent links.
 */
export function workflowSpanProcessor(target: SpanProcessor): SpanProcessor {
  return {
    onStart: () => undefined,
    onEnd(span: ReadableSpan) {
      const w = span as unknown as WorkflowSpan & ReadableSpan;
      const ctx = w.spanContext();
      const parentSpanContext: SpanContext | undefined =
        w.parentSpanContext ??
        (w.parentSpanId ? { traceId: ctx.traceId, spanId: w.parentSpanId, traceFlags: TraceFlags.SAMPLED, isRemote: true } : undefined);
      const instrumentationScope = w.instrumentationScope ?? w.instrumentationLibrary ?? { name: '@temporalio/interceptor-workflow' };
      target.onEnd({ ...w, spanContext: () => ctx, parentSpanContext, instrumentationScope } as ReadableSpan);
    },
    forceFlush: () => target.forceFlush(),
    shutdown: async () => undefined,
  };
}
