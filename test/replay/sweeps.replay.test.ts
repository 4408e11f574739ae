/**
 * Replay gate of the sweep workflows (workflows/sweeps.ts; every workflow has a replay test from a
 * recorded history, docs/decisions/replay-histories.md). histories/sweeps/sweep-*.json were recorded from
 * real runs of test/integration/sweeps.test.ts (ROOST_RECORD_HISTORIES=1) and must replay against today's
 * workflows/index.ts bundle: a sweep changed without `patched()` (or a new workflow type) fails here.
 * Each recorded run made more than one activity call, so a changed batching loop is caught too.
 */
import path from 'node:path';
import { Worker } from '@temporalio/worker';
import { loadHistory, quietRuntime } from './histories';
import { workflowBundle } from '../../worker/worker';

const HISTORIES = path.join(__dirname, 'histories', 'sweeps');

/** Recorded history file → the workflow type it must start with. */
const EXPECTED: Record<string, string> = {
  'sweep-staleness.json': 'heartbeatStalenessSweepWorkflow',
  'sweep-chunk-gc.json': 'chunkGcSweepWorkflow',
  'sweep-chunk-verify.json': 'chunkVerifySweepWorkflow',
  'sweep-key-expiry.json': 'keyExpirySweepWorkflow',
  // Recorded by test/integration/conversations.test.ts (the conversation purge sweep).
  'sweep-conversation-purge.json': 'conversationPurgeSweepWorkflow',
};
const files = Object.keys(EXPECTED);

const load = (file: string) => loadHistory(HISTORIES, file);

beforeAll(quietRuntime);

it('has a recorded history of every sweep workflow, each with several activity calls', () => {
  for (const f of files) {
    const events = load(f).events!;
    expect(events[0].workflowExecutionStartedEventAttributes?.workflowType?.name).toBe(EXPECTED[f]);
    expect(events.filter((e) => e.activityTaskScheduledEventAttributes).length).toBeGreaterThan(1);
    expect(events[events.length - 1].workflowExecutionCompletedEventAttributes).toBeTruthy();
  }
});

it.each(files)('replays %s against the current workflow code', async (file) => {
  await expect(Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, load(file), file)).resolves.toBeUndefined();
});
