/**
 * The agent protocol, service side (docs/agent-protocol.md): enrolment, heartbeats, long-poll command
 * delivery, command results and screenshots, the sync answer of a version (signed body URL and signature)
 * and target-state reports. The routes are api/routes/agent.ts; the SQL is db/machines.ts.
 *
 * Secrets and tokens are stored as SHA-256 digests only. Long-poll: waiting requests register in one
 * per-process `CommandWaiters`; one loop checks the database every ~250 ms for all waiting machines of a
 * site with a single query, so a thousand waiting agents cost four queries a second, not four thousand,
 * and hands out delivery slots so at most MAX_DELIVERING deliveries are built at once.
 */
import { ApiError } from '../domain/errors';
import { hexEqual, isSha256Hex, randomToken, sha256Hex } from '../domain/hex';
import type { SigningJwk } from '../domain/signature';
import {
  type AgentVersionRow,
  type CommandReport,
  type CommandRow,
  type EnrolInput,
  type HeartbeatInput,
  type TargetStateInput,
  type TargetStateRow,
  claimCommands,
  enrolMachine as enrolMachineRow,
  expireSitePendingCommands,
  getCommand,
  deliverableMachinesPage,
  machinesWithDeliverable,
  recordHeartbeat,
  reportCommand,
  reportCommandWithState,
  roostAndVersionExist,
  roostVersionForAgent,
  setCommandArtifact,
  setSiteEnrolmentSecretHash,
  siteEnrolmentSecretHash,
  upsertTargetState,
} from '../db/machines';
import type { VersionBody } from '../domain/version';
import type { ServiceDeps } from './deps';
import { ensureVersionSignatures, listSigningKeys, sealKeyOf } from './signing';
import { noteTargetReport } from './observability';
import { loadVersionBody } from './version-bodies';
import { downloadUrls } from './chunks';

export type { CommandRow, HeartbeatInput, TargetStateRow };

/** Longest long-poll (seconds); larger `wait` values are capped. */
export const MAX_WAIT_SECONDS = 30;
/** Interval of the shared long-poll check (ms). */
export const POLL_INTERVAL_MS = 250;
/**
 * Deliveries (a claim and its inline syncs) one API process builds at once; the long-polls beyond it wait
 * for a free slot (see CommandWaiters).
 */
export const MAX_DELIVERING = 8;
/**
 * Commands of one site handed out and not finished (delivered, not completed; see machinesWithDeliverable)
 * beyond which the check hands out no more (see CommandWaiters): the wave then runs as fast as machines
 * finish, with at most this many syncing at once. Counting only deliveries not yet acknowledged (the
 * earlier rule) let a 10,000-machine wave hand out thousands of syncs that then ran side by side. The syncs
 * in flight share the API, the database and the blob store, so each lasts about (syncs in flight) ÷ (syncs
 * finished per second): ~14 s at 1,000 on two cores, longer than the agents' 5 s progress interval, which
 * the poll answer therefore stretches with the count (progressIntervalFor). A cap of 250 kept syncs short
 * without that, but no longer kept both cores busy at 10,000 machines (55–62 commits/s against 70;
 * docs/benchmarks.md "Statistics").
 */
export const MAX_IN_FLIGHT_PER_SITE = 1000;
/**
 * Progress reports per second that a site's commands in flight may send together: the poll answer's
 * `progressIntervalMs` (progressIntervalFor) spreads this budget over them. 25, not 50: the budget must
 * stay under the rate at which syncs finish, or the gap it asks for is shorter than a sync (a wave that
 * finished 52 syncs a second with 1,000 in flight, ~19 s each, was asked for 20 s at 50 a second and
 * still sent a progress report on many of them: docs/benchmarks.md "Statistics").
 */
export const PROGRESS_REPORTS_PER_SECOND = 25;
/** The longest progress gap the poll answer asks for (ms): well inside the stall bound (ROOST_COMMAND_STALL_MS, 120 s). */
export const MAX_PROGRESS_INTERVAL_MS = 30_000;

/**
 * The least gap between two progress reports of one command that the poll answer asks of an agent
 * (`progressIntervalMs`, ms), when `inFlight` commands of its site are in flight: together they then send
 * at most PROGRESS_REPORTS_PER_SECOND (250 in flight: 10 s; 750 and more: the cap), at most MAX_PROGRESS_INTERVAL_MS.
 * An agent keeps its own interval when that is longer (docs/agent-protocol.md "Commands"). A wave whose
 * syncs each outlast the agents' own interval would otherwise send a progress report per machine on top of
 * its first and last (docs/benchmarks.md "Statistics").
 */
export function progressIntervalFor(inFlight: number): number {
  return Math.min(MAX_PROGRESS_INTERVAL_MS, Math.ceil((Math.max(0, inFlight) * 1000) / PROGRESS_REPORTS_PER_SECOND));
}

/**
 * Polls of one site waiting beyond which the long-poll check no longer sends their ids but reads pages of
 * the site's pending machines (CommandWaiters readyByScan): an id list of thousands cost PostgreSQL more
 * to plan than to run (docs/benchmarks.md "The long-poll check").
 */
export const ID_LIST_MAX = 500;
/** Rows of the first page a check reads (its window's room is not known before). */
export const SCAN_PAGE_ROWS = 256;
/** Most pending machines one check reads in one site (a bound on its cost when few of them have a poll waiting). */
export const SCAN_MAX_ROWS = 20_000;
/** Every how many checks the long-poll loop closes a site's expired pending commands (2 s at POLL_INTERVAL_MS). */
export const EXPIRE_EVERY_CHECKS = 8;
/** Largest screenshot PNG accepted (bytes). */
export const MAX_SCREENSHOT_BYTES = 10 * 1024 * 1024;
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/** Shape of an enrolment secret as `POST /api/sites/{siteId}/enrolment-secret` issues it. */
export const ENROLMENT_SECRET_RE = /^ses_[A-Za-z0-9_-]{43}$/;

/** Blob name of a command's screenshot in the screenshots container. */
export function screenshotBlobName(siteId: string, machineId: string, commandId: string): string {
  return `sites/${siteId}/machines/${machineId}/screenshots/${commandId}.png`;
}

/** The machine an agent token is bound to (the route reads it from the request's agent principal). */
export interface AgentIdentity {
  siteId: string;
  machineId: string;
}

/** Where the waiter loop reports a failed check (a pino/Fastify logger fits). */
export interface WarnLogger {
  warn(obj: object, msg: string): void;
}

interface Waiter {
  resolve: (slot: boolean) => void;
  timer: NodeJS.Timeout;
}

/**
 * Per-process registry of long-polling agents, and the pacing of deliveries. One loop checks the
 * database every `intervalMs` for the waiting machines of each site that have a deliverable command (one
 * query per site and 5,000 machines, reading the partial index `commands_pending`) and keeps them as a
 * ready list, cut so that the site's deliveries in flight (handed out, not finished) stay under
 * `maxInFlight`; a ready machine's poll is woken only while fewer than `maxDelivering` deliveries are being
 * built, and each delivery's `release()` wakes the next ready one at once.
 *
 * Why slots: a wave queued for 10,000 machines made every waiting poll deliverable at once; woken
 * together (or 500 per check), their claims and inline syncs queued by the thousand for the database
 * pool, and the reports and heartbeats of machines already syncing waited behind them (minutes at 10,000
 * simulated machines: docs/benchmarks.md "10,000 machines"). With slots the work in flight stays
 * bounded, machines finish what they started first, and the rest wait in their long-poll, which costs
 * nothing. Slots alone still let a settled fleet take 9,900 deliveries in 20 s, faster than the agents'
 * first reports could come back; past 60 s unreported, commands were handed out again (redelivery),
 * which cost more deliveries still. The window ties the hand-out rate to the rate at which machines
 * finish (it first counted only deliveries without a report, which bounded the hand-out but not the syncs
 * running at once: see MAX_IN_FLIGHT_PER_SITE).
 */
export class CommandWaiters {
  private readonly bySite = new Map<string, Map<string, Set<Waiter>>>();
  /**
   * Commands in flight per site as the last check counted them, plus the deliveries it made ready (sites
   * with waiting polls only).
   */
  private inFlightBySite = new Map<string, number>();
  /** Machines found deliverable by the last check, not yet woken ([siteId, machineId]; `readyAt` is the next). */
  private ready: [string, string][] = [];
  private readyAt = 0;
  private inFlight = 0;
  /** Slots ever handed out (never decreases): what was taken while a check's statement ran. */
  private acquired = 0;
  private checks = 0;
  private loop: NodeJS.Timeout | undefined;
  private closed = false;

  /**
   * @param intervalMs pause between two checks (ms)
   * @param maxDelivering deliveries built at once (slots)
   * @param maxInFlight a site's deliveries in flight (handed out, not finished) beyond which none are woken
   */
  constructor(
    private readonly deps: Pick<ServiceDeps, 'db'>,
    private readonly log: WarnLogger,
    private readonly intervalMs = POLL_INTERVAL_MS,
    private readonly maxDelivering = MAX_DELIVERING,
    private readonly maxInFlight = MAX_IN_FLIGHT_PER_SITE,
  ) {}

  /**
   * Waits until `deadline` (epoch ms) for a deliverable command. The promise resolves true when the machine
   * has one: the caller then holds a delivery slot and must `release()` it once its delivery is built;
   * false at the deadline or when cancelled/closed (no slot). `cancel()` resolves false at once.
   */
  wait(siteId: string, machineId: string, deadline: number): { promise: Promise<boolean>; cancel: () => void } {
    let waiter!: Waiter;
    const promise = new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => this.finish(siteId, machineId, waiter, false), Math.max(0, deadline - Date.now()));
      waiter = { resolve, timer };
    });
    if (this.closed) {
      this.finish(siteId, machineId, waiter, false);
      return { promise, cancel: () => undefined };
    }
    let machines = this.bySite.get(siteId);
    if (!machines) this.bySite.set(siteId, (machines = new Map()));
    let set = machines.get(machineId);
    if (!set) machines.set(machineId, (set = new Set()));
    set.add(waiter);
    this.schedule();
    return { promise, cancel: () => this.finish(siteId, machineId, waiter, false) };
  }

  /** Takes a delivery slot when one is free (a poll that does not wait: `wait=0`). @returns whether it did. */
  tryAcquire(): boolean {
    if (this.inFlight >= this.maxDelivering) return false;
    this.inFlight++;
    this.acquired++;
    return true;
  }

  /** Gives back a slot taken by `tryAcquire` or handed out by `wait`, and wakes the next ready poll. */
  release(): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    this.pump();
  }

  /**
   * The site's commands in flight as the last check counted them, plus the deliveries that check made
   * ready (0 when no poll of the site waited then): what a delivery handed out now shares the service with.
   */
  inFlightOf(siteId: string): number {
    return this.inFlightBySite.get(siteId) ?? 0;
  }

  /** Number of requests currently waiting (for tests and metrics). */
  get size(): number {
    let n = 0;
    for (const machines of this.bySite.values()) for (const set of machines.values()) n += set.size;
    return n;
  }

  /** Deliveries being built now (slots taken). */
  get delivering(): number {
    return this.inFlight;
  }

  /** Releases every waiter (false) and stops the loop. */
  close(): void {
    this.closed = true;
    if (this.loop) clearTimeout(this.loop);
    this.loop = undefined;
    this.ready = [];
    this.readyAt = 0;
    for (const [siteId, machines] of this.bySite) {
      for (const [machineId, set] of machines) for (const w of [...set]) this.finish(siteId, machineId, w, false);
    }
  }

  private finish(siteId: string, machineId: string, w: Waiter, slot: boolean): void {
    clearTimeout(w.timer);
    const machines = this.bySite.get(siteId);
    const set = machines?.get(machineId);
    if (set) {
      set.delete(w);
      if (set.size === 0) machines!.delete(machineId);
      if (machines!.size === 0) this.bySite.delete(siteId);
    }
    w.resolve(slot);
  }

  /** Wakes ready polls (one per machine) while slots are free; a ready machine whose poll ended is skipped. */
  private pump(): void {
    while (this.inFlight < this.maxDelivering && this.readyAt < this.ready.length) {
      const [siteId, machineId] = this.ready[this.readyAt++];
      const set = this.bySite.get(siteId)?.get(machineId);
      const w = set?.values().next().value;
      if (!w) continue;
      this.inFlight++;
      this.acquired++;
      this.finish(siteId, machineId, w, true);
    }
  }

  private schedule(): void {
    if (this.loop || this.closed || this.bySite.size === 0) return;
    this.loop = setTimeout(() => {
      this.tick()
        .catch((err) => this.log.warn({ err }, 'long-poll check failed'))
        .finally(() => {
          this.loop = undefined;
          this.schedule();
        });
    }, this.intervalMs);
    this.loop.unref();
  }

  /**
   * Marks the slots before a check's statement: pass it to `roomOf` with the count that statement read.
   */
  private slotMark(): { held: number; acquired: number } {
    return { held: this.inFlight, acquired: this.acquired };
  }

  /**
   * Room left in the site's window: MAX_IN_FLIGHT_PER_SITE less those the statement counted in flight and
   * the deliveries built meanwhile. Those are the slots held when the statement was sent plus those taken
   * since, not the slots held now: a delivery whose claim committed after the statement's snapshot and
   * whose slot came back before its answer would be in neither count, and the check would wake one poll
   * too many.
   */
  private roomOf(inFlight: number, mark: { held: number; acquired: number }): number {
    const building = mark.held + (this.acquired - mark.acquired);
    return Math.max(0, this.maxInFlight - inFlight - building);
  }

  /**
   * Few polls waiting: the machines among them with a deliverable command, from one statement that takes
   * their ids (exact, whatever else of the site is pending), cut to the room left in the window.
   */
  private async readyByIds(siteId: string, machines: Map<string, Set<Waiter>>): Promise<{ ready: string[]; inFlight: number }> {
    const ids = [...machines.keys()];
    // A random pivot: each check starts its ready list at a different machine.
    const pivot = ids[Math.floor(Math.random() * ids.length)];
    const mark = this.slotMark();
    const r = await machinesWithDeliverable(this.deps.db, siteId, ids, this.maxInFlight, pivot, true);
    return { ready: r.ready.slice(0, this.roomOf(r.inFlight, mark)), inFlight: r.inFlight };
  }

  /**
   * Many polls waiting: pages of the site's machines with a deliverable command, from a random waiting
   * machine on and wrapping around, keeping those with a poll waiting, until the window's room is filled,
   * every pending machine was seen, or SCAN_MAX_ROWS were read. No id list is sent: the cost follows what
   * is pending and the room, not how many machines wait (docs/benchmarks.md "The long-poll check"). A
   * machine past the bound is reached by a later check, whose pivot differs.
   */
  private async readyByScan(siteId: string, machines: Map<string, Set<Waiter>>): Promise<{ ready: string[]; inFlight: number }> {
    // A random waiting machine as the pivot: each check starts at a different machine.
    let skip = Math.floor(Math.random() * machines.size);
    let pivot = '';
    for (const id of machines.keys()) {
      pivot = id;
      if (skip-- === 0) break;
    }
    const ready: string[] = [];
    let inFlight = 0;
    let room = 1;
    let scanned = 0;
    let first = true;
    const mark = this.slotMark();
    const segments: [string, string | null][] = [
      [pivot, null],
      ['', pivot],
    ];
    for (const [start, upTo] of segments) {
      let after = start;
      while (room > 0 && scanned < SCAN_MAX_ROWS) {
        const limit = Math.min(SCAN_MAX_ROWS - scanned, first ? SCAN_PAGE_ROWS : Math.max(SCAN_PAGE_ROWS, 2 * room));
        const page = await deliverableMachinesPage(this.deps.db, siteId, after, upTo, limit, first);
        if (first) {
          inFlight = page.inFlight;
          room = this.roomOf(inFlight, mark);
          first = false;
        }
        for (const id of page.machineIds) {
          if (room === 0) break;
          if (machines.has(id)) {
            ready.push(id);
            room--;
          }
        }
        scanned += page.machineIds.length;
        if (page.machineIds.length < limit) break;
        after = page.machineIds[page.machineIds.length - 1];
      }
    }
    // Slots taken while the later pages were read (from the previous check's list) use room too.
    return { ready: ready.slice(0, this.roomOf(inFlight, mark)), inFlight };
  }

  private async tick(): Promise<void> {
    const ready: [string, string][] = [];
    const inFlightBySite = new Map<string, number>();
    const expire = this.checks++ % EXPIRE_EVERY_CHECKS === 0;
    for (const [siteId, machines] of [...this.bySite]) {
      // Expired pending commands are closed here, as the claim on a poll's arrival used to do.
      if (expire) await expireSitePendingCommands(this.deps.db, siteId);
      const r = machines.size <= ID_LIST_MAX ? await this.readyByIds(siteId, machines) : await this.readyByScan(siteId, machines);
      for (const machineId of r.ready) ready.push([siteId, machineId]);
      // In flight once this check's hand-outs are out: what the deliveries it wakes will share the
      // service with (at a wave's start the count alone is low, and those syncs would outlast its gap).
      inFlightBySite.set(siteId, r.inFlight + r.ready.length);
    }
    // The new list replaces the old one: what was not woken yet is in it again if still deliverable.
    this.inFlightBySite = inFlightBySite;
    this.ready = ready;
    this.readyAt = 0;
    this.pump();
  }
}

// ---------------------------------------------------------------------------------------------------
// Enrolment (POST /api/sites/{siteId}/enrolment-secret, POST /api/agent/enrol)

/**
 * Creates or rotates a site's enrolment secret; only its SHA-256 is stored, so the raw secret is returned
 * once. Tokens already issued keep working.
 * @throws ApiError not_found when the site does not exist.
 */
export async function rotateEnrolmentSecret(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string },
): Promise<{ siteId: string; enrolmentSecret: string }> {
  const enrolmentSecret = `ses_${randomToken()}`;
  if (!(await setSiteEnrolmentSecretHash(deps.db, input.siteId, sha256Hex(enrolmentSecret))))
    throw new ApiError('not_found', 'site not found');
  return { siteId: input.siteId, enrolmentSecret };
}

/** What a machine sends to enrol (`POST /api/agent/enrol`): its details plus the site's enrolment secret. */
export type EnrolRequest = EnrolInput & { enrolmentSecret: string };

/** A site signing key as agents pin it: the JWK plus `active` and its ISO `createdAt`. */
export type PinnableKey = SigningJwk & { active: boolean; createdAt: string };

/**
 * Enrols (or re-enrols) a machine: checks the enrolment secret in constant time, issues a new `sat_`
 * token (the previous one stops working), marks the machine online and returns the site's signing keys
 * for the agent to pin.
 * @throws ApiError unauthorized for an unknown site or a wrong secret (no hint which).
 */
export async function enrolAgent(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: EnrolRequest,
): Promise<{ siteId: string; machineId: string; agentToken: string; signingKeys: PinnableKey[] }> {
  const stored = await siteEnrolmentSecretHash(deps.db, input.siteId);
  const digest = sha256Hex(input.enrolmentSecret);
  if (!stored || !ENROLMENT_SECRET_RE.test(input.enrolmentSecret) || !hexEqual(stored, digest)) {
    throw new ApiError('unauthorized', 'unknown site or wrong enrolment secret');
  }
  const agentToken = `sat_${randomToken()}`;
  const { enrolmentSecret: _secret, ...machine } = input;
  await enrolMachineRow(deps.db, machine, sha256Hex(agentToken), deps.cfg.ROOST_HEARTBEAT_STALE_SECONDS);
  const signingKeys = (await listSigningKeys(deps.db, sealKeyOf(deps.cfg), input.siteId)).map((k) => ({
    ...k.jwk,
    active: k.active,
    createdAt: k.createdAt.toISOString(),
  }));
  return { siteId: input.siteId, machineId: input.machineId, agentToken, signingKeys };
}

// ---------------------------------------------------------------------------------------------------
// Liveness (POST /api/agent/heartbeat)

/**
 * Records a heartbeat with whatever snapshot fields were sent.
 * @returns the server time, the number of deliverable pending commands and `processConfigStamp` (16 hex
 *   chars that change whenever the machine's managed-process configs or the site's time zone change).
 * @throws ApiError unauthorized when the machine is no longer enrolled.
 */
export async function recordAgentHeartbeat(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: AgentIdentity & { heartbeat: HeartbeatInput },
): Promise<{ serverTime: Date; pendingCommands: number; processConfigStamp: string }> {
  const r = await recordHeartbeat(deps.db, input.siteId, input.machineId, input.heartbeat, deps.cfg.ROOST_HEARTBEAT_STALE_SECONDS);
  if (!r) throw new ApiError('unauthorized', 'this machine is no longer enrolled');
  // Opaque to the agent: it re-reads GET /api/agent/processes only when this changes.
  return { ...r, processConfigStamp: sha256Hex(r.processConfigStamp).slice(0, 16) };
}

// ---------------------------------------------------------------------------------------------------
// Commands (GET /api/agent/commands, POST /api/agent/commands/{commandId}, PUT …/screenshot)

/**
 * A sync_pull command with what the agent would otherwise fetch in separate requests (the inline sync of
 * `GET /api/agent/commands?inline=sync`, docs/agent-protocol.md "Inline sync").
 */
export type PolledCommand = CommandRow & { sync?: InlineSync };

/** A version is inlined (body and chunk URLs) up to this many files and distinct chunks. */
export const INLINE_MAX_FILES = 256;
export const INLINE_MAX_CHUNKS = 256;

/**
 * What a sync_pull needs, carried by the long-poll answer: the version answer (as `GET
 * /api/agent/roosts/{roostId}/versions/{versionId}`), and for a version of at most INLINE_MAX_FILES files
 * and INLINE_MAX_CHUNKS distinct chunks its body and the signed URLs of all its chunks (as
 * `POST /api/chunks/download-urls`).
 */
export interface InlineSync {
  version: AgentVersionAnswer;
  body?: VersionBody;
  chunkUrls?: { urls: Record<string, string>; expiresAt: string; missing: string[] };
}

/**
 * The inline sync of one sync_pull command, or undefined when its params do not name a version of a live
 * roost of the site (the agent then asks the separate routes and gets their errors) or a body read fails.
 */
export async function inlineSyncFor(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'blob'>,
  input: AgentIdentity & { roostId: unknown; versionId: unknown },
): Promise<InlineSync | undefined> {
  const { siteId, roostId, versionId } = input;
  if (typeof roostId !== 'string' || typeof versionId !== 'string' || !isSha256Hex(versionId)) return undefined;
  const row = await roostVersionForAgent(deps.db, siteId, roostId, versionId);
  if (!row) return undefined;
  const version = await versionAnswer(deps, siteId, roostId, versionId, row);
  let body: VersionBody;
  try {
    body = await loadVersionBody(deps, siteId, roostId, versionId, row.blob_name);
  } catch {
    return { version };
  }
  const hashes = [...new Set(body.files.flatMap((f) => f.chunks.map((c) => c.hash)))];
  if (body.files.length > INLINE_MAX_FILES || hashes.length > INLINE_MAX_CHUNKS) return { version };
  const chunkUrls = hashes.length > 0 ? await downloadUrls(deps, { siteId, hashes }) : undefined;
  return { version, body, ...(chunkUrls ? { chunkUrls } : {}) };
}

/**
 * Hands out the machine's deliverable commands (expired ones closed first), long-polling through `waiters`
 * up to `waitSeconds` (capped at MAX_WAIT_SECONDS); with `inlineSync` each sync_pull carries its
 * InlineSync. `gone` aborts when the agent hung up: the wait stops so nothing is marked delivered to nobody.
 *
 * Pacing (CommandWaiters): a long-poll (`waitSeconds` > 0) does not claim on arrival; it waits, and the
 * shared check (every POLL_INTERVAL_MS) wakes it with a delivery slot when it has a deliverable command, so
 * a command reaches a machine that is already waiting at once, and one that polls anew within one check. A
 * poll with `waitSeconds` 0 claims at once, in a slot when one is free. The claim and the inline syncs
 * are built inside the slot.
 * @returns the claimed rows, oldest first (possibly none).
 */
export async function pollAgentCommands(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'blob'>,
  waiters: CommandWaiters,
  input: AgentIdentity & { waitSeconds: number; gone: AbortSignal; inlineSync: boolean },
): Promise<PolledCommand[]> {
  const { siteId, machineId, gone } = input;
  const waitSeconds = Math.min(input.waitSeconds, MAX_WAIT_SECONDS);
  if (waitSeconds <= 0) {
    const held = waiters.tryAcquire();
    try {
      return await deliver(deps, input);
    } finally {
      if (held) waiters.release();
    }
  }
  const deadline = Date.now() + waitSeconds * 1000;
  while (!gone.aborted && Date.now() < deadline) {
    const w = waiters.wait(siteId, machineId, deadline);
    gone.addEventListener('abort', w.cancel, { once: true });
    const slot = await w.promise;
    gone.removeEventListener('abort', w.cancel);
    if (!slot) break;
    try {
      if (gone.aborted) break;
      const rows = await deliver(deps, input);
      // Nothing left (cancelled or taken by another poll of the machine meanwhile): wait on.
      if (rows.length > 0) return rows;
    } finally {
      waiters.release();
    }
  }
  return [];
}

/** Claims the machine's deliverable commands (db/machines.ts claimCommands) and adds the inline syncs. */
async function deliver(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'blob'>,
  input: AgentIdentity & { inlineSync: boolean },
): Promise<PolledCommand[]> {
  const rows: PolledCommand[] = await claimCommands(deps.db, input.siteId, input.machineId);
  if (!input.inlineSync) return rows;
  return Promise.all(
    rows.map(async (r) => {
      if (r.type !== 'sync_pull') return r;
      const p = (r.params ?? {}) as Record<string, unknown>;
      const sync = await inlineSyncFor(deps, {
        siteId: input.siteId,
        machineId: input.machineId,
        roostId: p.roostId,
        versionId: p.versionId,
      });
      return sync ? { ...r, sync } : r;
    }),
  );
}

/** A command report, optionally with the machine's target state of a roost (one request for both). */
export type CommandReportInput = CommandReport & { targetState?: TargetStateReport & { roostId: string } };

/**
 * Applies an agent's command report (docs/agent-protocol.md "Commands"); with `targetState`, also stores
 * that target state (as `PUT /api/agent/roosts/{roostId}/state`) in the same transaction: both or neither.
 * The target state is stored even when the command was already closed (it is what the machine's disk holds).
 * @returns the command row after the report, `applied` (false when it was already closed) and the stored
 *   target state when one was sent.
 * @throws ApiError validation_failed for status `pending`, not_found when the command is not this machine's
 *   or targetState.roostId is not a live roost of the site, version_not_found when
 *   targetState.reportedVersionId is not one of its versions.
 */
export async function reportCommandStatus(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: AgentIdentity & { commandId: string; report: CommandReportInput },
): Promise<{ row: CommandRow; applied: boolean; targetState?: TargetStateRow }> {
  const { targetState, ...report } = input.report;
  if (report.status === 'pending') {
    throw new ApiError('validation_failed', 'status pending cannot be reported', {
      extras: { param: 'status', errors: { status: ['must not be pending'] } },
    });
  }
  if (!targetState) {
    const r = await reportCommand(deps.db, input.siteId, input.machineId, input.commandId, report);
    if (!r) throw new ApiError('not_found', 'command not found');
    return { row: r.row, applied: r.changed };
  }
  const { roostId, ...state } = targetState;
  // One statement checks the roost, the version and the command and writes both (db/machines.ts).
  const r = await reportCommandWithState(deps.db, input.siteId, input.machineId, input.commandId, report, roostId, state);
  if (r.found === 'no_roost') throw targetVersionError('roost', 'targetState.');
  if (r.found === 'no_version') throw targetVersionError('version', 'targetState.');
  if (r.found === 'no_command') throw new ApiError('not_found', 'command not found');
  noteTargetReport(input.siteId, state.status, state.bytes_fetched, deps.cfg.ROOST_METRICS_MAX_SITES);
  return { row: r.row, applied: r.changed, targetState: r.stored };
}

/**
 * Stores the PNG of an open capture_screenshot command in the screenshots container and records it on
 * the command (the machines route then serves a signed URL of it).
 * @returns the stored size in bytes.
 * @throws ApiError validation_failed (not a PNG), not_found (no such capture_screenshot command),
 *         conflict (the command is closed).
 */
export async function storeScreenshot(
  deps: Pick<ServiceDeps, 'db' | 'blob'>,
  input: AgentIdentity & { commandId: string; png: unknown },
): Promise<{ commandId: string; bytes: number }> {
  const { siteId, machineId, commandId, png } = input;
  if (!Buffer.isBuffer(png) || png.length < PNG_SIGNATURE.length || !png.subarray(0, 8).equals(PNG_SIGNATURE)) {
    throw new ApiError('validation_failed', 'body must be a PNG image sent as Content-Type: image/png', { extras: { param: 'body' } });
  }
  const cmd = await getCommand(deps.db, siteId, machineId, commandId);
  if (!cmd || cmd.type !== 'capture_screenshot') throw new ApiError('not_found', 'capture_screenshot command not found');
  if (cmd.completed_at) throw new ApiError('conflict', 'the command is closed; upload before reporting completed');
  const blobName = screenshotBlobName(siteId, machineId, commandId);
  await deps.blob.put('screenshots', blobName, png, 'image/png');
  await setCommandArtifact(deps.db, siteId, machineId, commandId, blobName);
  return { commandId, bytes: png.length };
}

// ---------------------------------------------------------------------------------------------------
// Roost sync (GET /api/agent/roosts/{roostId}/versions/{versionId}, PUT /api/agent/roosts/{roostId}/state)

/** What an agent needs to sync a version: its signed body URL, where to extract it, and its signature. */
export interface AgentVersionAnswer {
  roostId: string;
  versionId: string;
  versionNumber: number;
  versionUrl: string;
  /** ISO time the body URL stops working (15 minutes). */
  expiresAt: string;
  extractPath: string;
  /** Ed25519 signature (base64url) of `roost-version-v1:<siteId>:<roostId>:<versionId>`. */
  signature: string;
  signingKeyId: string;
}

/**
 * The sync answer of a version of a roost of the agent's site. Versions published before signing
 * existed are signed on first read (services/signing.ts ensureVersionSignatures).
 * @throws ApiError not_found (unknown or deleted roost), version_not_found (not a version of this roost).
 */
export async function versionForAgent(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'blob'>,
  input: AgentIdentity & { roostId: string; versionId: string },
): Promise<AgentVersionAnswer> {
  const { siteId, roostId, versionId } = input;
  const row = await roostVersionForAgent(deps.db, siteId, roostId, versionId);
  if (!row) {
    const exists = await roostAndVersionExist(deps.db, siteId, roostId, versionId);
    if (!exists.roost) throw new ApiError('not_found', 'roost not found');
    throw new ApiError('version_not_found', 'version not found in this roost');
  }
  return versionAnswer(deps, siteId, roostId, versionId, row);
}

/** The version answer of a looked-up version row (signed on first read). */
async function versionAnswer(
  deps: Pick<ServiceDeps, 'db' | 'cfg' | 'blob'>,
  siteId: string,
  roostId: string,
  versionId: string,
  row: AgentVersionRow,
): Promise<AgentVersionAnswer> {
  const [sig] = await ensureVersionSignatures(deps.db, sealKeyOf(deps.cfg), siteId, [
    { roost_id: roostId, version_id: versionId, signature: row.signature, signing_key_id: row.signing_key_id },
  ]);
  const signed = await deps.blob.readUrl('versions', row.blob_name);
  return {
    roostId,
    versionId,
    versionNumber: row.version_number,
    versionUrl: signed.url,
    expiresAt: new Date(signed.expiresAt).toISOString(),
    extractPath: row.extract_path,
    signature: sig.signature!,
    signingKeyId: sig.signing_key_id!,
  };
}

/**
 * The error of a target-state report naming an unknown or deleted roost (not_found, param
 * `<prefix>roostId`; no param without a prefix: the roost is the route's) or a version not of that roost
 * (version_not_found, param `<prefix>reportedVersionId`).
 */
function targetVersionError(missing: 'roost' | 'version', prefix: string): ApiError {
  if (missing === 'roost')
    return new ApiError('not_found', 'roost not found', prefix ? { extras: { param: `${prefix}roostId` } } : undefined);
  return new ApiError('version_not_found', 'reportedVersionId is not a version of this roost', {
    extras: { param: `${prefix}reportedVersionId` },
  });
}

/** @throws targetVersionError('roost' | 'version', '') unless the roost is live and the version one of its versions. */
async function checkTargetVersion(deps: Pick<ServiceDeps, 'db'>, siteId: string, roostId: string, versionId: string): Promise<void> {
  const exists = await roostAndVersionExist(deps.db, siteId, roostId, versionId);
  if (!exists.roost) throw targetVersionError('roost', '');
  if (!exists.version) throw targetVersionError('version', '');
}

/** A target-state report as the agent sends it (counters are counts, `bytes_fetched` bytes). */
export type TargetStateReport = TargetStateInput;

/**
 * Stores the machine's reported state for a roost.
 * @returns the stored state.
 * @throws ApiError not_found (unknown or deleted roost), version_not_found (reportedVersionId is not one
 *         of its versions).
 */
export async function reportTargetState(
  deps: Pick<ServiceDeps, 'db' | 'cfg'>,
  input: AgentIdentity & { roostId: string; report: TargetStateReport },
): Promise<TargetStateRow> {
  const { siteId, machineId, roostId, report } = input;
  await checkTargetVersion(deps, siteId, roostId, report.reportedVersionId);
  const stored = await upsertTargetState(deps.db, siteId, machineId, roostId, report);
  noteTargetReport(siteId, report.status, report.bytes_fetched, deps.cfg.ROOST_METRICS_MAX_SITES);
  return stored;
}
