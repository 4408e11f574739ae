/**
 * Version body rules: the body `POST /api/roosts/{roostId}/versions` accepts (schemaVersion, mediaType,
 * config, files with their chunk references) and the version id. Pure: no I/O. The version id is SHA-256
 * hex of the RFC 8785 (JCS) canonical JSON of the body exactly as received, extra keys included
 * (docs/decisions/version-publish.md), computed with the maintained `canonicalize`.
 */
import canonicalize from 'canonicalize';
import { collidingPaths, filePathProblem } from './paths';
import { isSha256Hex, sha256Hex } from './hex';

/** Size in bytes of every chunk of a file but its last. */
export const CHUNK_SIZE = 4194304;
/** Most chunk hashes (or per-chunk errors) named on a failed publish. */
export const MAX_MISSING_CHUNKS = 20;
/** Most characters of a version's description (docs/contract.md Limits). */
export const DESCRIPTION_MAX = 500;
export const VERSION_SCHEMA_VERSION = 2;
export const VERSION_MEDIA_TYPE = 'application/vnd.svc.version.v1+json';

export interface ChunkRef {
  hash: string;
  size: number;
}
export interface FileEntry {
  path: string;
  size: number;
  chunks: ChunkRef[];
}
export interface VersionBody {
  schemaVersion: 2;
  mediaType: string;
  config: Record<string, unknown>;
  files: FileEntry[];
  [extra: string]: unknown;
}

/** RFC 8785 canonical JSON text of a value. Throws TypeError on values JSON cannot carry. */
export function canonicalJson(value: unknown): string {
  const text = canonicalize(value);
  if (text === undefined) throw new TypeError('value has no canonical JSON form');
  return text;
}

/** versionId: SHA-256 hex (64 chars) of the canonical JSON of the version body. */
export function computeVersionId(body: unknown): string {
  return sha256Hex(canonicalJson(body));
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** True for a file path that is safe on the fleet's file system (domain/paths.ts `filePathProblem`). */
export function isSafeRelativePath(p: string): boolean {
  return filePathProblem(p) === null;
}

/**
 * Validates a version body. Returns a map from dotted path (e.g. `version.files.3.chunks.0.hash`) to
 * messages, or null when valid. `prefix` is prepended to every path.
 */
export function validateVersionBody(body: unknown, prefix = 'version'): Record<string, string[]> | null {
  const errs: Record<string, string[]> = {};
  const add = (path: string, msg: string) => {
    const key = `${prefix}${path ? '.' + path : ''}`;
    (errs[key] ??= []).push(msg);
  };
  if (!isPlainObject(body)) {
    add('', 'must be an object');
    return errs;
  }
  if (body.schemaVersion !== VERSION_SCHEMA_VERSION) add('schemaVersion', 'must be exactly 2');
  if (body.mediaType !== VERSION_MEDIA_TYPE) add('mediaType', `must be exactly ${VERSION_MEDIA_TYPE}`);
  if (!isPlainObject(body.config)) add('config', 'must be a JSON object');
  if (!Array.isArray(body.files)) {
    add('files', 'must be an array');
  } else if (body.files.length === 0) {
    add('files', 'must not be empty');
  } else {
    const seen = new Set<string>();
    const safe: string[] = [];
    const safeIndex: number[] = [];
    body.files.forEach((f: unknown, i: number) => {
      const at = `files.${i}`;
      if (!isPlainObject(f)) return add(at, 'must be an object');
      const why = typeof f.path === 'string' ? filePathProblem(f.path) : 'must be a string';
      if (typeof f.path !== 'string' || why) {
        add(`${at}.path`, `must be a safe forward-slash relative path: it ${why ?? 'is not a string'}`);
      } else if (seen.has(f.path)) {
        add(`${at}.path`, 'duplicate path');
      } else {
        seen.add(f.path);
        safe.push(f.path);
        safeIndex.push(i);
      }
      if (typeof f.size !== 'number' || !Number.isSafeInteger(f.size) || f.size < 0) add(`${at}.size`, 'must be a non-negative integer');
      if (!Array.isArray(f.chunks)) return add(`${at}.chunks`, 'must be an array');
      const n = f.chunks.length;
      /** Sum of the chunk sizes (bytes); null once a chunk size is not a valid one. */
      let sum: number | null = 0;
      f.chunks.forEach((c: unknown, j: number) => {
        const cat = `${at}.chunks.${j}`;
        if (!isPlainObject(c)) return add(cat, 'must be an object');
        if (!isSha256Hex(c.hash)) add(`${cat}.hash`, 'must be lowercase bare SHA-256 hex (64 chars)');
        const s = c.size;
        if (typeof s === 'number' && Number.isSafeInteger(s) && s > 0 && sum !== null) sum += s;
        else sum = null;
        if (typeof s !== 'number' || !Number.isSafeInteger(s) || s <= 0) add(`${cat}.size`, 'must be a positive integer');
        else if (j < n - 1 && s !== CHUNK_SIZE) add(`${cat}.size`, `every chunk but the last must be exactly ${CHUNK_SIZE} bytes`);
        else if (s > CHUNK_SIZE) add(`${cat}.size`, `must be at most ${CHUNK_SIZE} bytes`);
      });
      if (f.size === 0 && n !== 0) add(`${at}.chunks`, 'a zero-byte file has no chunks');
      if (typeof f.size === 'number' && f.size > 0 && n === 0) add(`${at}.chunks`, 'a non-empty file needs chunks');
      // A file is its chunks in offset order: its size is their sum (an agent refuses any other body).
      else if (typeof f.size === 'number' && f.size > 0 && Number.isSafeInteger(f.size) && sum !== null && sum !== f.size) {
        add(`${at}.size`, `must be the sum of its chunk sizes (${sum})`);
      }
    });
    // Names that are distinct here but one file on Windows (case, trailing dots, a file used as a folder).
    for (const [k, msg] of collidingPaths(safe)) add(`files.${safeIndex[k]}.path`, msg);
  }
  return Object.keys(errs).length ? errs : null;
}

/** Summary figures of a valid body: total bytes (sum of file sizes) and file count. */
export function summarize(body: VersionBody): { totalSize: number; totalFiles: number } {
  let totalSize = 0;
  for (const f of body.files) totalSize += f.size;
  return { totalSize, totalFiles: body.files.length };
}

/** Distinct chunk references of a body, each hash once with its size. */
export function distinctChunks(body: VersionBody): ChunkRef[] {
  const m = new Map<string, number>();
  for (const f of body.files) for (const c of f.chunks) m.set(c.hash, c.size);
  return [...m].map(([hash, size]) => ({ hash, size }));
}

/**
 * Distinct chunks of a valid body in first-use order, each with the number of files that reference
 * it. A hash referenced with two different sizes is a body error (a digest has exactly one length):
 * reported at the later reference's dotted path (at most MAX_MISSING_CHUNKS paths). `errors` is null
 * when there is none.
 */
export function chunkTable(body: VersionBody): { refs: (ChunkRef & { fileCount: number })[]; errors: Record<string, string[]> | null } {
  const table = new Map<string, ChunkRef & { fileCount: number; lastFile: number }>();
  const errors: Record<string, string[]> = {};
  let n = 0;
  body.files.forEach((f, i) =>
    f.chunks.forEach((c, j) => {
      const seen = table.get(c.hash);
      if (seen === undefined) table.set(c.hash, { hash: c.hash, size: c.size, fileCount: 1, lastFile: i });
      else {
        if (seen.lastFile !== i) {
          seen.fileCount++;
          seen.lastFile = i;
        }
        if (seen.size !== c.size && n++ < MAX_MISSING_CHUNKS) {
          errors[`version.files.${i}.chunks.${j}.size`] = [`chunk ${c.hash} is referenced elsewhere with size ${seen.size}`];
        }
      }
    }),
  );
  const refs = [...table.values()].map(({ hash, size, fileCount }) => ({ hash, size, fileCount }));
  return { refs, errors: Object.keys(errors).length ? errors : null };
}

/**
 * Dotted-path errors (`version.files.<i>.chunks.<j>.size`, at most MAX_MISSING_CHUNKS) for the chunk
 * references whose hash is stored with another size; `conflicts` maps hash → stored size in bytes.
 */
export function sizeConflictErrors(body: VersionBody, conflicts: ReadonlyMap<string, number>): Record<string, string[]> {
  const errors: Record<string, string[]> = {};
  let n = 0;
  body.files.forEach((f, i) =>
    f.chunks.forEach((c, j) => {
      const stored = conflicts.get(c.hash);
      if (stored !== undefined && n++ < MAX_MISSING_CHUNKS)
        errors[`version.files.${i}.chunks.${j}.size`] = [`chunk ${c.hash} is stored with ${stored} bytes`];
    }),
  );
  return errors;
}
