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
import { defaultPayloadConverter, type Payload } from '@temporalio/common';
import type {
  Next,
  WorkflowClientInterceptor,
  WorkflowSignalWithStartInput,
  WorkflowStartInput,
  WorkflowStartOutput,
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

/**
 * Secrets as they appear in text, each with the part kept for diagnosis (`$1`): the credential families of
 * domain/keys.ts (`svk_live_`, `svk_test_`), services/agent.ts (`ses_` enrolment secrets, `sat_` agent
 * tokens), db/sessions.ts (`sst_`), services/webhooks.ts (`whsec_`), the `sig` of an Azure SAS URL and any
 * `Bearer` credential.
 */
export const SECRET_PATTERNS: readonly RegExp[] = [
  /\b(svk_(?:live|test)_|ses_|sat_|sst_|whsec_)[A-Za-z0-9_-]{16,}/g,
  /([?&]sig=)[^&"'\s\\]+/gi,
  /(\bBearer\s+)[^"'\s\\]+/gi,
];

/** `text` with every secret of SECRET_PATTERNS replaced by its prefix and `[redacted]`. */
export function redactSecrets(text: string): string {
  let out = text;
  for (const re of SECRET_PATTERNS) out = out.replace(re, '$1[redacted]');
  return out;
}

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
        paths: [
          'req.headers.authorization',
          'req.headers.cookie',
          'headers.authorization',
          'authorization',
          'token',
          'apiKey',
          'agentToken',
          'enrolmentSecret',
          'secret',
          'signingSecret',
          'password',
        ],
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
 * Workflow-client interceptor (services/deps.ts): a workflow started while an API request is served carries
 * that request's id in the REQUEST_ID_HEADER header, so the activities it runs log it (worker/logging.ts).
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
    return next({ ...input, workflowStartHeaders: { ...input.workflowStartHeaders, ...requestIdHeader() } });
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
