/**
 * Azure Blob access: chunks per site under `sites/{siteId}/chunks/{hash}` in the
 * `chunks` container, version bodies in `versions`, screenshots and installers in their own containers.
 * SAS URLs are per blob and least privilege: upload URLs may only create that one blob (60 min; the store
 * refuses a PUT to a blob that exists, so stored chunk bytes cannot be overwritten through anything the API
 * hands out: docs/decisions/chunk-integrity.md), download URLs may only read it (15 min). Bytes found wrong
 * are moved aside (`quarantineChunk`) so a fresh upload can create the blob again. Shared-key signing is used with a connection string (Azurite,
 * or an account key); with Entra ID (`AZURE_STORAGE_ACCOUNT_URL` + DefaultAzureCredential) URLs are signed
 * with a user delegation key.
 */
import {
  BlobSASPermissions,
  BlobServiceClient,
  type ContainerClient,
  ContainerSASPermissions,
  SASProtocol,
  StorageSharedKeyCredential,
  type UserDelegationKey,
  generateBlobSASQueryParameters,
} from '@azure/storage-blob';
import { createHash } from 'node:crypto';
import { DefaultAzureCredential } from '@azure/identity';
import { type Config, azuriteConnectionString } from '../config/env';
import { BlobListError, fetchBlobListPage, LIST_PAGE_SIZE, type ListedBlob } from './blob-list';

export const CONTAINERS = { chunks: 'chunks', versions: 'versions', screenshots: 'screenshots', installers: 'installers' } as const;

/** SAS lifetimes in ms: upload URLs (`POST /api/chunks/upload-urls`) and download URLs (`/api/chunks/download-urls`). */
export const UPLOAD_URL_TTL_MS = 60 * 60 * 1000;
export const DOWNLOAD_URL_TTL_MS = 15 * 60 * 1000;
/** Lifetime in ms of the container SAS the API lists blobs with (never handed out). */
export const LIST_SAS_TTL_MS = 30 * 60 * 1000;

/** Blob name of a site's chunk in the `chunks` container (`hash`: bare SHA-256 hex). */
export function chunkBlobName(siteId: string, hash: string): string {
  return `sites/${siteId}/chunks/${hash}`;
}
/**
 * The hash prefixes a listing of a site's chunk blobs covers to find `hashes` (chunkBlobsByListing): the
 * distinct two-hex-digit prefixes when there are at most 4 (1/64 of the site at most), else the distinct
 * first digits when there are at most 8, else `['']` (the whole site, one listing).
 */
export function chunkListingPrefixes(hashes: Iterable<string>): string[] {
  const two = new Set<string>();
  for (const h of hashes) two.add(h.slice(0, 2));
  if (two.size <= 4) return [...two].sort();
  const one = new Set([...two].map((p) => p.slice(0, 1)));
  return one.size <= 8 ? [...one].sort() : [''];
}

/** Share of a site's chunk blobs a listing of these hash prefixes reads (hashes are uniform hex). */
export function listingShare(prefixes: readonly string[]): number {
  return prefixes.reduce((sum, p) => sum + 16 ** -p.length, 0);
}

/**
 * Blob name where the bad bytes of a site's chunk are kept once quarantined (`actualDigest`: SHA-256 hex of
 * those bytes): outside the chunk prefix, so listings, upload and download URLs never reach it.
 */
export function quarantineBlobName(siteId: string, hash: string, actualDigest: string): string {
  return `sites/${siteId}/quarantine/${hash}/${actualDigest}`;
}
/** Blob name of a version body (its canonical JSON) in the `versions` container. */
export function versionBlobName(siteId: string, roostId: string, versionId: string): string {
  return `sites/${siteId}/roosts/${roostId}/versions/${versionId}.json`;
}

/** What re-hashing a stored chunk found: SHA-256 hex and size in bytes of the stored bytes, and the blob's ETag. */
export interface ChunkDigest {
  digest: string;
  size: number;
  etag: string;
}

/** A stored blob's size in bytes and ETag. */
export interface StoredBlob {
  size: number;
  etag: string;
}

/** A signed URL and its expiry (epoch ms). */
export interface SignedUrl {
  url: string;
  expiresAt: number;
}

/** A blob name whose URL path is the name itself: unreserved characters in non-empty `/`-separated segments. */
const PLAIN_BLOB_NAME = /^[A-Za-z0-9\-._~]+(?:\/[A-Za-z0-9\-._~]+)*$/;
/** A `.` or `..` segment, which a URL would resolve away. */
const DOT_SEGMENT = /(?:^|\/)\.{1,2}(?:\/|$)/;

/** Most plain blob URLs a store keeps memoised (a few MB at most). */
const BLOB_URL_CACHE_SIZE = 20_000;

/** The blob store of one storage account: SAS signing, blob reads and writes, chunk size and digest lookups. */
export class BlobStore {
  private delegationKey?: { key: UserDelegationKey; expiresOn: number };
  /**
   * Plain blob URLs by container and blob name, as the SDK spells them: building a container and a blob
   * client for each URL cost about 6 % of the API's CPU on `GET /api/roosts/{roostId}/versions/{versionRef}`
   * (bench/api.ts). Bounded: cleared once it holds BLOB_URL_CACHE_SIZE names.
   */
  private readonly urls = new Map<string, string>();
  /** Whether `listPages` tries the lean listing first (off after the service refused it once). */
  private leanListing = true;
  /** Container list SAS query by storage container name, and when to sign a new one (epoch ms). */
  private readonly listSas = new Map<string, { query: string; renewAt: number }>();
  /** Container URL with a trailing slash by storage container name (null: it has a query, use the SDK). */
  private readonly containerUrls = new Map<string, string | null>();
  /** Whether `ensureContainers` has succeeded in this process. */
  private containersEnsured = false;

  private constructor(
    readonly service: BlobServiceClient,
    private readonly sharedKey: StorageSharedKeyCredential | undefined,
    private readonly https: boolean,
    /** ROOST_BLOB_CONTAINER_PREFIX: prepended to every container name (a test run's containers are its own). */
    private readonly prefix = '',
  ) {}

  /** Builds the store from configuration; does no I/O (call `ensureContainers` once at start-up, or in the background). */
  static fromConfig(cfg: Config): BlobStore {
    if (cfg.AZURE_STORAGE_ACCOUNT_URL && !cfg.AZURE_STORAGE_CONNECTION_STRING) {
      const service = new BlobServiceClient(cfg.AZURE_STORAGE_ACCOUNT_URL, new DefaultAzureCredential());
      return new BlobStore(service, undefined, true, cfg.ROOST_BLOB_CONTAINER_PREFIX ?? '');
    }
    const conn = cfg.AZURE_STORAGE_CONNECTION_STRING ?? azuriteConnectionString(cfg.ROOST_AZURITE_PORT);
    const service = BlobServiceClient.fromConnectionString(conn);
    const cred = service.credential instanceof StorageSharedKeyCredential ? service.credential : undefined;
    return new BlobStore(service, cred, service.url.startsWith('https:'), cfg.ROOST_BLOB_CONTAINER_PREFIX ?? '');
  }

  /** The storage name of a container: ROOST_BLOB_CONTAINER_PREFIX + its name in CONTAINERS. */
  containerName(name: keyof typeof CONTAINERS): string {
    return this.prefix + CONTAINERS[name];
  }

  container(name: keyof typeof CONTAINERS): ContainerClient {
    return this.service.getContainerClient(this.containerName(name));
  }

  /**
   * Resolves when the blob service answers a read of the chunk container's properties within `timeoutMs`
   * (`GET /readyz`), or, until the containers have been ensured in this process, ensures them within it.
   * @throws the SDK's error (or an AbortError) when it does not.
   */
  async ping(timeoutMs: number): Promise<void> {
    const abortSignal = AbortSignal.timeout(timeoutMs);
    // Not ready before the containers exist: a process started while blob storage was down ensures them in
    // the background (services/deps.ts) and the probe does not wait for that loop's next attempt.
    if (!this.containersEnsured) await this.ensureContainers({ abortSignal });
    else await this.container('chunks').exists({ abortSignal });
  }

  /** Creates the containers if missing (private access). */
  async ensureContainers(opts: { abortSignal?: AbortSignal } = {}): Promise<void> {
    await Promise.all(
      (Object.keys(CONTAINERS) as (keyof typeof CONTAINERS)[]).map((c) =>
        this.container(c).createIfNotExists({ abortSignal: opts.abortSignal }),
      ),
    );
    this.containersEnsured = true;
  }

  /** Deletes every container of this store with all its blobs (test runs remove their own; never in production code). */
  async deleteContainers(): Promise<void> {
    await Promise.all((Object.keys(CONTAINERS) as (keyof typeof CONTAINERS)[]).map((c) => this.container(c).deleteIfExists()));
  }

  private async sign(container: string, blobName: string, permissions: string, ttlMs: number): Promise<SignedUrl> {
    const now = Date.now();
    const startsOn = new Date(now - 5 * 60 * 1000); // clock skew allowance
    const expiresOn = new Date(now + ttlMs);
    const common = {
      containerName: container,
      blobName,
      permissions: BlobSASPermissions.parse(permissions),
      startsOn,
      expiresOn,
      protocol: this.https ? SASProtocol.Https : SASProtocol.HttpsAndHttp,
    };
    let query: string;
    if (this.sharedKey) {
      query = generateBlobSASQueryParameters(common, this.sharedKey).toString();
    } else {
      const key = await this.userDelegationKey();
      query = generateBlobSASQueryParameters(common, key, this.service.accountName).toString();
    }
    return { url: `${this.urlOf(container, blobName)}?${query}`, expiresAt: expiresOn.getTime() };
  }

  /**
   * The SDK's URL of `blobName` in the storage container `container`. A name of unreserved URL characters
   * only (`A-Z a-z 0-9 - . _ ~` in `/`-separated segments, none empty, `.` or `..`: every chunk, version
   * and installer name) is appended to the container's URL as is, which is exactly what the SDK's
   * `getBlobClient(name).url` gives for it (test/unit/blob-url.test.ts) without building two clients per
   * URL (most of the API's CPU for signing 1,000 upload URLs). Other names go through the SDK, memoised.
   */
  private urlOf(container: string, blobName: string): string {
    if (PLAIN_BLOB_NAME.test(blobName) && !DOT_SEGMENT.test(blobName)) {
      let base = this.containerUrls.get(container);
      if (base === undefined) {
        const u = this.service.getContainerClient(container).url;
        base = u.includes('?') || u.includes('#') ? null : u.endsWith('/') ? u : `${u}/`;
        this.containerUrls.set(container, base);
      }
      if (base !== null) return base + blobName;
    }
    const key = `${container}/${blobName}`;
    let url = this.urls.get(key);
    if (url === undefined) {
      url = this.service.getContainerClient(container).getBlobClient(blobName).url;
      if (this.urls.size >= BLOB_URL_CACHE_SIZE) this.urls.clear();
      this.urls.set(key, url);
    }
    return url;
  }

  private async userDelegationKey(): Promise<UserDelegationKey> {
    const now = Date.now();
    if (this.delegationKey && this.delegationKey.expiresOn - now > 2 * 60 * 60 * 1000) return this.delegationKey.key;
    const expiresOn = now + 6 * 60 * 60 * 1000;
    const key = await this.service.getUserDelegationKey(new Date(now - 5 * 60 * 1000), new Date(expiresOn));
    this.delegationKey = { key, expiresOn };
    return key;
  }

  /**
   * Signed PUT URL for one chunk: create only, 60 minutes. Azure Storage (and Azurite) refuse a PUT
   * through it when the blob exists (403 AuthorizationPermissionMismatch), and it allows no staged
   * blocks, so it can store a chunk once and never overwrite it.
   */
  chunkUploadUrl(siteId: string, hash: string): Promise<SignedUrl> {
    return this.sign(this.containerName('chunks'), chunkBlobName(siteId, hash), 'c', UPLOAD_URL_TTL_MS);
  }

  /** Signed GET URL for one chunk: read only, 15 minutes. */
  chunkDownloadUrl(siteId: string, hash: string): Promise<SignedUrl> {
    return this.sign(this.containerName('chunks'), chunkBlobName(siteId, hash), 'r', DOWNLOAD_URL_TTL_MS);
  }

  /**
   * Signed PUT URL of an agent installer's blob (`POST /api/installer/upload`): create only, 60 minutes,
   * so the bytes can be stored once and never overwritten through it (a finalised installer is immutable).
   */
  installerUploadUrl(blobName: string): Promise<SignedUrl> {
    return this.sign(this.containerName('installers'), blobName, 'c', UPLOAD_URL_TTL_MS);
  }

  /** Signed GET URL for any blob of a container: read only, `ttlMs` (default 15 minutes). */
  readUrl(container: keyof typeof CONTAINERS, blobName: string, ttlMs = DOWNLOAD_URL_TTL_MS): Promise<SignedUrl> {
    return this.sign(this.containerName(container), blobName, 'r', ttlMs);
  }

  /** Plain (unsigned) URL of a blob: the stable location reported as `versionUrl`. */
  blobUrl(container: keyof typeof CONTAINERS, blobName: string): string {
    return this.urlOf(this.containerName(container), blobName);
  }

  /** Stored size in bytes of a site's chunk, or null when no blob exists. */
  async chunkSize(siteId: string, hash: string): Promise<number | null> {
    return (await this.chunkBlob(siteId, hash))?.size ?? null;
  }

  /** Size in bytes and ETag of a site's chunk blob (one property read), or null when no blob exists. */
  async chunkBlob(siteId: string, hash: string): Promise<StoredBlob | null> {
    try {
      const props = await this.container('chunks').getBlobClient(chunkBlobName(siteId, hash)).getProperties();
      return { size: props.contentLength ?? 0, etag: props.etag ?? '' };
    } catch (err) {
      if ((err as { statusCode?: number }).statusCode === 404) return null;
      throw err;
    }
  }

  /**
   * Sizes (bytes) and ETags of the site's chunk blobs among `wanted` (hash → blob), by listing (5,000 blobs
   * a page) instead of one HEAD per chunk: for a large set of new chunks a few list pages cost far less
   * than thousands of property reads. Only the hash prefixes `chunkListingPrefixes(wanted)` names are
   * listed, so chunks uploaded in hash order can be confirmed a hash range at a time, each range listed
   * once. Hashes absent from the map have no blob.
   */
  async chunkBlobsByListing(siteId: string, wanted: ReadonlySet<string>): Promise<Map<string, StoredBlob>> {
    const base = chunkBlobName(siteId, '');
    const found = new Map<string, StoredBlob>();
    for (const hashPrefix of chunkListingPrefixes(wanted)) {
      for await (const page of this.listPages('chunks', base + hashPrefix)) {
        for (const b of page) {
          const hash = b.name.slice(base.length);
          if (wanted.has(hash)) found.set(hash, { size: b.size, etag: b.etag });
        }
        if (found.size === wanted.size) return found;
      }
    }
    return found;
  }

  /**
   * Every page of the blobs under `prefix` in `container` (name, size in bytes, ETag), in name order. Pages
   * come from the lean listing (storage/blob-list.ts: a container SAS with list permission, 5,000 blobs a
   * page) while it works; when a page fails there (network, timeout, a refusal, a body it cannot parse) the
   * listing goes on from that page through the SDK's `listBlobsFlat`, with the SDK's retries, and a refusal
   * (4xx) turns the lean listing off for this store. The SDK is used throughout when the container URL
   * carries a query of its own (a SAS connection string). @throws the SDK's error when its listing fails.
   */
  async *listPages(container: keyof typeof CONTAINERS, prefix: string, pageSize = LIST_PAGE_SIZE): AsyncGenerator<ListedBlob[]> {
    const name = this.containerName(container);
    const url = this.service.getContainerClient(name).url;
    let marker: string | undefined;
    if (this.leanListing && !url.includes('?')) {
      try {
        do {
          const page = await fetchBlobListPage(url, await this.containerListSas(name), prefix, marker, pageSize);
          marker = page.nextMarker;
          yield page.blobs;
        } while (marker);
        return;
      } catch (err) {
        if (err instanceof BlobListError && err.status >= 400 && err.status < 500) this.leanListing = false;
      }
    }
    const pages = this.container(container).listBlobsFlat({ prefix }).byPage({ maxPageSize: pageSize, continuationToken: marker });
    for await (const page of pages) {
      yield page.segment.blobItems.map((b) => ({ name: b.name, size: b.properties.contentLength ?? 0, etag: b.properties.etag ?? '' }));
    }
  }

  /** A container SAS query with list permission (LIST_SAS_TTL_MS), reused for half its lifetime. */
  private async containerListSas(container: string): Promise<string> {
    const now = Date.now();
    const cached = this.listSas.get(container);
    if (cached && cached.renewAt > now) return cached.query;
    const values = {
      containerName: container,
      permissions: ContainerSASPermissions.parse('l'),
      startsOn: new Date(now - 5 * 60 * 1000), // clock skew allowance
      expiresOn: new Date(now + LIST_SAS_TTL_MS),
      protocol: this.https ? SASProtocol.Https : SASProtocol.HttpsAndHttp,
    };
    const query = this.sharedKey
      ? generateBlobSASQueryParameters(values, this.sharedKey).toString()
      : generateBlobSASQueryParameters(values, await this.userDelegationKey(), this.service.accountName).toString();
    this.listSas.set(container, { query, renewAt: now + LIST_SAS_TTL_MS / 2 });
    return query;
  }

  /**
   * SHA-256 hex, byte count and ETag of a site's stored chunk, streamed (never buffered whole), or null
   * when no blob exists. Used by the chunk verification sweep and version verification (activities/) and
   * by chunk presence checks of chunks marked bad (services/chunks.ts).
   */
  async chunkDigest(siteId: string, hash: string): Promise<ChunkDigest | null> {
    let body: NodeJS.ReadableStream | undefined;
    let etag = '';
    try {
      const res = await this.container('chunks').getBlobClient(chunkBlobName(siteId, hash)).download();
      body = res.readableStreamBody;
      etag = res.etag ?? '';
    } catch (err) {
      if ((err as { statusCode?: number }).statusCode === 404) return null;
      throw err;
    }
    const digest = createHash('sha256');
    let size = 0;
    if (body) {
      for await (const part of body) {
        const buf = typeof part === 'string' ? Buffer.from(part) : (part as Buffer);
        size += buf.length;
        digest.update(buf);
      }
    }
    return { digest: digest.digest('hex'), size, etag };
  }

  /**
   * Quarantines a site's chunk blob whose bytes do not hash to its name: copies it (server side) to
   * `quarantineBlobName(siteId, hash, actualDigest)`, then deletes it, both only while its ETag is still
   * `etag` (the bytes that were hashed), so a fresh upload that replaced them meanwhile is never touched.
   * Afterwards a create-only upload URL can store the chunk again. Returns false when the blob is gone or
   * changed (nothing done). @throws blob storage errors other than 404/412.
   */
  async quarantineChunk(siteId: string, hash: string, etag: string, actualDigest: string): Promise<boolean> {
    const chunks = this.container('chunks');
    const source = chunks.getBlobClient(chunkBlobName(siteId, hash));
    const conditions = { ifMatch: etag };
    try {
      const readable = await this.readUrl('chunks', chunkBlobName(siteId, hash), 5 * 60 * 1000);
      const copy = await chunks
        .getBlobClient(quarantineBlobName(siteId, hash, actualDigest))
        .beginCopyFromURL(readable.url, { sourceConditions: conditions });
      await copy.pollUntilDone();
      await source.delete({ conditions });
      return true;
    } catch (err) {
      const status = (err as { statusCode?: number }).statusCode;
      if (status === 404 || status === 412) return false;
      throw err;
    }
  }

  /** Uploads bytes to a blob (overwrites). */
  async put(container: keyof typeof CONTAINERS, blobName: string, data: Buffer, contentType: string): Promise<void> {
    await this.container(container)
      .getBlockBlobClient(blobName)
      .uploadData(data, { blobHTTPHeaders: { blobContentType: contentType } });
  }

  /** Downloads a whole blob, or null when it does not exist. */
  async get(container: keyof typeof CONTAINERS, blobName: string): Promise<Buffer | null> {
    try {
      return await this.container(container).getBlobClient(blobName).downloadToBuffer();
    } catch (err) {
      if ((err as { statusCode?: number }).statusCode === 404) return null;
      throw err;
    }
  }

  /** Deletes a blob if present. */
  async delete(container: keyof typeof CONTAINERS, blobName: string): Promise<void> {
    await this.container(container).getBlobClient(blobName).deleteIfExists();
  }
}

/** Blob name of an agent-installer catalog version's binary in the `installers` container. */
export function installerBlobName(version: string): string {
  return `agent/${version}/roost-agent`;
}

/** What re-hashing a stored installer found (SHA-256 hex, size in bytes, ETag), or null when no blob exists. */
export async function installerDigest(blob: BlobStore, blobName: string): Promise<ChunkDigest | null> {
  let res;
  try {
    res = await blob.container('installers').getBlobClient(blobName).download();
  } catch (err) {
    if ((err as { statusCode?: number }).statusCode === 404) return null;
    throw err;
  }
  const digest = createHash('sha256');
  let size = 0;
  if (res.readableStreamBody) {
    for await (const part of res.readableStreamBody) {
      const buf = typeof part === 'string' ? Buffer.from(part) : (part as Buffer);
      size += buf.length;
      digest.update(buf);
    }
  }
  return { digest: digest.digest('hex'), size, etag: res.etag ?? '' };
}

/**
 * Deletes an installer blob only while its ETag is `etag` (the bytes that were hashed), so bytes uploaded
 * again meanwhile are never touched. Returns false when it was gone or changed.
 */
export async function deleteInstallerBlobIfUnchanged(blob: BlobStore, blobName: string, etag: string): Promise<boolean> {
  try {
    await blob
      .container('installers')
      .getBlobClient(blobName)
      .delete({ conditions: { ifMatch: etag } });
    return true;
  } catch (err) {
    const status = (err as { statusCode?: number }).statusCode;
    if (status === 404 || status === 412) return false;
    throw err;
  }
}

/** True when the installer blob exists (one property read). */
export async function installerBlobExists(blob: BlobStore, blobName: string): Promise<boolean> {
  return blob.container('installers').getBlobClient(blobName).exists();
}

/** Stable URL of a version body blob (`versionUrl` of roost and version records): the blob's plain URL, not a signed one. */
export function versionUrlOf(blob: BlobStore, row: { blob_name: string }): string {
  return blob.blobUrl('versions', row.blob_name);
}
