/**
 * A real API process (`node api/server.ts`) whose database is reached through a TCP proxy of the test, for crash
 * tests: the proxy can hold back the first packet that carries a given SQL text (the process then waits in the
 * middle of a request, at a known statement) and the test kills the process there.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { testConfig, testDatabase } from './env';
import { teeToTestLog } from './test-log';

const ROOT = path.join(__dirname, '..', '..');

/** A TCP proxy in front of the suite's PostgreSQL. */
export class PgProxy {
  private server: net.Server | undefined;
  private readonly sockets = new Set<net.Socket>();
  /** Packets held back, per upstream socket, in order. */
  private held: { upstream: net.Socket; data: Buffer }[] = [];
  private hold: { text: string; reached: () => void } | undefined;
  port = 0;

  /** Listens on a free loopback port. */
  async open(): Promise<void> {
    const pg = testConfig().ROOST_PG_PORT;
    this.server = net.createServer((client) => {
      const upstream = net.connect(pg, '127.0.0.1');
      this.sockets.add(client).add(upstream);
      client.on('data', (d: Buffer) => {
        if (this.hold && d.includes(this.hold.text)) {
          const { reached } = this.hold;
          this.hold = undefined;
          this.held.push({ upstream, data: d });
          reached();
        } else if (this.held.some((x) => x.upstream === upstream)) this.held.push({ upstream, data: d });
        else upstream.write(d);
      });
      upstream.pipe(client);
      const end = () => (client.destroy(), upstream.destroy());
      client.on('error', end).on('close', end);
      upstream.on('error', end).on('close', end);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as net.AddressInfo).port;
  }

  /** Resolves once a packet carrying `sqlText` arrived; it and what follows on its connection are held back. */
  holdAt(sqlText: string): Promise<void> {
    return new Promise((resolve) => (this.hold = { text: sqlText, reached: resolve }));
  }

  /** Sends what was held back. */
  release(): void {
    const held = this.held;
    this.held = [];
    for (const x of held) x.upstream.write(x.data);
  }

  /** Cuts every connection (what was held is dropped). */
  cut(): void {
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
    this.held = [];
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

/**
 * Starts `node -r tsx/cjs <entry>` (a path under the repository root) with `env` over this process's, its
 * output teed into the run's log file, and resolves with the process and the match once its stdout matches `ready`; rejects with the tail of its
 * stderr when it exits first.
 */
export function startEntry(entry: string, env: NodeJS.ProcessEnv, ready: RegExp): Promise<{ child: ChildProcess; match: RegExpExecArray }> {
  const child = spawn(process.execPath, ['-r', 'tsx/cjs', path.join(ROOT, entry)], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // Its JSON lines are part of the suite's logs, grepped for secrets (test/support/test-log.ts).
  teeToTestLog(child.stdout);
  teeToTestLog(child.stderr);
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    child.stderr!.on('data', (d) => (err += d));
    child.stdout!.on('data', (d) => {
      out += d;
      const match = ready.exec(out);
      if (match) {
        out = '';
        resolve({ child, match });
      }
    });
    child.on('exit', (code, signal) => reject(new Error(`${entry} exited ${code ?? signal}: ${err.slice(-2000)}`)));
  });
}

/**
 * Starts `node api/server.ts` on a free loopback port with its database reached through `proxy`; `env` adds
 * settings. It logs at info into the run's log file. Resolves with the process and its base URL once it listens.
 */
export async function startApiChild(proxy: PgProxy, env: Record<string, string> = {}): Promise<{ child: ChildProcess; url: string }> {
  const cfg = testConfig();
  const { child, match } = await startEntry(
    path.join('api', 'server.ts'),
    {
      ROOST_PG_DATABASE: testDatabase(),
      DATABASE_URL: cfg.databaseUrl.replace(`:${cfg.ROOST_PG_PORT}/`, `:${proxy.port}/`),
      ROOST_API_PORT: '0',
      ROOST_API_HOST: '127.0.0.1',
      ROOST_LOG_LEVEL: 'info',
      ...env,
    },
    /listening on (http:\/\/\S+)/,
  );
  return { child, url: match[1] };
}

/** SIGKILLs `child` and resolves once it is gone. */
export async function killHard(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGKILL');
  await gone;
}
