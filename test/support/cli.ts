/**
 * The `roost` binary (bin/roost.js) run as a person runs it, for the end-to-end CLI tests
 * (test/e2e/cli-*.test.ts): a child process with a base environment the test file supplies
 * (API URL, key, site, private config file) plus per-call overrides (`undefined` removes a variable).
 */
import { spawn } from 'node:child_process';
import path from 'node:path';

/** Absolute path of the CLI entry point. */
export const ROOST_BIN = path.resolve(__dirname, '..', '..', 'bin', 'roost.js');

/** Exit code (null when killed by a signal) and the whole stdout and stderr of one run. */
export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

export type CliEnv = Record<string, string | undefined>;

/** The runners of one test file; `base()` is read at each call, so it may use values set in beforeAll. */
export interface Cli {
  /** Runs `roost …`; `input` is written to stdin (closed either way). */
  roost(args: string[], env?: CliEnv, input?: string): Promise<CliRun>;
  /** Runs with `--json`, expects exit 0 and one JSON document on stdout. */
  json<T = any>(args: string[], env?: CliEnv, input?: string): Promise<T>;
  /** Runs and expects exit 0; resolves with stdout (human output). */
  human(args: string[], env?: CliEnv): Promise<string>;
  /**
   * Runs with `--json` and expects the exit code, `error: <code>: ` on stderr, `{error}` with that code on
   * stdout and, for an answered request, its request id on stderr. Resolves with the `error` object.
   */
  refused(args: string[], exit: number, code: string, env?: CliEnv): Promise<any>;
}

/** Builds the runners over a base environment (merged over `process.env`), run in `opts.cwd` when given. */
export function cliRunner(base: () => CliEnv, opts: { cwd?: string } = {}): Cli {
  const roost = (args: string[], env: CliEnv = {}, input?: string): Promise<CliRun> =>
    new Promise((resolve, reject) => {
      const child = spawn(process.execPath, [ROOST_BIN, ...args], {
        env: { ...process.env, ...base(), ...env },
        cwd: opts.cwd,
        stdio: ['pipe', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, stdout, stderr }));
      child.stdin.end(input ?? '');
    });
  const succeeded = (args: string[], r: CliRun): CliRun => {
    if (r.code !== 0) throw new Error(`roost ${args.join(' ')} exited ${r.code}: ${r.stderr}`);
    return r;
  };
  return {
    roost,
    async json<T = any>(args: string[], env: CliEnv = {}, input?: string): Promise<T> {
      return JSON.parse(succeeded(args, await roost([...args, '--json'], env, input)).stdout) as T;
    },
    async human(args: string[], env: CliEnv = {}): Promise<string> {
      return succeeded(args, await roost(args, env)).stdout;
    },
    async refused(args: string[], exit: number, code: string, env: CliEnv = {}): Promise<any> {
      const r = await roost([...args, '--json'], env);
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: exit, stderr: expect.stringContaining(`error: ${code}: `) });
      const body = JSON.parse(r.stdout);
      expect(body.error.code).toBe(code);
      expect(typeof body.error.detail).toBe('string');
      if (body.error.status > 0) {
        expect(body.error.requestId).toEqual(expect.any(String));
        expect(r.stderr).toContain(`request ${body.error.requestId}`);
      }
      return body.error;
    },
  };
}
