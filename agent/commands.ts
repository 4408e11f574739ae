/**
 * Machine commands of the reference agent other than syncs, and the outcome every handled command ends with.
 * The machine commands themselves: agent/installer.ts (classic installs), agent/processes.ts (managed
 * processes), agent/power.ts (reboot, shutdown), `runScreenshot` below (docs/decisions/agent-machine-commands.md).
 */
import type { SyncCounters } from '../domain/target-state';
import { errMessage } from './errors';
import type { AgentCommand, AgentTransport } from './transport';
import { type ScreenState, captureWindowsScreen, renderStatePng } from './screenshot';

/** Outcome of one handled command (the agent emits it as `command`). */
export interface CommandOutcome {
  commandId: string;
  type: string;
  status: 'completed' | 'failed' | 'cancelled' | 'abandoned';
  /** On completed: `staged` for a staged sync_pull, else `success`. */
  result?: 'success' | 'staged';
  error?: string;
  counters?: SyncCounters;
  refetched?: number;
}

/** Running totals of one agent since start (a fleet sums them). A type literal, so it reads as a `Record<string, number>`. */
export type AgentStats = {
  commands: number;
  syncsCommitted: number;
  syncsStaged: number;
  syncsFailed: number;
  chunksFetched: number;
  chunksDedup: number;
  chunksRefetched: number;
  bytesFetched: number;
  filesSkipped: number;
  /** Reads of GET /api/agent/processes (managed-process configs). */
  processConfigReads: number;
};

/** All-zero AgentStats. */
export function emptyStats(): AgentStats {
  return {
    commands: 0,
    syncsCommitted: 0,
    syncsStaged: 0,
    syncsFailed: 0,
    chunksFetched: 0,
    chunksDedup: 0,
    chunksRefetched: 0,
    bytesFetched: 0,
    filesSkipped: 0,
    processConfigReads: 0,
  };
}

/** The API channel and warning sink a command handler reports through. */
export interface CommandChannel {
  transport: AgentTransport;
  warn: (message: string) => void;
}

/**
 * Closes a command `completed` (result success, progress 100) or `failed` (with `error`). A report that
 * cannot be sent is a warning, not an error: the outcome stands.
 */
export async function closeCommand(
  ch: CommandChannel,
  cmd: AgentCommand,
  status: 'completed' | 'failed',
  error?: string,
): Promise<CommandOutcome> {
  try {
    await ch.transport.reportCommand(
      cmd.commandId,
      status === 'completed' ? { status, result: 'success', progress: 100 } : { status, error },
    );
  } catch (err) {
    ch.warn(`could not report ${cmd.commandId}: ${errMessage(err)}`);
  }
  return {
    commandId: cmd.commandId,
    type: cmd.type,
    status,
    ...(status === 'completed' ? { result: 'success' as const } : {}),
    ...(error ? { error } : {}),
  };
}

/**
 * capture_screenshot: the screen on Windows, else a PNG rendered from the machine's state
 * (agent/screenshot.ts), uploaded with `PUT /api/agent/commands/{commandId}/screenshot`, then completed.
 * @param upload false: completes without uploading anything (fleets that do not need the bytes)
 */
export async function runScreenshot(
  ch: CommandChannel,
  cmd: AgentCommand,
  upload: boolean,
  state: () => Promise<ScreenState>,
): Promise<CommandOutcome> {
  if (!upload) return closeCommand(ch, cmd, 'completed');
  try {
    const monitor = cmd.params?.monitor;
    const png =
      process.platform === 'win32'
        ? await captureWindowsScreen(monitor === 'all' || monitor === 'primary' || typeof monitor === 'number' ? monitor : 0)
        : renderStatePng(await state());
    await ch.transport.uploadScreenshot(cmd.commandId, png);
  } catch (err) {
    return closeCommand(ch, cmd, 'failed', `screenshot failed: ${errMessage(err)}`);
  }
  return closeCommand(ch, cmd, 'completed');
}
