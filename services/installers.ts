/**
 * The agent-installer catalog (`/api/installer…`, platform scope; docs/decisions/installer-catalog.md):
 * list, latest, the three-step upload (reserve → PUT to blob storage → finalise through
 * `installerFinalizeWorkflow`), set-latest, soft delete, and the agents' side (the update offer of a
 * heartbeat, the signed download URL). SQL: db/installers.ts; bytes: storage/blob.ts.
 */
import {
  countActiveInstallers,
  getInstallerRow,
  type InstallerPosition,
  type InstallerRow,
  insertReservation,
  latestInstallerRow,
  listInstallerRows,
  lockInstallerRow,
  markInstallerDeleted,
  renewReservation,
  setLatestPointer,
} from '../db/installers';
import { withTx } from '../db/pool';
import { ApiError, serviceUnavailable } from '../domain/errors';
import { isNewerInstaller, MIN_ACTIVE_INSTALLER_VERSIONS, parseInstallerVersion } from '../domain/installers';
import { installerBlobName, type SignedUrl } from '../storage/blob';
import { runInstallerFinalize } from '../workflows/client';
import type { ServiceDeps } from './deps';

export type { InstallerPosition, InstallerRow } from '../db/installers';

/** How long `PUT /api/installer/upload` waits for the finalise workflow before answering 503 (ms). */
export const FINALIZE_WAIT_MS = 120_000;

/** True for an installer-list position this server issues (`[major, minor, patch]`). */
export function isInstallerPosition(p: unknown): p is InstallerPosition {
  return Array.isArray(p) && p.length === 3 && p.every((n) => Number.isInteger(n) && (n as number) >= 0 && (n as number) < 1e9);
}

function notFound(version: string): ApiError {
  return new ApiError('not_found', `installer version ${version} not found`);
}

/**
 * A page of finalised versions, newest first (semver order); soft-deleted ones only with
 * `includeDeleted`. `next` is the position after the last row when more follow.
 */
export async function listInstallers(
  deps: Pick<ServiceDeps, 'db'>,
  q: { includeDeleted: boolean; after?: InstallerPosition; pageSize: number },
): Promise<{ rows: InstallerRow[]; next: InstallerPosition | undefined }> {
  const got = await listInstallerRows(deps.db, { ...q, limit: q.pageSize + 1 });
  const page = got.slice(0, q.pageSize);
  return { rows: page.map((r) => r.row), next: got.length > q.pageSize ? page[page.length - 1].position : undefined };
}

/** The version the latest pointer names. @throws ApiError not_found when no version was made latest yet. */
export async function latestInstaller(deps: Pick<ServiceDeps, 'db'>): Promise<InstallerRow> {
  const row = await latestInstallerRow(deps.db);
  if (!row) throw new ApiError('not_found', 'no installer version is latest yet');
  return row;
}

/** The answer of step 1: where to PUT the bytes, until when. */
export interface UploadReservation {
  version: string;
  uploadUrl: string;
  /** the upload URL's expiry */
  expiresAt: Date;
}

/**
 * Step 1 (`POST /api/installer/upload`): reserves `version` for this upload (`keyHash`: SHA-256 of the
 * request's Idempotency-Key, which the finalise must carry again) and signs a create-only upload URL
 * (60 minutes). A reservation of the same key is signed again; an unfinalised reservation whose URL
 * expired is handed to the new upload (its stale bytes deleted).
 * @throws ApiError version_exists (409: the version exists in any state, or another upload holds it)
 */
export async function reserveInstallerUpload(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: {
    version: string;
    sha256: string;
    releaseNotes: string | null;
    keyHash: string;
    actor: string;
    beforeChange?: () => Promise<void>;
  },
): Promise<UploadReservation> {
  const semver = parseInstallerVersion(input.version);
  if (!semver)
    throw new ApiError('validation_failed', 'version must be semver X.Y.Z', { extras: { errors: { version: ['must be X.Y.Z'] } } });
  await input.beforeChange?.();
  const blobName = installerBlobName(input.version);
  const signed: SignedUrl = await deps.blob.installerUploadUrl(blobName);
  const expiresAt = new Date(signed.expiresAt);
  const stale = await withTx(deps.db, async (tx) => {
    const row = await lockInstallerRow(tx, input.version);
    const fields = {
      version: input.version,
      sha256: input.sha256,
      releaseNotes: input.releaseNotes,
      keyHash: input.keyHash,
      expiresAt,
      actor: input.actor,
    };
    if (!row) {
      await insertReservation(tx, { ...fields, semver, blobName });
      return false;
    }
    if (row.state !== 'uploading')
      throw new ApiError('version_exists', `installer version ${input.version} exists (${row.state}); versions are never reused`, {
        extras: { state: row.state },
      });
    if (row.upload_key_hash === input.keyHash) {
      await renewReservation(tx, fields);
      return false;
    }
    if (row.upload_expires_at.getTime() > Date.now()) {
      throw new ApiError(
        'version_exists',
        `installer version ${input.version} is reserved by another upload until ${row.upload_expires_at.toISOString()}`,
        {
          extras: { state: row.state, reservedUntil: row.upload_expires_at.toISOString() },
        },
      );
    }
    await renewReservation(tx, fields);
    return true;
  });
  // Bytes an abandoned upload left behind would make the create-only URL refuse the new ones.
  if (stale) await deps.blob.delete('installers', blobName);
  return { version: input.version, uploadUrl: signed.url, expiresAt };
}

/**
 * Step 3 (`PUT /api/installer/upload`): runs `installerFinalizeWorkflow` (the stored bytes are re-hashed,
 * compared with the declared checksum, the version activated and, unless `setAsLatest` is false, made
 * latest) and waits for it (FINALIZE_WAIT_MS). A finalise of an active version answers it unchanged.
 * @throws ApiError not_found (no reservation), conflict (another Idempotency-Key, or soft-deleted),
 *   checksum_mismatch (422: `sha256` differs from step 1's, reason `declared`; or the bytes hash otherwise,
 *   reason `bytes`, and they are discarded so the upload URL can store them again), upload_missing (409),
 *   service_unavailable (503 with Retry-After while the workflow still runs)
 */
export async function finalizeInstallerUpload(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'temporal'>,
  input: { version: string; sha256?: string; setAsLatest: boolean; keyHash: string; actor: string; beforeChange?: () => Promise<void> },
): Promise<InstallerRow> {
  const row = await getInstallerRow(deps.db, input.version);
  if (!row) throw new ApiError('not_found', `no upload of installer version ${input.version} was reserved (POST /api/installer/upload)`);
  if (row.upload_key_hash !== input.keyHash) {
    throw new ApiError('conflict', 'finalise with the Idempotency-Key of the upload reservation (POST /api/installer/upload)');
  }
  if (row.state === 'deleted') throw new ApiError('conflict', `installer version ${input.version} is soft-deleted`);
  if (input.sha256 !== undefined && input.sha256 !== row.sha256) {
    throw new ApiError('checksum_mismatch', 'sha256 differs from the checksum declared when the upload was reserved', {
      extras: { reason: 'declared', expectedSha256: row.sha256, actualSha256: input.sha256 },
    });
  }
  if (row.state === 'active') return row;
  await input.beforeChange?.();
  const outcome = await runInstallerFinalize(
    deps.temporal,
    deps.cfg,
    { version: input.version, setAsLatest: input.setAsLatest, actor: input.actor },
    FINALIZE_WAIT_MS,
  );
  if (!outcome) {
    throw serviceUnavailable('the finalise workflow is still running; repeat this request');
  }
  if (outcome.outcome === 'missing') {
    throw new ApiError(
      'upload_missing',
      `nothing was uploaded for installer version ${input.version}; PUT the bytes to the upload URL first`,
    );
  }
  if (outcome.outcome === 'mismatch') {
    throw new ApiError(
      'checksum_mismatch',
      'the uploaded bytes do not hash to the declared sha256; they were discarded, upload them again',
      {
        extras: {
          reason: 'bytes',
          expectedSha256: outcome.expectedSha256,
          actualSha256: outcome.actualSha256,
          sizeBytes: outcome.sizeBytes,
        },
      },
    );
  }
  const now = await getInstallerRow(deps.db, input.version);
  if (!now) throw notFound(input.version);
  return now;
}

/**
 * Points latest at an active version (`POST /api/installer/{version}/set-latest`).
 * @throws ApiError not_found (unknown or not finalised), conflict (409: soft-deleted)
 */
export async function setLatestInstaller(
  deps: Pick<ServiceDeps, 'db'>,
  input: { version: string; actor: string; beforeChange?: () => Promise<void> },
): Promise<{ version: string; previousVersion: string | null; changed: boolean }> {
  await input.beforeChange?.();
  return withTx(deps.db, async (tx) => {
    const row = await lockInstallerRow(tx, input.version);
    if (!row || row.state === 'uploading') throw notFound(input.version);
    if (row.state === 'deleted')
      throw new ApiError('conflict', `installer version ${input.version} is soft-deleted; only an active version can be latest`);
    if (row.is_latest) return { version: row.version, previousVersion: row.version, changed: false };
    const previousVersion = await setLatestPointer(tx, row.version, input.actor);
    return { version: row.version, previousVersion, changed: true };
  });
}

/**
 * Soft-deletes a version (`DELETE /api/installer/{version}`); a repeat answers `alreadyDeleted`. Refuses
 * the version latest names (409 latest_version_protected) and a delete that would leave fewer than
 * MIN_ACTIVE_INSTALLER_VERSIONS active (409 min_versions_violated with `activeVersions`, `minimum`).
 * The blob stays (agents that fetched its URL finish their download).
 * @throws ApiError not_found (unknown or not finalised), latest_version_protected, min_versions_violated
 */
export async function deleteInstaller(
  deps: Pick<ServiceDeps, 'db'>,
  input: { version: string; actor: string; beforeChange?: () => Promise<void> },
): Promise<{ version: string; alreadyDeleted: boolean; deletedAt: Date }> {
  const first = await getInstallerRow(deps.db, input.version);
  if (first?.state === 'active') await input.beforeChange?.();
  return withTx(deps.db, async (tx) => {
    const row = await lockInstallerRow(tx, input.version);
    if (!row || row.state === 'uploading') throw notFound(input.version);
    if (row.state === 'deleted') return { version: row.version, alreadyDeleted: true, deletedAt: row.deleted_at ?? new Date() };
    if (row.is_latest) {
      throw new ApiError('latest_version_protected', `installer version ${row.version} is latest; make another version latest first`);
    }
    const active = await countActiveInstallers(tx);
    if (active - 1 < MIN_ACTIVE_INSTALLER_VERSIONS) {
      throw new ApiError(
        'min_versions_violated',
        `deleting ${row.version} would leave ${active - 1} active installer versions; at least ${MIN_ACTIVE_INSTALLER_VERSIONS} must remain`,
        { extras: { activeVersions: active, minimum: MIN_ACTIVE_INSTALLER_VERSIONS } },
      );
    }
    await markInstallerDeleted(tx, row.version, input.actor);
    const now = await lockInstallerRow(tx, row.version);
    return { version: row.version, alreadyDeleted: false, deletedAt: now?.deleted_at ?? new Date() };
  });
}

/**
 * The update an agent running `agentVersion` is offered (the heartbeat's `agentUpdate`): the latest
 * version and its checksum when latest is newer (semver), else null.
 */
export async function agentUpdateFor(
  deps: Pick<ServiceDeps, 'db'>,
  agentVersion: string | undefined,
): Promise<{ version: string; sha256: string } | null> {
  if (agentVersion === undefined) return null;
  const latest = await latestInstallerRow(deps.db);
  if (!latest || latest.state !== 'active' || !isNewerInstaller(latest.version, agentVersion)) return null;
  return { version: latest.version, sha256: latest.sha256 };
}

/**
 * What an agent needs to download an active version (`GET /api/agent/installer/{version}`; `latest`
 * names the latest): its checksum, size in bytes and a read-only signed URL (15 minutes).
 * @throws ApiError not_found (unknown, not finalised, soft-deleted, or no latest)
 */
export async function installerDownload(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  version: string,
): Promise<{ version: string; sha256: string; sizeBytes: number | null; downloadUrl: string; expiresAt: Date }> {
  const row = version === 'latest' ? await latestInstallerRow(deps.db) : await getInstallerRow(deps.db, version);
  if (!row || row.state !== 'active') throw notFound(version);
  const signed = await deps.blob.readUrl('installers', row.blob_name);
  return {
    version: row.version,
    sha256: row.sha256,
    sizeBytes: row.size_bytes,
    downloadUrl: signed.url,
    expiresAt: new Date(signed.expiresAt),
  };
}
