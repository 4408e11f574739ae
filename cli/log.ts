/**
 * The `roost --verbose` log (docs/observability.md "CLI"): pino JSON lines on stderr, so a `--json` result on
 * stdout stays one clean document. Lines carry `service: "roost-cli"`, `pid` and, when this invocation takes
 * part in a trace, `traceId`; the client (cli/client.ts) logs one line per API answer with the `requestId`
 * the API gave it (`X-Request-Id`). Secrets are redacted like in every Roost log (domain/redaction.ts).
 */
import { randomBytes } from 'node:crypto';
import pino, { type DestinationStream, type Logger } from 'pino';
import { REDACTED_FIELDS, redactSecrets } from '../domain/redaction';

/** A W3C `traceparent` value: version, 32-hex trace id, 16-hex parent id, flags. */
const TRACEPARENT_RE = /^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** The trace this invocation's API requests join: the `traceparent` header they carry and its trace id. */
export interface CliTrace {
  traceparent: string;
  traceId: string;
}

/**
 * The trace of this invocation, when tracing is on: `TRACEPARENT` (a caller's W3C trace context, e.g. a CI
 * job's) when it is well formed; else, when `OTEL_EXPORTER_OTLP_ENDPOINT` or
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (the setting that turns tracing on for the API and the worker),
 * a new sampled trace of its own; else none. The CLI exports no span itself: its requests are spans of the
 * API under one trace id per invocation.
 */
export function cliTrace(env: NodeJS.ProcessEnv = process.env): CliTrace | undefined {
  const given = env.TRACEPARENT?.trim().toLowerCase();
  const m = given ? TRACEPARENT_RE.exec(given) : null;
  if (given && m && !/^0+$/.test(m[1])) return { traceparent: given, traceId: m[1] };
  if (!env.OTEL_EXPORTER_OTLP_ENDPOINT && !env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return undefined;
  const traceId = randomBytes(16).toString('hex');
  return { traceparent: `00-${traceId}-${randomBytes(8).toString('hex')}-01`, traceId };
}

/**
 * The CLI's logger: with `verbose`, JSON lines at debug level to `destination` (default stderr, written
 * synchronously so nothing is lost when the command exits); otherwise a silent logger.
 */
export function cliLogger(opts: { verbose: boolean; trace?: CliTrace; destination?: DestinationStream }): Logger {
  const out = opts.destination ?? pino.destination({ dest: 2, sync: true });
  return pino(
    {
      level: opts.verbose ? 'debug' : 'silent',
      base: { service: 'roost-cli', pid: process.pid, ...(opts.trace ? { traceId: opts.trace.traceId } : {}) },
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: [...REDACTED_FIELDS], censor: '[redacted]' },
    },
    { write: (line: string) => out.write(redactSecrets(line)) },
  );
}

let active: Logger | undefined;

/** The logger of the running command (set by cli/context.ts commandContext), if it logs. */
export function activeCliLogger(): Logger | undefined {
  return active;
}

/** Sets the running command's logger (cli/context.ts). */
export function setActiveCliLogger(logger: Logger | undefined): void {
  active = logger;
}
