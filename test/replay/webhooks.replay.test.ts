/**
 * Replay gate of the webhook workflows (every workflow has a replay test from a recorded history;
 * docs/decisions/replay-histories.md). histories/webhooks/ holds real runs recorded by
 * `ROOST_RECORD_HISTORIES=1 npx jest test/integration/webhooks.test.ts`: a delivery that succeeded at
 * once, a delivery retried after two 500s, and one closed run of the event relay (it continued as new).
 * Each must replay against today's workflows/index.ts bundle; a variant with one extra activity call
 * must fail with a DeterminismViolationError.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DefaultLogger, Worker, bundleWorkflowCode } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { loadHistory, quietRuntime } from './histories';
import { workflowBundle } from '../../worker/worker';

const HISTORIES = path.join(__dirname, 'histories', 'webhooks');
const files = fs
  .readdirSync(HISTORIES)
  .filter((f) => f.endsWith('.json'))
  .sort();

const load = (file: string) => loadHistory(HISTORIES, file);

const typeOf = (file: string) => load(file).events![0].workflowExecutionStartedEventAttributes?.workflowType?.name;

beforeAll(quietRuntime);

it('has recorded histories of a succeeded and a retried delivery and of a relay run', () => {
  expect(files).toEqual(expect.arrayContaining(['delivery-succeeded.json', 'delivery-retried.json', 'relay.json']));
  expect(typeOf('delivery-succeeded.json')).toBe('webhookDeliveryWorkflow');
  expect(typeOf('delivery-retried.json')).toBe('webhookDeliveryWorkflow');
  expect(typeOf('relay.json')).toBe('eventRelayWorkflow');
  // The retried delivery's single activity was attempted three times (two 500s, then 200).
  const started = load('delivery-retried.json').events!.filter((e) => e.activityTaskStartedEventAttributes);
  expect(started.map((e) => e.activityTaskStartedEventAttributes!.attempt)).toContain(3);
  // The relay run ended by continuing as new.
  expect(load('relay.json').events!.some((e) => e.workflowExecutionContinuedAsNewEventAttributes)).toBe(true);
});

it.each(files)('replays %s against the current workflow code', async (file) => {
  await expect(Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, load(file), file)).resolves.toBeUndefined();
});

it('fails replay with a DeterminismViolationError when the delivery workflow gained an activity call', async () => {
  const changed = await bundleWorkflowCode({
    workflowsPath: require.resolve('./fixtures/webhooks-changed'),
    logger: new DefaultLogger('ERROR'),
  });
  await expect(Worker.runReplayHistory({ workflowBundle: changed }, load('delivery-succeeded.json'), 'changed')).rejects.toBeInstanceOf(
    DeterminismViolationError,
  );
});
