/**
 * What the replay tests share (test/replay/*.replay.test.ts): reading a recorded history (proto3 JSON,
 * scripts/record-history.ts) and a Temporal Runtime that logs errors only.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { historyFromJson } from '../../scripts/record-history';

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
