/**
 * `versionVerifyWorkflow`: the server's own SHA-256 of the chunks a newly published version stores
 * (docs/decisions/chunk-integrity.md). Started by publish (`POST /api/roosts/{roostId}/versions`, through
 * workflows/client.ts `startVersionVerification`, workflow id `verify:<siteId>:<roostId>:<versionId>`)
 * so that the work is done, in the background, by the time the version is deployed; every rollout runs
 * the same activity again before its first wave (workflows/rollout.ts), which then costs one query.
 * Deterministic code only: one activity, ids in the payload.
 *
 * 1. `verifyVersionChunks` (ascending hash order; a rollout walks descending, so the two meet in the
 *    middle when they overlap): heartbeating, retried under Temporal's policy; bad bytes are marked,
 *    reported once (`chunk.verify_failed`) and quarantined.
 * Changing this code changes replay: use `patched()` or a new workflow type (test/replay).
 */
import { proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';
import type { VerifyVersionResult } from '../activities/verify';

/** The version to verify. */
export interface VersionVerifyInput {
  siteId: string;
  roostId: string;
  versionId: string;
}

const { verifyVersionChunks } = proxyActivities<Activities>({
  startToCloseTimeout: '2 hours',
  heartbeatTimeout: '1 minute',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
});

/** Verifies every not yet verified chunk of a version; returns what it found. */
export async function versionVerifyWorkflow(input: VersionVerifyInput): Promise<VerifyVersionResult> {
  return verifyVersionChunks({ siteId: input.siteId, roostId: input.roostId, versionId: input.versionId, order: 'asc' });
}
