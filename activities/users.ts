/**
 * The user-delete cascade's steps (workflows/user-delete.ts; docs/decisions/users.md). Each step runs
 * in one SERIALIZABLE transaction that locks the user's `user_deletions` row, returns the recorded
 * result when the step ran before (a retry, or a new worker replaying after a restart), and otherwise
 * does the work and records its result: a step is never done twice.
 */
import { appendAuditRecords } from '../db/audit';
import { AUDIT_KIND_MEMBER_ADDED } from '../domain/audit';
import { revokeUserKeys } from '../db/keys';
import { cancelUserCommands as cancelCommandsOf } from '../db/machines';
import { withTx } from '../db/pool';
import { revokeUserSessions } from '../db/sessions';
import { transferOwnedSites } from '../db/sites';
import { type DeletionRow, lockDeletion, markDeleted, recordDeletionStep } from '../db/users';
import { ApplicationFailure } from '@temporalio/common';
import type { ActivityDeps } from './deps';

/** Audit kind of a site moved to a deleted owner's successor. */
export const AUDIT_KIND_SITE_OWNER_TRANSFERRED = 'site_owner_transferred';

/** The cascade row, or a non-retryable failure when there is none (the workflow was started without one). */
async function deletionOf(tx: Parameters<typeof lockDeletion>[0], uid: string): Promise<DeletionRow> {
  const row = await lockDeletion(tx, uid);
  if (!row) throw ApplicationFailure.nonRetryable(`user ${uid} has no deletion record`, 'user_not_deleted');
  return row;
}

/** The activities of the user-delete cascade. */
export function createUserActivities(deps: ActivityDeps) {
  return {
    /** Step 1: the user stays soft-deleted (the route did it with the row; re-asserted, idempotent). */
    async softDeleteUser(input: { uid: string }): Promise<void> {
      await withTx(deps.db, async (tx) => {
        const d = await deletionOf(tx, input.uid);
        await markDeleted(tx, { uid: d.uid, successorUid: d.successor_uid, requestedBy: d.requested_by, workflowId: d.workflow_id });
      });
    },

    /** Step 2: revokes every API key and signs out every session of the user; returns the counts (recorded once). */
    async revokeUserCredentials(input: { uid: string }): Promise<{ keysRevoked: number; sessionsRevoked: number }> {
      return withTx(deps.db, async (tx) => {
        const d = await deletionOf(tx, input.uid);
        if (d.keys_revoked !== null) return { keysRevoked: d.keys_revoked, sessionsRevoked: d.sessions_revoked ?? 0 };
        const step = { keysRevoked: await revokeUserKeys(tx, input.uid), sessionsRevoked: await revokeUserSessions(tx, input.uid) };
        await recordDeletionStep(tx, input.uid, step);
        return step;
      });
    },

    /** Step 3: cancels the user's pending commands on every site; returns the count (recorded once). */
    async cancelUserCommands(input: { uid: string }): Promise<{ commandsCancelled: number }> {
      return withTx(deps.db, async (tx) => {
        const d = await deletionOf(tx, input.uid);
        if (d.commands_cancelled !== null) return { commandsCancelled: d.commands_cancelled };
        const step = { commandsCancelled: await cancelCommandsOf(tx, input.uid, null, 'cancelled: the user who queued it was deleted') };
        await recordDeletionStep(tx, input.uid, step);
        return step;
      });
    },

    /**
     * Step 4: moves every site the user owns to the successor, in one transaction, with a
     * `site_owner_transferred` audit record on each moved site; returns the moved site ids (recorded once).
     */
    async transferUserSites(input: { uid: string }): Promise<{ sitesTransferred: string[] }> {
      return withTx(
        deps.db,
        async (tx) => {
          const d = await deletionOf(tx, input.uid);
          if (d.sites_transferred !== null) return { sitesTransferred: d.sites_transferred };
          const { moved, joined } =
            d.successor_uid === null ? { moved: [], joined: [] } : await transferOwnedSites(tx, input.uid, d.successor_uid);
          for (const siteId of moved) {
            await appendAuditRecords(tx, siteId, [
              {
                kind: AUDIT_KIND_SITE_OWNER_TRANSFERRED,
                actor: d.requested_by,
                attributes: { siteId, fromUid: input.uid, toUid: d.successor_uid, reason: 'user_deleted', workflowId: d.workflow_id },
              },
              // The successor became a member by owning it (docs/decisions/users.md "Audit and events").
              ...(joined.includes(siteId)
                ? [
                    {
                      kind: AUDIT_KIND_MEMBER_ADDED,
                      actor: d.requested_by,
                      attributes: { siteId, uid: d.successor_uid, reason: 'site_owner' },
                    },
                  ]
                : []),
            ]);
          }
          await recordDeletionStep(tx, input.uid, { sitesTransferred: moved });
          return { sitesTransferred: moved };
        },
        { attempts: 25 },
      );
    },

    /** Step 5: marks the cascade completed (idempotent). */
    async finishUserDelete(input: { uid: string }): Promise<void> {
      await withTx(deps.db, async (tx) => {
        await deletionOf(tx, input.uid);
        await recordDeletionStep(tx, input.uid, 'completed');
      });
    },
  };
}
