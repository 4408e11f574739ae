/**
 * The rollout benchmark's fleet: agent/fleet.ts `startFleet` in a process of its own (so the simulated
 * machines and the API with its worker do not share one event loop), driven over Node IPC by
 * bench/rollout.ts. Never run by hand.
 *
 * bench/rollout.ts spreads a big fleet over several of these (`--fleet-processes`).
 *
 * Parent → child: `start` (fleet options), `counters` (asks for the request counters), `stop`.
 * Child → parent: `ready` (machine ids, enrolment ms), `outcomes` (every handled command with its
 * wall-clock time `at` in epoch ms, batched every 50 ms), `counters` (API and blob requests so far, CPU
 * seconds of this process), `stopped` (fleet stats and last warnings), `failed` (message).
 *
 * Signed-URL GETs (blob storage) go through Node's global connection pool, bounded here to
 * `blobConnections` keep-alive connections per origin.
 */
import { Agent as HttpAgent, setGlobalDispatcher } from 'undici';
import { startFleet, type Fleet } from '../agent/fleet';
import type { CommandOutcome } from '../agent/agent';
import { requestCounters } from '../agent/http';

/** Options the parent sends with `start`. */
export interface FleetChildStart {
  baseUrl: string;
  siteId: string;
  enrolmentSecret: string;
  count: number;
  rootDir: string;
  /** PEM of an extra CA every agent trusts for installer downloads (bench/classic.ts's HTTPS installer server). */
  installerCa?: string;
  /** The machine ids of this process's agents (`count` of them). */
  machineIds?: string[];
  /** Heartbeat interval of every agent (ms; agent default 30000). */
  heartbeatMs?: number;
  /** Long-poll wait (s; agent default 25). */
  pollWaitSeconds?: number;
  /** Agents enrolling at once (fleet default 50). */
  startConcurrency?: number;
  /** Keep-alive connections shared by the API calls other than long-polls (fleet default 64). */
  apiConnections?: number;
  /** Keep-alive connections per blob origin (default 64). */
  blobConnections?: number;
  /** The agents' compact sync protocol (AgentOptions.inlineSync, default true). */
  inlineSync?: boolean;
}

/** Request counters of one fleet process. */
export interface FleetCounters {
  api: number;
  blob: number;
  /** Of `api`: made while working on a command (agent/http.ts requestCounters). */
  command: number;
  /** Of `api`: long-polls answered with at least one command. */
  delivering: number;
  /** User+system CPU seconds of the fleet process. */
  cpuSeconds: number;
}

/** One handled command as reported to the parent. */
export interface FleetOutcome {
  machineId: string;
  commandId: string;
  type: string;
  status: CommandOutcome['status'];
  error?: string;
  /** Epoch ms when the agent finished the command (after its final report was answered). */
  at: number;
}

export type ToChild = { type: 'start'; opts: FleetChildStart } | { type: 'counters' } | { type: 'stop' };
export type FromChild =
  | { type: 'ready'; machineIds: string[]; startMs: number }
  | { type: 'counters'; counters: FleetCounters }
  | { type: 'outcomes'; items: FleetOutcome[] }
  | { type: 'stopped'; stats: ReturnType<Fleet['stats']>; warnings: string[] }
  | { type: 'failed'; message: string };

function send(msg: FromChild): void {
  process.send?.(msg);
}

let fleet: Fleet | undefined;
let buffer: FleetOutcome[] = [];
const flusher = setInterval(() => {
  if (buffer.length) {
    send({ type: 'outcomes', items: buffer });
    buffer = [];
  }
}, 50);

process.on('message', (msg: ToChild) => {
  if (msg.type === 'start') {
    const t0 = Date.now();
    const { installerCa, blobConnections, ...opts } = msg.opts;
    setGlobalDispatcher(new HttpAgent({ connections: blobConnections ?? 64, keepAliveTimeout: 60_000 }));
    // rebootDowntimeMs 0: the floor's reboot_machine is to cost the protocol alone. With the agent's default
    // (15 s offline, agent/power.ts) the machines were still down when the next floor round or the canary
    // wave came: the canary of a 1,000-machine rollout waited 14 s for its first delivery.
    startFleet({ ...opts, perAgent: () => ({ rebootDowntimeMs: 0, ...(installerCa ? { installerCa } : {}) }) })
      .then((f) => {
        fleet = f;
        for (const a of f.agents) {
          a.on('command', (o: CommandOutcome) => {
            buffer.push({
              machineId: a.machineId,
              commandId: o.commandId,
              type: o.type,
              status: o.status,
              ...(o.error ? { error: o.error } : {}),
              at: Date.now(),
            });
          });
        }
        send({ type: 'ready', machineIds: f.machineIds, startMs: Date.now() - t0 });
      })
      .catch((err) => send({ type: 'failed', message: (err as Error).stack ?? String(err) }));
  } else if (msg.type === 'counters') {
    const cpu = process.cpuUsage();
    send({
      type: 'counters',
      counters: {
        api: requestCounters.api,
        blob: requestCounters.blob,
        command: requestCounters.command,
        delivering: requestCounters.delivering,
        cpuSeconds: (cpu.user + cpu.system) / 1e6,
      },
    });
  } else if (msg.type === 'stop') {
    const done = async () => {
      if (fleet) await fleet.stop();
      clearInterval(flusher);
      if (buffer.length) send({ type: 'outcomes', items: buffer });
      send({
        type: 'stopped',
        stats: fleet ? fleet.stats() : ({} as ReturnType<Fleet['stats']>),
        warnings: fleet ? fleet.warnings.slice(-20) : [],
      });
    };
    done()
      .catch((err) => send({ type: 'failed', message: (err as Error).stack ?? String(err) }))
      .finally(() => process.disconnect?.());
  }
});

// The parent went away: stop quietly.
process.on('disconnect', () => {
  clearInterval(flusher);
  void (fleet?.stop() ?? Promise.resolve()).finally(() => process.exit(0));
});
