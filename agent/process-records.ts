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
import { JsonFileFolder, writeAtomic } from './machine-root';
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

/** The records in `<stateDir>/processes/`, and the saved overrides in `<stateDir>/process-overrides.json`. */
export class ProcessRecords {
  private readonly files: JsonFileFolder;

  constructor(private readonly stateDir: string) {
    this.files = new JsonFileFolder(path.join(stateDir, PROCESS_RECORD_DIR));
  }

  /** The records' folder. */
  get dir(): string {
    return this.files.dir;
  }

  /**
   * Records a launched process durably (replacing the process's previous record).
   * @throws Error when the folder or file cannot be written (the caller warns; the process keeps running)
   */
  async write(rec: ProcessRecord): Promise<void> {
    await this.files.write(rec.processId, rec);
  }

  /** Forgets a process's record (it ended). Never throws for a missing file. */
  async remove(processId: string): Promise<void> {
    await this.files.remove(processId);
  }

  /** Replaces the saved overrides (processId → override), written atomically. @throws Error when it cannot be written */
  async writeOverrides(overrides: Record<string, SavedOverride>): Promise<void> {
    await fs.mkdir(this.stateDir, { recursive: true, mode: 0o700 });
    await writeAtomic(path.join(this.stateDir, PROCESS_OVERRIDES_FILE), JSON.stringify(overrides));
  }

  /** The saved overrides; empty when none were saved or the file is unreadable (the launch modes then decide). */
  async readOverrides(): Promise<Record<string, SavedOverride>> {
    try {
      const raw = JSON.parse(await fs.readFile(path.join(this.stateDir, PROCESS_OVERRIDES_FILE), 'utf8')) as unknown;
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
    const out: ProcessRecord[] = [];
    for (const { id, value } of await this.files.readAll()) {
      const r = value as ProcessRecord;
      if (
        r &&
        typeof r.processId === 'string' &&
        r.processId === id &&
        Number.isInteger(r.pid) &&
        r.pid > 0 &&
        typeof r.identity?.startTime === 'string'
      )
        out.push(r);
    }
    return out;
  }
}
