/**
 * The one rule for client text and JSON (docs/decisions/hostile-input.md): every string a client sends, in a
 * JSON body (keys included), a query parameter or a path parameter, must be storable as it is. PostgreSQL
 * (and CockroachDB) refuse U+0000 in TEXT and JSONB, and a lone UTF-16 surrogate cannot be encoded as UTF-8
 * (the driver would silently store U+FFFD instead), so both are refused up front with 400
 * `validation_failed` naming the field. JSON is also bounded in depth, so nothing downstream (canonical JSON,
 * hashing, JSONB) can be driven into deep recursion, and keys that would reach an object's prototype when a
 * value is later merged (`__proto__`, `constructor.prototype`) are refused by name. A number too large for a
 * double (`1e400`, which JSON.parse reads as Infinity) is refused where it stands.
 *
 * Pure: no I/O. Used by api/plugins/input.ts for every request.
 */

/** Deepest nesting of arrays and objects accepted in a JSON body (the root is depth 1). */
export const MAX_JSON_DEPTH = 64;

/** Why a string is refused, or null when it is acceptable. */
export function textProblem(s: string): string | null {
  if (s.includes('\u0000')) return 'must not contain U+0000 (NUL)';
  if (!s.isWellFormed()) return 'must not contain a lone UTF-16 surrogate';
  return null;
}

/** A refused JSON value: the dotted path of the field (`body` prefix stripped) and the reason. */
export interface InputProblem {
  path: string;
  message: string;
}

function join(path: string, key: string | number): string {
  return path === '' ? String(key) : `${path}.${key}`;
}

/** Shortens a path for messages: a 100-level path is useless to read. */
function shortPath(path: string): string {
  return path.length <= 200 ? path : `${path.slice(0, 120)}…${path.slice(-60)}`;
}

/**
 * Walks a parsed JSON value without recursion and returns the first problem, or null: a string or key that
 * `textProblem` refuses, a number that is not finite, a `__proto__` key, a `constructor` object holding a `prototype` key, or nesting
 * deeper than `maxDepth`. O(size of the value).
 */
export function jsonInputProblem(value: unknown, maxDepth = MAX_JSON_DEPTH): InputProblem | null {
  const stack: { v: unknown; path: string; depth: number }[] = [{ v: value, path: '', depth: 1 }];
  while (stack.length > 0) {
    const { v, path, depth } = stack.pop()!;
    if (typeof v === 'string') {
      const why = textProblem(v);
      if (why) return { path: shortPath(path), message: why };
      continue;
    }
    // JSON.parse turns a number beyond the double range (1e400) into ±Infinity, which JSON cannot carry:
    // canonical JSON (version ids, the audit chain) and JSONB would fail on it later.
    if (typeof v === 'number' && !Number.isFinite(v))
      return { path: shortPath(path), message: 'is a number outside the range of a double' };
    if (v === null || typeof v !== 'object') continue;
    if (depth > maxDepth) return { path: shortPath(path), message: `nests deeper than ${maxDepth} levels of arrays and objects` };
    if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) stack.push({ v: v[i], path: join(path, i), depth: depth + 1 });
      continue;
    }
    const keys = Object.keys(v);
    for (let i = keys.length - 1; i >= 0; i--) {
      const k = keys[i];
      const at = join(path, k);
      const why = textProblem(k);
      if (why) return { path: shortPath(path), message: `a key ${why}` };
      if (k === '__proto__') return { path: shortPath(at), message: 'the key __proto__ is not allowed' };
      const child = (v as Record<string, unknown>)[k];
      if (k === 'constructor' && child !== null && typeof child === 'object' && Object.hasOwn(child, 'prototype')) {
        return { path: shortPath(join(at, 'prototype')), message: 'the key constructor.prototype is not allowed' };
      }
      stack.push({ v: child, path: at, depth: depth + 1 });
    }
  }
  return null;
}

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/**
 * A request header's text as its sender wrote it: Node hands header values over as Latin-1 (one character
 * per byte), so a UTF-8 `User-Agent` arrives as mojibake (`Ã©` for `é`). Bytes that are valid UTF-8 are read
 * as UTF-8; anything else (true Latin-1, or a value with characters above U+00FF) is kept as it came.
 */
export function headerText(value: string): string {
  if (!/[\u0080-\u00ff]/.test(value) || /[^\u0000-\u00ff]/.test(value)) return value;
  try {
    return UTF8.decode(Buffer.from(value, 'latin1'));
  } catch {
    return value;
  }
}
