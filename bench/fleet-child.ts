/**
 * The rollout benchmark's fleet: agent/fleet.ts `startFleet` in a process of its own (so the simulated
 * machines and the API with its worker do not share one event loop), driven over Node IPC by
 * bench/rollout.ts. Never run by hand.
 *
 * Parent → child: `start` (fleet options), `stop`.
 * Child → parent: `ready` (machine ids, enrolment ms), `outcomes` (every handled command with its
 * wall-clock time `at` in epoch ms, batched every 50 ms), `stopped` (fleet stats and last warnings),
 * `failed` (message).
 */
import { startFleet, type Fleet } from '../agent/fleet';
import type { CommandOutcome } from '../agent/agent';

/** Options the parent sends with `start`. */
export interface FleetChildStart {
  baseUrl: string;
  siteId: string;
  enrolmentSecret: string;
  count: number;
  rootDir: string;
  /** PEM of an extra CA every agent trusts for installer downloads (bench/classic.ts's HTTPS installer server). */
  installerCa?: string;
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

export type ToChild = { type: 'start'; opts: FleetChildStart } | { type: 'stop' };
export type FromChild =
  | { type: 'ready'; machineIds: string[]; startMs: number }
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
    const { installerCa, ...opts } = msg.opts;
    startFleet({ ...opts, ...(installerCa ? { perAgent: () => ({ installerCa }) } : {}) })
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
