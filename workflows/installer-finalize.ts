/**
 * `installerFinalizeWorkflow`: step 3 of the agent-installer upload (`PUT /api/installer/upload`;
 * docs/decisions/installer-catalog.md). Started by the route with id `installer-finalize:<version>`
 * (USE_EXISTING: a repeated finalise attaches to the running one), search attribute RoostInstallerVersion.
 *
 * 1. `hashInstallerUpload` streams the stored blob back and recomputes its SHA-256 (never trusting the
 *    client's claim);
 * 2. no blob → outcome `missing` (nothing changes);
 *    bytes that do not hash to the declared checksum → `discardInstallerUpload` deletes exactly those bytes
 *    (by ETag), so the reservation's upload URL can store the right ones, → outcome `mismatch`;
 * 3. otherwise `activateInstallerVersion` marks the version active with its size and, unless
 *    `setAsLatest` is false, moves the latest pointer, in one transaction → outcome `activated`.
 * Input: version, setAsLatest and the actor only. Changing this code changes replay: use `patched()` or a new
 * workflow type (test/replay/installers.replay.test.ts).
 */
import { proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../activities';

/** What finalising found and did. Sizes in bytes. */
export interface InstallerFinalizeOutcome {
  version: string;
  outcome: 'activated' | 'missing' | 'mismatch';
  expectedSha256: string;
  /** SHA-256 hex of the stored bytes; null when there were none */
  actualSha256: string | null;
  sizeBytes: number | null;
  /** true when the latest pointer names this version after the run */
  latest: boolean;
}

const { hashInstallerUpload, discardInstallerUpload, activateInstallerVersion } = proxyActivities<Activities>({
  startToCloseTimeout: '10 minutes',
  heartbeatTimeout: '1 minute',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds', maximumAttempts: 10 },
});

/** Verifies and activates one uploaded installer version. */
export async function installerFinalizeWorkflow(input: {
  version: string;
  setAsLatest: boolean;
  actor: string;
}): Promise<InstallerFinalizeOutcome> {
  const found = await hashInstallerUpload({ version: input.version });
  const base = { version: input.version, expectedSha256: found.expectedSha256, actualSha256: found.digest, sizeBytes: found.size };
  if (found.digest === null || found.etag === null) return { ...base, outcome: 'missing', latest: false };
  if (!found.alreadyActive && found.digest !== found.expectedSha256) {
    await discardInstallerUpload({ version: input.version, etag: found.etag });
    return { ...base, outcome: 'mismatch', latest: false };
  }
  const done = await activateInstallerVersion({
    version: input.version,
    sizeBytes: found.size ?? 0,
    setAsLatest: input.setAsLatest,
    actor: input.actor,
  });
  return { ...base, outcome: 'activated', latest: done.latest };
}
