/**
 * What the replay tests share (test/replay/*.replay.test.ts): reading a recorded history (proto3 JSON,
 * scripts/record-history.ts) and the test process's Temporal Runtime.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DefaultLogger, Runtime, Worker, bundleWorkflowCode } from '@temporalio/worker';
import { historyFromJson } from '../../scripts/record-history';
import { runtimeLogger } from '../../worker/logging';
import { testLogger } from '../support/test-log';

/** Names of the recorded histories (`*.json`) in the folder `dir`, sorted. */
export function historyFiles(dir: string): string[] {
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort();
}

/**
 * Replays `history` against a bundle of the workflow module `workflowsPath` (a deliberately changed copy
 * under test/replay/fixtures/): the promise rejects as the replay does, which the caller asserts.
 */
export async function replayAgainstModule(workflowsPath: string, history: ReturnType<typeof loadHistory>): Promise<void> {
  const bundle = await bundleWorkflowCode({ workflowsPath, logger: new DefaultLogger('ERROR') });
  await Worker.runReplayHistory({ workflowBundle: bundle }, history, 'changed');
}

/** The recorded history `file` of the folder `dir`, ready for `Worker.runReplayHistory`. */
export function loadHistory(dir: string, file: string) {
  return historyFromJson(JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8')));
}

/**
 * Installs the Temporal Runtime of the test process (once per process; later calls are no-ops): nothing on
 * stdout; the SDK's lines and the activities' lines at INFO go through the worker's JSON logger
 * (worker/logging.ts) into the run's log file (test/support/test-log.ts), like a worker process's.
 */
export function quietRuntime(): void {
  try {
    Runtime.install({
      logger: runtimeLogger(testLogger('roost-worker'), 'INFO'),
      telemetryOptions: { logging: { filter: { core: 'WARN', other: 'WARN' } } },
    });
  } catch {
    /* already installed in this process */
  }
}
