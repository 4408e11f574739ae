/**
 * Roost sync commands of the reference agent (docs/agent-protocol.md "Roost sync", "Signed versions" and
 * "Staged sync and activation"):
 *
 * `sync_pull` `{ roostId, versionId, extractRoot?, activation? }`:
 *   1. GET the version's signed body URL and signature (`GET /api/agent/roosts/{roostId}/versions/{versionId}`);
 *      refuse it (`signature_invalid`) unless the signature verifies against a pinned site key
 *      (agent/trust.ts). Fetch the body and refuse it unless SHA-256(JCS(body)) equals the versionId
 *      (domain/version.ts computeVersionId) and every file's size is the sum of its chunk sizes.
 *   2. Plan (agent/assembly.ts planFiles): unchanged files are skipped, the other files' distinct chunks
 *      are needed, those intact in the local chunk store reused (agent/download.ts).
 *   3. Download the rest (agent/download.ts downloadChunks).
 *   4. Immediate: commit the tree into the extract root and report `committed`. Staged: build the
 *      complete tree in the staging area, report the final counters at `assembling` and close the command
 *      `completed` with result `staged`.
 *   Target state goes pending → downloading → assembling → committed | failed (| cancelled when the
 *   command was closed by the server meanwhile); progress is reported at most every `progressIntervalMs`.
 *   Compact protocol (`SyncContext.compact`, docs/agent-protocol.md "Inline sync"): the version answer, body
 *   and chunk URLs come with the command when the poll carried them, status changes go with the command
 *   report in one request, and a phase shorter than `progressIntervalMs` is not reported.
 *
 * `roost_activate` `{ roostId, versionId, extractRoot }` switches a complete staged tree in, reports
 * `committed` with the staging run's counters and completes; `not_staged` when there is no such tree.
 */
import type { SyncCounters, TargetStatus } from '../domain/target-state';
import { computeVersionId, validateVersionBody, type VersionBody } from '../domain/version';
import { isSha256Hex } from '../domain/hex';
import {
  type ActivationJournal,
  type AssemblyContext,
  commitTree,
  completeStagedTree,
  discardStagedTree,
  planFiles,
  sealStagedTree,
  stageTree,
  switchStagedTree,
} from './assembly';
import { type AgentStats, type CommandChannel, type CommandOutcome, closeCommand } from './commands';
import { type ChunkStore, type Limiter, downloadChunks } from './download';
import { SyncCancelled, SyncFailure, TERMINAL_COMMAND_STATUSES, errMessage } from './errors';
import { type FaultInjector, stagingFault } from './faults';
import { fetchBytes, sleep } from './http';
import { defaultExtractRoot, type MachineRoot, type Manifest, type StagedManifest, resolveExtractDir } from './machine-root';
import type { AgentCommand, CommandReport, DownloadUrls, InlineSync } from './transport';
import { type KeyRing, verifySignature } from './trust';

/**
 * Reports an activation the agent finished on start from its journal (agent/assembly.ts recoverActivations):
 * target state `committed` with the staging run's counters, and its roost_activate command completed. Never
 * throws (a failure is a warning).
 */
export async function reportRecoveredActivation(ctx: Pick<SyncContext, 'transport' | 'warn'>, journal: ActivationJournal): Promise<void> {
  const { roostId, versionId, counters } = journal.staged;
  await ctx.transport
    .reportState(roostId, versionId, 'committed', counters)
    .catch((err) => ctx.warn(`could not report the recovered activation of ${roostId}: ${errMessage(err)}`));
  if (journal.commandId)
    await ctx.transport
      .reportCommand(journal.commandId, { status: 'completed', result: 'success', progress: 100 })
      .then(() => undefined)
      .catch((err) => ctx.warn(`could not complete ${journal.commandId} after recovery: ${errMessage(err)}`));
}

/** Error of a roost_activate for a version that has no complete staged tree. */
export const NOT_STAGED = 'not_staged';

/** Everything a sync or activation of one agent works with. */
export interface SyncContext extends CommandChannel {
  siteId: string;
  root: MachineRoot;
  store: ChunkStore;
  keys: KeyRing;
  limit: Limiter;
  faults: FaultInjector;
  /** The agent's stop signal: a stop abandons the sync without a report. */
  signal: AbortSignal;
  /** Minimum gap between two progress reports of one sync (ms). */
  progressIntervalMs: number;
  /**
   * The compact protocol (docs/agent-protocol.md "Inline sync"): use the poll's inline sync, send status
   * changes with the command report, and leave out status phases shorter than `progressIntervalMs`.
   */
  compact?: boolean;
  /** fsync each assembled file before its rename. */
  fsync: boolean;
  stats: AgentStats;
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

function zeroCounters(): SyncCounters {
  return { chunks_fetched: 0, chunks_total: 0, chunks_dedup: 0, files_total: 0, files_assembled: 0, files_skipped: 0, bytes_fetched: 0 };
}

/**
 * Target-state reports of one sync (`PUT /api/agent/roosts/{roostId}/state`): a status change is sent at
 * once, after any progress report in flight (so they arrive in order); progress at most once per
 * interval and never two at once. Counters are read when each report is sent.
 *
 * Compact protocol (`ctx.compact`): `change` sends a status change together with the command's status in
 * one `POST /api/agent/commands/{commandId}` (field `targetState`), and only when the last report is at
 * least `progressIntervalMs` old; otherwise it is sent when the interval is up, unless another change
 * came first (a phase shorter than the interval is never reported). `finish` always sends at once.
 */
class TargetStateReporter {
  private status: TargetStatus = 'pending';
  private lastReport = 0;
  /** Round trip of the last report (ms): the gap between reports stretches with it (`interval`). */
  private latencyMs = 0;
  /**
   * The agent's last API round trip when the sync started (ms; ApiClient `lastRoundTripMs`, e.g. a
   * heartbeat): the gap stretches with it too, so a sync whose own first report happened to be quick still
   * sends no early progress report while the agent's other requests say the API answers slowly.
   */
  private readonly agentLatencyMs: number;
  private pending: Promise<unknown> = Promise.resolve();
  private reporting = false;
  private deferred: NodeJS.Timeout | undefined;
  /** Set when a compact report learned that the server closed the command. */
  closedByServer: string | undefined;
  /** Compact: the command's intermediate status that progress reports repeat. */
  private commandStatus = 'downloading';

  constructor(
    private readonly ctx: SyncContext,
    private readonly roostId: string,
    private readonly versionId: string,
    private readonly counters: SyncCounters,
    private readonly commandId: string,
  ) {
    this.agentLatencyMs = ctx.transport.client.lastRoundTripMs;
  }

  /** Status change: waits for any progress report in flight, then reports now. */
  async enter(next: TargetStatus, error?: string): Promise<void> {
    this.cancelDeferred();
    this.status = next;
    await this.pending.catch(() => undefined);
    this.lastReport = Date.now();
    await this.send(error);
  }

  /** Compact: the status is `next` from now on, reported with the first progress report (none now). */
  assume(next: TargetStatus): void {
    this.status = next;
    this.lastReport = Date.now();
  }

  /**
   * Compact: a status change with the command's intermediate status. When the last report is at least an
   * interval old it is sent now and awaited: a command the server closed meanwhile throws SyncCancelled
   * (as the separate command report does). Otherwise it is sent when the interval is up unless a later
   * report supersedes it; a closed command found then is kept in `closedByServer`.
   */
  async change(next: TargetStatus, command: CommandReport): Promise<void> {
    this.cancelDeferred();
    await this.pending.catch(() => undefined);
    this.throwIfClosed();
    this.status = next;
    this.commandStatus = command.status;
    const due = this.lastReport + this.interval() - Date.now();
    const fire = () => {
      this.deferred = undefined;
      this.lastReport = Date.now();
      const sent = this.pending.catch(() => undefined).then(() => this.sendWithCommand(command));
      this.pending = sent.catch((err) => this.ctx.warn(`status report failed: ${errMessage(err)}`));
      return sent;
    };
    if (due > 0) {
      this.deferred = setTimeout(() => void fire().catch(() => undefined), due);
      this.deferred.unref?.();
      return;
    }
    await fire();
    this.throwIfClosed();
  }

  /** @throws SyncCancelled when a report learned that the server closed the command. */
  throwIfClosed(): void {
    if (this.closedByServer) throw new SyncCancelled(`command was closed by the server (${this.closedByServer})`);
  }

  /** Compact: the last status with the command's terminal status, at once, after any report in flight. */
  async finish(next: TargetStatus, command: CommandReport, error?: string): Promise<{ status: string; applied: boolean }> {
    this.cancelDeferred();
    this.status = next;
    await this.pending.catch(() => undefined);
    this.lastReport = Date.now();
    return this.sendWithCommand(command, error);
  }

  /** Progress: at most one report per interval, never two at once; failures are warnings. */
  progress(): void {
    if (this.reporting || Date.now() - this.lastReport < this.interval()) return;
    this.reporting = true;
    this.lastReport = Date.now();
    // Compact: progress goes with the command's status, so it also tells the agent of a cancellation.
    const sent = this.ctx.compact ? this.sendWithCommand({ status: this.commandStatus }).then(() => undefined) : this.send();
    this.pending = sent.catch((err) => this.ctx.warn(`progress report failed: ${errMessage(err)}`)).finally(() => (this.reporting = false));
  }

  /**
   * The least gap between two reports now: `progressIntervalMs`, or REPORT_BACKOFF round trips of the last
   * report or of the agent's last request before the sync, the longer, when the API answers slowly (at
   * most MAX_REPORT_INTERVAL_MS). A fleet syncing at once against a loaded API otherwise made every sync
   * longer than the interval, so each sent more reports, which loaded the API further (docs/agent-protocol.md "Inline sync"; docs/benchmarks.md "On a quiet machine").
   */
  private interval(): number {
    return Math.min(
      MAX_REPORT_INTERVAL_MS,
      Math.max(this.ctx.progressIntervalMs, REPORT_BACKOFF * Math.max(this.latencyMs, this.agentLatencyMs)),
    );
  }

  /** Awaits a report of this sync and keeps its round trip (ms) for `interval`; also for reports sent elsewhere (the command's `downloading`). */
  async timed<T>(report: Promise<T>): Promise<T> {
    const t0 = Date.now();
    const r = await report;
    this.latencyMs = Date.now() - t0;
    return r;
  }

  /** Drops a deferred status change (a later report supersedes it, or the sync ended). */
  cancelDeferred(): void {
    if (this.deferred) clearTimeout(this.deferred);
    this.deferred = undefined;
  }

  private send(error?: string): Promise<void> {
    return this.timed(this.ctx.transport.reportState(this.roostId, this.versionId, this.status, this.counters, error));
  }

  private async sendWithCommand(command: CommandReport, error?: string): Promise<{ status: string; applied: boolean }> {
    const r = await this.timed(
      this.ctx.transport.reportCommand(this.commandId, {
        ...command,
        targetState: {
          roostId: this.roostId,
          reportedVersionId: this.versionId,
          status: this.status,
          ...this.counters,
          ...(error ? { error } : {}),
        },
      }),
    );
    if (!r.applied && TERMINAL_COMMAND_STATUSES.has(r.status)) this.closedByServer ??= r.status;
    return r;
  }
}

/** Reports of a sync are at least this many round trips of the last one apart (see TargetStateReporter `interval`). */
export const REPORT_BACKOFF = 10;
/** The longest gap the backoff makes between two reports of a sync (ms). */
export const MAX_REPORT_INTERVAL_MS = 30_000;

/** Inline URLs this close to expiry (ms) are not used; the agent asks the separate routes instead. */
const INLINE_MARGIN_MS = 60_000;

function fresh(expiresAt: string | undefined): boolean {
  return typeof expiresAt === 'string' && Date.parse(expiresAt) - Date.now() > INLINE_MARGIN_MS;
}

/**
 * The download-URL source of a sync: the poll's inline chunk URLs for hashes never served from them
 * while they are fresh, else `POST /api/chunks/download-urls` (so a refresh after a 403 asks the API).
 */
function downloadUrlSource(ctx: SyncContext, inline: InlineSync | undefined): (hashes: string[]) => Promise<DownloadUrls> {
  const served = new Set<string>();
  const urls = inline?.chunkUrls;
  return async (hashes) => {
    if (urls && fresh(urls.expiresAt) && hashes.every((h) => urls.urls[h] && !served.has(h))) {
      for (const h of hashes) served.add(h);
      return { urls: Object.fromEntries(hashes.map((h) => [h, urls.urls[h]])), expiresAt: urls.expiresAt, missing: [] };
    }
    return ctx.transport.downloadUrls(hashes);
  };
}

/**
 * The verified body of a version: signature first (nothing else is fetched before it verifies), then the
 * body against its id and its file sizes against their chunks.
 * @throws SyncFailure (`signature_invalid`, or what is wrong with the body).
 */
async function fetchVerifiedVersion(
  ctx: SyncContext,
  roostId: string,
  versionId: string,
  inline?: InlineSync,
): Promise<{ body: VersionBody; extractPath: string }> {
  // The inline version answer is used when its body came with it or its body URL is still fresh.
  const useInline = inline?.version?.versionId === versionId && (inline.body !== undefined || fresh(inline.version.expiresAt));
  const info = useInline ? inline!.version : await ctx.transport.versionInfo(roostId, versionId);
  await verifySignature(
    { siteId: ctx.siteId, keys: ctx.keys, refresh: () => ctx.transport.refreshSigningKeys(), warn: ctx.warn },
    roostId,
    versionId,
    info.signature,
    info.signingKeyId,
  );
  let body: VersionBody;
  if (useInline && inline!.body !== undefined && inline!.body !== null && typeof inline!.body === 'object')
    body = inline!.body as VersionBody;
  else {
    const raw = await fetchBytes(info.versionUrl, ctx.signal);
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      throw new SyncFailure('version body is not JSON');
    }
  }
  if (computeVersionId(body) !== versionId) throw new SyncFailure('version body does not hash to the versionId; refused');
  const invalid = validateVersionBody(body);
  if (invalid) throw new SyncFailure(`version body is invalid: ${Object.keys(invalid)[0]} ${Object.values(invalid)[0][0]}`);
  for (const f of body.files) {
    const sum = f.chunks.reduce((a, c) => a + c.size, 0);
    if (sum !== f.size) throw new SyncFailure(`file ${f.path}: size ${f.size} is not the sum of its chunk sizes (${sum})`);
  }
  return { body, extractPath: info.extractPath };
}

/** Runs a `sync_pull` command to its end and reports it; never throws. */
export async function runSyncPull(ctx: SyncContext, cmd: AgentCommand): Promise<CommandOutcome> {
  const { signal } = ctx;
  const p = cmd.params as unknown as SyncParams;
  const counters = zeroCounters();
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
    return closeCommand(ctx, cmd, 'failed', 'sync_pull needs params.roostId and a 64-hex params.versionId');
  }
  if (p.activation !== undefined && p.activation !== null && p.activation !== 'immediate' && p.activation !== 'staged') {
    return closeCommand(
      ctx,
      cmd,
      'failed',
      `sync_pull params.activation must be "immediate" or "staged" (got ${JSON.stringify(p.activation).slice(0, 40)})`,
    );
  }
  const { roostId, versionId } = p;
  const staged = p.activation === 'staged';
  const state = new TargetStateReporter(ctx, roostId, versionId, counters, cmd.commandId);
  const compact = ctx.compact === true;
  const inline = compact ? cmd.sync : undefined;
  /** Command intermediate status; a command the server closed meanwhile stops the sync. */
  const commandStatus = async (s: string, pct: number) => {
    const r = await ctx.transport.reportCommand(cmd.commandId, { status: s, progress: pct });
    if (!r.applied && TERMINAL_COMMAND_STATUSES.has(r.status)) throw new SyncCancelled(`command was closed by the server (${r.status})`);
  };

  try {
    await state.timed(commandStatus('downloading', 0));
  } catch (err) {
    // Closed before we began (cancelled or expired): nothing on this machine changed, report no state.
    if (err instanceof SyncCancelled) return outcome('cancelled', err.message);
    return outcome('failed', errMessage(err));
  }
  try {
    // Compact: `pending` and `downloading` are not reported on their own; the first progress report (or the
    // final one) says where the sync is.
    if (compact) state.assume('downloading');
    else await state.enter('pending');
    if (ctx.faults.syncDelayMs) await sleep(ctx.faults.syncDelayMs, signal);
    if (signal.aborted) return outcome('abandoned');
    ctx.faults.checkSync();

    // 1. The version: its signature against the pinned site keys, then the body against its id.
    const { body, extractPath } = await fetchVerifiedVersion(ctx, roostId, versionId, inline);
    const extractDir = resolveExtractDir(ctx.root.dir, p.extractRoot || extractPath || defaultExtractRoot(roostId));
    const extractRel = ctx.root.relative(extractDir);

    // 2. Plan: skipped files (unchanged since the last commit), needed chunks, local dedup.
    const prev = await ctx.root.readManifest(roostId);
    const prevSameRoot = prev && prev.extractDir === extractRel ? prev : null;
    const plan = await planFiles(body.files, prevSameRoot, extractDir, ctx.root.stagingDir(roostId, versionId), counters);
    const missing = await ctx.store.missing(plan.needed, counters);

    // 3. Download what the chunk store lacks.
    if (!compact) await state.enter('downloading');
    const download = {
      store: ctx.store,
      downloadUrls: downloadUrlSource(ctx, inline),
      limit: ctx.limit,
      faults: ctx.faults,
      signal,
    };
    await downloadChunks(download, missing, counters, (r) => {
      refetched += r;
      state.progress();
    });

    // 4. Assemble: into the live extract root (immediate), or a complete tree in the staging area (staged).
    if (compact) await state.change('assembling', { status: 'assembling', progress: 50 });
    else {
      await commandStatus('assembling', 50);
      await state.enter('assembling');
    }
    const manifest: Manifest = {
      roostId,
      versionId,
      extractDir: extractRel,
      committedAt: new Date().toISOString(),
      files: body.files.map((f) => ({ path: f.path, size: f.size, chunks: f.chunks.map((c) => c.hash) })),
    };
    const asm: AssemblyContext = { root: ctx.root, store: ctx.store, fsync: ctx.fsync, signal, onFile: () => state.progress() };
    if (staged) {
      const failStage = ctx.faults.failsStaging();
      const checkFault = () => {
        if (failStage) throw stagingFault();
      };
      await stageTree(asm, manifest, extractDir, plan, counters, checkFault);
      checkFault();
      const stagedManifest: StagedManifest = {
        ...manifest,
        stagedAt: manifest.committedAt,
        baseVersionId: prev?.versionId ?? null,
        counters: { ...counters },
      };
      await sealStagedTree(ctx.root, stagedManifest);
      // The final counters (progress reports are throttled); the target state stays `assembling` until activation.
      if (compact) await state.finish('assembling', { status: 'completed', result: 'staged', progress: 100 });
      else {
        await state.enter('assembling');
        await ctx.transport.reportCommand(cmd.commandId, { status: 'completed', result: 'staged', progress: 100 });
      }
      ctx.stats.syncsStaged++;
    } else {
      // A compact report that learned of a cancellation stops the sync before the live tree changes.
      state.throwIfClosed();
      await commitTree(asm, manifest, prev, extractDir, plan, counters);
      if (compact) await state.finish('committed', { status: 'completed', result: 'success', progress: 100 });
      else {
        await state.enter('committed');
        await ctx.transport.reportCommand(cmd.commandId, { status: 'completed', result: 'success', progress: 100 });
      }
      ctx.stats.syncsCommitted++;
      // Any staged tree of this roost is now superseded.
      await ctx.root.clearStaging(roostId).catch((err) => ctx.warn(`could not clear staging of ${roostId}: ${errMessage(err)}`));
    }
    ctx.stats.chunksFetched += counters.chunks_fetched;
    ctx.stats.chunksDedup += counters.chunks_dedup;
    ctx.stats.chunksRefetched += refetched;
    ctx.stats.bytesFetched += counters.bytes_fetched;
    ctx.stats.filesSkipped += counters.files_skipped;
    return outcome('completed', undefined, staged ? 'staged' : 'success');
  } catch (err) {
    state.cancelDeferred();
    // A failed or interrupted staging leaves nothing behind (the live tree was never touched).
    if (staged) await discardStagedTree(ctx.root, roostId, versionId);
    if (signal.aborted) return outcome('abandoned', 'agent stopped');
    const message = errMessage(err);
    const cancelled = err instanceof SyncCancelled;
    try {
      if (compact && !cancelled) await state.finish('failed', { status: 'failed', error: message }, message);
      else {
        await state.enter(cancelled ? 'cancelled' : 'failed', message);
        if (!cancelled) await ctx.transport.reportCommand(cmd.commandId, { status: 'failed', error: message });
      }
    } catch (reportErr) {
      ctx.warn(`could not report failure of ${cmd.commandId}: ${errMessage(reportErr)}`);
    }
    if (!cancelled) ctx.stats.syncsFailed++;
    return outcome(cancelled ? 'cancelled' : 'failed', message);
  }
}

/**
 * Runs a `roost_activate` command `{ roostId, versionId, rolloutId, extractRoot }`: switches the tree
 * staged by a `sync_pull` with `activation: 'staged'` into the live extract root (`params.extractRoot`,
 * else the staged one), reports target state `committed` with the staging run's counters and completes the
 * command. Downloads nothing. No complete staged tree of that version → command failed with error
 * `not_staged`, nothing changed. Never throws.
 */
export async function runActivate(ctx: SyncContext, cmd: AgentCommand): Promise<CommandOutcome> {
  const p = cmd.params as { roostId?: unknown; versionId?: unknown; extractRoot?: unknown };
  if (typeof p?.roostId !== 'string' || !isSha256Hex(p?.versionId)) {
    return closeCommand(ctx, cmd, 'failed', 'roost_activate needs params.roostId and a 64-hex params.versionId');
  }
  const roostId = p.roostId;
  const versionId = p.versionId as string;
  const base = { commandId: cmd.commandId, type: cmd.type };
  try {
    const r = await ctx.transport.reportCommand(cmd.commandId, { status: 'activating', progress: 0 });
    if (!r.applied && TERMINAL_COMMAND_STATUSES.has(r.status))
      return { ...base, status: 'cancelled', error: `command was closed by the server (${r.status})` };
  } catch (err) {
    return { ...base, status: 'failed', error: errMessage(err) };
  }
  const staged = await completeStagedTree(ctx.root, roostId, versionId);
  if (!staged) return closeCommand(ctx, cmd, 'failed', NOT_STAGED);

  const counters = staged.counters;
  const sendState = (status: TargetStatus, error?: string) => ctx.transport.reportState(roostId, versionId, status, counters, error);
  try {
    const extractRoot = typeof p.extractRoot === 'string' && p.extractRoot ? p.extractRoot : staged.extractDir;
    await switchStagedTree(ctx.root, staged, resolveExtractDir(ctx.root.dir, extractRoot), {
      commandId: cmd.commandId,
      hooks: { afterFile: (n) => ctx.faults.afterActivatedFile(n) },
    });
    await sendState('committed');
    await ctx.transport.reportCommand(cmd.commandId, { status: 'completed', result: 'success', progress: 100 });
    ctx.stats.syncsCommitted++;
    await ctx.root.clearStaging(roostId).catch((err) => ctx.warn(`could not clear staging of ${roostId}: ${errMessage(err)}`));
    return { ...base, status: 'completed', result: 'success', counters: { ...counters } };
  } catch (err) {
    const message = errMessage(err);
    try {
      await sendState('failed', message);
      await ctx.transport.reportCommand(cmd.commandId, { status: 'failed', error: message });
    } catch (reportErr) {
      ctx.warn(`could not report failure of ${cmd.commandId}: ${errMessage(reportErr)}`);
    }
    ctx.stats.syncsFailed++;
    return { ...base, status: 'failed', error: message };
  }
}
