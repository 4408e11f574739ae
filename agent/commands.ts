/**
 * Commands of the reference agent other than syncs (docs/decisions/agent-simulated-commands.md): a
 * simulated machine acknowledges reboot_machine, shutdown_machine and restart_process without touching the
 * host; capture_screenshot uploads a 1×1 placeholder PNG (`PUT /api/agent/commands/{commandId}/screenshot`)
 * unless uploads are off; any other type fails. Also the outcome every handled command ends with.
 */
import type { SyncCounters } from '../domain/target-state';
import { errMessage } from './errors';
import type { AgentCommand, AgentTransport } from './transport';

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
  };
}

/** A 1×1 transparent PNG: the simulated screenshot. */
const PLACEHOLDER_PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==',
  'base64',
);

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
 * Handles a non-sync command on a simulated machine.
 * @param uploadScreenshots false: capture_screenshot completes without uploading anything
 */
export async function runSimulatedCommand(ch: CommandChannel, cmd: AgentCommand, uploadScreenshots: boolean): Promise<CommandOutcome> {
  switch (cmd.type) {
    case 'capture_screenshot':
      if (uploadScreenshots) {
        try {
          await ch.transport.uploadScreenshot(cmd.commandId, PLACEHOLDER_PNG);
        } catch (err) {
          return closeCommand(ch, cmd, 'failed', `screenshot upload failed: ${errMessage(err)}`);
        }
      }
      return closeCommand(ch, cmd, 'completed');
    case 'reboot_machine':
    case 'shutdown_machine':
    case 'restart_process':
      // A simulated machine acknowledges without touching the host.
      return closeCommand(ch, cmd, 'completed');
    default:
      return closeCommand(ch, cmd, 'failed', `unsupported command type ${cmd.type}`);
  }
}
