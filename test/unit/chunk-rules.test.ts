/**
 * Pure chunk rules: the size-conflict errors publish reports (domain/version.ts sizeConflictErrors) and
 * the referrer page position (domain/chunks.ts isReferrerPosition).
 */
import { isReferrerPosition } from '../../domain/chunks';
import { MAX_MISSING_CHUNKS, sizeConflictErrors, VERSION_MEDIA_TYPE, type VersionBody } from '../../domain/version';

const H = (c: string) => c.repeat(64);

function body(files: VersionBody['files']): VersionBody {
  return { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: {}, files };
}

describe('sizeConflictErrors', () => {
  it('keys every reference of a conflicting hash by its dotted path, naming the stored size', () => {
    const b = body([
      { path: 'a', size: 3, chunks: [{ hash: H('a'), size: 3 }] },
      { path: 'b', size: 5, chunks: [{ hash: H('b'), size: 5 }] },
      { path: 'c', size: 3, chunks: [{ hash: H('a'), size: 3 }] },
    ]);
    expect(sizeConflictErrors(b, new Map([[H('a'), 4]]))).toEqual({
      'version.files.0.chunks.0.size': [`chunk ${H('a')} is stored with 4 bytes`],
      'version.files.2.chunks.0.size': [`chunk ${H('a')} is stored with 4 bytes`],
    });
  });

  it('names at most MAX_MISSING_CHUNKS references and nothing without conflicts', () => {
    const files = Array.from({ length: MAX_MISSING_CHUNKS + 5 }, (_, i) => ({
      path: `f${i}`,
      size: 1,
      chunks: [{ hash: H('c'), size: 1 }],
    }));
    expect(Object.keys(sizeConflictErrors(body(files), new Map([[H('c'), 2]])))).toHaveLength(MAX_MISSING_CHUNKS);
    expect(sizeConflictErrors(body(files), new Map())).toEqual({});
  });
});

describe('isReferrerPosition', () => {
  it('accepts [roost key, source, integer, text] only', () => {
    expect(isReferrerPosition(['rst_1', 'mount', 0, 'x'])).toBe(true);
    expect(isReferrerPosition(['rst_1', 'version', 1.5, 'x'])).toBe(false);
    expect(isReferrerPosition(['rst_1', 'version', 1])).toBe(false);
    expect(isReferrerPosition('rst_1')).toBe(false);
    expect(isReferrerPosition([1, 'version', 1, 'x'])).toBe(false);
  });
});
