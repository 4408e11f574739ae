/**
 * What the operator endpoints and the metrics read (docs/observability.md): rollout counts for the
 * `roost_rollouts` gauge, and the hooks use cases call to count business events (agent reports, chunk
 * bytes) in the process registry (telemetry/metrics.ts).
 */
import type { ServiceDeps } from './deps';
import { countRolloutsByStageAndState } from '../db/rollouts';
import { chunkBytes, machineReports, type RolloutCount, siteLabel } from '../telemetry/metrics';
import type { TargetStatus } from '../domain/target-state';

/** Rollouts of all sites by stage and control state. @throws the driver's error when the database is unreachable. */
export function rolloutCounts(deps: Pick<ServiceDeps, 'db'>): Promise<RolloutCount[]> {
  return countRolloutsByStageAndState(deps.db);
}

const TERMINAL: ReadonlySet<TargetStatus> = new Set(['committed', 'failed', 'cancelled']);

/**
 * Counts an agent's target-state report when it ends a sync: the status per site (the first `maxSites`
 * sites by their id, later ones as `_other`: telemetry/metrics.ts siteLabel), and the bytes it fetched as served.
 */
export function noteTargetReport(siteId: string, status: TargetStatus, bytesFetched: number | undefined, maxSites: number): void {
  if (!TERMINAL.has(status)) return;
  machineReports.inc({ site: siteLabel(siteId, maxSites), status });
  if (bytesFetched && bytesFetched > 0) chunkBytes.inc({ direction: 'served' }, bytesFetched);
}

/** Counts bytes of chunks publish newly recorded (their upload is complete and its size checked). */
export function noteChunksUploaded(bytes: number): void {
  if (bytes > 0) chunkBytes.inc({ direction: 'uploaded' }, bytes);
}
