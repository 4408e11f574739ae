/**
 * agent/processes.ts `suppressedBy`: which managed processes a classic install's `suppress_projects` names
 * (names, Windows and POSIX paths, folders).
 */
import { suppressedBy } from '../../agent/processes';

const kiosk = { name: 'Kiosk', exe_path: 'C:\\Apps\\Kiosk\\kiosk.exe', cwd: 'C:\\Apps\\Kiosk' };
const player = { name: 'player', exe_path: '/opt/player/bin/player', cwd: null };

describe('suppressedBy', () => {
  it.each([
    [['kiosk'], kiosk, true],
    [['KIOSK '], kiosk, true],
    [['kiosk.exe'], kiosk, false], // a bare name is the process name, not the executable
    [['C:\\Apps\\Kiosk\\kiosk.exe'], kiosk, true],
    [['c:/apps/kiosk'], kiosk, true],
    [['C:\\Apps\\Kiosk\\'], kiosk, true],
    [['C:\\Apps'], kiosk, true],
    [['C:\\Apps\\Kio'], kiosk, false], // a prefix of a folder name is not the folder
    [['C:\\Other'], kiosk, false],
    [['/opt/player'], player, true],
    [['/opt/player/bin/player'], player, true],
    [['/opt/play'], player, false],
    [['other', 'player'], player, true],
    [[''], player, false],
    [[], player, false],
  ])('%j names %j: %s', (entries, cfg, expected) => {
    expect(suppressedBy(entries, cfg)).toBe(expected);
  });
});
