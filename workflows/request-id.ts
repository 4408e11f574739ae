/**
 * Workflow interceptors bundled into every workflow (worker/worker.ts workflowBundle): the request id a
 * workflow was started with (Temporal header `roost-request-id`, set by telemetry/logging.ts
 * RequestIdClientInterceptor) is passed on to every activity and child workflow it schedules, so their log
 * lines carry the request that started the job (docs/observability.md "Logs"). Headers only: no command,
 * timer or payload of the history changes.
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
