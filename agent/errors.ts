/**
 * How a sync or activation of the reference agent ends early (docs/agent-protocol.md "Roost sync"): a
 * `SyncFailure` closes it `failed` with its message as the reported error; a `SyncCancelled` means the
 * server closed the command meanwhile (or the agent is stopping) and the target state becomes `cancelled`.
 */

/** A failure that closes the sync as failed (the message becomes the reported error). */
export class SyncFailure extends Error {}

/** The server closed the command meanwhile (cancelled or expired), or the agent is stopping: stop and report cancelled. */
export class SyncCancelled extends Error {}

/** Command statuses that close a command (`POST /api/agent/commands/{commandId}`). */
export const TERMINAL_COMMAND_STATUSES: ReadonlySet<string> = new Set(['completed', 'failed', 'cancelled']);

/** The message of any thrown value. */
export function errMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
