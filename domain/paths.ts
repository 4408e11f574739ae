/**
 * Path rules that hold on the fleet's file system, NTFS under Windows (docs/decisions/windows-paths.md): one
 * definition used by publish (file paths), the roost routes (extract paths), and the agent before it writes.
 *
 * Windows resolves names case-insensitively, drops trailing dots and spaces from every segment, treats `:` as
 * the start of an alternate data stream (or a drive), and opens devices for the reserved names CON, PRN, AUX,
 * NUL, COM0-9 and LPT0-9 whatever extension follows. A path that means something else there than on the
 * publisher's machine is refused, naming the rule.
 *
 * Pure: no I/O.
 */

/** Longest file path in a version body, characters. */
export const MAX_PATH_LENGTH = 1024;
/** Longest single segment (NTFS's component limit), UTF-16 code units. */
export const MAX_SEGMENT_LENGTH = 255;

/**
 * Top-level folders of the agent's machine root that no extract root may use: the chunk store, the agent's
 * state (token, pinned keys) and staged trees. Compared the way Windows compares names.
 */
export const AGENT_RESERVED_DIRS = ['chunks', 'state', 'staging'] as const;

/** Device names Windows opens whatever the extension (`aux.txt` is AUX). Superscript digits count too. */
const DEVICE = /^(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³]|conin\$|conout\$)$/i;
/** Characters NTFS does not allow in a name (besides `:` and control characters, named separately). */
const FORBIDDEN_CHARS = /[<>"|?*]/;

/**
 * `s` upper-cased the way NTFS compares names: one UTF-16 code unit at a time, each to its simple upper case
 * (the volume's upcase table maps a unit to one unit). JavaScript's toUpperCase applies the full mappings,
 * which expand (`ß` → `SS`, `ﬁ` → `FI`): a unit whose upper case is longer than one unit keeps itself, as
 * NTFS keeps it, so `Straße` and `STRASSE` are two names. Lone surrogates and astral characters keep themselves.
 */
export function ntfsUpper(s: string): string {
  let out = '';
  for (let i = 0; i < s.length; i++) {
    const ch = s[i];
    const up = ch.toUpperCase();
    out += up.length === 1 ? up : ch;
  }
  return out;
}

/** The name Windows resolves a segment to: trailing dots and spaces dropped, upper-cased as NTFS compares (`ntfsUpper`). */
export function windowsFold(segment: string): string {
  return ntfsUpper(segment.replace(/[. ]+$/, ''));
}

/** Why one path segment is unsafe on Windows, or null. */
export function segmentProblem(seg: string): string | null {
  if (seg === '' || seg === '.' || seg === '..') return 'has an empty, "." or ".." segment';
  if (seg.length > MAX_SEGMENT_LENGTH) return `has a segment longer than ${MAX_SEGMENT_LENGTH} characters`;

  if (/[\u0000-\u001f\u007f]/.test(seg)) return 'has a control character';
  if (seg.includes('\\')) return 'has a backslash (separators are forward slashes)';
  if (seg.includes(':')) return `has ":" in "${seg}" (a drive or an alternate data stream on Windows)`;
  if (FORBIDDEN_CHARS.test(seg)) return `has a character Windows does not allow (< > " | ? *) in "${seg}"`;
  if (/[. ]$/.test(seg)) return `has a segment ending in a dot or a space ("${seg}"), which Windows drops`;
  const base = seg.split('.')[0].replace(/ +$/, '');
  if (DEVICE.test(base)) return `has a reserved Windows device name ("${seg}")`;
  return null;
}

/** Why a version file path is unsafe, or null: non-empty, relative, forward slashes, every segment safe. */
export function filePathProblem(p: string): string | null {
  if (p.length === 0) return 'is empty';
  if (p.length > MAX_PATH_LENGTH) return `is longer than ${MAX_PATH_LENGTH} characters`;
  if (p.startsWith('/')) return 'is absolute (paths are relative to the extract root)';
  if (/^[A-Za-z]:/.test(p)) return 'starts with a drive letter';
  for (const seg of p.split('/')) {
    const why = segmentProblem(seg);
    if (why) return why;
  }
  return null;
}

/**
 * Paths of one version that collide on Windows: two files whose names differ only in case (or in trailing
 * dots and spaces), or a file whose name is also a folder of another path. Returns `[index, message]` pairs,
 * at most `max`, for the later path of each collision. Paths are assumed to pass `filePathProblem`.
 */
export function collidingPaths(paths: readonly string[], max = 20): [number, string][] {
  const files = new Map<string, number>();
  const dirs = new Map<string, number>();
  const out: [number, string][] = [];
  paths.forEach((p, i) => {
    if (out.length >= max) return;
    const segs = p.split('/').map(windowsFold);
    const key = segs.join('/');
    const clash = files.get(key) ?? dirs.get(key);
    if (clash !== undefined) {
      out.push([i, `collides on Windows with "${paths[clash]}" (names differ only in case)`]);
      return;
    }
    for (let n = 1; n < segs.length; n++) {
      const prefix = segs.slice(0, n).join('/');
      const file = files.get(prefix);
      if (file !== undefined) {
        out.push([i, `uses "${paths[file]}" as a folder, but it is a file`]);
        return;
      }
    }
    files.set(key, i);
    for (let n = 1; n < segs.length; n++) if (!dirs.has(segs.slice(0, n).join('/'))) dirs.set(segs.slice(0, n).join('/'), i);
  });
  return out;
}

/**
 * The segments of an extract root as the agent places it under its machine root: `\` and `/` both separate,
 * a leading drive (`C:`) is dropped, empty and `.` segments are skipped. Returns the segments or a problem.
 */
export function extractRootSegments(root: string): { segments: string[] } | { problem: string } {
  if (root.length > MAX_PATH_LENGTH) return { problem: `is longer than ${MAX_PATH_LENGTH} characters` };
  const segments = root
    .replace(/\\/g, '/')
    .replace(/^[A-Za-z]:/, '')
    .split('/')
    .filter((s) => s !== '' && s !== '.');
  if (segments.length === 0) return { problem: 'names no folder' };
  for (const seg of segments) {
    const why = segmentProblem(seg);
    if (why) return { problem: why };
  }
  const top = windowsFold(segments[0]);
  const reserved = AGENT_RESERVED_DIRS.find((d) => ntfsUpper(d) === top);
  if (reserved) return { problem: `uses "${segments[0]}", which Windows resolves to the agent's own "${reserved}" folder` };
  return { segments };
}

/** Why an extract root is unsafe, or null (see `extractRootSegments`). */
export function extractRootProblem(root: string): string | null {
  const r = extractRootSegments(root);
  return 'problem' in r ? r.problem : null;
}

/**
 * Why a machine-side absolute path (a managed process's exe_path and cwd, a deployment's verify_path) is
 * unusable, or null. Accepted: a drive-absolute Windows path (`C:\Program Files\App\app.exe`, either
 * separator), a UNC path (`\\server\share\app.exe`), or a POSIX absolute path (`/opt/app/bin/app`, what the
 * reference agent uses on Linux). Drive-relative (`C:app.exe`), root-relative (`\app.exe`) and relative
 * paths are refused: they resolve differently per process. docs/decisions/managed-processes.md.
 */
/**
 * The paths absolutePathProblem accepts, as one regular expression (the `pattern` the OpenAPI document states
 * for exe_path, cwd and verify_path; length is bounded separately by MAX_PATH_LENGTH).
 */
export const ABSOLUTE_PATH_RE =
  /^(?:[A-Za-z]:[\\/][^\u0000-\u001f\u007f<>"|?*:]*|\\\\[^\\/\u0000-\u001f\u007f]+[\\/][^\\/\u0000-\u001f\u007f][^\u0000-\u001f\u007f]*|\/(?:[^/\u0000-\u001f\u007f][^\u0000-\u001f\u007f]*)?)$/;

export function absolutePathProblem(p: string): string | null {
  if (p.length === 0) return 'is empty';
  if (p.length > MAX_PATH_LENGTH) return `is longer than ${MAX_PATH_LENGTH} characters`;
  if (/[\u0000-\u001f\u007f]/.test(p)) return 'has a control character';
  if (/^[A-Za-z]:[\\/]/.test(p)) {
    if (/[<>"|?*]/.test(p.slice(2))) return 'has a character Windows does not allow (< > " | ? *)';
    if (p.slice(2).includes(':')) return 'has ":" after the drive (an alternate data stream on Windows)';
    return null;
  }
  if (/^\\\\[^\\/]+[\\/][^\\/]+/.test(p)) return null;
  if (p.startsWith('/') && !p.startsWith('//')) return null;
  return 'must be absolute (C:\\…, \\\\server\\share\\… or /…)';
}

// ---------------------------------------------------------------------------------------------------
// The same rules as regular expressions: the `pattern` the OpenAPI document states for extract roots and file
// names (test/unit/paths.test.ts checks each equal to its function on random strings).

/** A character allowed in a segment, and the last one of a segment (no trailing dot or space). */
const SEG_CHAR = '[^\\u0000-\\u001f\\u007f\\\\/:<>"|?*]';
const SEG_LAST = '[^\\u0000-\\u001f\\u007f\\\\/:<>"|?*. ]';
/** DEVICE without the `i` flag (its names are ASCII, which is all `i` folds without `u`). */
const DEVICE_SRC = `(?:${DEVICE.source
  .slice(2, -2)
  .replace(/[a-z]/g, (c) => `[${c.toUpperCase()}${c}]`)
  .replaceAll('[0-9¹²³]', '[0-9\\u00b9\\u00b2\\u00b3]')})`;
/** One segment segmentProblem accepts: 1..255 characters, no device name before the first dot. */
const SEGMENT_SRC = `(?!${DEVICE_SRC} *(?:\\.|[\\\\/]|$))${SEG_CHAR}{0,${MAX_SEGMENT_LENGTH - 1}}${SEG_LAST}`;

/**
 * `word` as a pattern matching every string Windows takes for the same name (`ntfsUpper` equal, as
 * windowsFold compares): `state` is also `STATE` and `ſtate` (U+017F upper-cases to `S`), not `ﬆate`.
 */
function foldedPattern(word: string): string {
  const target = ntfsUpper(word);
  const byUpper = new Map<string, string[]>();
  for (let c = 0; c <= 0xffff; c++) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    const ch = String.fromCharCode(c);
    const up = ntfsUpper(ch);
    if (target.includes(up)) byUpper.set(up, [...(byUpper.get(up) ?? []), ch]);
  }
  const cls = (chars: string[]) =>
    `[${chars.map((ch) => (/[A-Za-z]/.test(ch) ? ch : `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`)).join('')}]`;
  return [...target].map((up) => cls(byUpper.get(up)!)).join('');
}

/** The extract roots extractRootProblem accepts, '' (the default root) included. */
export const EXTRACT_ROOT_RE = new RegExp(
  `^(?:(?:[A-Za-z]:)?(?:\\.?[\\\\/])*` +
    `(?!(?:${AGENT_RESERVED_DIRS.map(foldedPattern).join('|')})(?:[\\\\/]|$))${SEGMENT_SRC}` +
    `(?:[\\\\/](?:\\.(?=[\\\\/]|$)|${SEGMENT_SRC})?)*)?$`,
);

/** The bare file names fileNameProblem accepts (an installer's file name, an executable to close). */
export const FILE_NAME_RE = new RegExp(`^${SEGMENT_SRC}$`);

/** Why a bare file name (an installer's file name) is unsafe on Windows, or null: one segment, no separators. */
export function fileNameProblem(name: string): string | null {
  if (name.includes('/') || name.includes('\\')) return 'must be a file name, not a path';
  return segmentProblem(name);
}
