/**
 * The reference agent (docs/agent-protocol.md). One `Agent` is one machine: it enrols with the site's
 * enrolment secret, heartbeats, long-polls its commands and runs each once. The work is split by concern:
 *
 *   agent/transport.ts     API calls, retries, re-enrolment, saved credentials
 *   agent/trust.ts         pinned site signing keys, version signature check
 *   agent/sync.ts          sync_pull and roost_activate: the reporting protocol of a sync
 *   agent/download.ts      local chunk store, chunk download and verification
 *   agent/assembly.ts      file planning, atomic assembly, commit, staging, journalled activation switch
 *   agent/machine-root.ts  the machine root's layout, path confinement, manifests
 *   agent/commands.ts      simulated non-sync commands, command outcomes
 *   agent/faults.ts        fault injection (tests, benchmarks, agent/fleet.ts)
 *
 * This file holds the loop (heartbeats, command poll, dispatch: one sync or activation per roost at a
 * time, in delivery order) and the agent's public surface, re-exported for tests, the demo and benchmarks.
 */
import { EventEmitter, setMaxListeners } from 'node:events';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { SigningJwk } from '../domain/signature';
import { type AgentStats, type CommandOutcome, closeCommand, emptyStats, runScreenshot } from './commands';
import { ProcessSupervisor } from './processes';
import { runPowerCommand } from './power';
import { PROCESS_COMMAND_TYPES } from '../domain/processes';
import { ChunkStore, type Limiter, createLimiter } from './download';
import { errMessage } from './errors';
import { type AgentFaults, FaultInjector } from './faults';
import type { CommandJournal } from './journal';
import { type ApiClient, isTransient, sleep, withCommandContext } from './http';
import { MachineRoot, type Manifest } from './machine-root';
import { recoverActivations } from './assembly';
import { NOT_STAGED, type SyncContext, reportRecoveredActivation, runActivate, runSyncPull } from './sync';
import { applySelfUpdate, SelfUpdateRefused, type SelfUpdateOptions } from './self-update';
import { AGENT_VERSION, type AgentCommand, type AgentIdentity, AgentTransport, type DownloadUrls } from './transport';
import { KeyRing, SIGNATURE_INVALID } from './trust';
import { type AgentOs, hostOs } from './os';
import { runClassicCommand } from './installer';
import { CLASSIC_INSTALL, CLASSIC_UNINSTALL } from '../domain/classic';

export { AGENT_VERSION, NOT_STAGED, SIGNATURE_INVALID, createLimiter };
export type { AgentCommand, AgentFaults, AgentStats, CommandOutcome, Limiter, Manifest };
export type { SyncCounters } from '../domain/target-state';
export { CHUNK_TRIES, DOWNLOAD_URL_BATCH } from './download';
export { STAGING_DIR, type StagedManifest, resolveExtractDir } from './machine-root';

/**
 * Default least gap between two progress reports of one command (ms). 5 s, not 1 s: a 10,000-machine wave
 * whose syncs each outlast a second sent a progress report per sync and second on top of its two reports
 * (6.96 requests per synced machine instead of 6: docs/benchmarks.md "10,000 machines"), and an operator
 * watching a fleet does not need a machine's progress more often than this.
 */
export const PROGRESS_INTERVAL_MS = 5000;

/** Options of one agent: who it is (AgentIdentity), where it keeps its files, its pace, and its faults. */
export interface AgentOptions extends AgentFaults, AgentIdentity {
  /** Upgrade from the agent-installer catalog when a heartbeat offers a newer version (agent/self-update.ts). */
  selfUpdate?: SelfUpdateOptions;
  /** Machine root: chunk store, state and every extract root live under it. */
  rootDir: string;
  /** Heartbeat interval (ms, default 30000; 0 turns periodic heartbeats off). */
  heartbeatMs?: number;
  /** Long-poll `wait` (seconds, default 25, max 30). */
  pollWaitSeconds?: number;
  /** Downloads in flight for this agent when no shared `downloadLimit` is given (default 8). */
  downloadConcurrency?: number;
  /** Shared download limiter (fleet). */
  downloadLimit?: Limiter;
  /** Minimum gap between two progress reports of one sync or installer download (ms, default PROGRESS_INTERVAL_MS). */
  progressIntervalMs?: number;
  /**
   * The compact sync protocol (docs/agent-protocol.md "Inline sync"; default true): polls ask for the
   * inline sync of each sync_pull, status changes go with the command report in one request, and a status
   * phase shorter than `progressIntervalMs` is not reported. false: one request per step, as agents built
   * before it do.
   */
  inlineSync?: boolean;
  /** Upload a placeholder PNG for capture_screenshot (default true). */
  uploadScreenshots?: boolean;
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
  /** Host operations (agent/os.ts; default: this host's implementation). */
  os?: AgentOs;
  /** Extra trusted CA certificates (PEM) for classic installer downloads. */
  installerCa?: string | Buffer;
  /** Time processes named in close_processes get to end before they are killed (ms, default 5000). */
  closeGraceMs?: number;
  /**
   * Journal of taken commands (agent/journal.ts): each command is written there before it starts and
   * removed once it ended with a reported outcome; start() runs what is left from a previous run first.
   */
  journal?: CommandJournal;
  /** Managed processes: config read interval (ms, default heartbeatMs or 30000) and state tick (ms, default 1000). */
  processSyncMs?: number;
  processTickMs?: number;
  /** Time a managed process gets to stop gracefully before it is killed (ms, default 10000). */
  stopGraceMs?: number;
  /** How long a reboot or shutdown keeps the agent offline before it comes back (ms, default 15000). */
  rebootDowntimeMs?: number;
}

/** Most command ids (and outcomes) an agent remembers. */
const REMEMBERED_COMMANDS = 2000;

/**
 * One machine. Emits `command` (CommandOutcome) after each handled command, `started` (AgentCommand) when
 * one starts, `heartbeat` ({pendingCommands}) after each accepted heartbeat, and `warn` (message, and the
 * error when there was one) on recoverable trouble (never `error`).
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
  /** Absolute machine root. */
  readonly rootDir: string;
  /** Running totals since start. */
  readonly stats: AgentStats = emptyStats();

  private readonly opts: AgentOptions;
  private readonly root: MachineRoot;
  private readonly store: ChunkStore;
  private readonly keys = new KeyRing();
  private readonly transport: AgentTransport;
  private readonly faults: FaultInjector;
  private readonly limit: Limiter;
  private readonly random: () => number;
  /** Host operations (agent/os.ts). */
  readonly os: AgentOs;
  /** The machine's managed processes (agent/processes.ts). */
  readonly processes: ProcessSupervisor;
  /** Flags the heartbeat reports while a reboot or shutdown is under way. */
  private power = { rebooting: false, shuttingDown: false };
  /** Set by stop(): a power cycle in progress does not bring the agent back. */
  private halted = false;
  private abort = Agent.stopController();
  /** Stops taking new commands (drain) without abandoning the running ones. */
  private polling = Agent.stopController();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private pollLoop: Promise<void> | undefined;
  private readonly inflight = new Set<Promise<void>>();
  /** Command ids already taken (in flight or done), newest last; bounded. */
  private readonly seen = new Map<string, true>();
  private readonly roostChains = new Map<string, Promise<void>>();
  private readonly outcomes = new Map<string, CommandOutcome>();
  /** The periodic heartbeat in flight, if any (stop() waits for it so no request outlives the agent). */
  private beating: Promise<void> | undefined;

  constructor(opts: AgentOptions) {
    super();
    this.opts = opts;
    this.machineId = opts.machineId;
    this.siteId = opts.siteId;
    this.root = new MachineRoot(opts.rootDir);
    this.rootDir = this.root.dir;
    this.store = new ChunkStore(this.root.chunkDir);
    this.random = opts.random ?? Math.random;
    this.os = opts.os ?? hostOs();
    this.transport = new AgentTransport(opts, this.root, this.keys, () => this.abort.signal, this.random);
    this.processes = new ProcessSupervisor({
      transport: this.transport,
      os: this.os,
      warn: (m) => this.warn(m),
      syncMs: opts.processSyncMs ?? (opts.heartbeatMs || 30_000),
      onConfigRead: () => this.stats.processConfigReads++,
      tickMs: opts.processTickMs ?? 1000,
      stopGraceMs: opts.stopGraceMs ?? 10_000,
      stateDir: this.root.stateDir,
    });
    this.faults = new FaultInjector(opts, opts.machineId, this.random);
    this.limit = opts.downloadLimit ?? createLimiter(opts.downloadConcurrency ?? 8);
    this.keys.pin(opts.signingKeys);
  }

  /** The agent's HTTP client (its `token` is the agent token). */
  get api(): ApiClient {
    return this.transport.client;
  }

  /** True between start() and stop(). */
  get running(): boolean {
    return this.pollLoop !== undefined && !this.abort.signal.aborted;
  }

  /** Agent token (after enrolment). */
  get token(): string | undefined {
    return this.transport.token;
  }

  /** The site keys this agent trusts (from enrolment, the saved state, or a refresh). */
  get pinnedKeys(): SigningJwk[] {
    return this.keys.keys;
  }

  /**
   * Finishes any activation a crash interrupted (its journal; the trees become wholly the new version),
   * enrols (or proves a persisted token with a heartbeat), reports those activations, then heartbeats every
   * `heartbeatMs` and long-polls commands until stop(). Transient API failures are retried; a refused
   * enrolment throws.
   */
  async start(): Promise<void> {
    await this.boot(false);
  }

  /**
   * start(), and the restart after a reboot or shutdown (`restart`). A start tries its first contact (the
   * heartbeat or enrolment) a few times and throws, so its caller decides (agent/service.ts retries the
   * whole start with its own backoff); a restart has no caller to do that, so its first contact is
   * retried the way a report is (AgentTransport.retrying 'untilStopped': network failures and 503 with
   * backoff and Retry-After) until the API answers or the agent stops, each failure a warning. A refusal
   * (401 revoked token and the like) still throws at once.
   */
  private async boot(restart: boolean): Promise<void> {
    if (this.pollLoop) return;
    this.halted = false;
    if (this.abort.signal.aborted) this.abort = Agent.stopController();
    if (this.polling.signal.aborted) this.polling = Agent.stopController();
    await fs.mkdir(this.root.stateDir, { recursive: true });
    await fs.mkdir(this.root.chunkDir, { recursive: true });
    const recovered = await recoverActivations(this.root);
    if (!this.transport.token && this.opts.persistToken !== false) await this.transport.loadState();
    const every = this.opts.heartbeatMs ?? 30_000;
    const signal = this.abort.signal;
    const firstContact = (what: string, fn: () => Promise<unknown>) =>
      restart
        ? this.transport.retrying(
            () =>
              fn().catch((err: unknown) => {
                if (isTransient(err) && !signal.aborted) this.warn(`${what} after restart failed, retrying: ${errMessage(err)}`, err);
                throw err;
              }),
            'untilStopped',
          )
        : this.transport.retrying(fn);
    if (this.transport.token) {
      // A saved token: the first heartbeat proves it (a 401 re-enrols).
      await firstContact('heartbeat', () => this.heartbeat(restart ? signal : undefined));
      this.scheduleHeartbeats(every, every);
    } else {
      // Enrolment counts as a heartbeat; the first real one follows at a random point of the interval,
      // so a fleet started at once does not heartbeat in lockstep.
      await firstContact('enrolment', () => this.enrol());
      this.scheduleHeartbeats(every, Math.floor(every * this.random()));
    }
    // stop() while the enrolment or first heartbeat was out: nothing more starts.
    if (this.abort.signal.aborted) {
      if (this.heartbeatTimer) clearTimeout(this.heartbeatTimer);
      this.heartbeatTimer = undefined;
      return;
    }
    // Commands a previous run took and did not finish come first, in the order they were taken.
    for (const cmd of (await this.opts.journal?.pending()) ?? []) this.dispatch(cmd);
    this.pollLoop = this.runPollLoop();
    for (const j of recovered) this.track(reportRecoveredActivation({ transport: this.transport, warn: (m) => this.warn(m) }, j));
    this.processes.start();
  }

  /** Keeps `p` among the work stop() waits for. */
  private track(p: Promise<void>): void {
    this.inflight.add(p);
    void p.finally(() => this.inflight.delete(p));
  }

  /**
   * A reboot or shutdown (agent/power.ts): offline for rebootDowntimeMs (managed processes stopped, no
   * heartbeats, no polls), then back with the flags cleared, unless stop() was called meanwhile.
   */
  private async powerCycle(): Promise<void> {
    this.abort.abort();
    if (this.heartbeatTimer) clearTimeout(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
    await this.beating;
    await this.pollLoop;
    this.pollLoop = undefined;
    await this.processes.stop();
    await sleep(this.opts.rebootDowntimeMs ?? 15_000);
    if (this.halted) return;
    this.power = { rebooting: false, shuttingDown: false };
    this.emit('restarted');
    try {
      await this.boot(true);
    } catch (err) {
      // stop() while the restart waited for the API: nothing to report.
      if (this.halted) return;
      throw err;
    }
  }

  private scheduleHeartbeats(every: number, firstIn: number): void {
    if (every <= 0) return;
    const beat = () => {
      if (this.beating) return; // the previous one is still out
      this.beating = this.heartbeat(this.abort.signal)
        .then(() => undefined)
        .catch((err) => {
          if (!this.abort.signal.aborted) this.warn(`heartbeat failed: ${errMessage(err)}`, err);
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

  /**
   * Stops taking new commands and lets the running ones finish for up to `graceMs`, then stops (what is
   * still running then is abandoned; with a journal it runs again at the next start).
   * @returns true when every running command finished within the grace period
   */
  async drain(graceMs: number): Promise<boolean> {
    this.polling.abort();
    await this.pollLoop;
    let timer: NodeJS.Timeout | undefined;
    const finished = await Promise.race([
      Promise.allSettled([...this.inflight]).then(() => true),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), graceMs))),
    ]);
    clearTimeout(timer);
    await this.stop();
    return finished;
  }

  /** Number of commands running now. */
  get busy(): number {
    return this.inflight.size;
  }

  /** Stops polling and heartbeats and waits for running commands to end (an interrupted sync is abandoned). */
  async stop(): Promise<void> {
    this.polling.abort();
    this.halted = true;
    this.abort.abort();
    if (this.heartbeatTimer) clearTimeout(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
    await this.beating;
    await this.pollLoop;
    this.pollLoop = undefined;
    await Promise.allSettled([...this.inflight]);
    await this.processes.stop();
  }

  /** POST /api/agent/enrol: a new token (any previous one stops working). @throws HttpError when refused. */
  enrol(): Promise<void> {
    return this.transport.enrol();
  }

  /** POST /api/agent/heartbeat with a small simulated snapshot. */
  async heartbeat(signal?: AbortSignal): Promise<{ pendingCommands: number; processConfigStamp?: string }> {
    const res = await this.transport.heartbeat(signal, { processes: await this.processes.snapshot(), ...this.power });
    this.processes.noteConfigStamp(res.processConfigStamp);
    this.emit('heartbeat', res);
    const offer = res.agentUpdate;
    if (offer && this.opts.selfUpdate && !this.updating && !this.sameBuildOffers.has(offer.sha256)) {
      this.updating = this.selfUpdate(offer, this.opts.selfUpdate);
    }
    return res;
  }

  /** The self-update in flight, if any (one at a time; agent/self-update.ts). */
  private updating: Promise<void> | undefined;
  /** Checksums of offers that are this very executable (refused once, never tried again by this process). */
  private readonly sameBuildOffers = new Set<string>();

  /**
   * Upgrades this agent to the offered catalog version (agent/self-update.ts); emits `self-update` with the
   * result, or `self-update-failed` with the error (then a later heartbeat's offer may try again).
   */
  private async selfUpdate(offer: { version: string; sha256: string }, opts: SelfUpdateOptions): Promise<void> {
    try {
      const download = await this.transport.installerDownload(offer.version);
      const done = await applySelfUpdate(download, offer.sha256, opts);
      this.emit('self-update', done);
    } catch (err) {
      if (err instanceof SelfUpdateRefused && err.sameBuild) this.sameBuildOffers.add(offer.sha256);
      this.warn(`self-update to ${offer.version} failed: ${errMessage(err)}`);
      this.emit('self-update-failed', err);
      this.updating = undefined;
    }
  }

  /**
   * GET /api/agent/signing-keys over the authenticated agent channel and pins any new valid key. Only
   * this route and enrolment add keys: a key named by a version answer is never trusted on its own.
   */
  refreshSigningKeys(): Promise<void> {
    return this.transport.refreshSigningKeys();
  }

  /** Signed download URLs of a batch (≤1000 hashes), fetched in one call. */
  downloadUrls(hashes: string[]): Promise<DownloadUrls> {
    return this.transport.downloadUrls(hashes);
  }

  /** Loads the last committed manifest of a roost, or null. */
  readManifest(roostId: string): Promise<Manifest | null> {
    return this.root.readManifest(roostId);
  }

  /** `<rootDir>/staging/<roostId>/<versionId>`: the staged tree of a version. */
  stagingDir(roostId: string, versionId: string): string {
    return this.root.stagingDir(roostId, versionId);
  }

  private warn(message: string, err?: unknown): void {
    this.emit('warn', message, err);
  }

  private async runPollLoop(): Promise<void> {
    const signal = AbortSignal.any([this.abort.signal, this.polling.signal]);
    const wait = Math.min(30, Math.max(0, this.opts.pollWaitSeconds ?? 25));
    let backoff = 500;
    while (!signal.aborted) {
      try {
        const res = await this.transport.pollCommands(wait, signal, this.opts.inlineSync !== false);
        backoff = 500;
        for (const cmd of res.commands) this.dispatch(cmd);
        if (wait === 0) await sleep(1000, signal);
      } catch (err) {
        if (signal.aborted) break;
        this.warn(`command poll failed: ${errMessage(err)}`, err);
        await sleep(backoff * (0.5 + this.random() / 2), signal);
        backoff = Math.min(30_000, backoff * 2);
      }
    }
  }

  /** Runs a delivered command once (redeliveries of a command already taken are ignored). */
  dispatch(cmd: AgentCommand): void {
    if (this.seen.has(cmd.commandId)) return;
    this.seen.set(cmd.commandId, true);
    if (this.seen.size > REMEMBERED_COMMANDS) this.seen.delete(this.seen.keys().next().value as string);
    const journal = this.opts.journal;
    // The command's requests carry the trace context it was queued in, and the events it emits (logged by
    // agent/service.ts) its request id and trace id (agent/http.ts withCommandContext).
    const run = () =>
      withCommandContext(cmd, async () => {
        await journal?.taken(cmd);
        this.emit('started', cmd);
        const outcome = await this.execute(cmd);
        // Abandoned (the agent stopped mid-way): it stays journaled and runs again at the next start.
        if (outcome.status !== 'abandoned') await journal?.done(cmd.commandId);
        this.stats.commands++;
        this.outcomes.set(cmd.commandId, outcome);
        if (this.outcomes.size > REMEMBERED_COMMANDS) this.outcomes.delete(this.outcomes.keys().next().value as string);
        this.emit('command', outcome);
      });
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
    this.track(
      p.catch((err) => {
        this.warn(`command ${cmd.commandId} crashed: ${errMessage(err)}`);
      }),
    );
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

  /** Least gap between two progress reports of `cmd`: the agent's own, or the server's ask when longer (ms). */
  private progressGapOf(cmd: AgentCommand): number {
    return Math.max(this.opts.progressIntervalMs ?? PROGRESS_INTERVAL_MS, cmd.progressIntervalMs ?? 0);
  }

  /** What a sync or activation of `cmd` started now works with. */
  private syncContext(cmd: AgentCommand): SyncContext {
    return {
      siteId: this.siteId,
      transport: this.transport,
      warn: (m) => this.warn(m),
      root: this.root,
      store: this.store,
      keys: this.keys,
      limit: this.limit,
      faults: this.faults,
      signal: this.abort.signal,
      progressIntervalMs: this.progressGapOf(cmd),
      compact: this.opts.inlineSync !== false,
      fsync: this.opts.fsyncFiles !== false,
      stats: this.stats,
    };
  }

  private execute(cmd: AgentCommand): Promise<CommandOutcome> {
    switch (cmd.type) {
      case 'sync_pull':
        return runSyncPull(this.syncContext(cmd), cmd);
      case 'roost_activate':
        return runActivate(this.syncContext(cmd), cmd);
      case CLASSIC_INSTALL:
      case CLASSIC_UNINSTALL:
        return runClassicCommand(
          {
            transport: this.transport,
            os: this.os,
            downloadDir: path.join(this.root.stateDir, 'installers'),
            ca: this.opts.installerCa,
            progressIntervalMs: this.progressGapOf(cmd),
            closeGraceMs: this.opts.closeGraceMs ?? 5000,
            suppress: (entries) => this.processes.suppress(entries),
            signal: this.abort.signal,
            warn: (m) => this.warn(m),
          },
          cmd,
        );
      case 'reboot_machine':
      case 'shutdown_machine':
        return runPowerCommand(
          {
            transport: this.transport,
            warn: (m, err) => this.warn(m, err),
            signal: this.abort.signal,
            announce: async (flags) => {
              this.power = flags;
              await this.heartbeat().catch((err) => this.warn(`heartbeat failed: ${errMessage(err)}`));
            },
            powerCycle: () => this.powerCycle(),
          },
          cmd,
        );
      case 'capture_screenshot':
        return runScreenshot(
          { transport: this.transport, warn: (m) => this.warn(m) },
          cmd,
          this.opts.uploadScreenshots !== false,
          async () => ({
            machineId: this.machineId,
            processes: await this.processes.snapshot(),
          }),
        );
      default:
        if (PROCESS_COMMAND_TYPES.includes(cmd.type)) return this.processes.command(cmd);
        return closeCommand(
          { transport: this.transport, warn: (m) => this.warn(m) },
          cmd,
          'failed',
          `unsupported command type ${cmd.type}`,
        );
    }
  }
}
