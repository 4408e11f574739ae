/**
 * The test suite's logs (docs/observability.md "Logs", "Secrets in the suite's logs"): every API app, worker
 * Runtime, agent service and child process the suite starts writes its JSON lines to a file of this run,
 * `<ROOST_TEST_LOG_DIR>/worker-<jest worker>.log` (global-setup.ts sets the folder, under .data/test-logs/),
 * and scripts/run-tests.ts greps them all for secrets (test/support/log-leaks.ts) after the run.
 *
 * One file descriptor per process, opened on first use and kept on `process` (Jest gives each test file a
 * fresh module registry but the worker process is the same), written synchronously: a line is on disk
 * before the test that logged it ends, whatever happens to the worker afterwards.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { createLogger } from '../../telemetry/logging';

const FD = Symbol.for('roost.test-log.fd');

/** Path of this process's log file, or undefined when the run keeps no logs (ROOST_TEST_LOG_DIR unset). */
export function testLogFile(): string | undefined {
  const dir = process.env.ROOST_TEST_LOG_DIR;
  if (!dir) return undefined;
  return path.join(dir, `worker-${process.env.JEST_WORKER_ID ?? `pid${process.pid}`}.log`);
}

function fd(): number | undefined {
  const holder = process as unknown as Record<symbol, number | undefined>;
  if (holder[FD] !== undefined) return holder[FD];
  const file = testLogFile();
  if (!file) return undefined;
  fs.mkdirSync(path.dirname(file), { recursive: true });
  holder[FD] = fs.openSync(file, 'a');
  return holder[FD];
}

/** Appends `text` (one or more lines, as written: child process output, a logger's line) to this process's log file. */
export function appendTestLog(text: string | Buffer): void {
  const f = fd();
  if (f === undefined) return;
  if (typeof text === 'string') fs.writeSync(f, text);
  else fs.writeSync(f, text);
}

/** A pino destination writing to this process's log file (nothing when the run keeps no logs). */
export const testLogDestination = { write: (line: string): void => appendTestLog(line) };

/**
 * The logger every app and worker of the suite uses unless a test captures lines itself: telemetry/logging.ts
 * createLogger (JSON, correlation fields, secrets redacted) at `level` (default info: a line per request
 * received and answered, and what the activities log) into this process's log file.
 */
export function testLogger(service: string, level = process.env.ROOST_TEST_LOG_LEVEL ?? 'info'): Logger {
  return createLogger({ service, level, destination: testLogDestination });
}

/** Writes `stream`'s output (a child process's stdout or stderr) to this process's log file as it comes. */
export function teeToTestLog(stream: NodeJS.ReadableStream | null | undefined): void {
  stream?.on('data', (d: Buffer | string) => appendTestLog(d));
}
