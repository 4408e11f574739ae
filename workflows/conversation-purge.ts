/**
 * The conversation purge sweep (docs/decisions/cortex.md "Deletion"; docs/decisions/sweeps.md): started by
 * its Temporal Schedule (worker/background.ts `sweepSchedules`, every
 * ROOST_SWEEP_CONVERSATION_PURGE_INTERVAL_SECONDS), it purges conversations deleted more than the recovery
 * window ago (ROOST_CONVERSATION_RECOVERY_SECONDS, 30 days) with their messages, in batches of an idempotent
 * activity (activities/conversations.ts) until a batch reports no more work or `maxBatches` is reached.
 *
 * Deterministic code only: the activity is imported by type, with explicit timeouts. Changing this code
 * changes replay: use `patched()` or a new workflow type (test/replay/conversation-purge.replay.test.ts).
 */
import { proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';
import type { SweepInput, SweepOutcome } from './sweeps';

const acts = proxyActivities<Activities>({
  startToCloseTimeout: '5 minutes',
  heartbeatTimeout: '1 minute',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute', maximumAttempts: 5 },
});

/** Purges expired deleted conversations; `emitted` is always 0 (no catalog event exists for conversations). */
export async function conversationPurgeSweepWorkflow(input?: SweepInput): Promise<SweepOutcome> {
  const batchSize = input?.batchSize ?? 100;
  const maxBatches = input?.maxBatches ?? 50;
  const out: SweepOutcome = { batches: 0, processed: 0, emitted: 0 };
  while (out.batches < maxBatches) {
    const r = await acts.purgeDeletedConversations({ batchSize });
    out.batches++;
    out.processed += r.processed;
    if (!r.more) break;
  }
  return out;
}
