/**
 * A real worker process (`node worker/main.ts`, the production entry point) for kill tests: started on the
 * suite's services and the test database with `env` added (at least the harness's ROOST_TASK_QUEUE), with
 * the background workflows off (the relay and sweeps belong to no single test), logging at info into the
 * run's log file. Resolves once the process logs that it serves its task queue; `killHard`
 * (test/support/api-child.ts) SIGKILLs it.
 */
import type { ChildProcess } from 'node:child_process';
import path from 'node:path';
import { startEntry } from './api-child';
import { testDatabase } from './env';

/** Starts the worker; rejects with the tail of its stderr when it exits before serving. */
export async function startWorkerChild(env: Record<string, string>): Promise<ChildProcess> {
  const started = await startEntry(
    path.join('worker', 'main.ts'),
    { ROOST_PG_DATABASE: testDatabase(), ROOST_LOG_LEVEL: 'info', ROOST_BACKGROUND_WORKFLOWS: 'false', ...env },
    /serving task queue/,
  );
  return started.child;
}
