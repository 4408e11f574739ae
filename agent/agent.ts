/**
 * The reference agent (docs/agent-protocol.md). One `Agent` is one machine: it enrols with the site's
 * enrolment secret, heartbeats, long-polls its commands and executes them.
 *
 * `sync_pull` (a roost version onto this machine):
 *   1. GET the version's signed body URL with the service's signature of the version; refuse it
 *      (`signature_invalid`) unless the signature verifies against a pinned site key (domain/signature.ts;
 *      keys pinned from the enrolment answer, refreshed only from GET /api/agent/signing-keys when the kid
 *      is unknown). Fetch the body and refuse it unless SHA-256(JCS(body)) equals the versionId
 *      (domain/version.ts computeVersionId) and it is a valid body whose file sizes equal the sum of their
 *      chunk sizes.
 *   2. Plan: files whose size and chunk list equal the last committed manifest's (and are still on disk
 *      at that size) are skipped (`files_skipped`); the other files' distinct chunks are needed
 *      (`chunks_total`); those already in the local chunk store `<rootDir>/chunks/<hash>` that still hash
 *      to their digest are reused (`chunks_dedup`).
 *   3. Download the rest through signed URLs requested in batches of ≤1000 (POST /api/chunks/download-urls),
 *      with bounded concurrency (optionally shared by a whole fleet), re-verifying every chunk's SHA-256
 *      and size and refetching on mismatch (3 tries). No per-chunk call reaches the API, only blob storage.
 *   4. Remove files of the previous version that the new one lacks, then assemble every planned file
 *      atomically (temp file in the target folder, fsync, rename) under `<rootDir>/<extractRoot>`
 *      (confined to rootDir), write the manifest `<rootDir>/state/<roostId>.json`, report `committed`.
 *   Target state goes pending → downloading → assembling → committed | failed (| cancelled when the
 *   command was closed by the server meanwhile); progress is reported at most every `progressIntervalMs`.
 *   With `params.activation: 'staged'`, step 4 instead builds the complete new tree under
 *   `<rootDir>/staging/<roostId>/<versionId>/` (changed files assembled from chunks, unchanged live files
 *   hard-linked), writes the staged manifest beside it, leaves the live tree and its manifest untouched
 *   and closes the command `completed` with result `staged` (target state stays `assembling`). Staging a
 *   version removes other staged versions of the roost; a failed staging removes its partial tree.
 *
 * `roost_activate` switches a staged tree in (dropped files removed, staged files renamed into the extract
 * root, manifest written), reports `committed` and completes; `not_staged` when there is no complete
 * staged tree of that version (nothing changes). A commit clears the roost's staging area.
 *
 * reboot_machine, shutdown_machine, restart_process and capture_screenshot are acknowledged without
 * touching the host (a simulated machine); a screenshot uploads a 1×1 placeholder PNG unless
 * `uploadScreenshots` is false (docs/decisions/agent-simulated-commands.md).
 *
 * Fault injection (tests, benchmarks): `corruptFirstDownloadRate` flips a byte of the first download of
 * that fraction of chunks (proves the refetch), `failSyncRate` / `failMachines` make syncs fail,
 * `failStageMachines` make staged syncs fail mid-staging, and `syncDelayMs` delays each sync.
 */
import { EventEmitter, setMaxListeners } from 'node:events';
import type { SyncCounters } from '../domain/target-state';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pLimit from 'p-limit';
import { computeVersionId, validateVersionBody, type VersionBody } from '../domain/version';
import { isSha256Hex } from '../domain/hex';
import { ApiClient, HttpError, fetchBytes, isTransient, sleep } from './http';
import { isValidJwk, type SigningJwk, verifyVersionSignature } from '../domain/signature';

export const AGENT_VERSION = '0.1.0-reference';
/** Hashes per download-urls call (SPEC.md Limits). */
export const DOWNLOAD_URL_BATCH = 1000;
/** Tries per chunk (first download plus refetches) before the sync fails. */
export const CHUNK_TRIES = 3;
/** Top-level folder of the machine root holding staged trees (`staging/<roostId>/<versionId>/`). */
export const STAGING_DIR = 'staging';
/** Error of a roost_activate for a version that has no complete staged tree. */
export const NOT_STAGED = 'not_staged';
/** Error of a sync whose version signature is missing, by an unknown key, or does not verify. */
export const SIGNATURE_INVALID = 'signature_invalid';

/** A 1×1 transparent PNG: the simulated screenshot. */
const PLACEHOLDER_PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==',
  'base64',
);

/** A concurrency limiter (p-limit); share one across agents to bound a fleet's downloads. */
export type Limiter = pLimit.Limit;
export function createLimiter(concurrency: number): Limiter {
  return pLimit(concurrency);
}

export interface AgentFaults {
  /** Fraction (0..1) of chunks whose first download gets one byte flipped. */
  corruptFirstDownloadRate?: number;
  /** Fraction (0..1) of syncs that fail on purpose. */
  failSyncRate?: number;
  /** Machine ids whose syncs always fail. */
  failMachines?: string[];
  /** Machine ids whose staged syncs (activation 'staged') fail while staging (the live tree stays untouched). */
  failStageMachines?: string[];
  /** Delay before each sync starts (ms). */
  syncDelayMs?: number;
}

export interface AgentOptions extends AgentFaults {
  baseUrl: string;
  siteId: string;
  enrolmentSecret: string;
  machineId: string;
  /** Machine root: chunk store, state and every extract root live under it. */
  rootDir: string;
  hostname?: string;
  agentVersion?: string;
  timezone?: string;
  timezoneIana?: string;
  capabilities?: Record<string, unknown>;
  /** Heartbeat interval (ms, default 30000; 0 turns periodic heartbeats off). */
  heartbeatMs?: number;
  /** Long-poll `wait` (seconds, default 25, max 30). */
  pollWaitSeconds?: number;
  /** Downloads in flight for this agent when no shared `downloadLimit` is given (default 8). */
  downloadConcurrency?: number;
  /** Shared download limiter (fleet). */
  downloadLimit?: Limiter;
  /** Minimum gap between two progress reports of one sync (ms, default 1000). */
  progressIntervalMs?: number;
  /** Upload a placeholder PNG for capture_screenshot (default true). */
  uploadScreenshots?: boolean;
  /** Keep the agent token in `<rootDir>/state/agent.json` and reuse it on restart (default true). */
  persistToken?: boolean;
  /** Random source (tests). */
  random?: () => number;
  /**
   * fsync each assembled file before its rename (default true: a real machine's switch survives a power
   * cut). The fleet simulator turns it off: its machines share one disk, where 20 machines' worth of
   * per-file syncs serialise (measured ~14 ms a file, 500 s for 20 × 1,800 files).
   */
  fsyncFiles?: boolean;
  /** Site signing keys to trust from the start (normally pinned from the enrolment answer). */
  signingKeys?: SigningJwk[];
}

/** A command as the agent receives it. */
export interface AgentCommand {
  commandId: string;
  type: string;
  params: Record<string, unknown>;
  createdAt: string;
  expiresAt: string | null;
}

/** Counters of one sync, as reported in target state (domain/target-state.ts). */
export type { SyncCounters };

/** Outcome of one handled command (emitted as `command`). */
export interface CommandOutcome {
  commandId: string;
  type: string;
  status: 'completed' | 'failed' | 'cancelled' | 'abandoned';
  /** On completed: `staged` for a staged sync_pull, else `success`. */
  result?: 'success' | 'staged';
  error?: string;
  counters?: SyncCounters;
  refetched?: number;
}

/** Last committed state of a roost on this machine. */
export interface Manifest {
  roostId: string;
  versionId: string;
  /** Extract directory relative to rootDir (forward slashes). */
  extractDir: string;
  committedAt: string;
  files: { path: string; size: number; chunks: string[] }[];
}

/** A staged tree's manifest (`<rootDir>/staging/<roostId>/<versionId>.json`, written when staging completes). */
export interface StagedManifest extends Manifest {
  stagedAt: string;
  /** The committed version the staging planned against (null: none). */
  baseVersionId: string | null;
  /** Counters of the staging run, reported again with `committed` at activation. */
  counters: SyncCounters;
}

interface SyncParams {
  roostId: string;
  versionId: string;
  versionNumber?: number;
  rolloutId?: string;
  extractRoot?: string;
  attempt?: number;
  /** 'staged': assemble into the staging area and wait for roost_activate (default 'immediate'). */
  activation?: string | null;
}

/** A failure that closes the sync as failed (message becomes the reported error). */
class SyncFailure extends Error {}
/** The server closed the command meanwhile (cancelled or expired): stop and report cancelled. */
class SyncCancelled extends Error {}

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

/**
 * Maps an extract root as the server gives it (e.g. `C:\Roost\app`, `/opt/app`, `app`) to a directory
 * under `rootDir`: drive letters and leading slashes dropped, backslashes read as separators.
 * @throws SyncFailure on `..` segments, an empty root, or the reserved top-level `chunks`/`state`/`staging`.
 */
export function resolveExtractDir(rootDir: string, extractRoot: string): string {
  const s = extractRoot.replace(/\\/g, '/').replace(/^[A-Za-z]:/, '');
  const segs = s.split('/').filter((x) => x !== '' && x !== '.');
  if (segs.some((x) => x === '..')) throw new SyncFailure(`extract root "${extractRoot}" must not contain ".."`);
  if (segs.length === 0) throw new SyncFailure('the roost has no extract root');
  if (['chunks', 'state', STAGING_DIR].includes(segs[0].toLowerCase()))
    throw new SyncFailure(`extract root "${extractRoot}" uses a reserved folder`);
  const root = path.resolve(rootDir);
  const dir = path.resolve(root, ...segs);
  if (!dir.startsWith(root + path.sep)) throw new SyncFailure(`extract root "${extractRoot}" escapes the machine root`);
  return dir;
}

/** A path of a version file under `dir`, refusing anything that would leave it. */
function confined(dir: string, rel: string): string {
  const segs = rel.split('/');
  if (segs.some((x) => x === '' || x === '.' || x === '..' || x.includes('\\') || x.includes('\0')))
    throw new SyncFailure(`unsafe path "${rel}"`);
  const p = path.resolve(dir, ...segs);
  if (!p.startsWith(dir + path.sep)) throw new SyncFailure(`path "${rel}" escapes the extract root`);
  return p;
}

function errMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Writes `data` to `file` atomically: temp file in the same folder, fsync, rename. */
async function writeAtomic(file: string, data: Buffer | string): Promise<void> {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.tmp-${randomBytes(4).toString('hex')}`);
  const fh = await fs.open(tmp, 'w');
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await fs.rename(tmp, file);
}

/**
 * One simulated machine. Emits `command` (CommandOutcome) after each handled command and `error`-free
 * `warn` (message) on recoverable trouble.
 */
export class Agent extends EventEmitter {
  /**
   * The controller whose signal stops this agent. Every request in flight holds one listener on it
   * (agent/http.ts withRequestSignal), and an agent may run dozens at once, so Node's default warning
   * threshold of 10 listeners is raised to a bound no healthy agent reaches.
   */
  private static stopController(): AbortController {
    const c = new AbortController();
    setMaxListeners(10_000, c.signal);
    return c;
  }
  readonly machineId: string;
  readonly siteId: string;
  readonly rootDir: string;
  readonly api: ApiClient;
  /** Running totals since start. */
  readonly stats = {
    commands: 0,
    syncsCommitted: 0,
    syncsStaged: 0,
    syncsFailed: 0,
    chunksFetched: 0,
    chunksDedup: 0,
    chunksRefetched: 0,
    bytesFetched: 0,
    filesSkipped: 0,
  };

  private readonly opts: AgentOptions;
  private readonly limit: Limiter;
  private readonly random: () => number;
  private abort = Agent.stopController();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private pollLoop: Promise<void> | undefined;
  private readonly inflight = new Set<Promise<void>>();
  /** Command ids already taken (in flight or done), newest last; bounded. */
  private readonly seen = new Map<string, true>();
  private readonly roostChains = new Map<string, Promise<void>>();
  private readonly outcomes = new Map<string, CommandOutcome>();
  private enrolling: Promise<void> | undefined;
  /** Pinned site signing keys by kid. */
  private readonly signingKeys = new Map<string, SigningJwk>();
  /** The periodic heartbeat in flight, if any (stop() waits for it so no request outlives the agent). */
  private beating: Promise<void> | undefined;

  constructor(opts: AgentOptions) {
    super();
    this.opts = opts;
    this.machineId = opts.machineId;
    this.siteId = opts.siteId;
    this.rootDir = path.resolve(opts.rootDir);
    this.api = new ApiClient(opts.baseUrl);
    this.limit = opts.downloadLimit ?? pLimit(opts.downloadConcurrency ?? 8);
    this.random = opts.random ?? Math.random;
    this.pinKeys(opts.signingKeys);
  }

  /** True between start() and stop(). */
  get running(): boolean {
    return this.pollLoop !== undefined && !this.abort.signal.aborted;
  }

  /** Agent token (after enrolment). */
  get token(): string | undefined {
    return this.api.token;
  }

  private get stateDir(): string {
    return path.join(this.rootDir, 'state');
  }
  private get chunkDir(): string {
    return path.join(this.rootDir, 'chunks');
  }
  private chunkPath(hash: string): string {
    return path.join(this.chunkDir, hash);
  }

  /**
   * Enrols (or proves a persisted token with a heartbeat), then heartbeats every `heartbeatMs` and
   * long-polls commands until stop(). Transient API failures are retried; a refused enrolment throws.
   */
  async start(): Promise<void> {
    if (this.pollLoop) return;
    if (this.abort.signal.aborted) this.abort = Agent.stopController();
    await fs.mkdir(this.stateDir, { recursive: true });
    await fs.mkdir(this.chunkDir, { recursive: true });
    if (!this.api.token && this.opts.persistToken !== false) await this.loadToken();
    const every = this.opts.heartbeatMs ?? 30_000;
    if (this.api.token) {
      // A saved token: the first heartbeat proves it (a 401 re-enrols).
      await this.retrying(() => this.heartbeat());
      this.scheduleHeartbeats(every, every);
    } else {
      // Enrolment counts as a heartbeat; the first real one follows at a random point of the interval,
      // so a fleet started at once does not heartbeat in lockstep.
      await this.retrying(() => this.enrol());
      this.scheduleHeartbeats(every, Math.floor(every * this.random()));
    }
    this.pollLoop = this.runPollLoop();
  }

  private scheduleHeartbeats(every: number, firstIn: number): void {
    if (every <= 0) return;
    const beat = () => {
      if (this.beating) return; // the previous one is still out
      this.beating = this.heartbeat(this.abort.signal)
        .then(() => undefined)
        .catch((err) => {
          if (!this.abort.signal.aborted) this.emit('warn', `heartbeat failed: ${errMessage(err)}`);
        })
        .finally(() => (this.beating = undefined));
    };
    this.heartbeatTimer = setTimeout(() => {
      if (this.abort.signal.aborted) return;
      beat();
      this.heartbeatTimer = setInterval(beat, every);
      this.heartbeatTimer.unref();
    }, firstIn);
    this.heartbeatTimer.unref();
  }

  /** Runs `fn`, retrying transient failures (network, 429, 5xx) up to `tries` times with jittered backoff. */
  private async retrying<T>(fn: () => Promise<T>, tries = 5): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        if (attempt >= tries || !isTransient(err) || this.abort.signal.aborted) throw err;
        await sleep(Math.min(5000, 200 * 2 ** attempt) * (0.5 + this.random() / 2), this.abort.signal);
      }
    }
  }

  /** Stops polling and heartbeats and waits for running commands to end (an interrupted sync is abandoned). */
  async stop(): Promise<void> {
    this.abort.abort();
    if (this.heartbeatTimer) clearTimeout(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
    await this.beating;
    await this.pollLoop;
    this.pollLoop = undefined;
    await Promise.allSettled([...this.inflight]);
  }

  /** POST /api/agent/enrol: a new token (any previous one stops working). */
  async enrol(): Promise<void> {
    if (this.enrolling) return this.enrolling;
    this.enrolling = (async () => {
      const res = await this.api.json<{ agentToken: string; signingKeys?: unknown[] }>('POST', '/api/agent/enrol', {
        body: {
          siteId: this.siteId,
          enrolmentSecret: this.opts.enrolmentSecret,
          machineId: this.machineId,
          hostname: this.opts.hostname ?? this.machineId,
          agentVersion: this.opts.agentVersion ?? AGENT_VERSION,
          ...(this.opts.timezone ? { timezone: this.opts.timezone } : {}),
          timezoneIana: this.opts.timezoneIana ?? 'UTC',
          capabilities: this.opts.capabilities ?? { sync_pull: true, screenshot: true, simulated: true },
        },
      });
      this.api.token = res.agentToken;
      this.pinKeys(res.signingKeys);
      await this.saveState();
    })();
    try {
      await this.enrolling;
    } finally {
      this.enrolling = undefined;
    }
  }

  private async loadToken(): Promise<void> {
    try {
      const saved = JSON.parse(await fs.readFile(path.join(this.stateDir, 'agent.json'), 'utf8'));
      if (saved.siteId === this.siteId && saved.machineId === this.machineId && typeof saved.agentToken === 'string') {
        this.api.token = saved.agentToken;
        this.pinKeys(saved.signingKeys);
      }
    } catch {
      /* no saved token */
    }
  }

  /** Saves token and pinned keys to `<rootDir>/state/agent.json` (unless `persistToken` is false). */
  private async saveState(): Promise<void> {
    if (this.opts.persistToken === false || !this.api.token) return;
    await fs.mkdir(this.stateDir, { recursive: true });
    await writeAtomic(
      path.join(this.stateDir, 'agent.json'),
      JSON.stringify({ siteId: this.siteId, machineId: this.machineId, agentToken: this.api.token, signingKeys: this.pinnedKeys }),
    );
  }

  /** Calls the API; a 401 (token rotated or revoked) re-enrols once and retries. */
  private async call<T = unknown>(method: string, p: string, opts: Parameters<ApiClient['json']>[2] = {}): Promise<T> {
    try {
      return await this.api.json<T>(method, p, opts);
    } catch (err) {
      if (err instanceof HttpError && err.status === 401 && !this.abort.signal.aborted) {
        await this.enrol();
        return this.api.json<T>(method, p, opts);
      }
      throw err;
    }
  }

  /** Like `call`, retrying transient failures (network, 429, 5xx) up to `tries` times with backoff. */
  private callRetrying<T = unknown>(method: string, p: string, opts: Parameters<ApiClient['json']>[2] = {}, tries = 4): Promise<T> {
    return this.retrying(() => this.call<T>(method, p, opts), tries);
  }

  /** POST /api/agent/heartbeat with a small simulated snapshot. */
  async heartbeat(signal?: AbortSignal): Promise<{ pendingCommands: number }> {
    return this.call('POST', '/api/agent/heartbeat', {
      signal,
      body: {
        agentVersion: this.opts.agentVersion ?? AGENT_VERSION,
        hostname: this.opts.hostname ?? this.machineId,
        metrics: {
          schemaVersion: 2,
          timestamp: new Date().toISOString(),
          cpus: { count: os.cpus().length, load1: os.loadavg()[0] },
          memory: { totalBytes: os.totalmem(), freeBytes: os.freemem() },
        },
        info: { os: 'simulated', platform: process.platform, agent: 'reference' },
        processes: [],
      },
    });
  }

  private async runPollLoop(): Promise<void> {
    const signal = this.abort.signal;
    const wait = Math.min(30, Math.max(0, this.opts.pollWaitSeconds ?? 25));
    let backoff = 500;
    while (!signal.aborted) {
      try {
        const res = await this.call<{ commands: AgentCommand[] }>('GET', '/api/agent/commands', { query: { wait }, signal });
        backoff = 500;
        for (const cmd of res.commands) this.dispatch(cmd);
        if (wait === 0) await sleep(1000, signal);
      } catch (err) {
        if (signal.aborted) break;
        this.emit('warn', `command poll failed: ${errMessage(err)}`);
        await sleep(backoff * (0.5 + this.random() / 2), signal);
        backoff = Math.min(30_000, backoff * 2);
      }
    }
  }

  /** Runs a delivered command once (redeliveries of a command already taken are ignored). */
  dispatch(cmd: AgentCommand): void {
    if (this.seen.has(cmd.commandId)) return;
    this.seen.set(cmd.commandId, true);
    if (this.seen.size > 2000) this.seen.delete(this.seen.keys().next().value as string);
    const run = async () => {
      const outcome = await this.execute(cmd);
      this.stats.commands++;
      this.outcomes.set(cmd.commandId, outcome);
      if (this.outcomes.size > 2000) this.outcomes.delete(this.outcomes.keys().next().value as string);
      this.emit('command', outcome);
    };
    let p: Promise<void>;
    if ((cmd.type === 'sync_pull' || cmd.type === 'roost_activate') && typeof cmd.params?.roostId === 'string') {
      // One sync or activation per roost at a time, in delivery order.
      const roostId = cmd.params.roostId;
      const prev = this.roostChains.get(roostId) ?? Promise.resolve();
      p = prev.then(run, run);
      this.roostChains.set(roostId, p);
      void p.finally(() => {
        if (this.roostChains.get(roostId) === p) this.roostChains.delete(roostId);
      });
    } else p = run();
    const tracked = p.catch((err) => {
      this.emit('warn', `command ${cmd.commandId} crashed: ${errMessage(err)}`);
    });
    this.inflight.add(tracked);
    void tracked.finally(() => this.inflight.delete(tracked));
  }

  /** Resolves with the outcome of `commandId` once handled (rejects after `timeoutMs`). */
  waitForCommand(commandId: string, timeoutMs = 60_000): Promise<CommandOutcome> {
    const done = this.outcomes.get(commandId);
    if (done) return Promise.resolve(done);
    return new Promise((resolve, reject) => {
      const onCommand = (o: CommandOutcome) => {
        if (o.commandId !== commandId) return;
        clearTimeout(t);
        this.off('command', onCommand);
        resolve(o);
      };
      const t = setTimeout(() => {
        this.off('command', onCommand);
        reject(new Error(`${this.machineId}: command ${commandId} not handled within ${timeoutMs} ms`));
      }, timeoutMs);
      this.on('command', onCommand);
    });
  }

  /** Reports a command status; returns the server's view (`applied` false when it was already closed). */
  private reportCommand(commandId: string, body: { status: string; progress?: number; result?: string; error?: string }) {
    return this.callRetrying<{ status: string; applied: boolean }>('POST', `/api/agent/commands/${encodeURIComponent(commandId)}`, {
      body,
    });
  }

  private async execute(cmd: AgentCommand): Promise<CommandOutcome> {
    switch (cmd.type) {
      case 'sync_pull':
        return this.syncPull(cmd);
      case 'roost_activate':
        return this.activate(cmd);
      case 'capture_screenshot':
        if (this.opts.uploadScreenshots !== false) {
          try {
            await this.callRetrying('PUT', `/api/agent/commands/${encodeURIComponent(cmd.commandId)}/screenshot`, {
              raw: PLACEHOLDER_PNG,
              contentType: 'image/png',
            });
          } catch (err) {
            return this.closeCommand(cmd, 'failed', `screenshot upload failed: ${errMessage(err)}`);
          }
        }
        return this.closeCommand(cmd, 'completed');
      case 'reboot_machine':
      case 'shutdown_machine':
      case 'restart_process':
        // A simulated machine acknowledges without touching the host.
        return this.closeCommand(cmd, 'completed');
      default:
        return this.closeCommand(cmd, 'failed', `unsupported command type ${cmd.type}`);
    }
  }

  private async closeCommand(cmd: AgentCommand, status: 'completed' | 'failed', error?: string): Promise<CommandOutcome> {
    try {
      await this.reportCommand(cmd.commandId, status === 'completed' ? { status, result: 'success', progress: 100 } : { status, error });
    } catch (err) {
      this.emit('warn', `could not report ${cmd.commandId}: ${errMessage(err)}`);
    }
    return {
      commandId: cmd.commandId,
      type: cmd.type,
      status,
      ...(status === 'completed' ? { result: 'success' as const } : {}),
      ...(error ? { error } : {}),
    };
  }

  /** Loads the last committed manifest of a roost, or null. */
  async readManifest(roostId: string): Promise<Manifest | null> {
    try {
      return JSON.parse(await fs.readFile(this.manifestPath(roostId), 'utf8')) as Manifest;
    } catch {
      return null;
    }
  }

  private async syncPull(cmd: AgentCommand): Promise<CommandOutcome> {
    const signal = this.abort.signal;
    const p = cmd.params as unknown as SyncParams;
    const counters: SyncCounters = {
      chunks_fetched: 0,
      chunks_total: 0,
      chunks_dedup: 0,
      files_total: 0,
      files_assembled: 0,
      files_skipped: 0,
      bytes_fetched: 0,
    };
    let refetched = 0;
    const outcome = (status: CommandOutcome['status'], error?: string, result?: CommandOutcome['result']): CommandOutcome => ({
      commandId: cmd.commandId,
      type: cmd.type,
      status,
      ...(error ? { error } : {}),
      ...(result ? { result } : {}),
      counters: { ...counters },
      refetched,
    });
    if (typeof p?.roostId !== 'string' || !isSha256Hex(p?.versionId)) {
      return this.closeCommand(cmd, 'failed', 'sync_pull needs params.roostId and a 64-hex params.versionId');
    }
    if (p.activation !== undefined && p.activation !== null && p.activation !== 'immediate' && p.activation !== 'staged') {
      return this.closeCommand(
        cmd,
        'failed',
        `sync_pull params.activation must be "immediate" or "staged" (got ${JSON.stringify(p.activation).slice(0, 40)})`,
      );
    }
    const staged = p.activation === 'staged';
    const statePath = `/api/agent/roosts/${encodeURIComponent(p.roostId)}/state`;
    let status = 'pending';
    let lastReport = 0;
    let pendingReport: Promise<unknown> = Promise.resolve();
    const interval = this.opts.progressIntervalMs ?? 1000;
    const sendState = (error?: string) =>
      this.callRetrying('PUT', statePath, { body: { reportedVersionId: p.versionId, status, ...counters, ...(error ? { error } : {}) } });
    /** Status change: wait for any progress report in flight, then report now (ordered). */
    const enter = async (next: string, error?: string) => {
      status = next;
      await pendingReport.catch(() => undefined);
      lastReport = Date.now();
      await sendState(error);
    };
    /** Progress: at most one report per interval, never two at once. */
    let reporting = false;
    const progress = () => {
      if (reporting || Date.now() - lastReport < interval) return;
      reporting = true;
      lastReport = Date.now();
      pendingReport = sendState()
        .catch((err) => this.emit('warn', `progress report failed: ${errMessage(err)}`))
        .finally(() => (reporting = false));
    };
    /** Command intermediate status; a command the server closed meanwhile stops the sync. */
    const commandStatus = async (s: string, pct: number) => {
      const r = await this.reportCommand(cmd.commandId, { status: s, progress: pct });
      if (!r.applied && TERMINAL.has(r.status)) throw new SyncCancelled(`command was closed by the server (${r.status})`);
    };

    try {
      await commandStatus('downloading', 0);
    } catch (err) {
      // Closed before we began (cancelled or expired): nothing on this machine changed, report no state.
      if (err instanceof SyncCancelled) return outcome('cancelled', err.message);
      return outcome('failed', errMessage(err));
    }
    const stageDir = this.stagingDir(p.roostId, p.versionId);
    const stagedManifestPath = this.stagedManifestPath(p.roostId, p.versionId);
    try {
      await enter('pending');
      if (this.opts.syncDelayMs) await sleep(this.opts.syncDelayMs, signal);
      if (signal.aborted) return outcome('abandoned');
      if ((this.opts.failMachines ?? []).includes(this.machineId) || (this.opts.failSyncRate ?? 0) > this.random()) {
        throw new SyncFailure('injected failure (fault injection)');
      }

      // 1. The version: its signature against the pinned site keys, then the body against its id.
      const info = await this.callRetrying<{ versionUrl: string; extractPath: string; signature?: string; signingKeyId?: string }>(
        'GET',
        `/api/agent/roosts/${encodeURIComponent(p.roostId)}/versions/${p.versionId}`,
      );
      await this.verifySignature(p.roostId, p.versionId, info.signature, info.signingKeyId);
      const raw = await fetchBytes(info.versionUrl, signal);
      let body: VersionBody;
      try {
        body = JSON.parse(raw.toString('utf8'));
      } catch {
        throw new SyncFailure('version body is not JSON');
      }
      if (computeVersionId(body) !== p.versionId) throw new SyncFailure('version body does not hash to the versionId; refused');
      const invalid = validateVersionBody(body);
      if (invalid) throw new SyncFailure(`version body is invalid: ${Object.keys(invalid)[0]} ${Object.values(invalid)[0][0]}`);
      for (const f of body.files) {
        const sum = f.chunks.reduce((a, c) => a + c.size, 0);
        if (sum !== f.size) throw new SyncFailure(`file ${f.path}: size ${f.size} is not the sum of its chunk sizes (${sum})`);
      }
      const extractDir = resolveExtractDir(this.rootDir, p.extractRoot || info.extractPath || '');
      const extractRel = path.relative(this.rootDir, extractDir).split(path.sep).join('/');

      // 2. Plan: skipped files (unchanged since the last commit), needed chunks, local dedup.
      const prev = await this.readManifest(p.roostId);
      const prevSameRoot = prev && prev.extractDir === extractRel ? prev : null;
      const prevFiles = new Map((prevSameRoot?.files ?? []).map((f) => [f.path, f]));
      const toAssemble: VersionBody['files'] = [];
      const unchanged: VersionBody['files'] = [];
      for (const f of body.files) {
        const old = prevFiles.get(f.path);
        const target = confined(extractDir, f.path);
        confined(stageDir, f.path);
        let same =
          !!old && old.size === f.size && old.chunks.length === f.chunks.length && old.chunks.every((h, i) => h === f.chunks[i].hash);
        if (same) {
          const st = await fs.stat(target).catch(() => null);
          same = !!st && st.isFile() && st.size === f.size;
        }
        if (same) {
          counters.files_skipped++;
          unchanged.push(f);
        } else toAssemble.push(f);
      }
      counters.files_total = body.files.length;
      const needed = new Map<string, number>();
      for (const f of toAssemble) for (const c of f.chunks) needed.set(c.hash, c.size);
      counters.chunks_total = needed.size;
      const missing: [string, number][] = [];
      for (const [hash, size] of needed) {
        const st = await fs.stat(this.chunkPath(hash)).catch(() => null);
        // A stored chunk is reused only when it still hashes to its digest (else it is fetched again).
        if (st && st.size === size && (await this.storedChunkIntact(hash))) counters.chunks_dedup++;
        else missing.push([hash, size]);
      }

      // 3. Download what the chunk store lacks.
      await enter('downloading');
      for (let i = 0; i < missing.length; i += DOWNLOAD_URL_BATCH) {
        const batch = missing.slice(i, i + DOWNLOAD_URL_BATCH);
        const urls = new UrlBatch(
          this,
          batch.map(([h]) => h),
        );
        await Promise.all(
          batch.map(([hash, size]) =>
            this.limit(async () => {
              if (signal.aborted) throw new SyncCancelled('agent stopping');
              const r = await this.downloadChunk(hash, size, urls, counters, signal);
              refetched += r;
              progress();
            }),
          ),
        );
      }

      // 4. Assemble: into the live extract root (immediate), or a complete tree in the staging area (staged).
      await commandStatus('assembling', 50);
      await enter('assembling');
      const manifest: Manifest = {
        roostId: p.roostId,
        versionId: p.versionId,
        extractDir: extractRel,
        committedAt: new Date().toISOString(),
        files: body.files.map((f) => ({ path: f.path, size: f.size, chunks: f.chunks.map((c) => c.hash) })),
      };
      if (staged) {
        // A new staging supersedes any other staged version of this roost; this version restarts clean.
        await this.clearStaging(p.roostId);
        await fs.mkdir(stageDir, { recursive: true });
        const failStage = (this.opts.failStageMachines ?? []).includes(this.machineId);
        for (const f of unchanged) {
          if (signal.aborted) throw new SyncCancelled('agent stopping');
          await this.linkInto(stageDir, extractDir, f.path);
          if (failStage) throw new SyncFailure('injected staging failure (fault injection)');
        }
        for (const f of toAssemble) {
          if (signal.aborted) throw new SyncCancelled('agent stopping');
          await this.assembleFile(stageDir, f);
          counters.files_assembled++;
          progress();
          if (failStage) throw new SyncFailure('injected staging failure (fault injection)');
        }
        if (failStage) throw new SyncFailure('injected staging failure (fault injection)');
        const stagedManifest: StagedManifest = {
          ...manifest,
          stagedAt: manifest.committedAt,
          baseVersionId: prev?.versionId ?? null,
          counters: { ...counters },
        };
        await writeAtomic(stagedManifestPath, JSON.stringify(stagedManifest));
        // The final counters (progress reports are throttled); the target state stays `assembling` until activation.
        await enter('assembling');
        await this.reportCommand(cmd.commandId, { status: 'completed', result: 'staged', progress: 100 });
        this.stats.syncsStaged++;
      } else {
        if (prev) {
          const prevDir = prev.extractDir ? path.resolve(this.rootDir, ...prev.extractDir.split('/')) : extractDir;
          const keep = prevSameRoot ? new Set(body.files.map((f) => f.path)) : new Set<string>();
          for (const f of prev.files) if (!keep.has(f.path)) await this.removeFile(prevDir, f.path);
        }
        for (const f of toAssemble) {
          if (signal.aborted) throw new SyncCancelled('agent stopping');
          await this.assembleFile(extractDir, f);
          counters.files_assembled++;
          progress();
        }
        await writeAtomic(this.manifestPath(p.roostId), JSON.stringify(manifest));
        await enter('committed');
        await this.reportCommand(cmd.commandId, { status: 'completed', result: 'success', progress: 100 });
        this.stats.syncsCommitted++;
        // Any staged tree of this roost is now superseded.
        await this.clearStaging(p.roostId).catch((err) => this.emit('warn', `could not clear staging of ${p.roostId}: ${errMessage(err)}`));
      }
      this.stats.chunksFetched += counters.chunks_fetched;
      this.stats.chunksDedup += counters.chunks_dedup;
      this.stats.chunksRefetched += refetched;
      this.stats.bytesFetched += counters.bytes_fetched;
      this.stats.filesSkipped += counters.files_skipped;
      return outcome('completed', undefined, staged ? 'staged' : 'success');
    } catch (err) {
      if (staged) {
        // A failed or interrupted staging leaves nothing behind (the live tree was never touched).
        await fs.rm(stagedManifestPath, { force: true }).catch(() => undefined);
        await fs.rm(stageDir, { recursive: true, force: true }).catch(() => undefined);
      }
      if (signal.aborted) return outcome('abandoned', 'agent stopped');
      const message = errMessage(err);
      const cancelled = err instanceof SyncCancelled;
      try {
        await enter(cancelled ? 'cancelled' : 'failed', message);
        if (!cancelled) await this.reportCommand(cmd.commandId, { status: 'failed', error: message });
      } catch (reportErr) {
        this.emit('warn', `could not report failure of ${cmd.commandId}: ${errMessage(reportErr)}`);
      }
      if (!cancelled) this.stats.syncsFailed++;
      return outcome(cancelled ? 'cancelled' : 'failed', message);
    }
  }

  /**
   * roost_activate `{ roostId, versionId, rolloutId, extractRoot }`: switches the tree staged by a
   * `sync_pull` with `activation: 'staged'` into the live extract root (files of the previous version
   * the new one lacks removed, staged files renamed in, manifest written), reports target state
   * `committed` with the staging run's counters and completes the command. Downloads nothing.
   * No complete staged tree of that version → command failed with error `not_staged`, nothing changed.
   */
  private async activate(cmd: AgentCommand): Promise<CommandOutcome> {
    const p = cmd.params as { roostId?: unknown; versionId?: unknown; extractRoot?: unknown };
    if (typeof p?.roostId !== 'string' || !isSha256Hex(p?.versionId)) {
      return this.closeCommand(cmd, 'failed', 'roost_activate needs params.roostId and a 64-hex params.versionId');
    }
    const roostId = p.roostId;
    const versionId = p.versionId as string;
    const base = { commandId: cmd.commandId, type: cmd.type };
    try {
      const r = await this.reportCommand(cmd.commandId, { status: 'activating', progress: 0 });
      if (!r.applied && TERMINAL.has(r.status))
        return { ...base, status: 'cancelled', error: `command was closed by the server (${r.status})` };
    } catch (err) {
      return { ...base, status: 'failed', error: errMessage(err) };
    }
    const stageDir = this.stagingDir(roostId, versionId);
    let staged: StagedManifest | null = null;
    try {
      staged = JSON.parse(await fs.readFile(this.stagedManifestPath(roostId, versionId), 'utf8')) as StagedManifest;
    } catch {
      staged = null;
    }
    let complete = !!staged && staged.roostId === roostId && staged.versionId === versionId;
    for (const f of complete ? staged!.files : []) {
      const st = await fs.lstat(path.join(stageDir, ...f.path.split('/'))).catch(() => null);
      if (!st || !st.isFile() || st.size !== f.size) {
        complete = false;
        break;
      }
    }
    if (!complete || !staged) return this.closeCommand(cmd, 'failed', NOT_STAGED);

    const counters = staged.counters;
    const sendState = (status: string, error?: string) =>
      this.callRetrying('PUT', `/api/agent/roosts/${encodeURIComponent(roostId)}/state`, {
        body: { reportedVersionId: versionId, status, ...counters, ...(error ? { error } : {}) },
      });
    try {
      const extractRoot = typeof p.extractRoot === 'string' && p.extractRoot ? p.extractRoot : staged.extractDir;
      const extractDir = resolveExtractDir(this.rootDir, extractRoot);
      const extractRel = path.relative(this.rootDir, extractDir).split(path.sep).join('/');
      const prev = await this.readManifest(roostId);
      if (prev) {
        const prevDir = prev.extractDir ? path.resolve(this.rootDir, ...prev.extractDir.split('/')) : extractDir;
        const keep = prev.extractDir === extractRel ? new Set(staged.files.map((f) => f.path)) : new Set<string>();
        for (const f of prev.files) if (!keep.has(f.path)) await this.removeFile(prevDir, f.path);
      }
      for (const f of staged.files) {
        const from = confined(stageDir, f.path);
        const target = confined(extractDir, f.path);
        await fs.mkdir(path.dirname(target), { recursive: true });
        const st = await fs.lstat(target).catch(() => null);
        if (st && !st.isFile()) throw new SyncFailure(`${f.path}: a non-file is in the way`);
        await fs.rename(from, target);
      }
      const manifest: Manifest = { roostId, versionId, extractDir: extractRel, committedAt: new Date().toISOString(), files: staged.files };
      await writeAtomic(this.manifestPath(roostId), JSON.stringify(manifest));
      await sendState('committed');
      await this.reportCommand(cmd.commandId, { status: 'completed', result: 'success', progress: 100 });
      this.stats.syncsCommitted++;
      await this.clearStaging(roostId).catch((err) => this.emit('warn', `could not clear staging of ${roostId}: ${errMessage(err)}`));
      return { ...base, status: 'completed', result: 'success', counters: { ...counters } };
    } catch (err) {
      const message = errMessage(err);
      try {
        await sendState('failed', message);
        await this.reportCommand(cmd.commandId, { status: 'failed', error: message });
      } catch (reportErr) {
        this.emit('warn', `could not report failure of ${cmd.commandId}: ${errMessage(reportErr)}`);
      }
      this.stats.syncsFailed++;
      return { ...base, status: 'failed', error: message };
    }
  }

  /** True when the local store's copy of a chunk hashes to its digest. */
  private async storedChunkIntact(hash: string): Promise<boolean> {
    try {
      return (
        createHash('sha256')
          .update(await fs.readFile(this.chunkPath(hash)))
          .digest('hex') === hash
      );
    } catch {
      return false;
    }
  }

  /** `<rootDir>/staging/<roostId>/<versionId>`: the staged tree of a version. */
  stagingDir(roostId: string, versionId: string): string {
    return path.join(this.rootDir, STAGING_DIR, encodeURIComponent(roostId), versionId);
  }

  /** The staged manifest (written last: its presence marks a complete staged tree), beside the tree. */
  private stagedManifestPath(roostId: string, versionId: string): string {
    return path.join(this.rootDir, STAGING_DIR, encodeURIComponent(roostId), `${versionId}.json`);
  }

  private manifestPath(roostId: string): string {
    return path.join(this.stateDir, `${encodeURIComponent(roostId)}.json`);
  }

  /** Removes every staged tree of a roost (superseded by a newer staging or a commit). */
  private async clearStaging(roostId: string): Promise<void> {
    await fs.rm(path.join(this.rootDir, STAGING_DIR, encodeURIComponent(roostId)), { recursive: true, force: true });
  }

  /** Places an unchanged live file into the staging tree: a hard link (no copy), or a copy where links fail. */
  private async linkInto(stageDir: string, extractDir: string, rel: string): Promise<void> {
    const from = confined(extractDir, rel);
    const to = confined(stageDir, rel);
    await fs.mkdir(path.dirname(to), { recursive: true });
    try {
      await fs.link(from, to);
    } catch {
      await fs.copyFile(from, to);
    }
  }

  /** The site keys this agent trusts, by kid (from enrolment, the saved state, or a refresh). */
  get pinnedKeys(): SigningJwk[] {
    return [...this.signingKeys.values()];
  }

  private pinKeys(keys: unknown): void {
    if (!Array.isArray(keys)) return;
    for (const k of keys) {
      if (isValidJwk(k)) this.signingKeys.set(k.kid, { kty: 'OKP', crv: 'Ed25519', x: k.x, kid: k.kid, alg: 'EdDSA', use: 'sig' });
    }
  }

  /**
   * GET /api/agent/signing-keys over the authenticated agent channel and pins any new valid key. Only
   * this route and enrolment add keys: a key named by a version answer is never trusted on its own.
   */
  async refreshSigningKeys(): Promise<void> {
    const res = await this.callRetrying<{ keys: unknown[] }>('GET', '/api/agent/signing-keys');
    const before = this.signingKeys.size;
    this.pinKeys(res.keys);
    if (this.signingKeys.size !== before) await this.saveState();
  }

  /**
   * Checks a version's signature against the pinned keys (refreshing them once when the kid is
   * unknown). @throws SyncFailure `signature_invalid` when unsigned, signed by an unknown key, or the
   * signature does not verify.
   */
  private async verifySignature(roostId: string, versionId: string, signature: string | undefined, kid: string | undefined): Promise<void> {
    if (typeof signature !== 'string' || typeof kid !== 'string') {
      this.emit('warn', `version ${versionId} of ${roostId} is unsigned; refused`);
      throw new SyncFailure(SIGNATURE_INVALID);
    }
    if (!this.signingKeys.has(kid)) await this.refreshSigningKeys();
    const key = this.signingKeys.get(kid);
    if (!key) {
      this.emit('warn', `version ${versionId} of ${roostId} is signed by unknown key ${kid}; refused`);
      throw new SyncFailure(SIGNATURE_INVALID);
    }
    if (!verifyVersionSignature(key, this.siteId, roostId, versionId, signature)) {
      this.emit('warn', `version ${versionId} of ${roostId}: signature does not verify with ${kid}; refused`);
      throw new SyncFailure(SIGNATURE_INVALID);
    }
  }

  /**
   * Downloads one chunk into the store, verifying size and SHA-256; refetches on mismatch.
   * @returns the number of refetches needed. @throws SyncFailure after CHUNK_TRIES bad downloads.
   */
  private async downloadChunk(hash: string, size: number, urls: UrlBatch, counters: SyncCounters, signal: AbortSignal): Promise<number> {
    const corruptRate = this.opts.corruptFirstDownloadRate ?? 0;
    const corruptFirst = corruptRate > 0 && this.random() < corruptRate;
    let lastError = '';
    for (let attempt = 1; attempt <= CHUNK_TRIES; attempt++) {
      const url = await urls.get(hash); // SyncFailure when the site lacks the chunk; API errors were retried already
      let data: Buffer;
      try {
        data = await fetchBytes(url, signal);
      } catch (err) {
        if (signal.aborted) throw err;
        lastError = errMessage(err);
        if (err instanceof HttpError && err.status === 403) urls.refresh(); // SAS expired
        await sleep(100 * attempt, signal);
        continue;
      }
      counters.bytes_fetched += data.length;
      if (attempt === 1 && corruptFirst && data.length > 0) data[data.length >> 1] ^= 0xff;
      const actual = createHash('sha256').update(data).digest('hex');
      if (data.length === size && actual === hash) {
        const file = this.chunkPath(hash);
        const tmp = `${file}.tmp-${randomBytes(4).toString('hex')}`;
        await fs.writeFile(tmp, data);
        await fs.rename(tmp, file);
        counters.chunks_fetched++;
        return attempt - 1;
      }
      lastError = `chunk ${hash} failed verification (got ${data.length} bytes, sha256 ${actual.slice(0, 12)}…)`;
    }
    throw new SyncFailure(`chunk ${hash} could not be fetched intact after ${CHUNK_TRIES} tries: ${lastError}`);
  }

  /** Builds one file from the chunk store: temp file in the target folder, fsync, rename. */
  private async assembleFile(extractDir: string, f: VersionBody['files'][number]): Promise<void> {
    const target = confined(extractDir, f.path);
    const dir = path.dirname(target);
    await fs.mkdir(dir, { recursive: true });
    const st = await fs.lstat(target).catch(() => null);
    if (st && !st.isFile()) throw new SyncFailure(`${f.path}: a non-file is in the way`);
    const tmp = path.join(dir, `.${path.basename(target)}.roost-tmp-${randomBytes(4).toString('hex')}`);
    const fh = await fs.open(tmp, 'w');
    try {
      let written = 0;
      for (const c of f.chunks) {
        const data = await fs.readFile(this.chunkPath(c.hash));
        if (data.length !== c.size) throw new SyncFailure(`chunk ${c.hash} in the store has the wrong size`);
        await fh.write(data, 0, data.length, written);
        written += data.length;
      }
      if (this.opts.fsyncFiles !== false) await fh.sync();
    } catch (err) {
      await fh.close().catch(() => undefined);
      await fs.rm(tmp, { force: true });
      throw err;
    }
    await fh.close();
    await fs.rename(tmp, target);
  }

  /** Removes a file of the previous version and the folders it leaves empty (up to the extract root). */
  private async removeFile(extractDir: string, rel: string): Promise<void> {
    let target: string;
    try {
      target = confined(extractDir, rel);
    } catch {
      return;
    }
    await fs.rm(target, { force: true });
    let dir = path.dirname(target);
    while (dir.startsWith(extractDir + path.sep)) {
      try {
        await fs.rmdir(dir);
      } catch {
        break; // not empty (or gone)
      }
      dir = path.dirname(dir);
    }
  }

  /** Signed download URLs of a batch (≤1000 hashes), fetched in one call and re-fetched when the SAS expires. */
  async downloadUrls(hashes: string[]): Promise<{ urls: Record<string, string>; expiresAt: string; missing?: string[] }> {
    return this.callRetrying('POST', '/api/chunks/download-urls', { body: { siteId: this.siteId, hashes } });
  }
}

/** Lazily fetched, shared, refreshable URL map of one download batch. */
class UrlBatch {
  private current: Promise<{ urls: Record<string, string>; expiresAt: number }> | undefined;

  constructor(
    private readonly agent: Agent,
    private readonly hashes: string[],
  ) {}

  async get(hash: string): Promise<string> {
    let batch = await this.load();
    if (batch.expiresAt - Date.now() < 30_000) {
      this.refresh();
      batch = await this.load();
    }
    const url = batch.urls[hash];
    if (!url) throw new SyncFailure(`the site does not hold chunk ${hash}`);
    return url;
  }

  refresh(): void {
    this.current = undefined;
  }

  private load(): Promise<{ urls: Record<string, string>; expiresAt: number }> {
    if (!this.current) {
      const p = this.agent.downloadUrls(this.hashes).then((r) => {
        if (r.missing && r.missing.length > 0)
          throw new SyncFailure(`the site lacks ${r.missing.length} chunk(s) of this version, e.g. ${r.missing[0]}`);
        return { urls: r.urls, expiresAt: Date.parse(r.expiresAt) };
      });
      p.catch(() => {
        if (this.current === p) this.current = undefined;
      });
      this.current = p;
    }
    return this.current;
  }
}
