/**
 * The reference agent's machine root on disk (docs/agent-protocol.md, docs/decisions/agent-sync.md):
 *
 *   <rootDir>/state/agent.json                       agent token and pinned signing keys
 *   <rootDir>/state/<roostId>.json                   manifest of the roost's last committed version
 *   <rootDir>/state/<roostId>.activation.json        journal of an activation under way (agent/assembly.ts)
 *   <rootDir>/chunks/<hash>                          local chunk store (agent/download.ts)
 *   <rootDir>/staging/<roostId>/<versionId>/         a staged tree, and `<versionId>.json` its manifest
 *   <rootDir>/<extractRoot>/…                        the live trees (`roosts/<roostId>` when the roost names none)
 *
 * Also the path rules that keep every write under the root, and the atomic write (temp file, fsync, rename).
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { SyncCounters } from '../domain/target-state';
import { SyncFailure } from './errors';
import { extractRootSegments, filePathProblem } from '../domain/paths';

/** Top-level folder of the machine root holding staged trees (`staging/<roostId>/<versionId>/`). */
export const STAGING_DIR = 'staging';

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

/**
 * Where a roost whose extract path is '' (the roost names none: "'' = the agent's default", the contract's
 * roost record) is extracted: `roosts/<roostId>` under the machine root, one folder per roost.
 */
export function defaultExtractRoot(roostId: string): string {
  return `roosts/${roostId}`;
}

/**
 * Maps an extract root as the server gives it (e.g. `C:\Roost\app`, `/opt/app`, `app`) to a directory
 * under `rootDir`: drive letters and leading slashes dropped, backslashes read as separators, every segment
 * checked by the Windows path rules (domain/paths.ts; docs/decisions/windows-paths.md). `pathApi` is the
 * platform's path module (path.win32 on Windows; tests pass either).
 * @throws SyncFailure naming the rule: `..`, `:`, device names, trailing dots or spaces, an empty root, a
 *   first folder that folds onto the agent's own `chunks`/`state`/`staging`, or a root that leaves `rootDir`.
 */
export function resolveExtractDir(rootDir: string, extractRoot: string, pathApi: path.PlatformPath = path): string {
  if (extractRoot === '') throw new SyncFailure('the roost has no extract root');
  const r = extractRootSegments(extractRoot);
  if ('problem' in r) throw new SyncFailure(`extract root "${extractRoot}" ${r.problem}`);
  const root = pathApi.resolve(rootDir);
  const dir = pathApi.resolve(root, ...r.segments);
  if (!dir.startsWith(root + pathApi.sep)) throw new SyncFailure(`extract root "${extractRoot}" escapes the machine root`);
  return dir;
}

/**
 * The path of a version file (`rel`, forward slashes) under `dir`, with `pathApi` as in `resolveExtractDir`.
 * @throws SyncFailure when `rel` breaks a Windows path rule (domain/paths.ts `filePathProblem`) or would
 *   leave `dir`.
 */
export function confined(dir: string, rel: string, pathApi: path.PlatformPath = path): string {
  const why = filePathProblem(rel);
  if (why) throw new SyncFailure(`unsafe path "${rel}": it ${why}`);
  const p = pathApi.resolve(dir, ...rel.split('/'));
  if (!p.startsWith(dir + pathApi.sep)) throw new SyncFailure(`path "${rel}" escapes the extract root`);
  return p;
}

/** Writes `data` to `file` atomically: temp file in the same folder, fsync, rename. */
export async function writeAtomic(file: string, data: Buffer | string): Promise<void> {
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

/** Ids that may name a file in a JsonFileFolder (the server's `cmd_…`, `prc_…`); anything else never becomes a file name. */
const SAFE_FILE_ID = /^[A-Za-z0-9_-]{1,128}$/;

/**
 * A folder of one JSON file per id (`<dir>/<id>.json`), written atomically (`writeAtomic`), owner-only: the
 * agent's durable records of what it is doing (agent/journal.ts commands, agent/process-records.ts launched
 * processes). Ids outside SAFE_FILE_ID are neither written nor removed.
 */
export class JsonFileFolder {
  constructor(readonly dir: string) {}

  private file(id: string): string | null {
    return SAFE_FILE_ID.test(id) ? path.join(this.dir, `${id}.json`) : null;
  }

  /** Writes `value` as `<id>.json` durably, replacing it. @throws Error when the folder or file cannot be written */
  async write(id: string, value: unknown): Promise<void> {
    const file = this.file(id);
    if (!file) return;
    await fs.mkdir(this.dir, { recursive: true, mode: 0o700 });
    await writeAtomic(file, JSON.stringify(value));
  }

  /** Removes `<id>.json`; a missing file is not an error. */
  async remove(id: string): Promise<void> {
    const file = this.file(id);
    if (file) await fs.rm(file, { force: true });
  }

  /**
   * Every readable file's id and parsed JSON, by file name; none when the folder is missing. Unreadable files
   * are skipped (a torn write cannot happen with writeAtomic), as are temp files and other names.
   */
  async readAll(): Promise<{ id: string; value: unknown }[]> {
    let names: string[];
    try {
      names = await fs.readdir(this.dir);
    } catch {
      return [];
    }
    const out: { id: string; value: unknown }[] = [];
    for (const name of names.sort()) {
      if (!name.endsWith('.json') || name.startsWith('.')) continue;
      try {
        out.push({ id: name.slice(0, -'.json'.length), value: JSON.parse(await fs.readFile(path.join(this.dir, name), 'utf8')) });
      } catch {
        // unreadable: nothing to act on
      }
    }
    return out;
  }
}

/** The layout of one machine root (absolute paths) and its manifests. */
export class MachineRoot {
  /** Absolute machine root. */
  readonly dir: string;

  constructor(rootDir: string) {
    this.dir = path.resolve(rootDir);
  }

  /** `<rootDir>/state`: agent state and committed manifests. */
  get stateDir(): string {
    return path.join(this.dir, 'state');
  }

  /** `<rootDir>/chunks`: the local chunk store. */
  get chunkDir(): string {
    return path.join(this.dir, 'chunks');
  }

  /** `<rootDir>/state/agent.json`: token and pinned keys. */
  get agentStatePath(): string {
    return path.join(this.stateDir, 'agent.json');
  }

  /** The committed manifest of a roost. */
  manifestPath(roostId: string): string {
    return path.join(this.stateDir, `${encodeURIComponent(roostId)}.json`);
  }

  /** The journal of a roost's activation under way (present only between its start and its end). */
  activationJournalPath(roostId: string): string {
    return path.join(this.stateDir, `${encodeURIComponent(roostId)}.activation.json`);
  }

  /** The roost ids that have an activation journal (an activation a crash interrupted, on start). */
  async journalledRoosts(): Promise<string[]> {
    const names = await fs.readdir(this.stateDir).catch(() => [] as string[]);
    return names.filter((n) => n.endsWith('.activation.json')).map((n) => decodeURIComponent(n.slice(0, -'.activation.json'.length)));
  }

  /** `<rootDir>/staging/<roostId>`: every staged tree of a roost. */
  stagingArea(roostId: string): string {
    return path.join(this.dir, STAGING_DIR, encodeURIComponent(roostId));
  }

  /** `<rootDir>/staging/<roostId>/<versionId>`: the staged tree of a version. */
  stagingDir(roostId: string, versionId: string): string {
    return path.join(this.stagingArea(roostId), versionId);
  }

  /** The staged manifest (written last: its presence marks a complete staged tree), beside the tree. */
  stagedManifestPath(roostId: string, versionId: string): string {
    return path.join(this.stagingArea(roostId), `${versionId}.json`);
  }

  /** An extract directory as manifests record it: relative to the root, forward slashes. */
  relative(dir: string): string {
    return path.relative(this.dir, dir).split(path.sep).join('/');
  }

  /** The absolute directory of a manifest's relative `extractDir`. */
  absolute(rel: string): string {
    return path.resolve(this.dir, ...rel.split('/'));
  }

  /** Loads the last committed manifest of a roost, or null. */
  async readManifest(roostId: string): Promise<Manifest | null> {
    try {
      return JSON.parse(await fs.readFile(this.manifestPath(roostId), 'utf8')) as Manifest;
    } catch {
      return null;
    }
  }

  /** Writes a roost's committed manifest atomically. */
  async writeManifest(manifest: Manifest): Promise<void> {
    await writeAtomic(this.manifestPath(manifest.roostId), JSON.stringify(manifest));
  }

  /** Loads the staged manifest of a version, or null. */
  async readStagedManifest(roostId: string, versionId: string): Promise<StagedManifest | null> {
    try {
      return JSON.parse(await fs.readFile(this.stagedManifestPath(roostId, versionId), 'utf8')) as StagedManifest;
    } catch {
      return null;
    }
  }

  /** Removes every staged tree of a roost (superseded by a newer staging or a commit). */
  async clearStaging(roostId: string): Promise<void> {
    await fs.rm(this.stagingArea(roostId), { recursive: true, force: true });
  }
}
