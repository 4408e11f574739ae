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
import { type MachineRoot, type Manifest, type StagedManifest, resolveExtractDir } from './machine-root';
import type { AgentCommand } from './transport';
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
 */
class TargetStateReporter {
  private status: TargetStatus = 'pending';
  private lastReport = 0;
  private pending: Promise<unknown> = Promise.resolve();
  private reporting = false;

  constructor(
    private readonly ctx: SyncContext,
    private readonly roostId: string,
    private readonly versionId: string,
    private readonly counters: SyncCounters,
  ) {}

  /** Status change: waits for any progress report in flight, then reports now. */
  async enter(next: TargetStatus, error?: string): Promise<void> {
    this.status = next;
    await this.pending.catch(() => undefined);
    this.lastReport = Date.now();
    await this.send(error);
  }

  /** Progress: at most one report per interval, never two at once; failures are warnings. */
  progress(): void {
    if (this.reporting || Date.now() - this.lastReport < this.ctx.progressIntervalMs) return;
    this.reporting = true;
    this.lastReport = Date.now();
    this.pending = this.send()
      .catch((err) => this.ctx.warn(`progress report failed: ${errMessage(err)}`))
      .finally(() => (this.reporting = false));
  }

  private send(error?: string): Promise<void> {
    return this.ctx.transport.reportState(this.roostId, this.versionId, this.status, this.counters, error);
  }
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
): Promise<{ body: VersionBody; extractPath: string }> {
  const info = await ctx.transport.versionInfo(roostId, versionId);
  await verifySignature(
    { siteId: ctx.siteId, keys: ctx.keys, refresh: () => ctx.transport.refreshSigningKeys(), warn: ctx.warn },
    roostId,
    versionId,
    info.signature,
    info.signingKeyId,
  );
  const raw = await fetchBytes(info.versionUrl, ctx.signal);
  let body: VersionBody;
  try {
    body = JSON.parse(raw.toString('utf8'));
  } catch {
    throw new SyncFailure('version body is not JSON');
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
  const state = new TargetStateReporter(ctx, roostId, versionId, counters);
  /** Command intermediate status; a command the server closed meanwhile stops the sync. */
  const commandStatus = async (s: string, pct: number) => {
    const r = await ctx.transport.reportCommand(cmd.commandId, { status: s, progress: pct });
    if (!r.applied && TERMINAL_COMMAND_STATUSES.has(r.status)) throw new SyncCancelled(`command was closed by the server (${r.status})`);
  };

  try {
    await commandStatus('downloading', 0);
  } catch (err) {
    // Closed before we began (cancelled or expired): nothing on this machine changed, report no state.
    if (err instanceof SyncCancelled) return outcome('cancelled', err.message);
    return outcome('failed', errMessage(err));
  }
  try {
    await state.enter('pending');
    if (ctx.faults.syncDelayMs) await sleep(ctx.faults.syncDelayMs, signal);
    if (signal.aborted) return outcome('abandoned');
    ctx.faults.checkSync();

    // 1. The version: its signature against the pinned site keys, then the body against its id.
    const { body, extractPath } = await fetchVerifiedVersion(ctx, roostId, versionId);
    const extractDir = resolveExtractDir(ctx.root.dir, p.extractRoot || extractPath || '');
    const extractRel = ctx.root.relative(extractDir);

    // 2. Plan: skipped files (unchanged since the last commit), needed chunks, local dedup.
    const prev = await ctx.root.readManifest(roostId);
    const prevSameRoot = prev && prev.extractDir === extractRel ? prev : null;
    const plan = await planFiles(body.files, prevSameRoot, extractDir, ctx.root.stagingDir(roostId, versionId), counters);
    const missing = await ctx.store.missing(plan.needed, counters);

    // 3. Download what the chunk store lacks.
    await state.enter('downloading');
    const download = {
      store: ctx.store,
      downloadUrls: (h: string[]) => ctx.transport.downloadUrls(h),
      limit: ctx.limit,
      faults: ctx.faults,
      signal,
    };
    await downloadChunks(download, missing, counters, (r) => {
      refetched += r;
      state.progress();
    });

    // 4. Assemble: into the live extract root (immediate), or a complete tree in the staging area (staged).
    await commandStatus('assembling', 50);
    await state.enter('assembling');
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
      await state.enter('assembling');
      await ctx.transport.reportCommand(cmd.commandId, { status: 'completed', result: 'staged', progress: 100 });
      ctx.stats.syncsStaged++;
    } else {
      await commitTree(asm, manifest, prev, extractDir, plan, counters);
      await state.enter('committed');
      await ctx.transport.reportCommand(cmd.commandId, { status: 'completed', result: 'success', progress: 100 });
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
    // A failed or interrupted staging leaves nothing behind (the live tree was never touched).
    if (staged) await discardStagedTree(ctx.root, roostId, versionId);
    if (signal.aborted) return outcome('abandoned', 'agent stopped');
    const message = errMessage(err);
    const cancelled = err instanceof SyncCancelled;
    try {
      await state.enter(cancelled ? 'cancelled' : 'failed', message);
      if (!cancelled) await ctx.transport.reportCommand(cmd.commandId, { status: 'failed', error: message });
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
