/**
 * Client-side chunker (docs/contract.md "Version body", "File entry", "Chunk reference", Limits "chunk size").
 *
 * Walks a directory deterministically, splits every regular file into 4 MiB chunks while streaming it
 * (a file is never held in memory whole), hashes each chunk with SHA-256 and builds the version body a
 * push publishes. Rules (docs/decisions/cli-chunker-walk.md):
 * - paths are relative to the root, forward-slash separated, Unicode NFC, sorted by their UTF-8 bytes;
 * - only regular files are listed; symlinks (to files or folders) are skipped, never followed, and
 *   reported, as are sockets, FIFOs and devices; empty folders leave no trace (versions list files);
 * - a zero-byte file has size 0 and no chunks (the empty chunk is never stored);
 * - every chunk but a file's last is exactly CHUNK_SIZE bytes; the last is 1..CHUNK_SIZE.
 * A name the spec cannot carry (backslash, over 1024 chars, clashes after NFC) fails the whole walk
 * with ChunkerError rather than silently leaving the file out.
 */
import { createHash } from 'node:crypto';
import { closeSync, createReadStream, lstatSync, openSync, promises as fsp, readSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pLimit from 'p-limit';
import { CHUNK_SIZE, type ChunkRef, type FileEntry, VERSION_MEDIA_TYPE, VERSION_SCHEMA_VERSION, type VersionBody } from '../domain/version';
import { CLI_VERSION } from './version';
import { collidingPaths, filePathProblem } from '../domain/paths';
import { type CarryBudget, defaultHashThreads, type HashOutcome, hashFiles } from './hash-pool';

/** The tree cannot be turned into a version body (bad names, no files, a file changed while read). */
export class ChunkerError extends Error {
  constructor(
    message: string,
    readonly paths: string[] = [],
  ) {
    super(message);
    this.name = 'ChunkerError';
  }
}

/** A regular file found by the walk. `size` in bytes as seen by lstat. */
export interface WalkedFile {
  /** Forward-slash relative path as it appears in the version body. */
  path: string;
  /** Absolute path on this machine (used to read the bytes). */
  absPath: string;
  size: number;
}

/** An entry the walk left out, with why (`symlink`, `socket`, `fifo`, `device`, `other`). */
export interface SkippedEntry {
  path: string;
  reason: 'symlink' | 'socket' | 'fifo' | 'device' | 'other';
}

export interface WalkResult {
  files: WalkedFile[];
  skipped: SkippedEntry[];
}

/** Total order on paths: by UTF-8 bytes (identical in every language and on every platform). */
export function comparePaths(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

/** Joins relative segments into the body's path form: forward slashes, NFC. */
export function toBodyPath(segments: string[]): string {
  return segments.join('/').normalize('NFC');
}

/**
 * Walks `root` (which must be a directory; a symlinked root is resolved once) and returns its regular
 * files sorted by path, plus what was skipped. @throws ChunkerError on names the spec cannot carry or
 * when the root is not a directory.
 */
export async function walkTree(root: string): Promise<WalkResult> {
  const rootAbs = path.resolve(root);
  let st;
  try {
    st = await fsp.stat(rootAbs);
  } catch (err) {
    throw new ChunkerError(`cannot read ${root}: ${(err as Error).message}`);
  }
  if (!st.isDirectory()) throw new ChunkerError(`${root} is not a directory`);

  const files: WalkedFile[] = [];
  const skipped: SkippedEntry[] = [];
  const bad: [string, string][] = [];

  async function visit(absDir: string, rel: string[]): Promise<void> {
    const entries = await fsp.readdir(absDir, { withFileTypes: true });
    for (const entry of entries) {
      const segs = [...rel, entry.name];
      const relPath = toBodyPath(segs);
      const abs = path.join(absDir, entry.name);
      if (entry.isSymbolicLink()) skipped.push({ path: relPath, reason: 'symlink' });
      else if (entry.isDirectory()) await visit(abs, segs);
      else if (entry.isFile()) {
        const why = filePathProblem(relPath);
        if (why) bad.push([relPath, why]);
        // lstat synchronously: a stat is microseconds, while an awaited one pays a thread-pool round trip
        // and every scheduling delay of a loaded machine once per file (docs/benchmarks.md "Hashing").
        else files.push({ path: relPath, absPath: abs, size: lstatSync(abs).size });
      } else if (entry.isSocket()) skipped.push({ path: relPath, reason: 'socket' });
      else if (entry.isFIFO()) skipped.push({ path: relPath, reason: 'fifo' });
      else if (entry.isBlockDevice() || entry.isCharacterDevice()) skipped.push({ path: relPath, reason: 'device' });
      else skipped.push({ path: relPath, reason: 'other' });
    }
  }
  await visit(rootAbs, []);

  if (bad.length) {
    throw new ChunkerError(
      `${bad.length} file name(s) are not safe on the fleet's Windows machines (docs/decisions/windows-paths.md): ${bad
        .slice(0, 5)
        .map(([p, why]) => `${p} ${why}`)
        .join('; ')}`,
      bad.map(([p]) => p),
    );
  }
  files.sort((a, b) => comparePaths(a.path, b.path));
  skipped.sort((a, b) => comparePaths(a.path, b.path));
  const dups = files.filter((f, i) => i > 0 && files[i - 1].path === f.path).map((f) => f.path);
  if (dups.length) throw new ChunkerError(`file names collide after Unicode NFC normalisation: ${dups.slice(0, 5).join(', ')}`, dups);
  const clashes = collidingPaths(files.map((f) => f.path));
  if (clashes.length) {
    const named = clashes.map(([i, msg]) => `${files[i].path} ${msg}`);
    throw new ChunkerError(
      `${clashes.length} file name(s) collide on Windows: ${named.slice(0, 5).join('; ')}`,
      clashes.map(([i]) => files[i].path),
    );
  }
  return { files, skipped };
}

/**
 * Streams one file and returns its chunk references in file-offset order. `expectedSize` (bytes, from
 * the walk) guards against files changing while read. `onBytes` is called with each block's byte count.
 * Memory: one read buffer (1 MiB) plus the running hash. @throws ChunkerError when the size changed.
 */
export async function chunkFile(absPath: string, expectedSize?: number, onBytes?: (n: number) => void): Promise<ChunkRef[]> {
  const chunks: ChunkRef[] = [];
  let hash = createHash('sha256');
  let inChunk = 0;
  let total = 0;
  const stream = createReadStream(absPath, { highWaterMark: 1024 * 1024 });
  for await (const block of stream as AsyncIterable<Buffer>) {
    let off = 0;
    while (off < block.length) {
      const take = Math.min(CHUNK_SIZE - inChunk, block.length - off);
      hash.update(block.subarray(off, off + take));
      inChunk += take;
      off += take;
      if (inChunk === CHUNK_SIZE) {
        chunks.push({ hash: hash.digest('hex'), size: CHUNK_SIZE });
        hash = createHash('sha256');
        inChunk = 0;
      }
    }
    total += block.length;
    onBytes?.(block.length);
  }
  if (inChunk > 0) chunks.push({ hash: hash.digest('hex'), size: inChunk });
  if (expectedSize !== undefined && total !== expectedSize) {
    throw new ChunkerError(`${absPath} changed while it was read (${expectedSize} bytes listed, ${total} read)`, [absPath]);
  }
  return chunks;
}

/** Where one chunk's bytes live on this machine: file and byte offset. */
export interface ChunkLocation {
  absPath: string;
  offset: number;
  size: number;
  /** The chunk's bytes as they were hashed, when the hashing thread carried them (ScanOptions.carry). */
  bytes?: Buffer;
}

/** The version body's `config` block (metadata only; docs/contract.md "Version body"). */
export interface ProducerConfig {
  producer: 'roost-cli';
  cliVersion: string;
  createdAt: string;
  hostname: string;
  platform: string;
  [extra: string]: unknown;
}

/** Default config: producer roost-cli, this CLI's version, now (ISO 8601 UTC), hostname, platform. */
export function producerConfig(now: Date = new Date()): ProducerConfig {
  return {
    producer: 'roost-cli',
    cliVersion: CLI_VERSION,
    createdAt: now.toISOString(),
    hostname: os.hostname(),
    platform: process.platform,
  };
}

/** Builds a version body from file entries (sorted here by path so the body never depends on input order). */
export function buildVersionBody(files: FileEntry[], config: Record<string, unknown> = producerConfig()): VersionBody {
  const sorted = [...files].sort((a, b) => comparePaths(a.path, b.path));
  return { schemaVersion: VERSION_SCHEMA_VERSION, mediaType: VERSION_MEDIA_TYPE, config, files: sorted };
}

/** Progress of a scan: files and bytes hashed so far against the totals. */
export interface ScanProgress {
  filesDone: number;
  filesTotal: number;
  bytesDone: number;
  bytesTotal: number;
}

export interface ScanOptions {
  /** Files hashed at once on the main thread (default 2; small trees and `threads: 1`). Output order never depends on it. */
  concurrency?: number;
  /**
   * Hashing threads (cli/hash-pool.ts; default one per core). With 1, or for a tree under
   * POOL_MIN_BYTES, files are hashed on the main thread instead.
   */
  threads?: number;
  /** Replaces the default producer config (tests pin createdAt through this). */
  config?: Record<string, unknown>;
  onProgress?: (p: ScanProgress) => void;
  /**
   * Called once per file as soon as its chunks are known (in completion order, not path order), so a
   * caller can start on them while the rest is hashed (cli/push.ts). `bytes`: the file's whole content
   * (one chunk) when `carry` held it. A throw fails the scan.
   */
  onEntry?: (file: WalkedFile, entry: FileEntry, bytes?: Buffer) => void;
  /**
   * Small files whose bytes come back with their chunks (cli/hash-pool.ts CarryBudget), on hashing
   * threads only; the caller holds and lets go of them.
   */
  carry?: CarryBudget;
}

export interface ScanResult {
  body: VersionBody;
  /** One location per distinct chunk hash (the first occurrence in path order). */
  locations: Map<string, ChunkLocation>;
  skipped: SkippedEntry[];
  /** Sum of file sizes in bytes. */
  bytesTotal: number;
}

/** Trees smaller than this (bytes) are hashed on the main thread: starting threads would cost more. */
export const POOL_MIN_BYTES = 8 * 1024 * 1024;

/** Hashes `files` on the main thread, `concurrency` files at once. */
async function hashInline(
  files: WalkedFile[],
  concurrency: number,
  progress: ScanProgress,
  onProgress: ScanOptions['onProgress'],
  onEntry: ScanOptions['onEntry'],
): Promise<FileEntry[]> {
  const limit = pLimit(concurrency);
  return Promise.all(
    files.map((f) =>
      limit(async (): Promise<FileEntry> => {
        const chunks =
          f.size === 0
            ? []
            : await chunkFile(f.absPath, f.size, (n) => {
                progress.bytesDone += n;
                onProgress?.({ ...progress });
              });
        progress.filesDone += 1;
        onProgress?.({ ...progress });
        const entry: FileEntry = { path: f.path, size: f.size, chunks };
        onEntry?.(f, entry);
        return entry;
      }),
    ),
  );
}

/**
 * Hashes `files` on `threads` worker threads (cli/hash-pool.ts). @throws ChunkerError when a file
 * cannot be read or its size changed since the walk, like `chunkFile`.
 */
async function hashOnThreads(
  files: WalkedFile[],
  threads: number,
  progress: ScanProgress,
  onProgress: ScanOptions['onProgress'],
  onEntry: ScanOptions['onEntry'],
  carry: ScanOptions['carry'],
): Promise<FileEntry[]> {
  const toEntry = (f: WalkedFile, o: HashOutcome): FileEntry => {
    if ('error' in o) throw new ChunkerError(`cannot read ${f.absPath}: ${o.error}`, [f.absPath]);
    if (o.total !== f.size) {
      throw new ChunkerError(`${f.absPath} changed while it was read (${f.size} bytes listed, ${o.total} read)`, [f.absPath]);
    }
    return { path: f.path, size: f.size, chunks: o.chunks };
  };
  const outcomes = await hashFiles(files, {
    onOutcome: onEntry
      ? (i, o) => {
          const bytes = 'bytes' in o && o.bytes ? Buffer.from(o.bytes.buffer, o.bytes.byteOffset, o.bytes.length) : undefined;
          onEntry(files[i], toEntry(files[i], o), bytes);
        }
      : undefined,
    carry: onEntry ? carry : undefined,
    threads,
    onBytes: (n) => {
      progress.bytesDone += n;
      onProgress?.({ ...progress });
    },
    onFile: () => {
      progress.filesDone += 1;
      onProgress?.({ ...progress });
    },
  });
  return files.map((f, i) => toEntry(f, outcomes[i]));
}

/**
 * Walks and hashes a tree into a version body plus the location of every distinct chunk.
 * @throws ChunkerError when the tree has no regular files (an empty publish is rejected by the API) or
 * when walkTree/chunkFile reject it.
 */
export async function scanTree(root: string, opts: ScanOptions = {}): Promise<ScanResult> {
  const { files, skipped } = await walkTree(root);
  if (files.length === 0) throw new ChunkerError(`${root} holds no regular files; an empty version cannot be published`);
  const bytesTotal = files.reduce((n, f) => n + f.size, 0);
  const progress: ScanProgress = { filesDone: 0, filesTotal: files.length, bytesDone: 0, bytesTotal };
  opts.onProgress?.({ ...progress });
  const threads = opts.threads ?? defaultHashThreads();
  const entries =
    threads > 1 && bytesTotal >= POOL_MIN_BYTES
      ? await hashOnThreads(files, threads, progress, opts.onProgress, opts.onEntry, opts.carry)
      : await hashInline(files, Math.max(1, opts.concurrency ?? 2), progress, opts.onProgress, opts.onEntry);
  const locations = new Map<string, ChunkLocation>();
  entries.forEach((entry, i) => {
    let offset = 0;
    for (const c of entry.chunks) {
      if (!locations.has(c.hash)) locations.set(c.hash, { absPath: files[i].absPath, offset, size: c.size });
      offset += c.size;
    }
  });
  return { body: buildVersionBody(entries, opts.config ?? producerConfig()), locations, skipped, bytesTotal };
}

/**
 * Chunks up to this size (bytes) are read back with synchronous calls (`readChunk`): for a small file an
 * awaited open, read and close cost three thread-pool round trips and a FileHandle, about 0.5 ms of the
 * main thread per chunk in a cold push's profile, against ~30 µs for the same read from the page cache
 * done synchronously (docs/benchmarks.md "Cold push: the push's own CPU"). Larger chunks are read
 * asynchronously, so a 4 MiB read never stalls the PUTs in flight.
 */
export const SYNC_READ_MAX = 256 * 1024;

/**
 * Reads one chunk's bytes back from its file (only `loc.size` bytes are held) and checks them against
 * `hash`; `loc.bytes`, when the hashing carried them, are those very bytes and are returned as they are.
 * Chunks of at most SYNC_READ_MAX bytes are read synchronously. @throws ChunkerError when the
 * file no longer holds those bytes; the fs error when it cannot be opened or read.
 */
export async function readChunk(loc: ChunkLocation, hash: string): Promise<Buffer> {
  if (loc.bytes) return loc.bytes;
  const buf = Buffer.allocUnsafe(loc.size);
  const got = loc.size <= SYNC_READ_MAX ? readAtSync(loc, buf) : await readAt(loc, buf);
  if (got !== loc.size || createHash('sha256').update(buf).digest('hex') !== hash) {
    throw new ChunkerError(`${loc.absPath} changed since it was hashed (chunk at offset ${loc.offset})`, [loc.absPath]);
  }
  return buf;
}

/** Fills `buf` from `loc.absPath` at `loc.offset` until full or end of file; returns the bytes read. */
function readAtSync(loc: ChunkLocation, buf: Buffer): number {
  const fd = openSync(loc.absPath, 'r');
  try {
    let got = 0;
    while (got < buf.length) {
      const n = readSync(fd, buf, got, buf.length - got, loc.offset + got);
      if (n === 0) break;
      got += n;
    }
    return got;
  } finally {
    closeSync(fd);
  }
}

/** `readAtSync` through the thread pool. */
async function readAt(loc: ChunkLocation, buf: Buffer): Promise<number> {
  const fh = await fsp.open(loc.absPath, 'r');
  try {
    let got = 0;
    while (got < buf.length) {
      const { bytesRead } = await fh.read(buf, got, buf.length - got, loc.offset + got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return got;
  } finally {
    await fh.close();
  }
}
