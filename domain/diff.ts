/**
 * File-level diff of two version bodies, the shape `GET /api/roosts/{roostId}/versions/{versionRef}/diff`
 * returns (docs/decisions/version-reads.md). Pure: no I/O.
 */
import { type Static, Type } from '@sinclair/typebox';
import { type FileEntry, summarize, type VersionBody } from './version';

/** An added or removed file: its size in bytes, `reason` (`added` | `removed`) and chunk count. */
export const DiffEntry = Type.Object({ path: Type.String(), size: Type.Number(), reason: Type.String(), chunks: Type.Integer() });
/** A file present in both versions whose size or chunk sequence differs (sizes in bytes). */
export const DiffModified = Type.Object({
  path: Type.String(),
  fromSize: Type.Number(),
  toSize: Type.Number(),
  reason: Type.String(),
  fromChunks: Type.Integer(),
  toChunks: Type.Integer(),
});
/** Counts of the diff; `netBytesDelta` is total bytes of the target minus total bytes of the base. */
export const DiffSummary = Type.Object({
  added: Type.Integer(),
  removed: Type.Integer(),
  changed: Type.Integer(),
  unchanged: Type.Integer(),
  hasChanges: Type.Boolean(),
  netBytesDelta: Type.Number(),
});
export const VersionDiff = Type.Object({
  summary: DiffSummary,
  added: Type.Array(DiffEntry),
  removed: Type.Array(DiffEntry),
  modified: Type.Array(DiffModified),
});
export type VersionDiff = Static<typeof VersionDiff>;

function sameChunks(a: FileEntry, b: FileEntry): boolean {
  if (a.size !== b.size || a.chunks.length !== b.chunks.length) return false;
  for (let i = 0; i < a.chunks.length; i++) if (a.chunks[i].hash !== b.chunks[i].hash) return false;
  return true;
}

/**
 * File-level diff of two version bodies, `from` (the base) to `to` (the target), by path. A file in
 * both is modified when its size or its ordered chunk hash sequence differs (reason `size_changed` when
 * the size differs, else `content_changed`); added/removed carry reason `added`/`removed` and their
 * chunk count. Lists are sorted by path; summary.changed = modified.length; netBytesDelta = total
 * bytes of `to` minus total bytes of `from`.
 */
export function diffBodies(from: VersionBody, to: VersionBody): VersionDiff {
  const base = new Map(from.files.map((f) => [f.path, f]));
  const target = new Map(to.files.map((f) => [f.path, f]));
  const added: VersionDiff['added'] = [];
  const removed: VersionDiff['removed'] = [];
  const modified: VersionDiff['modified'] = [];
  let unchanged = 0;
  for (const f of to.files) {
    const old = base.get(f.path);
    if (!old) added.push({ path: f.path, size: f.size, reason: 'added', chunks: f.chunks.length });
    else if (sameChunks(old, f)) unchanged++;
    else
      modified.push({
        path: f.path,
        fromSize: old.size,
        toSize: f.size,
        reason: old.size !== f.size ? 'size_changed' : 'content_changed',
        fromChunks: old.chunks.length,
        toChunks: f.chunks.length,
      });
  }
  for (const f of from.files)
    if (!target.has(f.path)) removed.push({ path: f.path, size: f.size, reason: 'removed', chunks: f.chunks.length });
  const byPath = (a: { path: string }, b: { path: string }) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
  added.sort(byPath);
  removed.sort(byPath);
  modified.sort(byPath);
  const netBytesDelta = summarize(to).totalSize - summarize(from).totalSize;
  return {
    summary: {
      added: added.length,
      removed: removed.length,
      changed: modified.length,
      unchanged,
      hasChanges: added.length + removed.length + modified.length > 0,
      netBytesDelta,
    },
    added,
    removed,
    modified,
  };
}
