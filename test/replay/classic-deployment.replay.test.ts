/**
 * Replay gate of the classic deployment workflow (workflows/classic-deployment.ts; every workflow has a
 * replay test from a recorded history, docs/decisions/replay-histories.md). histories/classic/ holds real
 * runs recorded by `ROOST_RECORD_HISTORIES=1 npx jest test/integration/classic-deployments.test.ts -t fan-out`:
 * a parallel fan-out to 10 agents ending partial, the run a retry started on the finished deployment
 * (update-with-start), a serial run cancelled by an update while an install was in flight, and the
 * uninstall run started by two uninstalls at once (one applied, one refused as deployment_in_flight by its
 * handler). Each must
 * replay against today's workflows/index.ts bundle; a variant with one extra activity call must fail.
 */
import path from 'node:path';
import { Worker } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { historyFiles, loadHistory, quietRuntime, replayAgainstModule } from './histories';
import { workflowBundle } from '../../worker/worker';

const HISTORIES = path.join(__dirname, 'histories', 'classic');
const files = historyFiles(HISTORIES);
const load = (file: string) => loadHistory(HISTORIES, file);

beforeAll(quietRuntime);

it('has recorded histories of a partial fan-out, a retry run, a cancelled run and an uninstall run, each with updates where they happened', () => {
  expect(files).toEqual(['classic-cancel.json', 'classic-partial.json', 'classic-retry.json', 'classic-uninstall.json']);
  for (const f of files) {
    expect(load(f).events![0].workflowExecutionStartedEventAttributes?.workflowType?.name).toBe('classicDeploymentWorkflow');
  }
  const updates = (f: string) =>
    load(f)
      .events!.filter((e) => e.workflowExecutionUpdateAcceptedEventAttributes)
      .map((e) => e.workflowExecutionUpdateAcceptedEventAttributes!.acceptedRequest?.input?.name);
  expect(updates('classic-partial.json')).toEqual([]);
  expect(updates('classic-retry.json')).toEqual(['retry']);
  expect(updates('classic-cancel.json')).toEqual(['cancel']);
  expect(updates('classic-uninstall.json')).toEqual(['uninstall', 'uninstall']);
  const outcomes = load('classic-uninstall.json')
    .events!.filter((e) => e.workflowExecutionUpdateCompletedEventAttributes)
    .map((e) => {
      const o = e.workflowExecutionUpdateCompletedEventAttributes!.outcome!;
      return o.failure ? o.failure.applicationFailureInfo?.type : 'success';
    });
  expect(outcomes).toEqual(['success', 'deployment_in_flight']);
  // History size does not depend on the number of targets: the 10-target fan-out is a handful of events.
  expect(load('classic-partial.json').events!.length).toBeLessThan(40);
});

it.each(files)('replays %s against the current workflow code', async (file) => {
  await expect(Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, load(file), file)).resolves.toBeUndefined();
});

it('fails replay with a DeterminismViolationError when the workflow gained an activity call', async () => {
  await expect(replayAgainstModule(require.resolve('./fixtures/classic-changed'), load('classic-partial.json'))).rejects.toBeInstanceOf(
    DeterminismViolationError,
  );
});
