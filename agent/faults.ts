/**
 * Fault injection of the reference agent, for tests, benchmarks and the fleet simulator (agent/fleet.ts):
 * corrupted first downloads (proves the chunk refetch of agent/download.ts), failing syncs, failing
 * stagings (docs/agent-protocol.md "Staged sync and activation"), delayed syncs and a crash in the middle of an
 * activation. Off unless asked for.
 */
import { SyncFailure } from './errors';

/** Faults an agent (or a whole fleet) injects on purpose. */
export interface AgentFaults {
  /** Fraction (0..1) of chunks whose first download gets one byte flipped. */
  corruptFirstDownloadRate?: number;
  /** Fraction (0..1) of syncs that fail on purpose. */
  failSyncRate?: number;
  /** Machine ids whose syncs always fail. */
  failMachines?: string[];
  /** Machine ids whose staged syncs (activation 'staged') fail while staging (the live tree stays untouched). */
  failStageMachines?: string[];
  /** Delay before each sync starts (ms). */
  syncDelayMs?: number;
  /**
   * Kills the agent's own process (SIGKILL) once this many files of an activation are switched in: a crash in
   * the middle of activation. Only for an agent that is a process of its own (crash tests); never in a fleet.
   */
  crashActivationAfterFiles?: number;
}

/** The faults of one machine, drawn from its random source. */
export class FaultInjector {
  constructor(
    private readonly faults: AgentFaults,
    private readonly machineId: string,
    private readonly random: () => number,
  ) {}

  /** Delay before each sync starts (ms; 0 for none). */
  get syncDelayMs(): number {
    return this.faults.syncDelayMs ?? 0;
  }

  /** @throws SyncFailure when this sync is to fail (the machine is listed, or a draw under `failSyncRate`). */
  checkSync(): void {
    if ((this.faults.failMachines ?? []).includes(this.machineId) || (this.faults.failSyncRate ?? 0) > this.random()) {
      throw new SyncFailure('injected failure (fault injection)');
    }
  }

  /** Whether a chunk's first download is to be corrupted (one draw per chunk, only when the rate is set). */
  corruptsFirstDownload(): boolean {
    const rate = this.faults.corruptFirstDownloadRate ?? 0;
    return rate > 0 && this.random() < rate;
  }

  /** Flips one byte in the middle of `data` (in place). */
  corrupt(data: Buffer): void {
    if (data.length > 0) data[data.length >> 1] ^= 0xff;
  }

  /** Called after the `done`-th file of an activation is switched in; dies there under `crashActivationAfterFiles`. */
  afterActivatedFile(done: number): void {
    if (this.faults.crashActivationAfterFiles === done) process.kill(process.pid, 'SIGKILL');
  }

  /** Whether this machine's stagings fail (checked once per staging). */
  failsStaging(): boolean {
    return (this.faults.failStageMachines ?? []).includes(this.machineId);
  }
}

/** The error a staging fails with under `failStageMachines`. */
export function stagingFault(): SyncFailure {
  return new SyncFailure('injected staging failure (fault injection)');
}
