/**
 * A bench server in a process of its own (bench/api-child.ts: the real app, or the API benchmark's bare
 * floor route), driven over Node IPC, and the environment such a child gets. Used by the API benchmark
 * (bench/api.ts) so autocannon never shares the server's event loop, and by the cold push (bench/push.ts)
 * so the API runs beside the CLI the way a remote API does, not on the CLI's main thread.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';
import type { Config } from '../config/env';
import { EnvSchema } from '../config/env';
import { cpuProfArgs, disconnectChild } from './util';
import type { ApiChildStart, FromApiChild, ToApiChild } from './api-child';

/** Environment of a child process for `cfg` (every setting spelled out, services reached as external). */
export function childEnv(cfg: Config, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(EnvSchema.properties)) {
    const v = (cfg as unknown as Record<string, unknown>)[key];
    if (v !== undefined && v !== null) env[key] = String(v);
  }
  env.DATABASE_URL = cfg.databaseUrl;
  env.TEMPORAL_ADDRESS = cfg.temporalAddress;
  return { ...env, ...extra };
}

/** One server child (bench/api-child.ts). */
export class ServerChild {
  private constructor(
    private readonly child: ChildProcess,
    readonly url: string,
  ) {}

  /** Process id of the server (benchmarks read its CPU time from /proc). */
  get pid(): number | undefined {
    return this.child.pid;
  }

  /**
   * Starts a server child and waits until it listens. `ownSession`: the child runs in a session of its
   * own, as the stack's services do (stack/services.ts), so the kernel schedules it as a separate
   * task group from the bench process (a remote API does not share the client's CPU).
   */
  static async start(cfg: Config, opts: ApiChildStart, spawnOpts: { ownSession?: boolean } = {}): Promise<ServerChild> {
    // ROOST_BENCH_CPU_PROF_DIR: each server child writes a V8 CPU profile there when it exits (where the time goes).
    const child = spawn(process.execPath, [...cpuProfArgs(), '--import', 'tsx', path.join(__dirname, 'api-child.ts')], {
      cwd: path.join(__dirname, '..'),
      env: childEnv(cfg),
      // The app's log lines go nowhere, as they would go to a collector in production (written, not read).
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
      detached: spawnOpts.ownSession === true,
    });
    const url = await new Promise<string>((resolve, reject) => {
      child.on('message', (m: FromApiChild) => {
        if (m.type === 'ready') resolve(m.url);
        else if (m.type === 'failed') reject(new Error(`server child failed to start: ${m.message}`));
      });
      child.once('exit', (code) => reject(new Error(`server child exited with ${code} before it was ready`)));
      child.send({ type: 'start', opts } satisfies ToApiChild);
    });
    return new ServerChild(child, url);
  }

  /** SQL statements sent through the child's pool so far, and the child's CPU time so far (µs). */
  stats(): Promise<{ queries: number; cpuMicros: number }> {
    return new Promise((resolve) => {
      const onMsg = (m: FromApiChild) => {
        if (m.type === 'stats') {
          this.child.off('message', onMsg);
          resolve({ queries: m.queries, cpuMicros: m.cpuMicros });
        }
      };
      this.child.on('message', onMsg);
      this.child.send({ type: 'stats' } satisfies ToApiChild);
    });
  }

  async stop(): Promise<void> {
    await disconnectChild(this.child, 15_000);
  }
}

/** Where a benchmark's API runs: a process of its own session (as a remote API would) or the bench process. */
export type ApiWhere = 'process' | 'in-process';

/**
 * Runs `fn` with the real app in a process of its own session when `where` is `process` (stopped
 * afterwards, whatever `fn` did), else with none (`in-process`: the bench stack's own API serves).
 */
export async function withApiChild<T>(cfg: Config, where: ApiWhere, fn: (server: ServerChild | undefined) => Promise<T>): Promise<T> {
  const server =
    where === 'process'
      ? await ServerChild.start(cfg, { mode: 'api', logLevel: cfg.ROOST_LOG_LEVEL, without: [] }, { ownSession: true })
      : undefined;
  try {
    return await fn(server);
  } finally {
    await server?.stop();
  }
}
