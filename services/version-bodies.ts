/**
 * Stored version bodies: the loader that reads a body's canonical JSON from blob storage, checks it
 * against its version id and keeps it parsed in an in-process cache (docs/decisions/version-reads.md).
 * Used by the version reads of services/versions.ts.
 */
import { ApiError } from '../domain/errors';
import { sha256Hex } from '../domain/hex';
import type { VersionBody } from '../domain/version';
import { type BlobStore, versionBlobName } from '../storage/blob';

/**
 * A small LRU of parsed version bodies keyed by (siteId, versionId). Bodies are immutable and
 * content-addressed, so entries never go stale; the bound is on entries and on the summed size of
 * their canonical JSON text (bytes).
 */
export class BodyCache {
  private readonly map = new Map<string, { body: VersionBody; bytes: number }>();
  private bytes = 0;

  constructor(
    readonly maxEntries = 64,
    readonly maxBytes = 128 * 1024 * 1024,
  ) {}

  /** The cached body of `key` (marked most recently used), or undefined. */
  get(key: string): VersionBody | undefined {
    const hit = this.map.get(key);
    if (!hit) return undefined;
    this.map.delete(key);
    this.map.set(key, hit);
    return hit.body;
  }

  /** Caches `body` (`bytes`: size of its JSON text), evicting least recently used entries; a body over maxBytes is not kept. */
  set(key: string, body: VersionBody, bytes: number): void {
    if (bytes > this.maxBytes) return;
    const old = this.map.get(key);
    if (old) {
      this.map.delete(key);
      this.bytes -= old.bytes;
    }
    this.map.set(key, { body, bytes });
    this.bytes += bytes;
    for (const [k, v] of this.map) {
      if (this.map.size <= this.maxEntries && this.bytes <= this.maxBytes) break;
      this.map.delete(k);
      this.bytes -= v.bytes;
    }
  }

  get size(): number {
    return this.map.size;
  }

  get totalBytes(): number {
    return this.bytes;
  }
}

/** The process-wide body cache used by `loadVersionBody`. */
export const versionBodyCache = new BodyCache();
const inflight = new Map<string, Promise<VersionBody>>();

/**
 * Loads a stored version body (the canonical JSON written at publish), parsed, through the
 * process-wide cache; concurrent loads of one body share a single blob read. `blobName` defaults to
 * `versionBlobName(siteId, roostId, versionId)`.
 * @throws ApiError not_found with status 410 when the body blob is gone; internal_error (500) when the
 *   stored bytes do not hash to `versionId`.
 */
export async function loadVersionBody(
  deps: { blob: BlobStore },
  siteId: string,
  roostId: string,
  versionId: string,
  blobName = versionBlobName(siteId, roostId, versionId),
): Promise<VersionBody> {
  const key = `${siteId}\n${versionId}`;
  const hit = versionBodyCache.get(key);
  if (hit) return hit;
  let pending = inflight.get(key);
  if (!pending) {
    pending = (async () => {
      const bytes = await deps.blob.get('versions', blobName);
      if (!bytes) throw new ApiError('not_found', 'the stored version body is gone', { status: 410 });
      if (sha256Hex(bytes) !== versionId)
        throw new ApiError('internal_error', 'the stored version body does not match its id', { status: 500 });
      const body = JSON.parse(bytes.toString('utf8')) as VersionBody;
      versionBodyCache.set(key, body, bytes.length);
      return body;
    })().finally(() => inflight.delete(key));
    inflight.set(key, pending);
  }
  return pending;
}
