/**
 * Roost target state as a machine's agent reports it (docs/agent-protocol.md "Roost sync"; route
 * `PUT /api/agent/roosts/{roostId}/state`): the statuses of one sync and its progress counters, shared by
 * the agent that reports them, the route that validates them and the repository that stores them.
 */

/** Target-state statuses, in protocol order: `pending → downloading → assembling → committed | failed | cancelled`. */
export const TARGET_STATUSES = ['pending', 'downloading', 'assembling', 'committed', 'failed', 'cancelled'] as const;
export type TargetStatus = (typeof TARGET_STATUSES)[number];

/** Progress counters of one sync (counts; `bytes_fetched` in bytes). */
export interface SyncCounters {
  chunks_fetched: number;
  chunks_total: number;
  chunks_dedup: number;
  files_total: number;
  files_assembled: number;
  files_skipped: number;
  bytes_fetched: number;
}
