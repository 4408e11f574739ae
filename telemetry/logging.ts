/**
 * One structured logger for Roost's processes (docs/observability.md "Logs"): pino JSON lines carrying the
 * service name, `requestId` (the API request being served, or the request that started the workflow an
 * activity runs for) and, while tracing is on, `traceId` and `spanId` of the active span. Every line is
 * scrubbed of secrets (API keys, enrolment secrets, agent and session tokens, webhook secrets, SAS
 * signatures, bearer credentials) before it is written, whatever logged it.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { isSpanContextValid, trace } from '@opentelemetry/api';
import pino, { type DestinationStream, type Logger } from 'pino';
import { REDACTED_FIELDS, redactSecrets, SECRET_PATTERNS } from '../domain/redaction';
import { defaultPayloadConverter, type Payload } from '@temporalio/common';
import type {
  Next,
  WorkflowClientInterceptor,
  WorkflowSignalWithStartInput,
  WorkflowStartInput,
  WorkflowStartOutput,
  WorkflowSignalInput,
  WorkflowStartUpdateInput,
  WorkflowStartUpdateOutput,
  WorkflowStartUpdateWithStartInput,
  WorkflowStartUpdateWithStartOutput,
} from '@temporalio/client';

/** What the lines logged inside one unit of work carry. */
export interface LogContext {
  /** `X-Request-Id` of the API request (`req_…`) the work serves or was started by. */
  requestId?: string;
}

/** The log context of the running unit of work: an API request (api/app.ts) or an activity (worker/logging.ts). */
export const logContext = new AsyncLocalStorage<LogContext>();

/** The request id of the running unit of work, if any. */
export function currentRequestId(): string | undefined {
  return logContext.getStore()?.requestId;
}

export { SECRET_PATTERNS, redactSecrets };

/** Loggers that carry `requestId` in their own bindings (Fastify's per-request children): the mixin adds none. */
const boundLoggers = new WeakSet<object>();

/** Marks `logger` as carrying `requestId` in its bindings; returns it. */
export function withBoundRequestId<T extends object>(logger: T): T {
  boundLoggers.add(logger);
  return logger;
}

/** The fields every line gets from where it is logged: requestId (unless bound), traceId and spanId. */
function correlation(_obj: object, _level: number, logger: object): Record<string, string> {
  const out: Record<string, string> = {};
  const requestId = logContext.getStore()?.requestId;
  if (requestId && !boundLoggers.has(logger)) out.requestId = requestId;
  const span = trace.getActiveSpan()?.spanContext();
  if (span && isSpanContextValid(span)) {
    out.traceId = span.traceId;
    out.spanId = span.spanId;
  }
  return out;
}

/** A destination that writes each line with its secrets redacted (redactSecrets) to `target`. */
export function redactingDestination(target: DestinationStream): DestinationStream {
  return { write: (line: string) => target.write(redactSecrets(line)) };
}

/**
 * Creates a logger: JSON lines (`level` as a number, `time` ISO 8601, `service`, `msg`), correlation fields
 * from the running request, activity and span, secrets redacted, written to `destination` (default stdout).
 * @param level a pino level: `fatal`, `error`, `warn`, `info`, `debug`, `trace` or `silent`
 */
export function createLogger(opts: { service: string; level: string; destination?: DestinationStream }): Logger {
  return pino(
    {
      level: opts.level,
      base: { service: opts.service, pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      mixin: correlation,
      // Structured fields that hold credentials by name, whatever their format.
      redact: {
        paths: [...REDACTED_FIELDS],
        censor: '[redacted]',
      },
    },
    redactingDestination(opts.destination ?? pino.destination({ dest: 1, sync: true })),
  );
}

/** Temporal header carrying the request id from a workflow start to the workflow's activities (workflows/request-id.ts). */
export const REQUEST_ID_HEADER = 'roost-request-id';

/** The request id of the running unit of work as a Temporal header payload (JSON string), or no header. */
function requestIdHeader(): Record<string, Payload> {
  const requestId = currentRequestId();
  return requestId ? { [REQUEST_ID_HEADER]: defaultPayloadConverter.toPayload(requestId) } : {};
}

/**
 * Workflow-client interceptor (services/deps.ts): a workflow started, updated or signalled while an API
 * request is served carries that request's id in the REQUEST_ID_HEADER header; workflows/request-id.ts
 * passes the latest one on to the activities scheduled after it, so they log it (worker/logging.ts).
 */
export class RequestIdClientInterceptor implements WorkflowClientInterceptor {
  start(input: WorkflowStartInput, next: Next<WorkflowClientInterceptor, 'start'>): Promise<string> {
    return next({ ...input, headers: { ...input.headers, ...requestIdHeader() } });
  }

  startWithDetails(input: WorkflowStartInput, next: Next<WorkflowClientInterceptor, 'startWithDetails'>): Promise<WorkflowStartOutput> {
    return next({ ...input, headers: { ...input.headers, ...requestIdHeader() } });
  }

  signalWithStart(input: WorkflowSignalWithStartInput, next: Next<WorkflowClientInterceptor, 'signalWithStart'>): Promise<string> {
    return next({ ...input, headers: { ...input.headers, ...requestIdHeader() } });
  }

  startUpdateWithStart(
    input: WorkflowStartUpdateWithStartInput,
    next: Next<WorkflowClientInterceptor, 'startUpdateWithStart'>,
  ): Promise<WorkflowStartUpdateWithStartOutput> {
    const header = requestIdHeader();
    return next({
      ...input,
      workflowStartHeaders: { ...input.workflowStartHeaders, ...header },
      updateHeaders: { ...input.updateHeaders, ...header },
    });
  }

  /** An update (rollout pause/resume/promote/abort): the activities it causes log the updating request. */
  startUpdate(input: WorkflowStartUpdateInput, next: Next<WorkflowClientInterceptor, 'startUpdate'>): Promise<WorkflowStartUpdateOutput> {
    return next({ ...input, headers: { ...input.headers, ...requestIdHeader() } });
  }

  signal(input: WorkflowSignalInput, next: Next<WorkflowClientInterceptor, 'signal'>): Promise<void> {
    return next({ ...input, headers: { ...input.headers, ...requestIdHeader() } });
  }
}

/** The request id a Temporal header map carries (REQUEST_ID_HEADER), if any. */
export function requestIdFromHeaders(headers: Record<string, Payload> | undefined): string | undefined {
  const payload = headers?.[REQUEST_ID_HEADER];
  if (!payload) return undefined;
  try {
    const value: unknown = defaultPayloadConverter.fromPayload(payload);
    return typeof value === 'string' ? value : undefined;
  } catch {
    return undefined;
  }
}
