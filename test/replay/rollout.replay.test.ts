/**
 * Replay gate of the rollout workflow (every workflow has a replay test from a recorded history;
 * docs/decisions/replay-histories.md). Each history under histories/ was recorded from a real run
 * (rollout.test.ts with ROOST_RECORD_HISTORIES=1, or scripts/record-history.ts) and must replay against
 * today's workflows/index.ts bundle; a workflow changed without `patched()` fails here. The negative test
 * proves the gate works: a variant with one extra activity call fails replay with a DeterminismViolationError.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DefaultLogger, Worker, bundleWorkflowCode } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { loadHistory, quietRuntime } from './histories';
import { workflowBundle } from '../../worker/worker';

const HISTORIES = path.join(__dirname, 'histories');
/** Rollout histories only (other workflows keep theirs in the same folder, with their own replay tests). */
const files = fs
  .readdirSync(HISTORIES)
  .filter((f) => f.startsWith('rollout-') && f.endsWith('.json'))
  .sort();
/**
 * Histories recorded before rollout control existed (they must replay on the fixed canary-then-fleet path of
 * workflows/rollout.ts).
 */
const PRE_CONTROL = ['rollout-completed.json', 'rollout-canary-failed.json', 'rollout-scheduled.json'];
/** Histories of the rollout-control paths (test/integration/rollout-control.test.ts with ROOST_RECORD_HISTORIES=1). */
const CONTROL = [
  'rollout-policy-waves.json',
  'rollout-pause-resume.json',
  'rollout-manual-gate.json',
  'rollout-abort.json',
  'rollout-auto-rollback.json',
  'rollout-rollback.json',
  'rollout-maintenance-window.json',
  'rollout-staged.json',
];

/**
 * Histories of rollouts that verified their version before the first wave (`rollout-verify-chunks-v1`;
 * test/integration/verify.test.ts with ROOST_RECORD_HISTORIES=1).
 */
const VERIFY = ['rollout-chunk-verify-failed.json'];

/**
 * A scheduled rollout aborted before its scheduleAt, ending at once (`rollout-schedule-abort-v1`;
 * test/integration/rollout-control.test.ts with ROOST_RECORD_HISTORIES=1).
 */
const SCHEDULE_ABORT = ['rollout-schedule-abort.json'];

const load = (file: string) => loadHistory(HISTORIES, file);

beforeAll(quietRuntime);

it('has recorded histories of a completed, a failed and a scheduled rollout, and of every control path', () => {
  expect(files).toEqual(expect.arrayContaining([...PRE_CONTROL, ...CONTROL, ...VERIFY, ...SCHEDULE_ABORT]));
  for (const f of files) {
    const first = load(f).events![0];
    expect(first.workflowExecutionStartedEventAttributes?.workflowType?.name).toBe('rolloutWorkflow');
  }
});

it('recorded the pre-control histories without the control patch marker, the control ones with it, and the verify marker only where recorded since', () => {
  const hasMarker = (f: string, patch: string) =>
    (load(f).events ?? []).some((e) =>
      (e.markerRecordedEventAttributes?.details?.['patch-data']?.payloads ?? []).some((p) =>
        Buffer.from(p.data ?? [])
          .toString('utf8')
          .includes(`"${patch}"`),
      ),
    );
  for (const f of PRE_CONTROL) expect(hasMarker(f, 'rollout-control-v1')).toBe(false);
  for (const f of CONTROL.filter((x) => files.includes(x))) expect(hasMarker(f, 'rollout-control-v1')).toBe(true);
  for (const f of CONTROL) expect(hasMarker(f, 'rollout-verify-chunks-v1')).toBe(false);
  for (const f of VERIFY) expect(hasMarker(f, 'rollout-verify-chunks-v1')).toBe(true);
  for (const f of files.filter((x) => !SCHEDULE_ABORT.includes(x))) expect(hasMarker(f, 'rollout-schedule-abort-v1')).toBe(false);
  for (const f of SCHEDULE_ABORT) expect(hasMarker(f, 'rollout-schedule-abort-v1')).toBe(true);
  // It ended before its first wave: no wave was dispatched.
  const activities = (load('rollout-schedule-abort.json').events ?? []).map(
    (e) => e.activityTaskScheduledEventAttributes?.activityType?.name,
  );
  expect(activities).not.toContain('dispatchWave');
});

it.each(files)('replays %s against the current workflow code', async (file) => {
  await expect(Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, load(file), file)).resolves.toBeUndefined();
});

it('fails replay with a DeterminismViolationError when the workflow gained an activity call', async () => {
  const changed = await bundleWorkflowCode({
    workflowsPath: require.resolve('./fixtures/rollout-changed'),
    logger: new DefaultLogger('ERROR'),
  });
  await expect(Worker.runReplayHistory({ workflowBundle: changed }, load('rollout-completed.json'), 'changed')).rejects.toBeInstanceOf(
    DeterminismViolationError,
  );
});
