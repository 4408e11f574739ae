/**
 * Roost target state as a machine's agent reports it (SPEC.md "Roost target state"): the progress
 * counters of one sync, shared by the agent that reports them and the repository that stores them.
 */

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
