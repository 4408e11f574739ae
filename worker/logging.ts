/**
 * Worker logs (docs/observability.md "Logs"): the Temporal SDK's Runtime logger writes through the process's
 * JSON logger (telemetry/logging.ts), so the SDK's own lines, workflow `log` calls and activity `log` calls
 * (with their workflowId, activityType, attempt…) are JSON lines too; activities run with the request id
 * their workflow was started with in the log context, and the active span's traceId when tracing is on.
 */
import { type ActivityInterceptors, DefaultLogger, type LogEntry, type LogLevel } from '@temporalio/worker';
import type { Context as ActivityContext } from '@temporalio/activity';
import type { Logger } from 'pino';
import { logContext, requestIdFromHeaders } from '../telemetry/logging';

const PINO_LEVEL: Record<LogLevel, 'trace' | 'debug' | 'info' | 'warn' | 'error'> = {
  TRACE: 'trace',
  DEBUG: 'debug',
  INFO: 'info',
  WARN: 'warn',
  ERROR: 'error',
};

/** A Runtime logger at `level` (Temporal's levels) writing each entry to `logger` with its metadata as fields. */
export function runtimeLogger(logger: Logger, level: LogLevel): DefaultLogger {
  return new DefaultLogger(level, (entry: LogEntry) => {
    logger[PINO_LEVEL[entry.level]]({ ...(entry.meta ?? {}) }, entry.message);
  });
}

/** Activity interceptor factory (Worker.create `interceptors.activity`): runs each activity in its request's log context. */
export function activityLogContext(ctx: ActivityContext): ActivityInterceptors {
  void ctx;
  return {
    inbound: {
      execute(input, next) {
        const requestId = requestIdFromHeaders(input.headers);
        return requestId ? logContext.run({ requestId }, () => next(input)) : next(input);
      },
    },
  };
}
