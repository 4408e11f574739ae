/**
 * Windows path rules (domain/paths.ts). The fleet runs NTFS; these tests state, with path.win32 where it
 * helps, what each refused name would mean there. What path.win32 cannot show (trailing dots and spaces
 * dropped by the Win32 layer, device names, alternate data streams) is written down in
 * docs/decisions/windows-paths.md.
 */
import path from 'node:path';
import {
  ABSOLUTE_PATH_RE,
  EXTRACT_ROOT_RE,
  FILE_NAME_RE,
  absolutePathProblem,
  collidingPaths,
  extractRootProblem,
  extractRootSegments,
  fileNameProblem,
  filePathProblem,
  segmentProblem,
  windowsFold,
} from '../../domain/paths';

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
    // NTFS upper-cases one UTF-16 unit to one unit: full mappings that expand are not applied.
    expect(windowsFold('Straße')).toBe('STRAßE');
    expect(collidingPaths(['Straße.txt', 'STRASSE.txt', 'strasse.txt', 'ﬁle', 'FILE', 'ſ', 'S', 'Ä', 'ä', 'σ', 'Σ'])).toEqual([
      [2, 'collides on Windows with "STRASSE.txt" (names differ only in case)'],
      [6, 'collides on Windows with "ſ" (names differ only in case)'],
      [8, 'collides on Windows with "Ä" (names differ only in case)'],
      [10, 'collides on Windows with "σ" (names differ only in case)'],
    ]);
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

describe('the document patterns state the same rules (EXTRACT_ROOT_RE, FILE_NAME_RE, ABSOLUTE_PATH_RE)', () => {
  // Characters each rule turns on: separators, drive colons, dots and spaces, forbidden and control characters,
  // device and reserved-folder letters (with the non-ASCII ones windowsFold folds to them), superscript digits.
  const ALPHABET = [...'aAcCoOnNuUxXsStTgGiIkKhHlLpP1¹.. //\\\\::<?*"\u0000\u001f\u007fſﬆıKé😀$'];
  const WORDS = ['con', 'CON', 'aux', 'com1', 'LPT¹', 'conin$', 'state', 'ſtate', 'ﬆaging', 'chunKs', 'C:', '..', ' .'];
  // A deterministic generator (mulberry32), so a failure reproduces.
  let seed = 20261124;
  const rand = (n: number) => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return (((t ^ (t >>> 14)) >>> 0) % n) as number;
  };
  const randomPath = () => {
    let s = '';
    const parts = 1 + rand(6);
    for (let i = 0; i < parts; i++) {
      if (rand(3) === 0) s += WORDS[rand(WORDS.length)];
      else if (rand(40) === 0) s += 'x'.repeat(250 + rand(10));
      else for (let n = rand(5); n >= 0; n--) s += ALPHABET[rand(ALPHABET.length)];
    }
    return s;
  };

  test('on 40,000 random strings each pattern accepts exactly what its function accepts', () => {
    const mismatches: string[] = [];
    for (let i = 0; i < 40_000 && mismatches.length < 5; i++) {
      const p = randomPath();
      if (EXTRACT_ROOT_RE.test(p) !== (p === '' || extractRootProblem(p) === null)) mismatches.push(`extract root ${JSON.stringify(p)}`);
      if (FILE_NAME_RE.test(p) !== (fileNameProblem(p) === null)) mismatches.push(`file name ${JSON.stringify(p)}`);
      if (p.length <= 1024 && ABSOLUTE_PATH_RE.test(p) !== (absolutePathProblem(p) === null))
        mismatches.push(`absolute ${JSON.stringify(p)}`);
    }
    expect(mismatches).toEqual([]);
  });

  // ﬆ (U+FB06) upper-cases to two letters, so NTFS keeps it: `ﬆaging` is not the agent's `staging` folder.
  test.each(['', 'apps/x', 'C:\\Program Files\\Acme\\', './a/./b', 'ſtates', 'x/state', 'ﬆaging/x'])(
    'extract root %j is in the pattern',
    (p) => {
      expect(EXTRACT_ROOT_RE.test(p)).toBe(true);
    },
  );
  test.each(['ſtate', 'ſtaging/x', 'a/' + 'x'.repeat(256), 'a/con.txt', 'a/b<c', 'C:', '/', 'a/b.'])('extract root %j is not', (p) => {
    expect(EXTRACT_ROOT_RE.test(p)).toBe(false);
  });
});
