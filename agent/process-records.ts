/**
 * The agent's record of the managed processes it launched (`<rootDir>/state/processes/<processId>.json`),
 * so that an agent killed without a chance to stop them (SIGKILL, a crash, a service wrapper's hard kill)
 * finds them again when it restarts instead of launching a second copy (agent/processes.ts adoption;
 * docs/decisions/managed-processes.md "Agent restarts"). Each file is written atomically (temp file, fsync,
 * rename: agent/machine-root.ts `writeAtomic`) right after the launch and removed once the process ended,
 * like the command journal (agent/journal.ts).
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { writeAtomic } from './machine-root';
import type { ProcessIdentity } from './os';

/** The folder of process records under a machine root's state folder. */
export const PROCESS_RECORD_DIR = 'processes';

/** One launched managed process. */
export interface ProcessRecord {
  processId: string;
  name: string;
  /** OS process id. */
  pid: number;
  /** What tells this process from a later one with the same pid (agent/os.ts `sameProcess`). */
  identity: ProcessIdentity;
  /** The executable the agent launched (diagnostics). */
  exePath: string;
  /** Crash relaunches counted when it was launched, and the config's `updatedAt` then. */
  restarts: number;
  configUpdatedAt: string;
  /** ISO time of the launch. */
  launchedAt: string;
}

/** The file of start/stop overrides under a machine root's state folder (`ProcessRecords.writeOverrides`). */
export const PROCESS_OVERRIDES_FILE = 'process-overrides.json';

/**
 * A start/stop command's override of a process's launch mode, kept across agent restarts: it holds while
 * the config is the one it was given under (`configUpdatedAt`) and, for a scheduled process, while the
 * schedule is in the state it was then (`open`; null for other launch modes).
 */
export interface SavedOverride {
  override: 'run' | 'stop';
  configUpdatedAt: string;
  open: boolean | null;
}

/** Process ids are the server's (`prc_…`); anything else never becomes a file name. */
const SAFE_ID = /^[A-Za-z0-9_-]{1,128}$/;

/** The records in `<stateDir>/processes/`. */
export class ProcessRecords {
  readonly dir: string;

  constructor(stateDir: string) {
    this.dir = path.join(stateDir, PROCESS_RECORD_DIR);
  }

  private file(processId: string): string | null {
    return SAFE_ID.test(processId) ? path.join(this.dir, `${processId}.json`) : null;
  }

  /**
   * Records a launched process durably (replacing the process's previous record).
   * @throws Error when the folder or file cannot be written (the caller warns; the process keeps running)
   */
  async write(rec: ProcessRecord): Promise<void> {
    const file = this.file(rec.processId);
    if (!file) return;
    await fs.mkdir(this.dir, { recursive: true, mode: 0o700 });
    await writeAtomic(file, JSON.stringify(rec));
  }

  /** Forgets a process's record (it ended). Never throws for a missing file. */
  async remove(processId: string): Promise<void> {
    const file = this.file(processId);
    if (file) await fs.rm(file, { force: true });
  }

  /** Replaces the saved overrides (processId → override), written atomically. @throws Error when it cannot be written */
  async writeOverrides(overrides: Record<string, SavedOverride>): Promise<void> {
    await fs.mkdir(path.dirname(this.dir), { recursive: true, mode: 0o700 });
    await writeAtomic(path.join(path.dirname(this.dir), PROCESS_OVERRIDES_FILE), JSON.stringify(overrides));
  }

  /** The saved overrides; empty when none were saved or the file is unreadable (the launch modes then decide). */
  async readOverrides(): Promise<Record<string, SavedOverride>> {
    try {
      const raw = JSON.parse(await fs.readFile(path.join(path.dirname(this.dir), PROCESS_OVERRIDES_FILE), 'utf8')) as unknown;
      if (!raw || typeof raw !== 'object' || Array.isArray(raw)) return {};
      const out: Record<string, SavedOverride> = {};
      for (const [id, o] of Object.entries(raw as Record<string, Partial<SavedOverride>>)) {
        if ((o?.override === 'run' || o?.override === 'stop') && typeof o.configUpdatedAt === 'string') {
          out[id] = { override: o.override, configUpdatedAt: o.configUpdatedAt, open: typeof o.open === 'boolean' ? o.open : null };
        }
      }
      return out;
    } catch {
      return {};
    }
  }

  /** Every readable record (an unreadable or foreign file is skipped: it names nothing to signal). */
  async list(): Promise<ProcessRecord[]> {
    let names: string[];
    try {
      names = await fs.readdir(this.dir);
    } catch {
      return [];
    }
    const out: ProcessRecord[] = [];
    for (const name of names.sort()) {
      if (!name.endsWith('.json') || name.startsWith('.')) continue;
      try {
        const r = JSON.parse(await fs.readFile(path.join(this.dir, name), 'utf8')) as ProcessRecord;
        if (
          r &&
          typeof r.processId === 'string' &&
          `${r.processId}.json` === name &&
          Number.isInteger(r.pid) &&
          r.pid > 0 &&
          typeof r.identity?.startTime === 'string'
        )
          out.push(r);
      } catch {
        // A torn write cannot happen (writeAtomic); anything unreadable is not ours to signal.
      }
    }
    return out;
  }
}
