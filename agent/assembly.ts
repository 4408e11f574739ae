/**
 * File assembly of the reference agent (docs/agent-protocol.md "Roost sync" and "Staged sync and
 * activation"; docs/decisions/agent-sync.md, docs/decisions/stage-activate.md): which files of a version
 * need writing, building files atomically from the local chunk store (temp file in the target folder,
 * fsync, rename), committing a tree into its extract root, staging a complete tree beside it, and
 * switching a staged tree in under a journal replayed after a crash. Downloads nothing; every path is
 * confined to its tree.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { VersionBody } from '../domain/version';
import type { SyncCounters } from '../domain/target-state';
import type { ChunkStore } from './download';
import { SyncCancelled, SyncFailure } from './errors';
import { type MachineRoot, type Manifest, type StagedManifest, confined, writeAtomic } from './machine-root';

/** A file of a version body. */
export type VersionFile = VersionBody['files'][number];

/** What the sync writes: files to build from chunks, and files unchanged since the last commit. */
export interface FilePlan {
  toAssemble: VersionFile[];
  unchanged: VersionFile[];
  /** Distinct chunks of `toAssemble` (hash → size in bytes). */
  needed: Map<string, number>;
}

/**
 * Splits a version's files: a file whose size and ordered chunk list equal the last committed manifest's
 * (same extract root) and that is still on disk at that size is unchanged (`files_skipped`); the rest are
 * to be assembled. Sets `files_total`, `files_skipped` and `chunks_total`. Checks every path against
 * both the extract dir and the staging dir.
 * @throws SyncFailure for an unsafe path.
 */
export async function planFiles(
  files: VersionFile[],
  prevSameRoot: Manifest | null,
  extractDir: string,
  stageDir: string,
  counters: SyncCounters,
): Promise<FilePlan> {
  const prevFiles = new Map((prevSameRoot?.files ?? []).map((f) => [f.path, f]));
  const toAssemble: VersionFile[] = [];
  const unchanged: VersionFile[] = [];
  for (const f of files) {
    const old = prevFiles.get(f.path);
    const target = confined(extractDir, f.path);
    confined(stageDir, f.path);
    let same = !!old && old.size === f.size && old.chunks.length === f.chunks.length && old.chunks.every((h, i) => h === f.chunks[i].hash);
    if (same) {
      const st = await fs.stat(target).catch(() => null);
      same = !!st && st.isFile() && st.size === f.size;
    }
    if (same) {
      counters.files_skipped++;
      unchanged.push(f);
    } else toAssemble.push(f);
  }
  counters.files_total = files.length;
  const needed = new Map<string, number>();
  for (const f of toAssemble) for (const c of f.chunks) needed.set(c.hash, c.size);
  counters.chunks_total = needed.size;
  return { toAssemble, unchanged, needed };
}

/**
 * Builds one file from the chunk store: temp file in the target folder, fsync (unless `fsync` is false),
 * rename. @throws SyncFailure when a non-file is in the way or a stored chunk has the wrong size.
 */
export async function assembleFile(store: ChunkStore, dir: string, f: VersionFile, fsync: boolean): Promise<void> {
  const target = confined(dir, f.path);
  const folder = path.dirname(target);
  await fs.mkdir(folder, { recursive: true });
  const st = await fs.lstat(target).catch(() => null);
  if (st && !st.isFile()) throw new SyncFailure(`${f.path}: a non-file is in the way`);
  const tmp = path.join(folder, `.${path.basename(target)}.roost-tmp-${randomBytes(4).toString('hex')}`);
  const fh = await fs.open(tmp, 'w');
  try {
    let written = 0;
    for (const c of f.chunks) {
      const data = await store.read(c.hash);
      if (data.length !== c.size) throw new SyncFailure(`chunk ${c.hash} in the store has the wrong size`);
      await fh.write(data, 0, data.length, written);
      written += data.length;
    }
    if (fsync) await fh.sync();
  } catch (err) {
    await fh.close().catch(() => undefined);
    await fs.rm(tmp, { force: true });
    throw err;
  }
  await fh.close();
  await fs.rename(tmp, target);
}

/** Removes a file of the previous version and the folders it leaves empty (up to the extract root). */
async function removeFile(extractDir: string, rel: string): Promise<void> {
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

/**
 * Removes the files of the previous commit `prev` that are not in `keep` (callers pass an empty set when
 * the extract root changed, so the old root is emptied), with the folders they leave empty.
 */
async function removeDropped(root: MachineRoot, prev: Manifest | null, extractDir: string, keep: Set<string>): Promise<void> {
  if (!prev) return;
  const prevDir = prev.extractDir ? root.absolute(prev.extractDir) : extractDir;
  for (const f of prev.files) if (!keep.has(f.path)) await removeFile(prevDir, f.path);
}

/** Places an unchanged live file into the staging tree: a hard link (no copy), or a copy where links fail. */
async function linkInto(stageDir: string, extractDir: string, rel: string): Promise<void> {
  const from = confined(extractDir, rel);
  const to = confined(stageDir, rel);
  await fs.mkdir(path.dirname(to), { recursive: true });
  try {
    await fs.link(from, to);
  } catch {
    await fs.copyFile(from, to);
  }
}

/** Where and how a tree is written. */
export interface AssemblyContext {
  root: MachineRoot;
  store: ChunkStore;
  /** fsync each assembled file before its rename. */
  fsync: boolean;
  /** The agent's stop signal: a stop between files ends the run (SyncCancelled). */
  signal: AbortSignal;
  /** Called after each assembled file (`files_assembled` already counted). */
  onFile: () => void;
}

function checkStop(signal: AbortSignal): void {
  if (signal.aborted) throw new SyncCancelled('agent stopping');
}

/**
 * Immediate sync: removes the previous commit's files the new version lacks, assembles the planned files
 * into `extractDir`, then writes the roost's manifest (a crash before it leaves the previous manifest, so
 * the next sync redoes the work).
 */
export async function commitTree(
  ctx: AssemblyContext,
  manifest: Manifest,
  prev: Manifest | null,
  extractDir: string,
  plan: FilePlan,
  counters: SyncCounters,
): Promise<void> {
  const sameRoot = !!prev && prev.extractDir === manifest.extractDir;
  await removeDropped(ctx.root, prev, extractDir, sameRoot ? new Set(manifest.files.map((f) => f.path)) : new Set<string>());
  for (const f of plan.toAssemble) {
    checkStop(ctx.signal);
    await assembleFile(ctx.store, extractDir, f, ctx.fsync);
    counters.files_assembled++;
    ctx.onFile();
  }
  await ctx.root.writeManifest(manifest);
}

/**
 * Staged sync: builds the complete new tree of `version` under `<rootDir>/staging/<roostId>/<versionId>/`
 * (unchanged live files hard-linked, the rest assembled); any other staged version of the roost is
 * removed first. The live tree and its manifest are not touched; `sealStagedTree` completes the staging.
 * `afterFile` runs after each placed file (fault injection may throw there).
 */
export async function stageTree(
  ctx: AssemblyContext,
  version: Pick<Manifest, 'roostId' | 'versionId'>,
  extractDir: string,
  plan: FilePlan,
  counters: SyncCounters,
  afterFile: () => void,
): Promise<void> {
  const stageDir = ctx.root.stagingDir(version.roostId, version.versionId);
  await ctx.root.clearStaging(version.roostId);
  await fs.mkdir(stageDir, { recursive: true });
  for (const f of plan.unchanged) {
    checkStop(ctx.signal);
    await linkInto(stageDir, extractDir, f.path);
    afterFile();
  }
  for (const f of plan.toAssemble) {
    checkStop(ctx.signal);
    await assembleFile(ctx.store, stageDir, f, ctx.fsync);
    counters.files_assembled++;
    ctx.onFile();
    afterFile();
  }
}

/** Writes the staged manifest of a complete staged tree (the last step of a staging: its presence marks the tree complete). */
export async function sealStagedTree(root: MachineRoot, staged: StagedManifest): Promise<void> {
  await writeAtomic(root.stagedManifestPath(staged.roostId, staged.versionId), JSON.stringify(staged));
}

/** Removes a failed or interrupted staging of a version: its manifest and its partial tree. Never throws. */
export async function discardStagedTree(root: MachineRoot, roostId: string, versionId: string): Promise<void> {
  await fs.rm(root.stagedManifestPath(roostId, versionId), { force: true }).catch(() => undefined);
  await fs.rm(root.stagingDir(roostId, versionId), { recursive: true, force: true }).catch(() => undefined);
}

/** The staged manifest of a version when its tree is complete (manifest present, every file there at its size), else null. */
export async function completeStagedTree(root: MachineRoot, roostId: string, versionId: string): Promise<StagedManifest | null> {
  const staged = await root.readStagedManifest(roostId, versionId);
  if (!staged || staged.roostId !== roostId || staged.versionId !== versionId) return null;
  const stageDir = root.stagingDir(roostId, versionId);
  for (const f of staged.files) {
    const st = await fs.lstat(path.join(stageDir, ...f.path.split('/'))).catch(() => null);
    if (!st || !st.isFile() || st.size !== f.size) return null;
  }
  return staged;
}

/**
 * The journal of one activation (`<rootDir>/state/<roostId>.activation.json`), written atomically before the
 * live tree is touched and removed after the new manifest is written. Everything it names is redone
 * idempotently by `replayActivation`, so a crash anywhere in between rolls forward to the new tree.
 */
export interface ActivationJournal {
  staged: StagedManifest;
  /** Live extract directory relative to the root (forward slashes). */
  extractDir: string;
  /** Files of the previous commit to remove, each with the extract directory (relative) it lives in. */
  drop: { dir: string; path: string }[];
  /** The roost_activate command being run, when known (reported completed after a replay). */
  commandId?: string;
}

/** Steps of an activation a test may hook into (a crash there is what the journal exists for). */
export interface ActivationHooks {
  /** Runs after each staged file is switched in (`done` counts them). */
  afterFile?: (done: number) => void;
}

/**
 * Activation, crash-safe (docs/decisions/crash-safe-activation.md): writes the activation journal, removes the
 * previous commit's files the staged version lacks, renames every staged file into `extractDir`, writes the
 * roost's manifest, then removes the journal. A crash in between leaves the journal, which the agent replays
 * on start (`recoverActivations`): the tree ends wholly new. @returns the committed manifest.
 * @throws SyncFailure when a non-file is in the way (the journal is removed: nothing was switched yet).
 */
export async function switchStagedTree(
  root: MachineRoot,
  staged: StagedManifest,
  extractDir: string,
  opts: { commandId?: string; hooks?: ActivationHooks } = {},
): Promise<Manifest> {
  const { roostId, versionId } = staged;
  const stageDir = root.stagingDir(roostId, versionId);
  const extractRel = root.relative(extractDir);
  const prev = await root.readManifest(roostId);
  const sameRoot = !!prev && prev.extractDir === extractRel;
  // A non-file in the way refuses the activation before anything changes.
  for (const f of staged.files) {
    confined(stageDir, f.path);
    const st = await fs.lstat(confined(extractDir, f.path)).catch(() => null);
    if (st && !st.isFile()) throw new SyncFailure(`${f.path}: a non-file is in the way`);
  }
  const keep = sameRoot ? new Set(staged.files.map((f) => f.path)) : new Set<string>();
  const prevDir = prev ? prev.extractDir || extractRel : extractRel;
  const journal: ActivationJournal = {
    staged,
    extractDir: extractRel,
    drop: (prev?.files ?? []).filter((f) => !keep.has(f.path)).map((f) => ({ dir: prevDir, path: f.path })),
    ...(opts.commandId ? { commandId: opts.commandId } : {}),
  };
  await fs.mkdir(root.stateDir, { recursive: true });
  await writeAtomic(root.activationJournalPath(roostId), JSON.stringify(journal));
  return replayActivation(root, journal, opts.hooks);
}

/**
 * Carries out (or finishes) the activation a journal describes; every step may already have happened:
 * removals ignore missing files, a staged file already moved is left alone. Ends with the manifest written
 * and the journal removed. @returns the committed manifest.
 */
export async function replayActivation(root: MachineRoot, journal: ActivationJournal, hooks: ActivationHooks = {}): Promise<Manifest> {
  const { staged } = journal;
  const stageDir = root.stagingDir(staged.roostId, staged.versionId);
  const extractDir = root.absolute(journal.extractDir);
  for (const d of journal.drop) await removeFile(root.absolute(d.dir), d.path);
  let done = 0;
  for (const f of staged.files) {
    const from = confined(stageDir, f.path);
    const target = confined(extractDir, f.path);
    await fs.mkdir(path.dirname(target), { recursive: true });
    try {
      await fs.rename(from, target);
    } catch (err) {
      // Moved before a crash: the staged file is gone and the live one is in place.
      const st = await fs.lstat(target).catch(() => null);
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || !st || !st.isFile() || st.size !== f.size) throw err;
    }
    hooks.afterFile?.(++done);
  }
  const manifest: Manifest = {
    roostId: staged.roostId,
    versionId: staged.versionId,
    extractDir: journal.extractDir,
    committedAt: new Date().toISOString(),
    files: staged.files,
  };
  await root.writeManifest(manifest);
  await fs.rm(root.activationJournalPath(staged.roostId), { force: true });
  return manifest;
}

/**
 * Finishes every activation a crash interrupted (run by the agent on start, before it takes commands):
 * replays each journal left under `<rootDir>/state/`. A journal that does not parse is removed (it was
 * never complete: `writeAtomic` renames a whole file into place, so the live tree was not touched).
 * @returns the journals replayed (their trees are now wholly the new version)
 */
export async function recoverActivations(root: MachineRoot): Promise<ActivationJournal[]> {
  const out: ActivationJournal[] = [];
  for (const roostId of await root.journalledRoosts()) {
    const file = root.activationJournalPath(roostId);
    let journal: ActivationJournal;
    try {
      journal = JSON.parse(await fs.readFile(file, 'utf8')) as ActivationJournal;
    } catch {
      await fs.rm(file, { force: true });
      continue;
    }
    await replayActivation(root, journal);
    await root.clearStaging(roostId).catch(() => undefined);
    out.push(journal);
  }
  return out;
}
