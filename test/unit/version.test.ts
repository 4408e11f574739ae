/**
 * Version body rules and the chunk table (domain/version.ts), the file diff (domain/diff.ts), and the
 * body cache of services/version-bodies.ts. Pure: no services.
 */
import canonicalize from 'canonicalize';
import { sha256Hex } from '../../domain/hex';
import {
  CHUNK_SIZE,
  canonicalJson,
  chunkTable,
  computeVersionId,
  distinctChunks,
  isSafeRelativePath,
  summarize,
  validateVersionBody,
  VERSION_MEDIA_TYPE,
  type VersionBody,
} from '../../domain/version';
import { diffBodies } from '../../domain/diff';
import { BodyCache } from '../../services/version-bodies';

const H = (c: string) => c.repeat(64);

function body(files: VersionBody['files'], extra: Record<string, unknown> = {}): VersionBody {
  return { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: {}, files, ...extra } as VersionBody;
}

describe('computeVersionId', () => {
  it('is SHA-256 hex of the RFC 8785 canonical JSON', () => {
    const b = body([{ path: 'a', size: 1, chunks: [{ hash: H('a'), size: 1 }] }]);
    expect(computeVersionId(b)).toBe(sha256Hex(canonicalize(b)!));
    expect(computeVersionId(b)).toMatch(/^[0-9a-f]{64}$/);
  });

  it('ignores key order and whitespace but not extra keys or values', () => {
    const a = { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { x: 1, y: 2 }, files: [] };
    const b = JSON.parse('{ "files": [], "config": {"y":2,"x":1}, "mediaType": "' + VERSION_MEDIA_TYPE + '", "schemaVersion": 2 }');
    expect(computeVersionId(a)).toBe(computeVersionId(b));
    expect(computeVersionId({ ...a, extra: true })).not.toBe(computeVersionId(a));
    expect(computeVersionId({ ...a, config: { x: 1, y: 3 } })).not.toBe(computeVersionId(a));
  });

  it('canonicalises numbers and sorts keys by UTF-16 code units', () => {
    expect(canonicalJson({ b: 1.0, a: 1e21, '\u00e9': 0, Z: -0 })).toBe('{"Z":0,"a":1e+21,"b":1,"é":0}');
    expect(() => canonicalJson(undefined)).toThrow(TypeError);
  });
});

describe('validateVersionBody', () => {
  const good = () =>
    body([
      {
        path: 'big.bin',
        size: CHUNK_SIZE + 5,
        chunks: [
          { hash: H('a'), size: CHUNK_SIZE },
          { hash: H('b'), size: 5 },
        ],
      },
      { path: 'dir/empty.txt', size: 0, chunks: [] },
    ]);

  it('accepts a valid body (zero-byte files have no chunks)', () => {
    expect(validateVersionBody(good())).toBeNull();
  });

  it('reports dotted paths under the prefix', () => {
    const b = good() as any;
    b.schemaVersion = '2';
    b.files[0].chunks[1].hash = 'B'.repeat(64);
    b.files[1].chunks = [{ hash: H('c'), size: 1 }];
    const errs = validateVersionBody(b)!;
    expect(Object.keys(errs).sort()).toEqual(['version.files.0.chunks.1.hash', 'version.files.1.chunks', 'version.schemaVersion']);
    expect(Object.keys(validateVersionBody(b, 'body')!)).toContain('body.schemaVersion');
  });

  it.each([
    ['not an object', [], 'version'],
    ['files missing', { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: {} }, 'version.files'],
    [
      'config not an object',
      { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: 'x', files: [{ path: 'a', size: 0, chunks: [] }] },
      'version.config',
    ],
    [
      'wrong media type',
      { schemaVersion: 2, mediaType: 'application/json', config: {}, files: [{ path: 'a', size: 0, chunks: [] }] },
      'version.mediaType',
    ],
    ['empty files', { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: {}, files: [] }, 'version.files'],
  ])('rejects %s', (_n, b, key) => {
    expect(Object.keys(validateVersionBody(b)!)).toContain(key);
  });

  it('enforces chunk sizing: inner chunks exactly 4 MiB, last 1..4 MiB, sizes positive integers', () => {
    const cases: [VersionBody['files'][number], string][] = [
      [
        {
          path: 'a',
          size: 10,
          chunks: [
            { hash: H('a'), size: 5 },
            { hash: H('b'), size: 5 },
          ],
        },
        'version.files.0.chunks.0.size',
      ],
      [{ path: 'a', size: CHUNK_SIZE + 1, chunks: [{ hash: H('a'), size: CHUNK_SIZE + 1 }] }, 'version.files.0.chunks.0.size'],
      [{ path: 'a', size: 1, chunks: [{ hash: H('a'), size: 0 }] }, 'version.files.0.chunks.0.size'],
      [{ path: 'a', size: 1.5, chunks: [{ hash: H('a'), size: 1.5 }] }, 'version.files.0.size'],
      [{ path: 'a', size: 4, chunks: [] }, 'version.files.0.chunks'],
    ];
    for (const [f, key] of cases) expect(Object.keys(validateVersionBody(body([f]))!)).toContain(key);
  });

  it("refuses a file whose size is not the sum of its chunks' sizes, naming the sum", () => {
    for (const size of [7, 5, CHUNK_SIZE + 6, 999_999_999_999, Number.MAX_SAFE_INTEGER]) {
      const f = {
        path: 's',
        size,
        chunks: [
          { hash: H('a'), size: CHUNK_SIZE },
          { hash: H('b'), size: 6 },
        ],
      };
      const one = { path: 's', size, chunks: [{ hash: H('a'), size: 6 }] };
      expect(validateVersionBody(body([one]))).toEqual(
        size === 6 ? null : { 'version.files.0.size': ['must be the sum of its chunk sizes (6)'] },
      );
      expect(validateVersionBody(body([f]))).toEqual(
        size === CHUNK_SIZE + 6 ? null : { 'version.files.0.size': [`must be the sum of its chunk sizes (${CHUNK_SIZE + 6})`] },
      );
    }
    // One message per problem: a bad chunk size is reported there, not again as a wrong sum.
    expect(Object.keys(validateVersionBody(body([{ path: 's', size: 3, chunks: [{ hash: H('a'), size: 0 }] }]))!)).toEqual([
      'version.files.0.chunks.0.size',
    ]);
  });

  it('rejects duplicate paths and unsafe paths', () => {
    const dup = body([
      { path: 'a', size: 0, chunks: [] },
      { path: 'a', size: 0, chunks: [] },
    ]);
    expect(validateVersionBody(dup)).toEqual({ 'version.files.1.path': ['duplicate path'] });
    for (const p of ['', '/abs', 'a\\b', 'C:/x', 'a//b', './a', 'a/..', 'a\0b']) expect(isSafeRelativePath(p)).toBe(false);
    for (const p of ['a', 'a/b/c.txt', '.hidden', 'dir/...x']) expect(isSafeRelativePath(p)).toBe(true);
  });
});

describe('summarize and distinctChunks', () => {
  it('sums file sizes, counts files and lists each hash once', () => {
    const b = body([
      { path: 'a', size: 3, chunks: [{ hash: H('a'), size: 3 }] },
      { path: 'b', size: 3, chunks: [{ hash: H('a'), size: 3 }] },
      { path: 'c', size: 0, chunks: [] },
    ]);
    expect(summarize(b)).toEqual({ totalSize: 6, totalFiles: 3 });
    expect(distinctChunks(b)).toEqual([{ hash: H('a'), size: 3 }]);
  });
});

describe('chunkTable', () => {
  it('keeps first-use order and counts the files using each chunk', () => {
    const b = body([
      {
        path: 'a',
        size: CHUNK_SIZE + 1,
        chunks: [
          { hash: H('b'), size: CHUNK_SIZE },
          { hash: H('a'), size: 1 },
        ],
      },
      { path: 'b', size: 1, chunks: [{ hash: H('a'), size: 1 }] },
      {
        path: 'c',
        size: CHUNK_SIZE * 2,
        chunks: [
          { hash: H('b'), size: CHUNK_SIZE },
          { hash: H('b'), size: CHUNK_SIZE },
        ],
      },
    ]);
    expect(chunkTable(b)).toEqual({
      refs: [
        { hash: H('b'), size: CHUNK_SIZE, fileCount: 2 },
        { hash: H('a'), size: 1, fileCount: 2 },
      ],
      errors: null,
    });
  });

  it('reports a hash referenced with two sizes at the later reference', () => {
    const b = body([
      { path: 'a', size: 2, chunks: [{ hash: H('a'), size: 2 }] },
      { path: 'b', size: 3, chunks: [{ hash: H('a'), size: 3 }] },
    ]);
    expect(Object.keys(chunkTable(b).errors!)).toEqual(['version.files.1.chunks.0.size']);
  });
});

describe('diffBodies', () => {
  const f = (path: string, ...hashes: [string, number][]) => ({
    path,
    size: hashes.reduce((s, [, n]) => s + n, 0),
    chunks: hashes.map(([c, size]) => ({ hash: H(c), size })),
  });

  it('classifies by path and ordered chunk sequence, sorted by path', () => {
    const from = body([f('z', ['a', 1]), f('same', ['b', 2]), f('gone', ['c', 3]), f('reorder', ['d', 4], ['e', 4]), f('swap', ['f', 5])]);
    const to = body([
      f('same', ['b', 2]),
      f('z', ['a', 1], ['a', 1]),
      f('new', ['g', 7]),
      f('reorder', ['e', 4], ['d', 4]),
      f('swap', ['h', 5]),
    ]);
    const d = diffBodies(from, to);
    expect(d.added).toEqual([{ path: 'new', size: 7, reason: 'added', chunks: 1 }]);
    expect(d.removed).toEqual([{ path: 'gone', size: 3, reason: 'removed', chunks: 1 }]);
    expect(d.modified).toEqual([
      { path: 'reorder', fromSize: 8, toSize: 8, reason: 'content_changed', fromChunks: 2, toChunks: 2 },
      { path: 'swap', fromSize: 5, toSize: 5, reason: 'content_changed', fromChunks: 1, toChunks: 1 },
      { path: 'z', fromSize: 1, toSize: 2, reason: 'size_changed', fromChunks: 1, toChunks: 2 },
    ]);
    expect(d.summary).toEqual({ added: 1, removed: 1, changed: 3, unchanged: 1, hasChanges: true, netBytesDelta: 24 - 19 });
  });

  it('finds nothing between a body and itself', () => {
    const b = body([f('a', ['a', 1]), { path: 'empty', size: 0, chunks: [] }]);
    expect(diffBodies(b, b)).toEqual({
      summary: { added: 0, removed: 0, changed: 0, unchanged: 2, hasChanges: false, netBytesDelta: 0 },
      added: [],
      removed: [],
      modified: [],
    });
  });
});

describe('BodyCache', () => {
  const b = body([{ path: 'x', size: 0, chunks: [] }]);

  it('evicts the least recently used entry beyond the entry bound', () => {
    const c = new BodyCache(2, 1000);
    c.set('a', b, 10);
    c.set('b', b, 10);
    expect(c.get('a')).toBe(b); // a is now most recent
    c.set('c', b, 10);
    expect(c.get('b')).toBeUndefined();
    expect(c.get('a')).toBe(b);
    expect(c.get('c')).toBe(b);
    expect(c.size).toBe(2);
  });

  it('keeps the summed size under the byte bound and skips entries larger than it', () => {
    const c = new BodyCache(10, 100);
    c.set('a', b, 60);
    c.set('b', b, 30);
    c.set('c', b, 30);
    expect(c.get('a')).toBeUndefined();
    expect(c.totalBytes).toBe(60);
    c.set('huge', b, 101);
    expect(c.get('huge')).toBeUndefined();
    c.set('b', b, 40); // replacing an entry accounts its new size
    expect(c.totalBytes).toBe(70);
  });
});
