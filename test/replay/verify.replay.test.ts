/**
 * Replay gate of the version verification workflow (workflows/verify.ts; every workflow has a replay test
 * from a recorded history, docs/decisions/replay-histories.md). histories/verify/ holds a real run recorded
 * by `ROOST_RECORD_HISTORIES=1 npx jest test/integration/verify.test.ts`: a verification that found one
 * chunk with bad bytes. It must replay against today's workflows/index.ts bundle; a variant with one extra
 * activity call must fail with a DeterminismViolationError.
 */
import path from 'node:path';
import { Worker } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { historyFiles, loadHistory, quietRuntime, replayAgainstModule } from './histories';
import { workflowBundle } from '../../worker/worker';

const HISTORIES = path.join(__dirname, 'histories', 'verify');
const files = historyFiles(HISTORIES);

const load = (file: string) => loadHistory(HISTORIES, file);

beforeAll(quietRuntime);

it('has a recorded verification that found bad bytes', () => {
  expect(files).toContain('verify-failed.json');
  const events = load('verify-failed.json').events!;
  expect(events[0].workflowExecutionStartedEventAttributes?.workflowType?.name).toBe('versionVerifyWorkflow');
  expect(events.some((e) => e.activityTaskCompletedEventAttributes)).toBe(true);
});

it.each(files)('replays %s against the current workflow code', async (file) => {
  await expect(Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, load(file), file)).resolves.toBeUndefined();
});

it('fails replay with a DeterminismViolationError when the workflow gained an activity call', async () => {
  await expect(replayAgainstModule(require.resolve('./fixtures/verify-changed'), load('verify-failed.json'))).rejects.toBeInstanceOf(
    DeterminismViolationError,
  );
});
