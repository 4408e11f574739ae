/**
 * The embedded PostgreSQL of the local default (docs/decisions/local-services.md): one private cluster per
 * data folder, on ROOST_PG_PORT, trust auth on 127.0.0.1 only, TCP only, with a `roost` role and the
 * configured database.
 *
 * - Binaries: ROOST_PG_BIN, else `pg_config --bindir`, else the newest /usr/lib/postgresql/N/bin; PostgreSQL
 *   15 or newer. An existing cluster is started by binaries of the major version that created it.
 * - Who runs them: this user; as root, the `postgres` user (PostgreSQL refuses to run as root).
 * - Where the cluster lives: DATA/pg. As root, when the postgres user cannot reach DATA (a clone under
 *   /root or in a `mktemp -d` folder: a parent folder is 0700), in
 *   `<postgres's home>/roost-clusters/<project path>-<hash>/cluster` instead, with DATA/pg a symbolic link to
 *   it and the server log beside it. Such a cluster goes with its data folder: every start as root removes
 *   the clusters whose data folder no longer links to them (removeOrphanClusters).
 * - Reuse: a server already on the port is reused only when it is this data folder's own cluster (its
 *   postmaster.pid); anything else on the port stops the start at once with PortInUseError.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import type { Config } from '../config/env';
import { describePortHolder, isListening, PortInUseError, processAlive, type ServiceHandle, waitForPort } from './ports';

/** Oldest PostgreSQL major version the migrations are written for. */
export const MIN_PG_MAJOR = 15;

/** One installation of PostgreSQL's server binaries. */
export interface PgInstall {
  /** Folder holding postgres, initdb and pg_ctl. */
  bin: string;
  /** Major version (15, 16, 17, …). */
  major: number;
  /** `postgres --version` output, for messages. */
  version: string;
}

function isRoot(): boolean {
  return typeof process.getuid === 'function' && process.getuid() === 0;
}

function isExecutable(p: string): boolean {
  try {
    fs.accessSync(p, fs.constants.X_OK);
    return fs.statSync(p).isFile();
  } catch {
    return false;
  }
}

function hasServerBinaries(dir: string): boolean {
  return ['postgres', 'initdb', 'pg_ctl'].every((b) => isExecutable(path.join(dir, b)));
}

const versions = new Map<string, { major: number; version: string } | null>();

/** Major version of the server binaries in `bin` (`postgres --version`, which also runs as root); undefined when it does not run. */
function serverVersion(bin: string): { major: number; version: string } | undefined {
  if (!versions.has(bin)) {
    const r = spawnSync(path.join(bin, 'postgres'), ['--version'], { encoding: 'utf8', cwd: '/' });
    const m = r.status === 0 ? /\(PostgreSQL\)\s+(\d+)(?:\.\d+)*/.exec(r.stdout) : null;
    versions.set(bin, m ? { major: Number(m[1]), version: r.stdout.trim() } : null);
  }
  return versions.get(bin) ?? undefined;
}

/** Candidate bin folders in order: `pg_config --bindir`, then `searchRoot`/N/bin from the newest N; only folders with the server binaries. */
function discoveredBins(env: NodeJS.ProcessEnv, searchRoot: string): string[] {
  const dirs: string[] = [];
  const pc = spawnSync('pg_config', ['--bindir'], { encoding: 'utf8', cwd: '/', env });
  if (pc.status === 0 && pc.stdout.trim()) dirs.push(pc.stdout.trim());
  let installed: string[] = [];
  try {
    installed = fs.readdirSync(searchRoot).filter((v) => /^\d+(\.\d+)?$/.test(v));
  } catch {
    /* no Debian-style installation */
  }
  for (const v of installed.sort((a, b) => Number(b) - Number(a))) dirs.push(path.join(searchRoot, v, 'bin'));
  const seen = new Set<string>();
  return dirs.filter((d) => {
    const real = fs.existsSync(d) ? fs.realpathSync(d) : d;
    if (seen.has(real) || !hasServerBinaries(d)) return false;
    seen.add(real);
    return true;
  });
}

const MISSING_SERVER =
  'PostgreSQL server binaries not found (looked at ROOST_PG_BIN, `pg_config --bindir`, /usr/lib/postgresql/*/bin): ' +
  'install the PostgreSQL 15, 16 or 17 server (Debian/Ubuntu: `apt-get install postgresql-15`, which `npm run demo` and `npm test` do by themselves as root), ' +
  'or set ROOST_PG_BIN to the folder holding postgres, initdb and pg_ctl, or DATABASE_URL to use a server of your own';

/** What findPostgres looks for beyond the environment. */
export interface FindPostgresOptions {
  /** An existing cluster (its PG_VERSION and data directory): only binaries of that major version start it. */
  cluster?: { major: number; dir: string };
  /** Where Debian-style installations live (`N/bin` under it); /usr/lib/postgresql unless a test says otherwise. */
  searchRoot?: string;
}

/**
 * Finds PostgreSQL's server binaries: ROOST_PG_BIN when set, else `pg_config --bindir` (pg_config looked up
 * on env.PATH), else the newest /usr/lib/postgresql/N/bin; the first of version 15 or newer. For an existing
 * cluster, the first of exactly its major version, since a cluster only starts under it.
 * @throws Error with one line naming what to install or set when nothing fits.
 */
export function findPostgres(env: NodeJS.ProcessEnv = process.env, opts: FindPostgresOptions = {}): PgInstall {
  const explicit = env.ROOST_PG_BIN;
  if (explicit && !hasServerBinaries(explicit))
    throw new Error(`ROOST_PG_BIN=${explicit} does not hold PostgreSQL's server binaries (postgres, initdb, pg_ctl)`);
  const installs: PgInstall[] = [];
  for (const bin of explicit ? [explicit] : discoveredBins(env, opts.searchRoot ?? '/usr/lib/postgresql')) {
    const v = serverVersion(bin);
    if (v) installs.push({ bin, ...v });
  }
  if (installs.length === 0) throw new Error(MISSING_SERVER);
  const found = installs.map((i) => `${i.major} (${i.bin})`).join(', ');
  if (opts.cluster) {
    const { major, dir } = opts.cluster;
    const match = installs.find((i) => i.major === major);
    if (match) return match;
    throw new Error(
      `the embedded cluster ${dir} was created by PostgreSQL ${major} and the server binaries found are ${found}: ` +
        `install postgresql-${major} or set ROOST_PG_BIN to its bin folder, or delete ${dir} (the database is recreated empty)`,
    );
  }
  const fit = installs.find((i) => i.major >= MIN_PG_MAJOR);
  if (fit) return fit;
  throw new Error(
    `PostgreSQL ${found} is too old: Roost needs ${MIN_PG_MAJOR} or newer; install postgresql-15, -16 or -17 or set ROOST_PG_BIN`,
  );
}

/** psql: the one beside the server binaries, else the first on PATH (any version talks to the server). */
let psqlPath: string | undefined;
function psqlBinary(): string {
  if (psqlPath === undefined) {
    psqlPath = 'psql';
    try {
      const p = path.join(findPostgres().bin, 'psql');
      if (isExecutable(p)) psqlPath = p;
    } catch {
      /* no server binaries here: the client alone may still be installed */
    }
  }
  return psqlPath;
}

/** Runs a server binary of `install` (as the postgres user when we are root) from `/`, so the caller's folder need not be reachable. */
function runPg(install: PgInstall, bin: string, args: string[], opts: { allowFail?: boolean } = {}): string {
  const exe = path.join(install.bin, bin);
  const [cmd, argv] = isRoot() ? ['runuser', ['-u', 'postgres', '--', exe, ...args]] : [exe, args];
  const r = spawnSync(cmd, argv, { encoding: 'utf8', cwd: '/' });
  if (r.error) throw new Error(`${cmd}: ${r.error.message}`);
  if (r.status !== 0 && !opts.allowFail) throw new Error(`${bin} ${args.join(' ')} failed: ${(r.stderr || r.stdout).trim()}`);
  return r.stdout;
}

/** Runs one SQL statement on the embedded cluster's `postgres` database over TCP; returns psql's unaligned output. */
function psql(port: number, sql: string): string {
  const args = ['-X', '-h', '127.0.0.1', '-p', String(port), '-U', 'postgres', '-d', 'postgres', '-v', 'ON_ERROR_STOP=1', '-tAc', sql];
  const r = spawnSync(psqlBinary(), args, { encoding: 'utf8', cwd: '/' });
  if (r.error) throw new Error(`psql: ${r.error.message} (install the PostgreSQL client, e.g. postgresql-client-15)`);
  if (r.status !== 0) throw new Error(`psql ${sql} failed: ${(r.stderr || r.stdout).trim()}`);
  return r.stdout;
}

/** Home folder of the `postgres` user (from the user database), or undefined when there is no such user. */
function postgresHome(): string | undefined {
  const r = spawnSync('getent', ['passwd', 'postgres'], { encoding: 'utf8' });
  if (r.status === 0) return r.stdout.trim().split(':')[5] || undefined;
  try {
    const line = fs
      .readFileSync('/etc/passwd', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('postgres:'));
    return line?.split(':')[5] || undefined;
  } catch {
    return undefined;
  }
}

/** Folder holding the clusters of data folders the postgres user cannot reach: `<postgres's home>/roost-clusters`. */
export function externalClustersRoot(): string {
  return path.join(postgresHome() ?? '/var/lib/postgresql', 'roost-clusters');
}

/**
 * The folder of `dataDir`'s cluster when it must live outside it: named after the data folder's path (its
 * last 48 characters, non-alphanumerics as `-`) plus 10 hex digits of the path's SHA-256, so two clones
 * never share one. It holds `cluster/` (the PostgreSQL data directory), `postgres.log` and `data-folder`.
 */
export function externalClusterFolder(dataDir: string): string {
  const abs = path.resolve(dataDir);
  const slug =
    abs
      .replace(/[^A-Za-z0-9]+/g, '-')
      .slice(-48)
      .replace(/^-+|-+$/g, '') || 'root';
  return path.join(externalClustersRoot(), `${slug}-${createHash('sha256').update(abs).digest('hex').slice(0, 10)}`);
}

/** Where a data folder's cluster and its server log are. */
interface ClusterPlace {
  /** The PostgreSQL data directory. */
  dir: string;
  log: string;
  /** Set when the cluster lives outside the data folder (externalClusterFolder). */
  folder?: string;
}

/** The data folder recorded in an external cluster folder, or undefined. */
function ownerOf(folder: string): string | undefined {
  try {
    return fs.readFileSync(path.join(folder, 'data-folder'), 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

/** Where `dataDir/pg` points when it is a symbolic link, else undefined. */
function linkTarget(dataDir: string): string | undefined {
  const link = path.join(dataDir, 'pg');
  try {
    return fs.lstatSync(link).isSymbolicLink() ? path.resolve(dataDir, fs.readlinkSync(link)) : undefined;
  } catch {
    return undefined;
  }
}

/** The data directory of this data folder's cluster as it stands (DATA/pg or the folder it links to); creates nothing. */
export function clusterDir(cfg: Pick<Config, 'ROOST_DATA_DIR'>): string {
  const data = path.resolve(cfg.ROOST_DATA_DIR);
  return linkTarget(data) ?? path.join(data, 'pg');
}

/** The postmaster of the cluster in `dir` when it runs: its process id and port (from postmaster.pid). */
export function runningPostmaster(dir: string): { pid: number; port: number } | undefined {
  let lines: string[];
  try {
    lines = fs.readFileSync(path.join(dir, 'postmaster.pid'), 'utf8').split('\n');
  } catch {
    return undefined;
  }
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || pid <= 0 || !processAlive(pid)) return undefined;
  try {
    // A stale postmaster.pid whose process id now belongs to another program (after a reboot).
    if (!fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('postgres')) return undefined;
  } catch {
    /* no /proc here: trust the live process id */
  }
  return { pid, port };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Stops the server of an external cluster folder if it runs (fast shutdown, then immediate), then deletes the folder. */
async function removeClusterFolder(folder: string): Promise<void> {
  const running = runningPostmaster(path.join(folder, 'cluster'));
  if (running) {
    const signal = (sig: NodeJS.Signals) => {
      try {
        process.kill(running.pid, sig);
      } catch {
        /* already gone */
      }
    };
    signal('SIGINT');
    for (let i = 0; i < 100 && processAlive(running.pid); i++) await sleep(100);
    if (processAlive(running.pid)) signal('SIGQUIT');
    for (let i = 0; i < 50 && processAlive(running.pid); i++) await sleep(100);
  }
  fs.rmSync(folder, { recursive: true, force: true });
}

/**
 * Removes every cluster under externalClustersRoot() whose data folder no longer links to it (the data
 * folder, or the clone, was deleted), stopping its server first. Folders still without a `data-folder` file
 * are left alone for 10 minutes (a start may be setting them up). Root only; returns the folders removed.
 */
export async function removeOrphanClusters(): Promise<string[]> {
  const root = externalClustersRoot();
  const removed: string[] = [];
  let names: string[];
  try {
    names = fs.readdirSync(root);
  } catch {
    return removed;
  }
  for (const name of names) {
    const folder = path.join(root, name);
    try {
      const owner = ownerOf(folder);
      if (owner === undefined) {
        if (Date.now() - fs.statSync(folder).mtimeMs < 10 * 60_000) continue;
      } else if (linkTarget(owner) === path.join(folder, 'cluster')) continue;
      await removeClusterFolder(folder);
      removed.push(folder);
    } catch {
      /* one unreadable folder does not stop the others */
    }
  }
  return removed;
}

/** True when the postgres user can enter `dir` (every folder above it included). */
function postgresCanEnter(dir: string): boolean {
  return spawnSync('runuser', ['-u', 'postgres', '--', 'test', '-x', dir], { cwd: '/' }).status === 0;
}

function chownToPostgres(p: string, recursive = false): void {
  const r = spawnSync('chown', [...(recursive ? ['-R'] : []), 'postgres:postgres', p]);
  if (r.status !== 0) throw new Error(`chown postgres ${p} failed: ${String(r.stderr)}`);
}

/**
 * Creates (when missing) an external cluster folder owned by the postgres user (0700), links DATA/pg to its
 * `cluster/` and then records the data folder in it: in that order, so removeOrphanClusters in another
 * process never sees a recorded folder without its link.
 */
function makeExternalFolder(folder: string, dataDir: string): ClusterPlace {
  const root = path.dirname(folder);
  if (!fs.existsSync(root)) {
    fs.mkdirSync(root, { recursive: true });
    chownToPostgres(root);
  }
  if (!fs.existsSync(folder)) {
    fs.mkdirSync(folder, { mode: 0o700 });
    chownToPostgres(folder);
  }
  const place: ClusterPlace = { dir: path.join(folder, 'cluster'), log: path.join(folder, 'postgres.log'), folder };
  const link = path.join(dataDir, 'pg');
  if (linkTarget(dataDir) !== place.dir) {
    fs.rmSync(link, { force: true });
    fs.symlinkSync(place.dir, link);
  }
  if (ownerOf(folder) !== dataDir) fs.writeFileSync(path.join(folder, 'data-folder'), `${dataDir}\n`);
  return place;
}

/**
 * Decides where `dataDir`'s cluster lives (see the file comment) and prepares the folders, without
 * running initdb. As root: DATA/pg when the postgres user can enter DATA and DATA/logs, else an external
 * folder linked from DATA/pg. A DATA/pg link copied from another clone's data folder (its folder records
 * a data folder that still links to it) is replaced, so two clones never share a cluster.
 * @throws Error when root has no `postgres` user, or an existing cluster in DATA/pg is out of its reach.
 */
async function placeCluster(dataDir: string): Promise<ClusterPlace> {
  const link = path.join(dataDir, 'pg');
  const logs = path.join(dataDir, 'logs');
  fs.mkdirSync(logs, { recursive: true });
  const inPlace: ClusterPlace = { dir: link, log: path.join(logs, 'postgres.log') };
  if (!isRoot()) return inPlace;
  if (postgresHome() === undefined)
    throw new Error(
      'running as root, the embedded PostgreSQL runs as the `postgres` user (it refuses root), and there is none: ' +
        'install the postgresql-15 (or -16, -17) package, which creates it, or `useradd --system --create-home --home-dir /var/lib/postgresql postgres`',
    );
  const target = linkTarget(dataDir);
  if (target !== undefined) {
    const folder = path.dirname(target);
    const owner = ownerOf(folder);
    if (owner === undefined || owner === dataDir) return makeExternalFolder(folder, dataDir);
    // The folder records another data folder: left behind when this clone was moved (that folder no
    // longer links to it: adopt it), or copied along with another clone's data folder (make our own).
    if (linkTarget(owner) !== target) return makeExternalFolder(folder, dataDir);
    fs.unlinkSync(link);
  }
  if (postgresCanEnter(dataDir) && postgresCanEnter(logs)) return inPlace;
  if (fs.existsSync(path.join(link, 'PG_VERSION')))
    throw new Error(
      `the postgres user cannot reach the cluster in ${link} (a folder above it is closed to others, e.g. 0700): ` +
        `delete ${link} to have it recreated where that user can reach it, or move the clone to a folder others may enter`,
    );
  fs.rmSync(link, { recursive: true, force: true }); // nothing, or an unfinished initdb: no data in it
  const folder = externalClusterFolder(dataDir);
  // A cluster left at this path by an earlier data folder went with that folder.
  if (fs.existsSync(folder)) await removeClusterFolder(folder);
  return makeExternalFolder(folder, dataDir);
}

/** Runs initdb in `place.dir` unless it already holds a cluster; returns the binaries that match the cluster. */
function initCluster(place: ClusterPlace): PgInstall {
  const versionFile = path.join(place.dir, 'PG_VERSION');
  if (fs.existsSync(versionFile))
    return findPostgres(process.env, { cluster: { major: Number(fs.readFileSync(versionFile, 'utf8').trim()), dir: place.dir } });
  const install = findPostgres(process.env);
  fs.mkdirSync(place.dir, { recursive: true, mode: 0o700 });
  if (isRoot()) chownToPostgres(place.dir, true);
  runPg(install, 'initdb', ['-D', place.dir, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--locale=C.UTF-8']);
  // TCP on 127.0.0.1 only: no Unix socket, whose path inside a deep clone would exceed the 107-byte limit.
  fs.appendFileSync(
    path.join(place.dir, 'postgresql.conf'),
    `\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 300\nshared_buffers = 256MB\n`,
  );
  return install;
}

/** The last lines of a log file, for error messages ('' when unreadable). */
function tail(file: string, lines = 15): string {
  try {
    return fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

/**
 * Starts (initialising on first use) this data folder's PostgreSQL cluster on ROOST_PG_PORT and makes sure
 * the `roost` role and ROOST_PG_DATABASE exist. Reuses the cluster's own server when it already runs there.
 * @throws PortInUseError when something else holds the port; Error naming what to install when the server
 *   binaries are missing, or with the server log's tail when it does not start.
 */
export async function ensurePostgres(cfg: Config): Promise<ServiceHandle> {
  const port = cfg.ROOST_PG_PORT;
  const data = path.resolve(cfg.ROOST_DATA_DIR);
  fs.mkdirSync(data, { recursive: true });
  const place = await placeCluster(data);
  if (isRoot()) await removeOrphanClusters();
  const running = runningPostmaster(place.dir);
  if (running && running.port !== port)
    throw new Error(
      `this clone's PostgreSQL (${place.dir}) already runs on port ${running.port}, not on ROOST_PG_PORT=${port}: set ROOST_PG_PORT=${running.port} or stop it first`,
    );
  let install: PgInstall | undefined;
  let started = false;
  if (!running) {
    if (await isListening(port))
      throw await PortInUseError.of([{ service: 'PostgreSQL', port, setting: 'ROOST_PG_PORT', holder: describePortHolder(port) }]);
    install = initCluster(place);
    fs.writeFileSync(place.log, '');
    if (isRoot()) chownToPostgres(place.log);
    try {
      // jit=off: JIT compiled a rollout's reconcile statements for 144 ms a pass that ran in milliseconds
      // (docs/benchmarks.md "The long-poll check"); a start option, so clusters made before it get it too.
      runPg(install, 'pg_ctl', ['-D', place.dir, '-l', place.log, '-o', `-p ${port} -c jit=off`, '-w', '-t', '60', 'start']);
      started = true;
    } catch (err) {
      // Another process of this clone may have started it meanwhile (two commands at once).
      if (runningPostmaster(place.dir)?.port !== port)
        throw new Error(`${(err as Error).message}\n${place.log}:\n${tail(place.log)}`, { cause: err });
    }
  }
  await waitForPort(port);
  if (!psql(port, `SELECT 1 FROM pg_roles WHERE rolname = 'roost'`).includes('1')) psql(port, `CREATE ROLE roost LOGIN SUPERUSER`);
  const db = cfg.ROOST_PG_DATABASE;
  if (!psql(port, `SELECT 1 FROM pg_database WHERE datname = '${db}'`).includes('1')) psql(port, `CREATE DATABASE "${db}" OWNER roost`);
  return {
    name: 'postgres',
    started,
    running: () => runningPostmaster(place.dir) !== undefined,
    async stop() {
      if (started && install) runPg(install, 'pg_ctl', ['-D', place.dir, '-m', 'fast', '-w', 'stop'], { allowFail: true });
    },
  };
}

/** True when the embedded PostgreSQL serving `cfg.ROOST_PG_PORT` is this data folder's own cluster. */
export function postgresIsOurs(cfg: Pick<Config, 'ROOST_DATA_DIR' | 'ROOST_PG_PORT'>): boolean {
  return runningPostmaster(clusterDir(cfg))?.port === cfg.ROOST_PG_PORT;
}

/** Creates a database on the embedded cluster if missing (tests use one per run); `dropFirst` drops it first. */
export function createDatabase(cfg: Config, name: string, dropFirst = false): void {
  if (dropFirst) psql(cfg.ROOST_PG_PORT, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
  if (!psql(cfg.ROOST_PG_PORT, `SELECT 1 FROM pg_database WHERE datname = '${name}'`).includes('1'))
    psql(cfg.ROOST_PG_PORT, `CREATE DATABASE "${name}" OWNER roost`);
}

/** Drops a database on the embedded cluster (test runs clean up their own). */
export function dropDatabase(cfg: Config, name: string): void {
  psql(cfg.ROOST_PG_PORT, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
}
