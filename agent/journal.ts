/**
 * The agent's journal of taken commands (`<rootDir>/state/work/<commandId>.json`), so work survives a
 * crash, a SIGKILL or a power cut. The server hands a command out again only while it is still `pending`
 * (docs/agent-protocol.md "Commands"), and a sync reports `downloading` as soon as it starts, so a sync
 * interrupted after that would never come back by itself: the agent writes the command here (fsynced)
 * before it starts, removes it once the command has ended with a reported outcome, and on start runs
 * every command still journaled before it polls for new ones. Re-running is safe: a sync re-plans
 * against the last committed manifest and reuses the chunks already in the local store, and a command
 * the server closed meanwhile answers `applied: false` and is dropped (agent/sync.ts).
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { AgentCommand } from './transport';
import { writeAtomic } from './machine-root';

/** The folder of journaled commands under a machine root's state folder. */
export const JOURNAL_DIR = 'work';

/** What the agent loop needs from a journal (agent/agent.ts AgentOptions.journal). */
export interface CommandJournal {
  /** Records `cmd` durably before it starts. */
  taken(cmd: AgentCommand): Promise<void>;
  /** Forgets a command that ended with a reported outcome. */
  done(commandId: string): Promise<void>;
  /** The commands taken and not done, oldest first. */
  pending(): Promise<AgentCommand[]>;
}

/** A journaled command with the time it was taken (epoch ms). */
interface Entry {
  takenAt: number;
  command: AgentCommand;
}

/** Command ids are the server's (`cmd_…`); anything else never becomes a file name. */
const SAFE_ID = /^[A-Za-z0-9_-]{1,128}$/;

/** The journal in `<stateDir>/work/`. */
export class FileJournal implements CommandJournal {
  readonly dir: string;

  constructor(stateDir: string) {
    this.dir = path.join(stateDir, JOURNAL_DIR);
  }

  private file(commandId: string): string | null {
    return SAFE_ID.test(commandId) ? path.join(this.dir, `${commandId}.json`) : null;
  }

  async taken(cmd: AgentCommand): Promise<void> {
    const file = this.file(cmd.commandId);
    if (!file) return;
    await fs.mkdir(this.dir, { recursive: true, mode: 0o700 });
    const entry: Entry = { takenAt: Date.now(), command: cmd };
    await writeAtomic(file, JSON.stringify(entry));
  }

  async done(commandId: string): Promise<void> {
    const file = this.file(commandId);
    if (file) await fs.rm(file, { force: true });
  }

  async pending(): Promise<AgentCommand[]> {
    let names: string[];
    try {
      names = await fs.readdir(this.dir);
    } catch {
      return [];
    }
    const entries: Entry[] = [];
    for (const name of names) {
      if (!name.endsWith('.json') || name.startsWith('.')) continue;
      try {
        const e = JSON.parse(await fs.readFile(path.join(this.dir, name), 'utf8')) as Entry;
        if (e?.command && typeof e.command.commandId === 'string' && typeof e.command.type === 'string') entries.push(e);
      } catch {
        // A torn write cannot happen (writeAtomic); anything unreadable is not ours to run.
      }
    }
    return entries.sort((a, b) => a.takenAt - b.takenAt).map((e) => e.command);
  }
}
