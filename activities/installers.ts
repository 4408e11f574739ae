/**
 * The steps of `installerFinalizeWorkflow` (workflows/installer-finalize.ts; docs/decisions/installer-catalog.md):
 * re-hash the uploaded installer, discard bytes that do not match, activate the version. Each is safe to
 * run again: hashing only reads, discarding is conditional on the ETag that was hashed, activating finds
 * an active version and changes nothing.
 */
import { ApplicationFailure, Context } from '@temporalio/activity';
import { getInstallerRow, lockInstallerRow, markInstallerActive, setLatestPointer } from '../db/installers';
import { withTx } from '../db/pool';
import { deleteInstallerBlobIfUnchanged, installerDigest } from '../storage/blob';
import type { ActivityDeps } from './deps';

/** What the stored bytes of a reservation hash to (`digest`, `size` in bytes, `etag` null when there is no blob). */
export interface InstallerHash {
  expectedSha256: string;
  digest: string | null;
  size: number | null;
  etag: string | null;
  /** the version was already active (a finalise run again after it succeeded) */
  alreadyActive: boolean;
}

/** The activities of the installer finalise workflow. */
export function createInstallerActivities(deps: ActivityDeps) {
  async function rowOf(version: string) {
    const row = await getInstallerRow(deps.db, version);
    if (!row || row.state === 'deleted') {
      throw ApplicationFailure.nonRetryable(`installer ${version} has no upload to finalise`, 'installer_not_uploading');
    }
    return row;
  }

  return {
    /** Streams the version's blob and returns its SHA-256, size and ETag (nulls when no blob exists). */
    async hashInstallerUpload(input: { version: string }): Promise<InstallerHash> {
      const row = await rowOf(input.version);
      const ctx = Context.current();
      const beat = setInterval(() => ctx.heartbeat(), 10_000);
      try {
        const d = await installerDigest(deps.blob, row.blob_name);
        return {
          expectedSha256: row.sha256,
          digest: d?.digest ?? null,
          size: d?.size ?? null,
          etag: d?.etag ?? null,
          alreadyActive: row.state === 'active',
        };
      } finally {
        clearInterval(beat);
      }
    },

    /** Deletes the version's blob while it still holds the bytes that were hashed (ETag `etag`). */
    async discardInstallerUpload(input: { version: string; etag: string }): Promise<void> {
      const row = await rowOf(input.version);
      if (row.state === 'uploading') await deleteInstallerBlobIfUnchanged(deps.blob, row.blob_name, input.etag);
    },

    /**
     * Marks the version active with its size and, when `setAsLatest`, points latest at it, in one
     * transaction. An already active version is left as it is. Returns whether latest names it now.
     */
    async activateInstallerVersion(input: {
      version: string;
      sizeBytes: number;
      setAsLatest: boolean;
      actor: string;
    }): Promise<{ latest: boolean }> {
      return withTx(deps.db, async (tx) => {
        const row = await lockInstallerRow(tx, input.version);
        if (!row || row.state === 'deleted') {
          throw ApplicationFailure.nonRetryable(`installer ${input.version} has no upload to finalise`, 'installer_not_uploading');
        }
        if (row.state === 'active') return { latest: row.is_latest };
        await markInstallerActive(tx, input.version, input.sizeBytes, input.actor);
        if (input.setAsLatest) await setLatestPointer(tx, input.version, input.actor);
        return { latest: input.setAsLatest };
      });
    },
  };
}
