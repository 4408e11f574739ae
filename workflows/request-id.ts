/**
 * Workflow interceptors bundled into every workflow (worker/worker.ts workflowBundle): the request id a
 * workflow was started with (Temporal header `roost-request-id`, set by telemetry/logging.ts
 * RequestIdClientInterceptor) is passed on to every activity and child workflow it schedules, so their log
 * lines carry the request that started the job (docs/observability.md "Logs"). An update or signal that
 * carries the header (rollout pause/resume/promote/abort, classic retry/cancel/uninstall) replaces it: the
 * activities scheduled from then on carry the request that last steered the job. Headers only: no command,
 * timer or payload of the history changes, and the headers of updates and signals are in the history, so
 * a replay sees the same ids.
 */
import type { Payload } from '@temporalio/common';
import type { WorkflowInterceptors } from '@temporalio/workflow';

const HEADER = 'roost-request-id';

/** Interceptors of one workflow run (the SDK calls this once per run). */
export const interceptors = (): WorkflowInterceptors => {
  let requestId: Payload | undefined;
  const withRequestId = <T extends { headers: Record<string, Payload> }>(input: T): T =>
    requestId && !input.headers[HEADER] ? { ...input, headers: { ...input.headers, [HEADER]: requestId } } : input;
  return {
    inbound: [
      {
        execute(input, next) {
          requestId = input.headers[HEADER];
          return next(input);
        },
        handleUpdate(input, next) {
          requestId = input.headers[HEADER] ?? requestId;
          return next(input);
        },
        handleSignal(input, next) {
          requestId = input.headers[HEADER] ?? requestId;
          return next(input);
        },
      },
    ],
    outbound: [
      {
        scheduleActivity: (input, next) => next(withRequestId(input)),
        scheduleLocalActivity: (input, next) => next(withRequestId(input)),
        startChildWorkflowExecution: (input, next) => next(withRequestId(input)),
        continueAsNew: (input, next) => next(withRequestId(input)),
      },
    ],
  };
};
