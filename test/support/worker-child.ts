/**
 * A real worker process (`node worker/main.ts`, the production entry point) for kill tests: started on the
 * suite's services and the test database with `env` added (at least the harness's ROOST_TASK_QUEUE), with
 * the background workflows off (the relay and sweeps belong to no single test). Resolves once the process
 * logs that it serves its task queue; `killHard` (test/support/api-child.ts) SIGKILLs it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';
import { testDatabase } from './env';
import { teeToTestLog } from './test-log';

const ROOT = path.join(__dirname, '..', '..');

/** Starts the worker; rejects with the tail of its stderr when it exits before serving. */
export function startWorkerChild(env: Record<string, string>): Promise<ChildProcess> {
  const child = spawn(process.execPath, ['-r', 'tsx/cjs', path.join(ROOT, 'worker', 'main.ts')], {
    cwd: ROOT,
    env: {
      ...process.env,
      ROOST_PG_DATABASE: testDatabase(),
      ROOST_LOG_LEVEL: 'info',
      ROOST_BACKGROUND_WORKFLOWS: 'false',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // Its JSON lines are part of the suite's logs, grepped for secrets (test/support/test-log.ts).
  teeToTestLog(child.stdout);
  teeToTestLog(child.stderr);
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    child.stderr!.on('data', (d) => (err += d));
    child.stdout!.on('data', (d) => {
      out += d;
      if (out.includes('serving task queue')) {
        out = '';
        resolve(child);
      }
    });
    child.on('exit', (code, signal) => reject(new Error(`worker exited ${code ?? signal}: ${err.slice(-2000)}`)));
  });
}
