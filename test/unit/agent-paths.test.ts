/**
 * The agent applies the Windows path rules before it writes (agent/machine-root.ts over domain/paths.ts),
 * exercised with path.win32 as on a fleet machine and with path.posix as on ours.
 */
import path from 'node:path';
import { confined, resolveExtractDir } from '../../agent/machine-root';

const WIN_ROOT = 'C:\\ProgramData\\Roost';

describe('resolveExtractDir', () => {
  test('places a Windows extract root under the machine root (path.win32)', () => {
    expect(resolveExtractDir(WIN_ROOT, 'C:\\Program Files\\Acme', path.win32)).toBe('C:\\ProgramData\\Roost\\Program Files\\Acme');
    expect(resolveExtractDir(WIN_ROOT, 'D:/apps/acme/', path.win32)).toBe('C:\\ProgramData\\Roost\\apps\\acme');
  });

  test('and the same root under a Linux machine root (path.posix)', () => {
    expect(resolveExtractDir('/var/lib/roost', 'C:\\Program Files\\Acme', path.posix)).toBe('/var/lib/roost/Program Files/Acme');
  });

  test.each([
    ['state.', /dot or a space/],
    ['STATE\\x', /agent's own "state"/],
    ['Chunks', /agent's own "chunks"/],
    ['staging', /agent's own "staging"/],
    ['apps\\..\\..\\Windows', /"\.\."/],
    ['apps\\con', /device/],
    ['apps\\x:stream', /":"/],
    ['', /no extract root/],
  ])('refuses %j on both platforms', (root, why) => {
    expect(() => resolveExtractDir(WIN_ROOT, root, path.win32)).toThrow(why);
    expect(() => resolveExtractDir('/var/lib/roost', root, path.posix)).toThrow(why);
  });
});

describe('confined', () => {
  const dir = 'C:\\ProgramData\\Roost\\apps';

  test('joins a version path with Windows separators', () => {
    expect(confined(dir, 'bin/tool.exe', path.win32)).toBe('C:\\ProgramData\\Roost\\apps\\bin\\tool.exe');
  });

  test.each([
    ['bin/../../x', /"\.\."/],
    ['bin\\..\\x', /backslash/],
    ['file.txt:ads', /alternate data stream/],
    ['AUX.log', /device/],
    ['readme. ', /dot or a space/],
    ['C:/Windows/x', /drive/],
  ])('refuses %j', (rel, why) => {
    expect(() => confined(dir, rel, path.win32)).toThrow(why);
  });
});
