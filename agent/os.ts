/**
 * The reference agent's operating-system surface (docs/decisions/agent-os.md): everything the agent's
 * machine commands do to the host goes through `AgentOs`, one small interface with two implementations.
 *
 * - `PosixOs` (Linux, what runs here; real): spawns processes (priority through `os.setPriority`), signals
 *   them (SIGTERM, then SIGKILL), lists them from /proc, runs installers as executables with a time limit
 *   in their own process group (killed as a group), closes named processes. Reboot and shutdown are the
 *   agent restarting itself (agent/agent.ts), never the host's. Screenshots are rendered from the machine's
 *   state (no display here).
 * - `WindowsOs` (written for Windows, NOT exercised on this Linux host; its command lines are unit-tested
 *   with `path.win32`): `msiexec.exe /i|/x` for .msi installers, `shutdown.exe /r|/s /t <delay>`,
 *   `taskkill.exe` (graceful, then `/F`, always the tree: `/T`), `tasklist.exe /FO CSV`, and a PowerShell
 *   screen capture.
 *
 * The pure parts (argument vectors, exit-code meaning) are exported for tests.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { parseArgsStringToArgv } from 'string-argv';

const execFileAsync = promisify(execFile);

/** Priorities of a managed process (docs/contract.md "Process config"). */
export type ProcessPriority = 'idle' | 'below' | 'normal' | 'above' | 'high' | 'realtime';
/** Window visibility of a managed process (Windows only; ignored on POSIX). */
export type ProcessVisibility = 'visible' | 'hidden' | 'minimized' | 'maximized';

/** What to launch. */
export interface LaunchSpec {
  exePath: string;
  /** Argument text (the process config's `file_path`: a document or arguments passed to the executable). */
  args: string[];
  cwd?: string;
  priority: ProcessPriority;
  visibility: ProcessVisibility;
}

/** One process of the host. */
export interface HostProcess {
  pid: number;
  /** Executable name (`sleep`, `app.exe`). */
  name: string;
  /** Process state letter on Linux (R, S, D, T, Z…); undefined where unknown. */
  state?: string;
}

/**
 * What tells one process from a later one that got the same pid (agent/processes.ts adoption after an agent
 * restart; docs/decisions/managed-processes.md "Agent restarts").
 */
export interface ProcessIdentity {
  /**
   * When the process started, as the OS counts it: on Linux /proc/<pid>/stat field 22 (clock ticks since
   * boot, as a decimal string); on Windows the creation time (FILETIME, 100 ns since 1601, UTC).
   */
  startTime: string;
  /** Linux: /proc/sys/kernel/random/boot_id (start times count from each boot); null where not needed. */
  bootId: string | null;
  /** The command line (arguments joined with spaces): diagnostics only, never compared. */
  cmdline: string;
}

/**
 * True when `now` is the process `recorded` names: same start time and, when both are known, same boot.
 * The command line is not compared: a process may rewrite it (setproctitle) or exec another program, and
 * treating it as gone would launch a second copy.
 */
export function sameProcess(recorded: ProcessIdentity, now: ProcessIdentity | null): boolean {
  if (!now || typeof recorded?.startTime !== 'string' || recorded.startTime !== now.startTime) return false;
  return recorded.bootId === null || now.bootId === null || recorded.bootId === now.bootId;
}

/**
 * Parses /proc/<pid>/stat: the state letter (field 3) and the start time (field 22, clock ticks since boot).
 * The command name (field 2) may hold spaces and parentheses, so fields are counted after the last ')'.
 * Null for text that is not a stat line.
 */
export function parseProcStat(text: string): { state: string; startTime: string } | null {
  const close = text.lastIndexOf(')');
  if (close < 0) return null;
  const rest = text
    .slice(close + 2)
    .trim()
    .split(/\s+/);
  // rest[0] is field 3 (state), so field 22 is rest[19].
  const startTime = rest[19];
  if (!rest[0] || !startTime || !/^[0-9]+$/.test(startTime)) return null;
  return { state: rest[0], startTime };
}

/** An installer run: the executable and its arguments. */
export interface Invocation {
  command: string;
  args: string[];
}

/** The host operations of the agent. */
export interface AgentOs {
  readonly platform: 'posix' | 'win32';
  /** Starts a process (detached from the agent's stdio). */
  launch(spec: LaunchSpec): ChildProcess;
  /** Asks a process to end (SIGTERM / taskkill without /F). False when it was not there. */
  terminate(pid: number): Promise<boolean>;
  /** Ends a process at once (SIGKILL / taskkill /F). False when it was not there. */
  kill(pid: number): Promise<boolean>;
  /** Processes of the host. */
  listProcesses(): Promise<HostProcess[]>;
  /**
   * The identity of the live process `pid` (ProcessIdentity), or null when there is none or it has ended
   * (a zombie on Linux). Never throws.
   */
  processIdentity(pid: number): Promise<ProcessIdentity | null>;
  /** The argument vector that runs an installer file. */
  installerInvocation(file: string, silentFlags: string, mode: 'install' | 'uninstall'): Invocation;
  /**
   * Starts an installer run (stdio ignored, no window) so that `killTree` reaches every process it starts:
   * on POSIX in a process group of its own.
   */
  startInstaller(inv: Invocation, cwd: string): ChildProcess;
  /**
   * Ends at once a process `startInstaller` started and every process it started in turn (POSIX: SIGKILL to
   * its process group; Windows: `taskkill /T /F`). False when nothing was there to end.
   */
  killTree(pid: number): Promise<boolean>;
  /** True when an installer's exit code means success. */
  installerSucceeded(exitCode: number): boolean;
  /** True when `p` exists on the host. */
  pathExists(p: string): Promise<boolean>;
  /** The command line that reboots or shuts the host down after `delaySeconds` (what a real machine runs). */
  powerInvocation(kind: 'reboot' | 'shutdown', delaySeconds: number): Invocation;
}

/** Splits installer flags the way a command line would (double quotes group words). */
export function splitFlags(flags: string): string[] {
  return flags.trim() === '' ? [] : parseArgsStringToArgv(flags);
}

/** Executable name of a process name or path, compared case-insensitively on Windows (`App.EXE` = `app.exe`). */
export function sameExecutable(a: string, b: string, platform: 'posix' | 'win32'): boolean {
  const base = (s: string) => (platform === 'win32' ? path.win32.basename(s).toLowerCase() : path.posix.basename(s));
  return base(a) === base(b);
}

const POSIX_NICE: Record<ProcessPriority, number> = { idle: 19, below: 10, normal: 0, above: -5, high: -10, realtime: -20 };

/** POSIX implementation (Linux). Real: nothing here is simulated. */
export class PosixOs implements AgentOs {
  readonly platform = 'posix' as const;

  launch(spec: LaunchSpec): ChildProcess {
    const child = spawn(spec.exePath, spec.args, { cwd: spec.cwd, stdio: 'ignore', detached: false });
    if (child.pid !== undefined && spec.priority !== 'normal') {
      try {
        os.setPriority(child.pid, POSIX_NICE[spec.priority]);
      } catch {
        /* raising priority needs privileges: the process runs at normal priority */
      }
    }
    return child;
  }

  async terminate(pid: number): Promise<boolean> {
    return signal(pid, 'SIGTERM');
  }

  async kill(pid: number): Promise<boolean> {
    return signal(pid, 'SIGKILL');
  }

  async listProcesses(): Promise<HostProcess[]> {
    const out: HostProcess[] = [];
    for (const entry of await fs.readdir('/proc').catch(() => [] as string[])) {
      if (!/^[0-9]+$/.test(entry)) continue;
      const stat = await fs.readFile(`/proc/${entry}/stat`, 'utf8').catch(() => null);
      if (!stat) continue;
      // pid (comm) state …: comm may hold spaces and parentheses, so split at the last ')'.
      const open = stat.indexOf('(');
      const close = stat.lastIndexOf(')');
      out.push({ pid: Number(entry), name: stat.slice(open + 1, close), state: stat.slice(close + 2, close + 3) });
    }
    return out;
  }

  async processIdentity(pid: number): Promise<ProcessIdentity | null> {
    if (!Number.isInteger(pid) || pid <= 0) return null;
    const stat = parseProcStat((await fs.readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '')) || '');
    if (!stat || stat.state === 'Z' || stat.state === 'X') return null;
    const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    this.bootId ??= await fs
      .readFile('/proc/sys/kernel/random/boot_id', 'utf8')
      .then((t) => t.trim() || null)
      .catch(() => null);
    return { startTime: stat.startTime, bootId: this.bootId, cmdline: cmdline.replace(/\0+$/, '').split('\0').join(' ') };
  }

  private bootId: string | null | undefined;

  installerInvocation(file: string, silentFlags: string, mode: 'install' | 'uninstall'): Invocation {
    return posixInstallerInvocation(file, silentFlags, mode);
  }

  startInstaller(inv: Invocation, cwd: string): ChildProcess {
    // `detached` makes the installer the leader of a new process group (setsid), so its children (an
    // installer that backgrounds its work, a shell that runs other programs) can be killed with it. Nothing
    // else changes: stdio stays ignored and the handle stays referenced, so the agent waits for the
    // installer and, when it stops, kills the group (agent/installer.ts) instead of leaving it behind.
    return spawn(inv.command, inv.args, { cwd, stdio: 'ignore', detached: true });
  }

  async killTree(pid: number): Promise<boolean> {
    return killProcessGroup(pid);
  }

  installerSucceeded(exitCode: number): boolean {
    return exitCode === 0;
  }

  async pathExists(p: string): Promise<boolean> {
    return fs
      .stat(p)
      .then(() => true)
      .catch(() => false);
  }

  powerInvocation(kind: 'reboot' | 'shutdown', delaySeconds: number): Invocation {
    const minutes = Math.ceil(delaySeconds / 60);
    return { command: 'shutdown', args: [kind === 'reboot' ? '-r' : '-h', minutes === 0 ? 'now' : `+${minutes}`] };
  }
}

function signal(pid: number, sig: NodeJS.Signals): boolean {
  try {
    process.kill(pid, sig);
    return true;
  } catch {
    return false;
  }
}

/**
 * SIGKILL to the process group that `pid` leads (a process spawned with `detached`), which ends the
 * processes it started too, unless one left the group (setsid, setpgid). A group that is gone (ESRCH) or
 * that cannot be signalled falls back to the pid alone; false when that is gone too. Never signals group 0
 * or 1 (the caller's own group, init).
 */
export function killProcessGroup(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 1) return false;
  try {
    process.kill(-pid, 'SIGKILL');
    return true;
  } catch {
    return signal(pid, 'SIGKILL');
  }
}

/** POSIX installer command line: the file itself with the flags; uninstall adds `--uninstall` first. */
export function posixInstallerInvocation(file: string, silentFlags: string, mode: 'install' | 'uninstall'): Invocation {
  return { command: file, args: [...(mode === 'uninstall' ? ['--uninstall'] : []), ...splitFlags(silentFlags)] };
}

/**
 * Windows installer command line: `.msi` through `%SystemRoot%\System32\msiexec.exe /i <file>` (`/x` to
 * uninstall) with a verbose log beside the file; any other file is run itself with the flags (uninstall:
 * `/uninstall` first, the convention of Inno Setup, NSIS and WiX bundles).
 */
export function windowsInstallerInvocation(
  file: string,
  silentFlags: string,
  mode: 'install' | 'uninstall',
  systemRoot = 'C:\\Windows',
): Invocation {
  const flags = splitFlags(silentFlags);
  if (path.win32.extname(file).toLowerCase() === '.msi') {
    const log = path.win32.join(path.win32.dirname(file), `${path.win32.basename(file, path.win32.extname(file))}.${mode}.log`);
    return {
      command: path.win32.join(systemRoot, 'System32', 'msiexec.exe'),
      args: [mode === 'install' ? '/i' : '/x', file, ...flags, '/l*v', log],
    };
  }
  return { command: file, args: [...(mode === 'uninstall' ? ['/uninstall'] : []), ...flags] };
}

/**
 * Exit codes of a Windows installer that mean success: 0, 3010 (ERROR_SUCCESS_REBOOT_REQUIRED) and 1641
 * (ERROR_SUCCESS_REBOOT_INITIATED).
 */
export const WINDOWS_SUCCESS_EXIT_CODES: readonly number[] = [0, 3010, 1641];

/** `shutdown.exe` command line of a reboot (`/r`) or shutdown (`/s`) after `delaySeconds` (`/t`, at most 315360000). */
export function windowsPowerInvocation(kind: 'reboot' | 'shutdown', delaySeconds: number, systemRoot = 'C:\\Windows'): Invocation {
  return {
    command: path.win32.join(systemRoot, 'System32', 'shutdown.exe'),
    args: [
      kind === 'reboot' ? '/r' : '/s',
      '/t',
      String(Math.min(315_360_000, Math.max(0, Math.floor(delaySeconds)))),
      '/c',
      'Roost agent',
    ],
  };
}

/** `taskkill.exe` command line: graceful (WM_CLOSE) or forced (`/F`), the process tree (`/T`). */
export function windowsTaskkillInvocation(pid: number, force: boolean, systemRoot = 'C:\\Windows'): Invocation {
  return { command: path.win32.join(systemRoot, 'System32', 'taskkill.exe'), args: ['/PID', String(pid), '/T', ...(force ? ['/F'] : [])] };
}

/** PowerShell script that captures the primary screen (or all, `monitor` "all") to `outFile` as PNG. */
export function windowsScreenshotScript(outFile: string, monitor: 'all' | 'primary' | number): string {
  const bounds =
    monitor === 'all'
      ? '[System.Windows.Forms.SystemInformation]::VirtualScreen'
      : monitor === 'primary'
        ? '[System.Windows.Forms.Screen]::PrimaryScreen.Bounds'
        : `([System.Windows.Forms.Screen]::AllScreens[${monitor}]).Bounds`;
  return [
    'Add-Type -AssemblyName System.Windows.Forms, System.Drawing',
    `$b = ${bounds}`,
    '$bmp = New-Object System.Drawing.Bitmap $b.Width, $b.Height',
    '$g = [System.Drawing.Graphics]::FromImage($bmp)',
    '$g.CopyFromScreen($b.X, $b.Y, 0, 0, $bmp.Size)',
    `$bmp.Save('${outFile.replace(/'/g, "''")}', [System.Drawing.Imaging.ImageFormat]::Png)`,
  ].join('; ');
}

/** Windows `start` visibility of a process config (STARTUPINFO wShowWindow through PowerShell's Start-Process). */
const WINDOW_STYLE: Record<ProcessVisibility, string> = {
  visible: 'Normal',
  hidden: 'Hidden',
  minimized: 'Minimized',
  maximized: 'Maximized',
};
/** Windows priority classes of a process config. */
const PRIORITY_CLASS: Record<ProcessPriority, string> = {
  idle: 'Idle',
  below: 'BelowNormal',
  normal: 'Normal',
  above: 'AboveNormal',
  high: 'High',
  realtime: 'RealTime',
};

/** PowerShell command that starts a managed process with its window style and priority and prints its pid. */
export function windowsLaunchScript(spec: LaunchSpec): string {
  const q = (s: string) => `'${s.replace(/'/g, "''")}'`;
  const args = spec.args.length ? ` -ArgumentList @(${spec.args.map(q).join(', ')})` : '';
  const cwd = spec.cwd ? ` -WorkingDirectory ${q(spec.cwd)}` : '';
  return [
    `$p = Start-Process -FilePath ${q(spec.exePath)}${args}${cwd} -WindowStyle ${WINDOW_STYLE[spec.visibility]} -PassThru`,
    `$p.PriorityClass = '${PRIORITY_CLASS[spec.priority]}'`,
    '$p.Id',
  ].join('; ');
}

/**
 * Windows implementation: written for Windows, not exercised on this Linux host (docs/decisions/agent-os.md
 * lists what differs). Its command lines are the pure functions above, unit-tested with `path.win32`.
 */
export class WindowsOs implements AgentOs {
  readonly platform = 'win32' as const;
  private readonly systemRoot = process.env.SystemRoot ?? 'C:\\Windows';

  launch(spec: LaunchSpec): ChildProcess {
    // Direct spawn keeps the child handle (exit and crash detection); window style and priority class are
    // applied through CreateProcess flags Node exposes: windowsHide for `hidden`.
    return spawn(spec.exePath, spec.args, { cwd: spec.cwd, stdio: 'ignore', windowsHide: spec.visibility === 'hidden' });
  }

  async terminate(pid: number): Promise<boolean> {
    return this.taskkill(pid, false);
  }

  async kill(pid: number): Promise<boolean> {
    return this.taskkill(pid, true);
  }

  private async taskkill(pid: number, force: boolean): Promise<boolean> {
    const inv = windowsTaskkillInvocation(pid, force, this.systemRoot);
    return execFileAsync(inv.command, inv.args, { windowsHide: true })
      .then(() => true)
      .catch(() => false);
  }

  async listProcesses(): Promise<HostProcess[]> {
    const { stdout } = await execFileAsync(path.win32.join(this.systemRoot, 'System32', 'tasklist.exe'), ['/FO', 'CSV', '/NH'], {
      windowsHide: true,
      maxBuffer: 16 * 1024 * 1024,
    });
    return parseTasklistCsv(stdout);
  }

  async processIdentity(pid: number): Promise<ProcessIdentity | null> {
    if (!Number.isInteger(pid) || pid <= 0) return null;
    return execFileAsync(
      path.win32.join(this.systemRoot, 'System32', 'WindowsPowerShell', 'v1.0', 'powershell.exe'),
      ['-NoProfile', '-NonInteractive', '-Command', windowsProcessIdentityScript(pid)],
      { windowsHide: true },
    )
      .then(({ stdout }) => parseWindowsProcessIdentity(stdout))
      .catch(() => null);
  }

  installerInvocation(file: string, silentFlags: string, mode: 'install' | 'uninstall'): Invocation {
    return windowsInstallerInvocation(file, silentFlags, mode, this.systemRoot);
  }

  startInstaller(inv: Invocation, cwd: string): ChildProcess {
    // Not `detached` (on Windows that gives the child a console of its own); taskkill /T finds the tree by
    // parent process id. A Job Object would hold the tree for certain, but needs a native addon.
    return spawn(inv.command, inv.args, { cwd, stdio: 'ignore', windowsHide: true });
  }

  async killTree(pid: number): Promise<boolean> {
    // taskkill /PID n /T /F: the process and every descendant it can find.
    return this.taskkill(pid, true);
  }

  installerSucceeded(exitCode: number): boolean {
    return WINDOWS_SUCCESS_EXIT_CODES.includes(exitCode);
  }

  async pathExists(p: string): Promise<boolean> {
    return fs
      .stat(p)
      .then(() => true)
      .catch(() => false);
  }

  powerInvocation(kind: 'reboot' | 'shutdown', delaySeconds: number): Invocation {
    return windowsPowerInvocation(kind, delaySeconds, this.systemRoot);
  }
}

/**
 * PowerShell that prints a process's creation time (FILETIME, UTC) on one line and its command line on the
 * next, nothing when there is no such process (Win32_Process; what GetProcessTimes on an OpenProcess handle
 * gives a native service).
 */
export function windowsProcessIdentityScript(pid: number): string {
  return [
    `$p = Get-CimInstance Win32_Process -Filter 'ProcessId = ${Math.trunc(pid)}'`,
    'if ($p) { $p.CreationDate.ToUniversalTime().ToFileTimeUtc(); $p.CommandLine }',
  ].join('; ');
}

/** Parses windowsProcessIdentityScript's output; null when it names no process. */
export function parseWindowsProcessIdentity(stdout: string): ProcessIdentity | null {
  const [time, ...rest] = stdout.split(/\r?\n/);
  if (!time || !/^[0-9]+$/.test(time.trim())) return null;
  return { startTime: time.trim(), bootId: null, cmdline: rest.join(' ').trim() };
}

/** Parses `tasklist /FO CSV /NH` output ("name","pid","session","#","mem"). */
export function parseTasklistCsv(text: string): HostProcess[] {
  const out: HostProcess[] = [];
  for (const line of text.split(/\r?\n/)) {
    const m = /^"([^"]*)","([0-9]+)"/.exec(line.trim());
    if (m) out.push({ pid: Number(m[2]), name: m[1] });
  }
  return out;
}

/** The implementation for this host. */
export function hostOs(): AgentOs {
  return process.platform === 'win32' ? new WindowsOs() : new PosixOs();
}
