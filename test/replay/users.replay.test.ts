/**
 * Replay gate of the user-delete cascade (every workflow has a replay test from a recorded history;
 * docs/decisions/replay-histories.md). histories/users/ holds real runs recorded by
 * `ROOST_RECORD_HISTORIES=1 npx jest test/integration/user-delete-restart.test.ts`: a cascade that ran
 * straight through, and one whose worker was stopped in the site-transfer step and which a new worker
 * finished. Each must replay against today's workflows/index.ts bundle; a variant with one extra activity
 * call must fail with a DeterminismViolationError.
 */
import path from 'node:path';
import { Worker } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { historyFiles, loadHistory, quietRuntime, replayAgainstModule } from './histories';
import { workflowBundle } from '../../worker/worker';

const HISTORIES = path.join(__dirname, 'histories', 'users');
const files = historyFiles(HISTORIES);

const load = (file: string) => loadHistory(HISTORIES, file);

beforeAll(quietRuntime);

it('has recorded histories of a straight cascade and of one interrupted by a worker restart', () => {
  expect(files).toEqual(['cascade-after-restart.json', 'cascade-completed.json']);
  for (const f of files) expect(load(f).events![0].workflowExecutionStartedEventAttributes?.workflowType?.name).toBe('userDeleteWorkflow');
  // The interrupted run's transfer step was attempted again by the second worker.
  const started = load('cascade-after-restart.json').events!.filter((e) => e.activityTaskStartedEventAttributes);
  expect(Math.max(...started.map((e) => e.activityTaskStartedEventAttributes!.attempt ?? 1))).toBeGreaterThanOrEqual(2);
});

it.each(files)('replays %s against the current workflow code', async (file) => {
  await expect(Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, load(file), file)).resolves.toBeUndefined();
});

it('fails replay with a DeterminismViolationError when the cascade gained an activity call', async () => {
  await expect(
    replayAgainstModule(require.resolve('./fixtures/user-delete-changed'), load('cascade-completed.json')),
  ).rejects.toBeInstanceOf(DeterminismViolationError);
});
