/**
 * Activity of the conversation purge sweep (workflows/conversation-purge.ts): removes up to `batchSize`
 * conversations deleted more than ROOST_CONVERSATION_RECOVERY_SECONDS ago, with their messages. Idempotent:
 * each purge re-checks the tombstone in its own transaction (db/conversations.ts), so a retry, a concurrent
 * run or a restore in between never removes a live conversation.
 */
import { Context } from '@temporalio/activity';
import type { ActivityDeps } from './deps';
import { purgeExpiredConversations } from '../db/conversations';
import { type BatchInput, type BatchResult, MAX_SWEEP_BATCH } from './sweeps';

/** Builds the conversation activities over their dependencies (`createActivities` merges them). */
export function createConversationActivities({ db, cfg }: ActivityDeps) {
  return {
    /** Purges one batch; `processed` counts the conversations removed, `more` when the batch was full. */
    async purgeDeletedConversations(input: BatchInput): Promise<BatchResult> {
      const size = Math.max(1, Math.min(MAX_SWEEP_BATCH, Math.floor(input.batchSize) || 1));
      const r = await purgeExpiredConversations(db, cfg.ROOST_CONVERSATION_RECOVERY_SECONDS, size);
      try {
        Context.current().heartbeat(r.purged);
      } catch {
        /* called outside an activity (direct use): nothing to heartbeat */
      }
      return { processed: r.purged, emitted: 0, more: r.more };
    },
  };
}
