/**
 * `userDeleteWorkflow`: the user-delete cascade (`DELETE /api/users/{uid}`; docs/decisions/users.md).
 * The route soft-deletes the user and writes its `user_deletions` row in one transaction (so every
 * credential of the user is refused from the next request on), then starts this workflow with id
 * `user-delete:<uid>` (USE_EXISTING: a repeated DELETE attaches). Steps, each an activity that does its
 * work and records its result in one transaction, and finds the result recorded when run again (after a
 * retry or a worker restart), so nothing is done twice:
 *
 * 1. `softDeleteUser`: the user stays deleted (re-asserted; the route did it);
 * 2. `revokeUserCredentials`: every API key revoked, every session signed out;
 * 3. `cancelUserCommands`: the user's pending commands on every site cancelled;
 * 4. `transferUserSites`: every owned site moved to the successor in one transaction, with an audit
 *    record on each moved site;
 * 5. `finishUserDelete`: the row's status becomes `completed`.
 * Input: the uid only. Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import { proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';

/** What the cascade did, as recorded by its steps. */
export interface UserDeleteOutcome {
  uid: string;
  keysRevoked: number;
  sessionsRevoked: number;
  commandsCancelled: number;
  sitesTransferred: string[];
}

const { softDeleteUser, revokeUserCredentials, cancelUserCommands, transferUserSites, finishUserDelete } = proxyActivities<Activities>({
  startToCloseTimeout: '1 minute',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
});

/** Runs the cascade of one deleted user to its end. */
export async function userDeleteWorkflow(input: { uid: string }): Promise<UserDeleteOutcome> {
  await softDeleteUser(input);
  const creds = await revokeUserCredentials(input);
  const commands = await cancelUserCommands(input);
  const sites = await transferUserSites(input);
  await finishUserDelete(input);
  return {
    uid: input.uid,
    keysRevoked: creds.keysRevoked,
    sessionsRevoked: creds.sessionsRevoked,
    commandsCancelled: commands.commandsCancelled,
    sitesTransferred: sites.sitesTransferred,
  };
}
