/**
 * The stand-in for a load balancer in the scale-out benchmark (bench/scaleout.ts, run in processes of
 * its own by bench/balancer-child.ts).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { disconnectChild } from './util';

/**
 * A round-robin TCP balancer on a free loopback port: each new connection goes to the next backend that
 * accepts it (a refused connect tries the next one, so a dead process drops out by itself, as behind a
 * load balancer's health check). Connections are spliced whole, so HTTP keep-alive stays per backend.
 */
export class RoundRobin {
  private server?: net.Server;
  private next = 0;
  private readonly sockets = new Set<net.Socket>();
  /** Connections handed to each backend, by index. */
  readonly connections: number[];
  port = 0;

  constructor(private readonly backends: number[]) {
    this.connections = backends.map(() => 0);
  }

  async open(): Promise<string> {
    this.server = net.createServer((client) => {
      client.pause();
      this.sockets.add(client);
      client.on('close', () => this.sockets.delete(client));
      client.on('error', () => client.destroy());
      this.route(client, 0);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as net.AddressInfo).port;
    return `http://127.0.0.1:${this.port}`;
  }

  private route(client: net.Socket, tried: number): void {
    if (tried >= this.backends.length || client.destroyed) return void client.destroy();
    const i = this.next++ % this.backends.length;
    const upstream = net.connect(this.backends[i], '127.0.0.1');
    let connected = false;
    upstream.once('connect', () => {
      connected = true;
      this.connections[i]++;
      this.sockets.add(upstream);
      client.pipe(upstream);
      upstream.pipe(client);
      client.resume();
    });
    upstream.on('error', () => {
      if (!connected) this.route(client, tried + 1);
      else client.destroy();
    });
    upstream.on('close', () => {
      this.sockets.delete(upstream);
      if (connected) client.destroy();
    });
    client.on('close', () => upstream.destroy());
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

/** Machines per balancer process: at most two connections each, two descriptors per connection. */
export const MACHINES_PER_BALANCER_PROCESS = 2500;

/**
 * The balancer run as bench/balancer-child.ts: `processes` cluster workers sharing one loopback port,
 * `nice` as the fleet's (it stands for a machine in front of the APIs, not for the APIs' own CPU).
 */
export class BalancerProcesses {
  private constructor(
    private readonly proc: ChildProcess,
    readonly port: number,
  ) {}

  /** The balancer's base URL (`http://127.0.0.1:<port>`). */
  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Spawns the balancer and resolves once every worker listens; rejects if it exits first (or in 60 s). */
  static async start(backends: number[], processes: number, nice = 0): Promise<BalancerProcesses> {
    const proc = spawn(process.execPath, ['--import', 'tsx', path.join(__dirname, 'balancer-child.ts')], {
      cwd: path.join(__dirname, '..'),
      env: { ...process.env, ROOST_BALANCER_BACKENDS: JSON.stringify(backends), ROOST_BALANCER_PROCESSES: String(processes) },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    if (nice > 0 && proc.pid) os.setPriority(proc.pid, nice);
    const port = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the balancer did not listen within 60 s')), 60_000);
      proc.on('message', (m: { type: string; port?: number }) => {
        if (m.type !== 'ready') return;
        clearTimeout(timer);
        resolve(m.port!);
      });
      proc.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`the balancer exited (${code ?? signal}) before it listened`));
      });
    });
    return new BalancerProcesses(proc, port);
  }

  /** Connections handed to each backend so far, summed over the balancer's processes. */
  connections(): Promise<number[]> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the balancer did not answer within 10 s')), 10_000);
      const onMsg = (m: { type: string; connections?: number[] }) => {
        if (m.type !== 'stats') return;
        clearTimeout(timer);
        this.proc.off('message', onMsg);
        resolve(m.connections!);
      };
      this.proc.on('message', onMsg);
      this.proc.send({ type: 'stats' });
    });
  }

  /** Disconnects (the balancer kills its workers and exits) and resolves once it is gone. */
  async close(): Promise<void> {
    await disconnectChild(this.proc, 10_000);
  }
}
