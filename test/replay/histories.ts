/**
 * What the replay tests share (test/replay/*.replay.test.ts): reading a recorded history (proto3 JSON,
 * scripts/record-history.ts) and a Temporal Runtime that logs errors only.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DefaultLogger, Runtime, Worker, bundleWorkflowCode } from '@temporalio/worker';
import { historyFromJson } from '../../scripts/record-history';

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

/** Installs the Temporal Runtime with an ERROR-level logger (once per process; later calls are no-ops). */
export function quietRuntime(): void {
  try {
    Runtime.install({ logger: new DefaultLogger('ERROR'), telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' } } } });
  } catch {
    /* already installed in this process */
  }
}
