/**
 * The agent's OS surface (agent/os.ts): the Windows command lines (written for Windows, not run here) checked
 * with `path.win32`, the POSIX ones, flag splitting, exit-code meaning and the tasklist parser. The POSIX
 * implementation's process operations are exercised for real by the integration tests.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  PosixOs,
  WINDOWS_SUCCESS_EXIT_CODES,
  WindowsOs,
  killProcessGroup,
  parseProcStat,
  parseTasklistCsv,
  parseWindowsProcessIdentity,
  posixInstallerInvocation,
  sameExecutable,
  sameProcess,
  splitFlags,
  windowsInstallerInvocation,
  windowsLaunchScript,
  windowsPowerInvocation,
  windowsProcessIdentityScript,
  windowsScreenshotScript,
  windowsTaskkillInvocation,
} from '../../agent/os';
import { absolutePathProblem, fileNameProblem } from '../../domain/paths';

describe('Windows command lines', () => {
  const dir = 'C:\\ProgramData\\Roost\\state\\installers\\dep_1\\1';

  it('runs an .msi through msiexec /i (install) and /x (uninstall) with a verbose log beside it', () => {
    const file = path.win32.join(dir, 'Kiosk Setup.MSI');
    const inst = windowsInstallerInvocation(file, '/qn REBOOT=ReallySuppress', 'install');
    expect(inst.command).toBe('C:\\Windows\\System32\\msiexec.exe');
    expect(path.win32.isAbsolute(inst.command)).toBe(true);
    expect(inst.args).toEqual(['/i', file, '/qn', 'REBOOT=ReallySuppress', '/l*v', path.win32.join(dir, 'Kiosk Setup.install.log')]);
    const un = windowsInstallerInvocation(file, '/qn', 'uninstall', 'D:\\WINNT');
    expect(un.command).toBe('D:\\WINNT\\System32\\msiexec.exe');
    expect(un.args.slice(0, 2)).toEqual(['/x', file]);
    expect(path.win32.dirname(un.args[un.args.length - 1])).toBe(dir);
  });

  it('runs an .exe itself, /uninstall first for an uninstall; quoted flags stay one argument', () => {
    const file = path.win32.join(dir, 'setup.exe');
    expect(windowsInstallerInvocation(file, '/S /v"/qn ALLUSERS=1"', 'install')).toEqual({
      command: file,
      args: ['/S', '/v"/qn ALLUSERS=1"'],
    });
    expect(windowsInstallerInvocation(file, '/S', 'uninstall')).toEqual({ command: file, args: ['/uninstall', '/S'] });
    expect(splitFlags('  ')).toEqual([]);
    expect(splitFlags('--dir "C:\\Program Files\\App" -q')).toEqual(['--dir', 'C:\\Program Files\\App', '-q']);
  });

  it('counts 0, 3010 and 1641 as success on Windows, only 0 on POSIX', () => {
    const win = new WindowsOs();
    const posix = new PosixOs();
    expect(WINDOWS_SUCCESS_EXIT_CODES.map((c) => win.installerSucceeded(c))).toEqual([true, true, true]);
    expect(win.installerSucceeded(1603)).toBe(false);
    expect(posix.installerSucceeded(0)).toBe(true);
    expect(posix.installerSucceeded(3010)).toBe(false);
  });

  it('reboots and shuts down through shutdown.exe with the delay, and closes processes through taskkill', () => {
    expect(windowsPowerInvocation('reboot', 90)).toEqual({
      command: 'C:\\Windows\\System32\\shutdown.exe',
      args: ['/r', '/t', '90', '/c', 'Roost agent'],
    });
    expect(windowsPowerInvocation('shutdown', -5).args.slice(0, 3)).toEqual(['/s', '/t', '0']);
    expect(windowsTaskkillInvocation(42, false).args).toEqual(['/PID', '42', '/T']);
    expect(windowsTaskkillInvocation(42, true).args).toEqual(['/PID', '42', '/T', '/F']);
    expect(new PosixOs().powerInvocation('reboot', 0)).toEqual({ command: 'shutdown', args: ['-r', 'now'] });
    expect(new PosixOs().powerInvocation('shutdown', 61)).toEqual({ command: 'shutdown', args: ['-h', '+2'] });
  });

  it('writes the screen capture and launch scripts with quoted paths', () => {
    const out = "C:\\Users\\o'brien\\shot.png";
    const s = windowsScreenshotScript(out, 'primary');
    expect(s).toContain("Save('C:\\Users\\o''brien\\shot.png'");
    expect(s).toContain('PrimaryScreen.Bounds');
    expect(windowsScreenshotScript(out, 1)).toContain('AllScreens[1]');
    const l = windowsLaunchScript({
      exePath: 'C:\\Apps\\kiosk.exe',
      args: ['--full screen'],
      cwd: 'C:\\Apps',
      priority: 'high',
      visibility: 'minimized',
    });
    expect(l).toContain(
      "-FilePath 'C:\\Apps\\kiosk.exe' -ArgumentList @('--full screen') -WorkingDirectory 'C:\\Apps' -WindowStyle Minimized",
    );
    expect(l).toContain("PriorityClass = 'High'");
  });

  it('parses tasklist CSV and compares executable names the Windows way', () => {
    const csv = '"System Idle Process","0","Services","0","8 K"\r\n"Kiosk.EXE","4242","Console","1","20,000 K"\r\n';
    expect(parseTasklistCsv(csv)).toEqual([
      { pid: 0, name: 'System Idle Process' },
      { pid: 4242, name: 'Kiosk.EXE' },
    ]);
    expect(sameExecutable('C:\\Apps\\Kiosk.EXE', 'kiosk.exe', 'win32')).toBe(true);
    expect(sameExecutable('/opt/Kiosk', 'kiosk', 'posix')).toBe(false);
  });
});

describe('POSIX command lines', () => {
  it('runs the installer file itself; --uninstall first for an uninstall', () => {
    expect(posixInstallerInvocation('/tmp/a/setup.sh', '-q', 'install')).toEqual({ command: '/tmp/a/setup.sh', args: ['-q'] });
    expect(posixInstallerInvocation('/tmp/a/setup.sh', '', 'uninstall')).toEqual({ command: '/tmp/a/setup.sh', args: ['--uninstall'] });
  });

  it('starts an installer leading its own process group, which killTree ends; never signals group 0 or 1', async () => {
    const posix = new PosixOs();
    const child = posix.startInstaller({ command: '/bin/sleep', args: ['30'] }, '/');
    const exited = new Promise<NodeJS.Signals | null>((r) => child.once('exit', (_code, sig) => r(sig)));
    const stat = await fs.readFile(`/proc/${child.pid}/stat`, 'utf8');
    // Field 5 (the process group) after the command name: the installer leads its group.
    expect(Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2])).toBe(child.pid);
    await expect(posix.killTree(child.pid!)).resolves.toBe(true);
    expect(await exited).toBe('SIGKILL');
    await expect(posix.killTree(child.pid!)).resolves.toBe(false);
    expect(killProcessGroup(0)).toBe(false);
    expect(killProcessGroup(1)).toBe(false);
    expect(killProcessGroup(-7)).toBe(false);
  });
});

describe('process identity (adoption after an agent restart, agent/processes.ts)', () => {
  const id = (startTime: string, bootId: string | null = 'boot-1') => ({ startTime, bootId, cmdline: '/bin/sleep 60' });

  it('parses /proc/<pid>/stat: state and start time (field 22), a command name with spaces and parentheses included', () => {
    const stat = '4242 (my (odd) app) S 1 4242 4242 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 123456789 5726208 205 18446744073709551615';
    expect(parseProcStat(stat)).toEqual({ state: 'S', startTime: '123456789' });
    expect(parseProcStat('garbage')).toBeNull();
  });

  it('is the same process only with the same start time and boot: a reused pid never matches, whatever its command line', () => {
    expect(sameProcess(id('100'), id('100'))).toBe(true);
    expect(sameProcess(id('100'), { ...id('100'), cmdline: 'nginx: worker process' })).toBe(true);
    expect(sameProcess(id('100'), id('101'))).toBe(false);
    expect(sameProcess(id('100'), id('100', 'boot-2'))).toBe(false);
    expect(sameProcess(id('100'), null)).toBe(false);
    expect(sameProcess(id('133484521234567890', null), id('133484521234567890', null))).toBe(true);
  });

  it('reads a live process on this host, and none once it ended', async () => {
    const posix = new PosixOs();
    const child = spawn('/bin/sleep', ['30'], { stdio: 'ignore' });
    const exited = new Promise((r) => child.once('exit', r));
    const a = await posix.processIdentity(child.pid!);
    expect(a).toMatchObject({ startTime: expect.stringMatching(/^[0-9]+$/), cmdline: '/bin/sleep 30' });
    expect(sameProcess(a!, await posix.processIdentity(child.pid!))).toBe(true);
    expect(sameProcess(a!, await posix.processIdentity(process.pid))).toBe(false);
    child.kill('SIGKILL');
    await exited;
    expect(await posix.processIdentity(child.pid!)).toBeNull();
    expect(await posix.processIdentity(-1)).toBeNull();
  });

  it('reads the Windows creation time through Win32_Process (script and parser; not run here)', () => {
    expect(windowsProcessIdentityScript(4242)).toContain("Win32_Process -Filter 'ProcessId = 4242'");
    expect(windowsProcessIdentityScript(4242)).toContain('ToFileTimeUtc()');
    expect(parseWindowsProcessIdentity('133484521234567890\r\n"C:\\Apps\\kiosk.exe" --full\r\n')).toEqual({
      startTime: '133484521234567890',
      bootId: null,
      cmdline: '"C:\\Apps\\kiosk.exe" --full',
    });
    expect(parseWindowsProcessIdentity('')).toBeNull();
  });
});

describe('machine path rules (domain/paths.ts)', () => {
  it.each(['C:\\Program Files\\App\\app.exe', 'c:/apps/app.exe', '\\\\fileserver\\share\\app.exe', '/usr/bin/sleep'])('accepts %s', (p) => {
    expect(absolutePathProblem(p)).toBeNull();
    if (!p.startsWith('/')) expect(path.win32.isAbsolute(p)).toBe(true);
  });
  it.each(['app.exe', 'C:app.exe', '\\app.exe', '//double', 'C:\\a\\b:stream', 'C:\\a|b', ''])('refuses %s', (p) => {
    expect(absolutePathProblem(p)).not.toBeNull();
  });
  it('takes bare Windows-safe file names only', () => {
    expect(fileNameProblem('setup.msi')).toBeNull();
    expect(fileNameProblem('..\\setup.msi')).not.toBeNull();
    expect(fileNameProblem('a/b.exe')).not.toBeNull();
    expect(fileNameProblem('CON.exe')).not.toBeNull();
  });
});
