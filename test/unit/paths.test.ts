/**
 * Windows path rules (domain/paths.ts). The fleet runs NTFS; these tests state, with path.win32 where it
 * helps, what each refused name would mean there. What path.win32 cannot show (trailing dots and spaces
 * dropped by the Win32 layer, device names, alternate data streams) is written down in
 * docs/decisions/windows-paths.md.
 */
import path from 'node:path';
import { collidingPaths, extractRootProblem, extractRootSegments, filePathProblem, segmentProblem, windowsFold } from '../../domain/paths';

describe('file paths', () => {
  test.each([
    'a.txt',
    'dir/sub/file.bin',
    '.hidden',
    'dir/...x',
    'console/x',
    'icon.png',
    'aux1.txt',
    'lpt10',
    'my file.txt',
    'Ünïcödé/файл',
  ])('accepts %j', (p) => {
    expect(filePathProblem(p)).toBeNull();
  });

  test.each([
    ['', /empty/],
    ['/abs', /absolute/],
    ['C:/x', /drive/],
    ['a//b', /empty/],
    ['a/../b', /"\.\."/],
    ['a\\b', /backslash/],
    ['x/C:y', /":"/],
    ['file.txt:ads', /alternate data stream/],
    ['CON', /device/],
    ['aux.txt', /device/],
    ['dir/com1.log', /device/],
    ['LPT9', /device/],
    ['nul.tar.gz', /device/],
    ['con.d/x', /device/],
    ['com¹', /device/],
    ['trailing.', /dot or a space/],
    ['dir /x', /dot or a space/],
    ['a?b', /does not allow/],
    ['a\u0001b', /control/],
    ['x'.repeat(256), /longer than 255/],
  ])('refuses %j', (p, why) => {
    expect(filePathProblem(p)).toMatch(why);
  });

  test('what path.win32 makes of some refused names', () => {
    // A drive-relative segment is a different root on Windows, not a folder.
    expect(path.win32.isAbsolute('C:/x')).toBe(true);
    expect(path.win32.parse('x/C:y').base).toBe('C:y');
    // Backslashes separate on Windows: "a\b" is two segments there, one on Linux.
    expect(path.win32.normalize('a\\b').split('\\')).toEqual(['a', 'b']);
    expect(path.posix.normalize('a\\b').split('/')).toEqual(['a\\b']);
  });
});

describe('collisions within one version', () => {
  test('names that differ only in case, or in trailing dots and spaces, collide', () => {
    expect(collidingPaths(['A.txt', 'b', 'a.txt'])).toEqual([[2, expect.stringMatching(/collides on Windows with "A.txt"/)]]);
    expect(collidingPaths(['Dir/x', 'dir/X'])).toEqual([[1, expect.stringMatching(/"Dir\/x"/)]]);
  });

  test('a file used as a folder by another path (in any case) collides', () => {
    expect(collidingPaths(['tools', 'TOOLS/run.exe'])).toEqual([[1, expect.stringMatching(/is a file/)]]);
    expect(collidingPaths(['tools/run.exe', 'tools'])).toEqual([[1, expect.stringMatching(/collides/)]]);
  });

  test('distinct names pass, and the count is bounded', () => {
    expect(collidingPaths(['a/b', 'a/c', 'ab', 'a.b'])).toEqual([]);
    expect(
      collidingPaths(
        Array.from({ length: 100 }, (_, i) => (i % 2 ? 'X' : 'x')),
        5,
      ),
    ).toHaveLength(5);
  });

  test('folding is what Windows compares', () => {
    expect(windowsFold('State. . ')).toBe('STATE');
    expect(segmentProblem('state.')).toMatch(/dot/);
  });
});

describe('extract roots', () => {
  test.each(['C:\\Program Files\\Acme', 'apps/acme', 'D:/data/roost', 'state-files', 'mystate'])('accepts %j', (r) => {
    expect(extractRootProblem(r)).toBeNull();
  });

  test.each([
    ['state', /agent's own "state"/],
    ['STATE/x', /agent's own "state"/],
    ['chunks', /agent's own "chunks"/],
    ['C:\\Staging\\app', /agent's own "staging"/],
    ['state.', /dot or a space/],
    ['apps\\..\\..\\etc', /"\.\."/],
    ['apps/aux', /device/],
    ['apps/x:y', /":"/],
    ['C:\\', /names no folder/],
  ])('refuses %j', (r, why) => {
    expect(extractRootProblem(r)).toMatch(why);
  });

  test('segments are what the agent places under its machine root', () => {
    expect(extractRootSegments('C:\\Program Files\\Acme\\')).toEqual({ segments: ['Program Files', 'Acme'] });
    const root = 'C:\\ProgramData\\Roost';
    const segs = (extractRootSegments('C:\\Program Files\\Acme') as { segments: string[] }).segments;
    expect(path.win32.join(root, ...segs)).toBe('C:\\ProgramData\\Roost\\Program Files\\Acme');
  });
});
