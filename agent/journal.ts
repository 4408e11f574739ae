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
import path from 'node:path';
import type { AgentCommand } from './transport';
import { JsonFileFolder } from './machine-root';

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

/** The journal in `<stateDir>/work/`. */
export class FileJournal implements CommandJournal {
  private readonly files: JsonFileFolder;

  constructor(stateDir: string) {
    this.files = new JsonFileFolder(path.join(stateDir, JOURNAL_DIR));
  }

  /** The journal's folder. */
  get dir(): string {
    return this.files.dir;
  }

  async taken(cmd: AgentCommand): Promise<void> {
    const entry: Entry = { takenAt: Date.now(), command: cmd };
    await this.files.write(cmd.commandId, entry);
  }

  async done(commandId: string): Promise<void> {
    await this.files.remove(commandId);
  }

  async pending(): Promise<AgentCommand[]> {
    const entries: Entry[] = [];
    for (const { value } of await this.files.readAll()) {
      const e = value as Entry;
      if (e?.command && typeof e.command.commandId === 'string' && typeof e.command.type === 'string') entries.push(e);
    }
    return entries.sort((a, b) => a.takenAt - b.takenAt).map((e) => e.command);
  }
}
