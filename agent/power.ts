/**
 * reboot_machine and shutdown_machine on the reference agent (docs/decisions/agent-machine-commands.md).
 * The agent never reboots its host: it honours `params.delaySeconds`, shows `rebooting` / `shuttingDown` on
 * the machine through its heartbeat, closes the command `completed`, then goes offline (managed processes
 * stopped, no heartbeats, no command poll) for its downtime and comes back as a restarted agent (first
 * heartbeat clears the flag; managed processes start again by their launch mode). A shutdown comes back
 * too (a simulated machine that is powered on again). On Windows a real agent runs
 * `AgentOs.powerInvocation` (`shutdown.exe /r|/s /t <delay>`) instead of the restart.
 */
import type { CommandOutcome } from './commands';
import { closeCommand } from './commands';
import { errMessage } from './errors';
import { outsideCommandContext, sleep } from './http';
import type { AgentCommand, AgentTransport } from './transport';

/** What a power command needs from the agent. */
export interface PowerHost {
  transport: AgentTransport;
  /** A warning; `err`, when given, is the failure (agent/service.ts exits on a refused token). */
  warn: (message: string, err?: unknown) => void;
  signal: AbortSignal;
  /** Sets the flags the heartbeat reports and sends a heartbeat now. */
  announce(flags: { rebooting: boolean; shuttingDown: boolean }): Promise<void>;
  /**
   * Goes offline for `downtimeMs`, then restarts the agent (unless it was stopped meanwhile), waiting out an
   * API outage at the restart; rejects only on a refusal (a revoked token).
   */
  powerCycle(): Promise<void>;
}

/** Runs a reboot_machine or shutdown_machine command. */
export async function runPowerCommand(host: PowerHost, cmd: AgentCommand): Promise<CommandOutcome> {
  const kind = cmd.type === 'reboot_machine' ? 'reboot' : 'shutdown';
  const delaySeconds = typeof cmd.params?.delaySeconds === 'number' ? cmd.params.delaySeconds : 0;
  try {
    const first = await host.transport.reportCommand(cmd.commandId, {
      status: kind === 'reboot' ? 'rebooting' : 'shutting_down',
      progress: 0,
    });
    if (!first.applied) return { commandId: cmd.commandId, type: cmd.type, status: 'cancelled' };
    await host.announce({ rebooting: kind === 'reboot', shuttingDown: kind === 'shutdown' });
    if (delaySeconds > 0) await sleep(delaySeconds * 1000, host.signal);
    if (host.signal.aborted) return { commandId: cmd.commandId, type: cmd.type, status: 'abandoned', error: 'agent stopped' };
  } catch (err) {
    return closeCommand({ transport: host.transport, warn: host.warn }, cmd, 'failed', errMessage(err));
  }
  const out = await closeCommand({ transport: host.transport, warn: host.warn }, cmd, 'completed');
  // The restarted agent is not part of this command: its loops must not carry the command's trace context.
  void outsideCommandContext(() => host.powerCycle()).catch((err) => host.warn(`${kind} restart failed: ${errMessage(err)}`, err));
  return out;
}
