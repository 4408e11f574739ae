/**
 * Replay gate of the installer finalise workflow (every workflow has a replay test from a recorded
 * history; docs/decisions/replay-histories.md). histories/installers/ holds real runs recorded by
 * `ROOST_RECORD_HISTORIES=1 npx jest test/integration/installers.test.ts`: a finalise that activated the
 * version, one whose bytes did not match the declared checksum (discarded), and one with nothing uploaded.
 * Each must replay against today's workflows/index.ts bundle; a variant with one extra activity call must
 * fail with a DeterminismViolationError.
 */
import path from 'node:path';
import { Worker } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { historyFiles, loadHistory, quietRuntime, replayAgainstModule } from './histories';
import { workflowBundle } from '../../worker/worker';

const HISTORIES = path.join(__dirname, 'histories', 'installers');
const files = historyFiles(HISTORIES);
const load = (file: string) => loadHistory(HISTORIES, file);

beforeAll(quietRuntime);

it('has recorded histories of an activated, a mismatched and a missing upload', () => {
  expect(files).toEqual(['finalize-activated.json', 'finalize-mismatch.json', 'finalize-missing.json']);
  for (const f of files)
    expect(load(f).events![0].workflowExecutionStartedEventAttributes?.workflowType?.name).toBe('installerFinalizeWorkflow');
  const activities = (f: string) =>
    load(f)
      .events!.map((e) => e.activityTaskScheduledEventAttributes?.activityType?.name)
      .filter(Boolean);
  expect(activities('finalize-activated.json')).toEqual(['hashInstallerUpload', 'activateInstallerVersion']);
  expect(activities('finalize-mismatch.json')).toEqual(['hashInstallerUpload', 'discardInstallerUpload']);
  expect(activities('finalize-missing.json')).toEqual(['hashInstallerUpload']);
});

it.each(files)('replays %s against the current workflow code', async (file) => {
  await expect(Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, load(file), file)).resolves.toBeUndefined();
});

it('fails replay with a DeterminismViolationError when the finalise gained an activity call', async () => {
  await expect(
    replayAgainstModule(require.resolve('./fixtures/installer-finalize-changed'), load('finalize-activated.json')),
  ).rejects.toBeInstanceOf(DeterminismViolationError);
});
