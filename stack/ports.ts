/**
 * Ports and processes of the embedded default's services (stack/services.ts, stack/postgres.ts): whether
 * something listens on a port, a free port, which local process runs with given arguments, and the error
 * that names a port held by something other than this clone's own service (another clone's PostgreSQL,
 * Azurite, Temporal or Redis, or any other program), with the setting that moves it.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { type ChildProcess, spawnSync } from 'node:child_process';

/** A running embedded service as seen by the process that ensured it. */
export interface ServiceHandle {
  name: string;
  /** true when this process started it (and so stops it). */
  started: boolean;
  /** Whether the service is still running (services this process started; absent for reused ones). */
  running?(): boolean;
  /** Process id of the service when this process started it (benchmarks read its CPU time from /proc). */
  pid?: number;
  stop(): Promise<void>;
}

/**
 * Resolves when something accepts TCP connections on host:port.
 * @throws Error after `timeoutMs` milliseconds, or as soon as `proc` (the process expected to listen) exits.
 */
export async function waitForPort(port: number, host = '127.0.0.1', timeoutMs = 60_000, proc?: ChildProcess): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc && proc.exitCode !== null) throw new Error(`process exited with code ${proc.exitCode} before listening on ${port}`);
    if (await isListening(port, host)) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`nothing listening on ${host}:${port} after ${timeoutMs} ms`);
}

/**
 * The range the kernel hands out for port 0 and for outgoing connections (Linux:
 * /proc/sys/net/ipv4/ip_local_port_range; elsewhere the IANA dynamic range 49152–65535).
 */
export function ephemeralPortRange(): [number, number] {
  try {
    const [lo, hi] = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (Number.isInteger(lo) && Number.isInteger(hi) && lo > 0 && hi >= lo) return [lo, hi];
  } catch {
    // not Linux: fall through
  }
  return [49152, 65535];
}

/** Binds host:port and closes it again: resolves true when the bind succeeded. */
function canBind(port: number, host: string): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen({ port, host, exclusive: true }, () => srv.close(() => resolve(true)));
  });
}

/**
 * A TCP port on 127.0.0.1 that nothing listens on right now, chosen outside the kernel's ephemeral range
 * (ephemeralPortRange) so that a port picked now and bound seconds later by a service we start cannot
 * meanwhile become the source port of some outgoing connection or another process's port-0 listener
 * (the Temporal dev server, for one, binds several port-0 listeners of its own). Falls back to a
 * kernel-chosen port when 200 random candidates are all taken.
 */
export async function freePort(): Promise<number> {
  const [lo, hi] = ephemeralPortRange();
  const below: [number, number] = [10_000, lo - 1];
  const above: [number, number] = [hi + 1, 65_535];
  const span = below[1] - below[0] >= above[1] - above[0] ? below : above;
  if (span[1] - span[0] >= 100) {
    for (let i = 0; i < 200; i++) {
      const port = span[0] + Math.floor(Math.random() * (span[1] - span[0] + 1));
      if (await canBind(port, '127.0.0.1')) return port;
    }
  }
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no free port'))));
    });
  });
}

/** `count` distinct free TCP ports on 127.0.0.1 (see freePort), none of them in `avoid`. */
export async function freePorts(count: number, avoid: number[] = []): Promise<number[]> {
  const out: number[] = [];
  while (out.length < count) {
    const p = await freePort();
    if (!out.includes(p) && !avoid.includes(p)) out.push(p);
  }
  return out;
}

/** One TCP connect attempt to host:port (1 s timeout): true when something accepted it. */
export function isListening(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ port, host });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
    s.setTimeout(1000, () => {
      s.destroy();
      resolve(false);
    });
  });
}

/** One local process: its id and its arguments, program first. */
export interface ProcessInfo {
  pid: number;
  argv: string[];
}

/**
 * Every process this user can see, with its arguments: from /proc on Linux (exact arguments), else from
 * `ps` (arguments split on spaces, so a path with spaces appears in pieces). Empty when neither works.
 */
export function listProcesses(): ProcessInfo[] {
  if (fs.existsSync('/proc/self/cmdline')) {
    const out: ProcessInfo[] = [];
    for (const name of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(name)) continue;
      try {
        const raw = fs.readFileSync(`/proc/${name}/cmdline`, 'utf8');
        if (raw) out.push({ pid: Number(name), argv: raw.replace(/\0$/, '').split('\0') });
      } catch {
        /* the process ended meanwhile, or is hidden from this user */
      }
    }
    return out;
  }
  const ps = spawnSync('ps', ['-ww', '-eo', 'pid=,args='], { encoding: 'utf8' });
  if (ps.status !== 0) return [];
  return ps.stdout
    .split('\n')
    .map((l) => l.trim().split(/\s+/))
    .filter((f) => f.length > 1 && /^\d+$/.test(f[0]))
    .map((f) => ({ pid: Number(f[0]), argv: f.slice(1) }));
}

/** True when `argv` holds `flag value` (two arguments) or `flag=value`. */
export function hasArg(argv: string[], flag: string, value: string): boolean {
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === flag && argv[i + 1] === value) return true;
    if (argv[i] === `${flag}=${value}`) return true;
  }
  return false;
}

/** True when a process with this id exists (whoever owns it). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * A short description of the local process that appears to serve `port` (an argument naming the port after
 * a port flag, or ending in `:port` as Redis's process title does), for error messages; undefined when
 * none is visible.
 */
export function describePortHolder(port: number): string | undefined {
  const p = String(port);
  const flags = ['--port', '-p', '--blobPort', '--ui-port', '--http-port'];
  for (const proc of listProcesses()) {
    if (proc.pid === process.pid) continue;
    const argv = proc.argv;
    const hit =
      flags.some((f) => hasArg(argv, f, p)) ||
      argv.some((a) => a.endsWith(`:${p}`) || (a.includes(' ') && a.split(' ').some((w) => w.endsWith(`:${p}`))));
    if (hit) {
      // The folder a service keeps its state in says whose it is (another clone's data folder, typically).
      for (const flag of ['-D', '--location', '--db-filename', '--dir']) {
        const i = argv.indexOf(flag);
        if (i >= 0 && argv[i + 1]) {
          const program = path.basename(argv[0].split(' ')[0]);
          const main = program === 'node' && argv[1] ? ` ${argv[1].split('/node_modules/').pop()}` : '';
          return `pid ${proc.pid} (${program}${main} ${flag} ${argv[i + 1]})`;
        }
      }
      const cmd = argv.join(' ');
      return `pid ${proc.pid} (${cmd.length > 120 ? `${cmd.slice(0, 117)}…` : cmd})`;
    }
  }
  return undefined;
}

/** One embedded service's port that something other than this clone's own service holds. */
export interface PortConflict {
  /** Service name for people: PostgreSQL, Azurite, Temporal, Temporal Web UI, Redis. */
  service: string;
  port: number;
  /** The setting that moves it (ROOST_PG_PORT, …). */
  setting: string;
  /** What holds it (describePortHolder), when visible. */
  holder?: string;
}

/**
 * Thrown before anything starts when one or more of the embedded services' ports are held by something
 * that is not this data folder's service: reusing it would let another clone's processes serve this one.
 * The message names each port, its holder and the setting that moves it, with free ports to use.
 */
export class PortInUseError extends Error {
  constructor(
    readonly conflicts: PortConflict[],
    suggestions: number[],
  ) {
    const lines = conflicts.map(
      (c) => `port ${c.port} (${c.setting}) is in use by ${c.holder ?? 'another program'}, not by this clone's ${c.service}`,
    );
    const fix = conflicts.map((c, i) => `${c.setting}=${suggestions[i] ?? '<free port>'}`).join(' ');
    super(`${lines.join('; ')}: ${conflicts.length > 1 ? 'set these to free ports' : 'set it to a free port'}, e.g. ${fix}`);
    this.name = 'PortInUseError';
  }

  /** Builds the error with a free port suggested for each conflict. */
  static async of(conflicts: PortConflict[]): Promise<PortInUseError> {
    return new PortInUseError(conflicts, await freePorts(conflicts.length));
  }
}
