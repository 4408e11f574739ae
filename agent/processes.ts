/**
 * Managed processes on the machine (`/api/sites/{siteId}/machines/{machineId}/processes`;
 * docs/decisions/managed-processes.md): the reference agent runs each configured process as a real child
 * process through AgentOs (agent/os.ts).
 *
 * - Configs come from `GET /api/agent/processes` every `syncMs` (and before a process command); the site's
 *   time zone comes with them.
 * - A process should run when a start command overrides it on, or (no override) when `launch_mode` is
 *   `always`, or `scheduled` and a schedule block is open now in the site's time zone. A stop command
 *   overrides it off; an override lasts until the config changes or a scheduled process's window flips.
 * - Launch: after `time_delay` seconds (status `waiting`), `starting` for `time_to_init` seconds, then `running`.
 * - A process that exits on its own has crashed: it is relaunched (`relaunching`) up to `relaunch_attempts`
 *   times, then `failed` until a start command, a config change or a window flip.
 * - Stop is graceful (SIGTERM / taskkill) and kills after `stopGraceMs`; kill is immediate; restart is
 *   stop then start.
 * - `snapshot()` is the heartbeat's `processes` list: processId, name, pid, status, responsive (process
 *   state not stopped or zombie), restarts, launch_mode, updatedAt.
 * - Agent restarts: each launch is recorded in the state folder (agent/process-records.ts) with the pid and
 *   its identity (agent/os.ts `ProcessIdentity`). The first config read after a start adopts every recorded
 *   process still alive with the same identity (tracked by polling, since it is not our child: stop, kill,
 *   restart, crash relaunch and the heartbeat act on it) and never signals a pid whose identity differs.
 *   A recorded process whose config was deleted meanwhile is stopped.
 */
import type { ChildProcess } from 'node:child_process';
import { type ScheduleBlock, scheduleOpen } from '../domain/processes';
import type { CommandOutcome } from './commands';
import { errMessage } from './errors';
import { type ProcessRecord, ProcessRecords, type SavedOverride } from './process-records';
import { type AgentOs, type ProcessIdentity, type ProcessPriority, type ProcessVisibility, sameProcess, splitFlags } from './os';
import type { AgentCommand, AgentTransport } from './transport';

/** A process config as `GET /api/agent/processes` answers it. */
export interface ProcessConfig {
  processId: string;
  name: string;
  exe_path: string;
  file_path: string | null;
  cwd: string | null;
  priority: ProcessPriority;
  visibility: ProcessVisibility;
  launch_mode: 'off' | 'always' | 'scheduled';
  time_delay: number;
  time_to_init: number;
  relaunch_attempts: number;
  schedules: ScheduleBlock[];
  updatedAt: string;
}

/** One entry of the heartbeat's `processes`. */
export interface ProcessReport {
  processId: string;
  name: string;
  pid: number | null;
  status: string;
  responsive: boolean | null;
  restarts: number;
  launch_mode: string;
  updatedAt: string;
}

/** One launch of a managed process: our child, or a process a previous agent run launched (adopted). */
interface Run {
  pid: number | undefined;
  /** The child process; null when adopted (not our child: its exit is noticed by polling its identity). */
  child: ChildProcess | null;
  /** Its identity once read (always set for an adopted run); null when it could not be read. */
  identity: ProcessIdentity | null;
}

interface Managed {
  cfg: ProcessConfig;
  run: Run | null;
  status: 'stopped' | 'waiting' | 'starting' | 'running' | 'relaunching' | 'failed' | 'stopping';
  restarts: number;
  override: 'run' | 'stop' | null;
  launchAt: number | null;
  runningAt: number | null;
  /** We asked it to end: its exit is not a crash. */
  ending: boolean;
  lastOpen: boolean | null;
  changedAt: number;
  exited: Promise<void> | null;
}

/** What the supervisor works with. */
export interface SupervisorContext {
  transport: AgentTransport;
  os: AgentOs;
  warn: (message: string) => void;
  /**
   * Config read interval (ms) while the server sends no `processConfigStamp` (heartbeats off, or an older
   * server); with stamps the configs are read when the stamp changes, and every STAMPED_RESYNC_MS regardless.
   */
  syncMs: number;
  /** Counts each config read (the agent's `processConfigReads` stat). */
  onConfigRead?: () => void;
  /** State machine tick (ms). */
  tickMs: number;
  /** Time a graceful stop gets before the kill (ms). */
  stopGraceMs: number;
  /**
   * The agent's state folder: launches are recorded in its `processes/` (agent/process-records.ts) and
   * adopted after a restart. Unset: nothing is recorded (a process outlives a killed agent unknown).
   */
  stateDir?: string;
}

/**
 * True when a `suppress_projects` entry (classic deployments) names this managed process: an entry without
 * a path separator is compared with the process name; one with `/` or `\\` is a path, matching the
 * process's exe_path or cwd when equal to it or when they lie inside it. Case-insensitive, separators and a
 * trailing separator ignored (Windows paths are case-insensitive; on Linux a case-only difference is
 * treated as the same project).
 */
export function suppressedBy(entries: readonly string[], cfg: Pick<ProcessConfig, 'name' | 'exe_path' | 'cwd'>): boolean {
  const norm = (x: string) => x.trim().replace(/\\/g, '/').replace(/\/+$/, '').toLowerCase();
  const inside = (p: string | null, dir: string) => p !== null && (norm(p) === dir || norm(p).startsWith(`${dir}/`));
  return entries.some((raw) => {
    const e = norm(raw);
    if (e === '') return false;
    if (!/[\\/]/.test(raw)) return norm(cfg.name) === e;
    return inside(cfg.exe_path, e) || inside(cfg.cwd, e);
  });
}

/** With heartbeat stamps, the configs are still re-read this often (ms): a safety net, not the mechanism. */
export const STAMPED_RESYNC_MS = 15 * 60_000;

/** Runs the machine's managed processes. */
export class ProcessSupervisor {
  private readonly procs = new Map<string, Managed>();
  private timezone = 'UTC';
  private timer: NodeJS.Timeout | undefined;
  private lastSync = 0;
  /** The latest `processConfigStamp` a heartbeat answered, and the one the last successful read started under. */
  private stamp: string | undefined;
  private syncedStamp: string | undefined;
  private syncing: Promise<void> | undefined;
  private running = false;
  /** A tick is running (the next is planned when it ends). */
  private ticking = false;
  /** When the planned tick runs (epoch ms). */
  private wakeAt = 0;
  /** `suppress_projects` lists of the classic installs running now. */
  private readonly suppressions = new Set<readonly string[]>();
  private readonly records: ProcessRecords | null;
  /** Record writes and removals of each process, in order (a removal never overtakes the write before it). */
  private readonly recordOps = new Map<string, Promise<void>>();
  /** The reconciliation with the records of a previous run (once; the first config read waits for it). */
  private recovery: Promise<void> | undefined;
  /** Recorded processes found alive with their identity, adopted by the next successful config read. */
  private readonly orphans = new Map<string, { rec: ProcessRecord; identity: ProcessIdentity }>();
  /** Overrides a previous agent run saved, restored by the config read that first sees each process. */
  private savedOverrides: Record<string, SavedOverride> = {};
  /** The last write of the overrides file (writes run one after another, the latest state last). */
  private overridesWrite: Promise<void> = Promise.resolve();

  constructor(private readonly ctx: SupervisorContext) {
    this.records = ctx.stateDir ? new ProcessRecords(ctx.stateDir) : null;
  }

  /** Starts the periodic config read and state machine. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.schedule(0);
  }

  /** Runs the next tick in `delayMs` (replacing the one planned); nothing while a tick runs or once stopped. */
  private schedule(delayMs: number): void {
    if (!this.running || this.ticking) return;
    if (this.timer) clearTimeout(this.timer);
    this.wakeAt = Date.now() + delayMs;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.ticking = true;
      this.tick()
        .catch((err) => this.ctx.warn(`process supervisor: ${errMessage(err)}`))
        .finally(() => {
          this.ticking = false;
          this.schedule(this.nextDelay());
        });
    }, delayMs).unref();
  }

  /**
   * Gap to the next tick (ms): tickMs while there are processes to supervise or a config read is owed;
   * with none, until the next periodic config read. A machine without managed processes (most of a fleet)
   * then wakes every few minutes instead of every second: at 10,000 simulated machines the idle ticks were
   * 6% of the fleet's CPU (docs/benchmarks.md "The long-poll check"). What gives it processes wakes it
   * (`wake`: a config read that found some, a new heartbeat stamp).
   */
  private nextDelay(): number {
    if (this.procs.size > 0 || (this.stamp !== undefined && this.stamp !== this.syncedStamp)) return this.ctx.tickMs;
    const every = this.stamp === undefined ? this.ctx.syncMs : STAMPED_RESYNC_MS;
    return Math.max(this.ctx.tickMs, this.lastSync + every - Date.now());
  }

  /** Brings the next tick forward to within tickMs when it is planned later (after a tick, nextDelay decides). */
  private wake(): void {
    if (this.wakeAt > Date.now() + this.ctx.tickMs) this.schedule(this.ctx.tickMs);
  }

  /** Stops every managed process (gracefully, then killed) and the loop: what a reboot or an agent exit does. */
  async stop(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    await this.syncing?.catch(() => undefined);
    await Promise.all([...this.procs.values()].map((m) => this.end(m, false)));
    // The records of the processes just ended are removed before the agent exits.
    await Promise.all([...this.recordOps.values()]);
  }

  /** The heartbeat's `processes` list. */
  async snapshot(): Promise<ProcessReport[]> {
    if (this.procs.size === 0) return [];
    const states = new Map((await this.ctx.os.listProcesses().catch(() => [])).map((p) => [p.pid, p.state]));
    return [...this.procs.values()].map((m) => {
      const pid = m.run?.pid ?? null;
      const state = pid !== null ? states.get(pid) : undefined;
      return {
        processId: m.cfg.processId,
        name: m.cfg.name,
        pid,
        status: m.status,
        responsive: pid === null ? null : state === undefined ? this.ctx.os.platform === 'win32' : state !== 'T' && state !== 'Z',
        restarts: m.restarts,
        launch_mode: m.cfg.launch_mode,
        updatedAt: new Date(m.changedAt).toISOString(),
      };
    });
  }

  /** Handles kill_process, restart_process, start_process and stop_process. */
  async command(cmd: AgentCommand): Promise<CommandOutcome> {
    const processId = String(cmd.params?.processId ?? '');
    const report = (status: 'completed' | 'failed', error?: string) =>
      this.ctx.transport
        .reportCommand(cmd.commandId, status === 'completed' ? { status, result: 'success', progress: 100 } : { status, error })
        .catch((err) => this.ctx.warn(`could not report ${cmd.commandId}: ${errMessage(err)}`));
    const done = async (status: 'completed' | 'failed', error?: string): Promise<CommandOutcome> => {
      await report(status, error);
      return {
        commandId: cmd.commandId,
        type: cmd.type,
        status,
        ...(status === 'completed' ? { result: 'success' as const } : {}),
        ...(error ? { error } : {}),
      };
    };
    try {
      const first = await this.ctx.transport.reportCommand(cmd.commandId, { status: 'running' });
      if (!first.applied) return { commandId: cmd.commandId, type: cmd.type, status: 'cancelled' };
      if (!this.procs.has(processId)) await this.sync();
      const m = this.procs.get(processId);
      if (!m) return done('failed', `unknown process ${processId}`);
      switch (cmd.type) {
        case 'kill_process':
          await this.setOverride(m, 'stop');
          await this.end(m, true);
          return done('completed');
        case 'stop_process':
          await this.setOverride(m, 'stop');
          await this.end(m, false);
          return done('completed');
        case 'start_process':
        case 'restart_process': {
          if (cmd.type === 'restart_process') await this.end(m, false);
          await this.setOverride(m, 'run');
          m.restarts = 0;
          // A classic install holds it stopped (suppress_projects): it starts once the install ended.
          if (this.suppressed(m)) return done('failed', 'suppressed while a classic install runs; it starts when the install ends');
          const err = await this.launch(m);
          return err ? done('failed', err) : done('completed');
        }
        default:
          return done('failed', `unsupported command type ${cmd.type}`);
      }
    } catch (err) {
      return done('failed', errMessage(err));
    }
  }

  /**
   * Suppresses the managed processes `entries` name (suppressedBy) for a classic install: reads the configs,
   * stops the matching ones (graceful, then killed after the grace time) and keeps them from being launched
   * or relaunched, start commands included, until the returned release function is called; then they
   * run again per their launch mode (after their time_delay). Resolves once they have ended.
   */
  async suppress(entries: readonly string[]): Promise<() => void> {
    const list = [...entries];
    this.suppressions.add(list);
    const release = () => void this.suppressions.delete(list);
    try {
      await this.sync();
      const matching = [...this.procs.values()].filter((m) => suppressedBy(list, m.cfg));
      await Promise.all(matching.map(async (m) => (m.run && !m.ending ? this.end(m, false) : m.exited)));
      return release;
    } catch (err) {
      release();
      throw err;
    }
  }

  private suppressed(m: Managed): boolean {
    for (const list of this.suppressions) if (suppressedBy(list, m.cfg)) return true;
    return false;
  }

  /**
   * Notes the `processConfigStamp` of a heartbeat answer (POST /api/agent/heartbeat): the configs are read
   * again on the next tick only when it differs from the stamp of the last read.
   */
  noteConfigStamp(stamp: string | undefined): void {
    if (typeof stamp !== 'string') return;
    this.stamp = stamp;
    if (stamp !== this.syncedStamp) this.wake();
  }

  /**
   * Reads the configs now (deleted processes are stopped and forgotten; changed ones clear their override).
   * The first read adopts the processes a previous agent run launched and left running (`recover`).
   */
  sync(): Promise<void> {
    this.syncing ??= (async () => {
      try {
        this.recovery ??= this.recover();
        await this.recovery;
        const stampAtStart = this.stamp;
        this.ctx.onConfigRead?.();
        const res = await this.ctx.transport.callRetrying<{ timezone: string; processes: ProcessConfig[] }>('GET', '/api/agent/processes');
        this.timezone = res.timezone;
        this.lastSync = Date.now();
        // A change after stampAtStart shows as a newer stamp on a later heartbeat: read again then.
        this.syncedStamp = stampAtStart;
        const seen = new Set<string>();
        for (const cfg of res.processes) {
          seen.add(cfg.processId);
          const m = this.procs.get(cfg.processId);
          if (!m) {
            const fresh = this.managed(cfg);
            this.restoreOverride(fresh);
            this.procs.set(cfg.processId, fresh);
            const orphan = this.orphans.get(cfg.processId);
            this.orphans.delete(cfg.processId);
            if (orphan) this.adopt(fresh, orphan.rec, orphan.identity);
          } else if (m.cfg.updatedAt !== cfg.updatedAt) {
            m.cfg = cfg;
            if (m.override) void this.setOverride(m, null);
            if (m.status === 'failed') m.status = 'stopped';
            m.restarts = 0;
          }
        }
        for (const [id, m] of this.procs) {
          if (seen.has(id)) continue;
          await this.end(m, false);
          this.procs.delete(id);
        }
        // Recorded processes whose config was deleted while the agent was down: stopped, not adopted.
        const gone = [...this.orphans.values()];
        this.orphans.clear();
        await Promise.all(
          gone.map(async ({ rec, identity }) => {
            const m = this.managed(recordConfig(rec));
            this.adopt(m, rec, identity);
            await this.end(m, false);
          }),
        );
        if (this.procs.size > 0) this.wake();
      } finally {
        this.syncing = undefined;
      }
    })();
    return this.syncing;
  }

  private async tick(): Promise<void> {
    const due =
      this.stamp === undefined
        ? Date.now() - this.lastSync >= this.ctx.syncMs
        : this.stamp !== this.syncedStamp || Date.now() - this.lastSync >= STAMPED_RESYNC_MS;
    if (due) await this.sync();
    const now = Date.now();
    for (const m of this.procs.values()) {
      const open = m.cfg.launch_mode === 'scheduled' ? scheduleOpen(m.cfg.schedules, this.timezone, now) : null;
      if (open !== null && m.lastOpen !== null && open !== m.lastOpen) {
        if (m.override) void this.setOverride(m, null); // the window flipped: the schedule decides again
        if (m.status === 'failed') m.status = 'stopped';
        m.restarts = 0;
      }
      m.lastOpen = open;
      const want =
        !this.suppressed(m) &&
        (m.override ? m.override === 'run' : m.cfg.launch_mode === 'always' || (m.cfg.launch_mode === 'scheduled' && open === true));
      if (!want) {
        if (m.run && !m.ending) await this.end(m, false);
        if (m.status === 'waiting') this.set(m, 'stopped');
        m.launchAt = null;
        continue;
      }
      if (m.run) {
        if (m.status === 'starting' && m.runningAt !== null && now >= m.runningAt) this.set(m, 'running');
        continue;
      }
      if (m.status === 'failed' || m.ending) continue;
      if (m.status === 'relaunching') {
        await this.launch(m);
        continue;
      }
      if (m.launchAt === null) {
        m.launchAt = now + m.cfg.time_delay * 1000;
        if (m.cfg.time_delay > 0) this.set(m, 'waiting');
      }
      if (now >= m.launchAt) await this.launch(m);
    }
  }

  /**
   * Sets `m`'s start/stop override and saves every override to the state folder before it resolves, so a
   * process a stop command took down stays down after the agent is killed and restarted (and one a start
   * command brought up keeps running). Failures to save are warned about; the override holds in memory.
   */
  private async setOverride(m: Managed, override: Managed['override']): Promise<void> {
    m.override = override;
    if (!this.records) return;
    const records = this.records;
    const now = Date.now();
    const saved: Record<string, SavedOverride> = {};
    for (const p of this.procs.values()) {
      if (!p.override) continue;
      const open = p.cfg.launch_mode === 'scheduled' ? scheduleOpen(p.cfg.schedules, this.timezone, now) : null;
      saved[p.cfg.processId] = { override: p.override, configUpdatedAt: p.cfg.updatedAt, open };
    }
    this.overridesWrite = this.overridesWrite
      .then(() => records.writeOverrides(saved))
      .catch((err) => this.ctx.warn(`process overrides: ${errMessage(err)}`));
    await this.overridesWrite;
  }

  /** Restores the override a previous agent run saved for `m`, while its config and schedule state are as they were then. */
  private restoreOverride(m: Managed): void {
    const o = this.savedOverrides[m.cfg.processId];
    delete this.savedOverrides[m.cfg.processId];
    if (!o || o.configUpdatedAt !== m.cfg.updatedAt) return;
    const open = m.cfg.launch_mode === 'scheduled' ? scheduleOpen(m.cfg.schedules, this.timezone, Date.now()) : null;
    if (open !== o.open) return;
    m.override = o.override;
    m.lastOpen = open;
  }

  /** A managed process nothing runs for yet. */
  private managed(cfg: ProcessConfig): Managed {
    return {
      cfg,
      run: null,
      status: 'stopped',
      restarts: 0,
      override: null,
      launchAt: null,
      runningAt: null,
      ending: false,
      lastOpen: null,
      changedAt: Date.now(),
      exited: null,
    };
  }

  /**
   * Reconciles with the records a previous agent run left (it was killed before it could stop its
   * processes): a recorded process alive with the same identity (agent/os.ts `sameProcess`) waits in
   * `orphans` for the config read that adopts it; any other record names an ended process or a reused pid
   * and is removed without signalling anything. Never throws (an unreadable folder is warned about).
   */
  private async recover(): Promise<void> {
    if (!this.records) return;
    this.savedOverrides = await this.records.readOverrides();
    try {
      for (const rec of await this.records.list()) {
        const now = await this.ctx.os.processIdentity(rec.pid);
        if (sameProcess(rec.identity, now)) this.orphans.set(rec.processId, { rec, identity: now! });
        else await this.recordOp(rec.processId, () => this.records!.remove(rec.processId));
      }
    } catch (err) {
      this.ctx.warn(`process records: ${errMessage(err)}`);
    }
  }

  /**
   * Tracks a recorded process of a previous agent run as `m`'s run: `running`, its pid reported, its exit
   * noticed by polling its identity every tickMs (a crash then relaunches it like our own child's). The
   * relaunch count carries over when the config did not change meanwhile.
   */
  private adopt(m: Managed, rec: ProcessRecord, identity: ProcessIdentity): void {
    const run: Run = { pid: rec.pid, child: null, identity };
    m.run = run;
    m.ending = false;
    m.runningAt = Date.now();
    if (rec.configUpdatedAt === m.cfg.updatedAt && Number.isInteger(rec.restarts)) m.restarts = rec.restarts;
    this.set(m, 'running');
    this.ctx.warn(`process ${m.cfg.name}: adopted pid ${rec.pid} launched by a previous agent run (${identity.cmdline})`);
    m.exited = new Promise((resolve) => {
      const poll = async () => {
        if (sameProcess(identity, await this.ctx.os.processIdentity(rec.pid))) {
          setTimeout(() => void poll(), this.ctx.tickMs).unref();
          return;
        }
        this.ended(m, run);
        resolve();
      };
      void poll();
    });
  }

  /** The bookkeeping of a run's end: a crash unless we asked it to end; its record is removed. */
  private ended(m: Managed, run: Run, spawnError?: string): void {
    if (m.run === run) {
      m.run = null;
      if (m.ending) this.set(m, 'stopped');
      else if (m.restarts < m.cfg.relaunch_attempts) {
        m.restarts++;
        this.set(m, 'relaunching');
      } else {
        this.set(m, 'failed');
        if (spawnError) this.ctx.warn(`process ${m.cfg.name}: ${spawnError}`);
      }
    }
    if (this.records && run.pid !== undefined) void this.recordOp(m.cfg.processId, () => this.records!.remove(m.cfg.processId));
  }

  /** Runs a record write or removal of `processId` after the ones queued before it; failures are warned about. */
  private recordOp(processId: string, op: () => Promise<void>): Promise<void> {
    const next = (this.recordOps.get(processId) ?? Promise.resolve())
      .then(op)
      .catch((err) => this.ctx.warn(`process record of ${processId}: ${errMessage(err)}`));
    this.recordOps.set(processId, next);
    void next.finally(() => {
      if (this.recordOps.get(processId) === next) this.recordOps.delete(processId);
    });
    return next;
  }

  /** Records a run we launched (pid and identity) before the launch counts as done. */
  private async remember(m: Managed, run: Run): Promise<void> {
    if (!this.records || run.pid === undefined) return;
    const pid = run.pid;
    run.identity = await this.ctx.os.processIdentity(pid);
    // Gone already (it crashed at once): its close removes nothing worth writing first.
    if (!run.identity || m.run !== run) return;
    const rec: ProcessRecord = {
      processId: m.cfg.processId,
      name: m.cfg.name,
      pid,
      identity: run.identity,
      exePath: m.cfg.exe_path,
      restarts: m.restarts,
      configUpdatedAt: m.cfg.updatedAt,
      launchedAt: new Date().toISOString(),
    };
    await this.recordOp(m.cfg.processId, () => this.records!.write(rec));
  }

  /** True when it is safe to signal the run's pid: our child, or an adopted process still the one recorded. */
  private async signalable(run: Run): Promise<boolean> {
    if (run.pid === undefined) return false;
    if (run.child) return true;
    return run.identity !== null && sameProcess(run.identity, await this.ctx.os.processIdentity(run.pid));
  }

  private set(m: Managed, status: Managed['status']): void {
    if (m.status !== status) {
      m.status = status;
      m.changedAt = Date.now();
    }
  }

  /** Starts the process now and records it. Resolves with an error message when it could not start. */
  private async launch(m: Managed): Promise<string | undefined> {
    if (m.run) return undefined;
    let child: ChildProcess;
    try {
      child = this.ctx.os.launch({
        exePath: m.cfg.exe_path,
        args: m.cfg.file_path ? splitFlags(m.cfg.file_path) : [],
        cwd: m.cfg.cwd ?? undefined,
        priority: m.cfg.priority,
        visibility: m.cfg.visibility,
      });
    } catch (err) {
      this.set(m, 'failed');
      return `could not start ${m.cfg.exe_path}: ${errMessage(err)}`;
    }
    const run: Run = { pid: child.pid, child, identity: null };
    m.run = run;
    m.ending = false;
    m.launchAt = null;
    m.runningAt = Date.now() + m.cfg.time_to_init * 1000;
    this.set(m, m.cfg.time_to_init > 0 ? 'starting' : 'running');
    let spawnError: string | undefined;
    child.on('error', (err) => (spawnError = errMessage(err)));
    m.exited = new Promise((resolve) => {
      child.on('close', () => {
        this.ended(m, run, spawnError);
        resolve();
      });
    });
    if (child.pid === undefined) return `could not start ${m.cfg.exe_path}`;
    await this.remember(m, run);
    return undefined;
  }

  /** Ends the process: graceful (then killed after stopGraceMs) or forced; resolves once it exited. */
  private async end(m: Managed, force: boolean): Promise<void> {
    const run = m.run;
    m.launchAt = null;
    if (!run || run.pid === undefined) {
      if (m.status !== 'failed') this.set(m, 'stopped');
      return;
    }
    const pid = run.pid;
    m.ending = true;
    this.set(m, 'stopping');
    const exited = m.exited ?? Promise.resolve();
    // An adopted pid is signalled only while its identity still matches (never a reused pid); when it
    // does not, the process has ended and its poll resolves `exited`.
    if (force) {
      if (await this.signalable(run)) await this.ctx.os.kill(pid);
    } else {
      if (await this.signalable(run)) await this.ctx.os.terminate(pid);
      const t = new Promise<boolean>((r) => setTimeout(() => r(false), this.ctx.stopGraceMs).unref());
      if (!(await Promise.race([exited.then(() => true), t])) && (await this.signalable(run))) await this.ctx.os.kill(pid);
    }
    await exited;
    m.ending = false;
    this.set(m, 'stopped');
  }
}

/** A stand-in config for a recorded process whose config is gone (it is only stopped). */
function recordConfig(rec: ProcessRecord): ProcessConfig {
  return {
    processId: rec.processId,
    name: rec.name,
    exe_path: rec.exePath,
    file_path: null,
    cwd: null,
    priority: 'normal',
    visibility: 'visible',
    launch_mode: 'off',
    time_delay: 0,
    time_to_init: 0,
    relaunch_attempts: 0,
    schedules: [],
    updatedAt: rec.configUpdatedAt,
  };
}
