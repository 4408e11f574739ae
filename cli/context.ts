/**
 * What every `roost` command shares: the global options (`--api`, `--key`, `--site`, `--quiet`), the
 * API client built from them, the output contract and error reporting (docs/architecture.md "Operator surface").
 *
 * Output contract (docs/decisions/cli-output.md): with `--json` a command writes exactly one JSON
 * document to stdout and nothing else (on failure: `{"error": <problem>}`); without it, human text.
 * Progress, retries and warnings always go to stderr. Exit codes (EXIT below): 0 success, 1 failure,
 * 2 usage, 3 conflict or failed precondition, 4 not found, 5 authentication or authorisation.
 * With `--verbose`, stderr carries JSON log lines only (cli/log.ts: a line per API answer with its
 * requestId, the failure with its requestId), never the result.
 * Values of `--api`, `--key` and `--site` come from the flag, the environment, then the config file
 * (cli/config.ts), then the default.
 */
import { type Command, Option } from 'commander';
import { ClientError, type RetryInfo, RoostClient } from './client';
import { ChunkerError } from './chunker';
import { readConfig } from './config';
import { activeCliLogger, cliLogger, cliTrace, setActiveCliLogger } from './log';

export const DEFAULT_API_URL = 'http://127.0.0.1:8080';

/** Process exit codes of every `roost` command (docs/decisions/cli-output.md). */
export const EXIT = { ok: 0, failure: 1, usage: 2, conflict: 3, notFound: 4, auth: 5 } as const;

/** A missing or unusable credential detected by the CLI itself (no key, no session): exit code 5. */
export class AuthError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'AuthError';
  }
}

/** Values of the global options after env fallbacks. */
export interface GlobalOptions {
  api: string;
  key?: string;
  site?: string;
  quiet?: boolean;
  verbose?: boolean;
}

/** A usage problem detected by the CLI itself (missing --site, bad flag value): exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/** Adds the global options to the root program (env ROOST_API_URL, ROOST_API_KEY, ROOST_SITE_ID). */
export function addGlobalOptions(program: Command): Command {
  return program
    .addOption(new Option('--api <url>', `API base URL (default: the config file's, else ${DEFAULT_API_URL})`).env('ROOST_API_URL'))
    .addOption(new Option('--key <key>', 'API key (svk_…)').env('ROOST_API_KEY'))
    .addOption(new Option('--site <siteId>', 'site id').env('ROOST_SITE_ID'))
    .addOption(new Option('-q, --quiet', 'no progress output on stderr'))
    .addOption(
      new Option(
        '--verbose',
        'JSON log lines on stderr instead of progress: one per API answer with its requestId (and traceId when tracing is on)',
      ),
    );
}

/** Adds `--json` to a command (every command has it). */
export function withJson(cmd: Command): Command {
  return cmd.option('--json', 'print one machine-readable JSON document on stdout');
}

let jsonMode = false;

/** True once a command running with `--json` has started (main.ts uses it to shape error output). */
export function isJsonMode(): boolean {
  return jsonMode;
}

/** Per-invocation context handed to a command's action. */
export interface CommandContext {
  globals: GlobalOptions;
  json: boolean;
  /** True when progress may be drawn as a bar (stderr is a TTY, not --quiet). */
  tty: boolean;
  quiet: boolean;
  /** The API client with the API key; throws AuthError when no key is configured. */
  client(): RoostClient;
  /**
   * An API client for the person rather than a key (key lifecycle routes): `idToken` when given (an OIDC
   * ID token), else ROOST_ID_TOKEN, else the session `roost login` stored for this API.
   * @throws AuthError when there is none (or the stored one expired).
   */
  userClient(idToken?: string): RoostClient;
  /** An API client without any credential (session exchange, version). */
  anonymousClient(): RoostClient;
  /** The site id from --site / ROOST_SITE_ID; throws UsageError when missing. */
  siteId(): string;
  /** A line on stderr (suppressed by --quiet). */
  info(line: string): void;
  /** Prints the command's result: the JSON document with --json, else `human()` output. */
  emit(value: unknown, human: () => void): void;
}

/** True when `api` is an absolute http or https URL (what `--api` must be). */
export function isApiUrl(api: string): boolean {
  try {
    const u = new URL(api);
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.host !== '';
  } catch {
    return false;
  }
}

/** Builds the context of a running command from its merged options. */
export function commandContext(cmd: Command): CommandContext {
  const opts = cmd.optsWithGlobals<Partial<GlobalOptions> & { json?: boolean }>();
  const json = opts.json === true;
  jsonMode = json;
  // --verbose: stderr carries JSON lines only (cli/log.ts): progress is off and info lines become log lines.
  const verbose = opts.verbose === true;
  const trace = cliTrace();
  const log = cliLogger({ verbose, trace });
  setActiveCliLogger(verbose ? log : undefined);
  const quiet = opts.quiet === true || verbose;
  const info = (line: string) => {
    if (verbose) log.info(line);
    else if (!quiet) process.stderr.write(`${line}\n`);
  };
  // The config file is read only when a flag or variable left a value open.
  let config: ReturnType<typeof readConfig> | undefined;
  const stored = () => (config ??= readConfig());
  const api = (opts.api ?? stored().api ?? DEFAULT_API_URL).replace(/\/+$/, '');
  const key = opts.key ?? stored().key;
  const site = opts.site ?? stored().site;
  const makeClient = (credential: string | undefined) => {
    if (!isApiUrl(api)) throw new UsageError(`--api ${JSON.stringify(api)} is not an http(s) URL (flag, ROOST_API_URL or the config file)`);
    return new RoostClient({
      baseUrl: api,
      apiKey: credential,
      logger: verbose ? log : undefined,
      traceparent: trace?.traceparent,
      onRetry: (r: RetryInfo) =>
        info(`retrying ${r.method} ${r.url.split('?')[0]} in ${(r.delayMs / 1000).toFixed(1)}s (attempt ${r.attempt} failed: ${r.reason})`),
    });
  };
  let client: RoostClient | undefined;
  return {
    globals: { api, key, site, quiet, verbose },
    json,
    quiet,
    tty: !quiet && process.stderr.isTTY === true,
    client() {
      if (!key) throw new AuthError('no API key: pass --key, set ROOST_API_KEY or run: roost config set key <svk_…>');
      client ??= makeClient(key);
      return client;
    },
    userClient(idToken) {
      const token = idToken ?? process.env.ROOST_ID_TOKEN;
      if (token) return makeClient(token);
      const session = stored().session;
      if (!session || session.api.replace(/\/+$/, '') !== api)
        throw new AuthError(`not signed in to ${api}: run roost login --id-token <token>, or pass --id-token`);
      if (session.expiresAt <= Date.now()) throw new AuthError(`the session of ${session.email} expired: run roost login again`);
      return makeClient(session.token);
    },
    anonymousClient() {
      return makeClient(undefined);
    },
    siteId() {
      if (!site) throw new UsageError('no site: pass --site, set ROOST_SITE_ID or run: roost config set site <site_…>');
      return site;
    },
    info,
    emit(value, human) {
      if (json) process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
      else human();
    },
  };
}

/** Parses a positive integer flag value. @throws UsageError */
export function positiveInt(name: string): (raw: string) => number {
  return (raw) => {
    const n = Number(raw);
    if (!/^[0-9]+$/.test(raw) || !Number.isSafeInteger(n) || n < 1)
      throw new UsageError(`${name} must be a positive integer, got "${raw}"`);
    return n;
  };
}

/** Parses a comma/space separated list whose every item is one of `values`. @throws UsageError naming the unknown ones */
export function listOf<T extends string>(name: string, values: readonly T[]): (raw: string) => T[] {
  return (raw) => {
    const items = idList(raw);
    const unknown = items.filter((i) => !(values as readonly string[]).includes(i));
    if (items.length === 0 || unknown.length > 0)
      throw new UsageError(
        `${name}: ${unknown.length ? `unknown ${unknown.map((u) => `"${u}"`).join(', ')}` : 'empty'}; known: ${values.join(', ')}`,
      );
    return items as T[];
  };
}

/** Parses a date or date-time flag (ISO 8601, as the API reads it). @throws UsageError */
export function isoTime(name: string): (raw: string) => string {
  return (raw) => {
    if (!/^\d{4}-\d{2}-\d{2}([T ].+)?$/.test(raw) || Number.isNaN(Date.parse(raw)))
      throw new UsageError(`${name} must be an ISO 8601 date or time (e.g. 2026-11-29 or 2026-11-29T08:00:00Z); got "${raw}"`);
    return raw;
  };
}

/** Splits a comma/space separated id list, dropping empties. */
export function idList(raw: string): string[] {
  return raw
    .split(/[\s,]+/)
    .map((s) => s.trim())
    .filter(Boolean);
}

/** Human byte count: 1536 → "1.5 KiB". */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
}

/** A plain text table: columns padded to their widest cell. */
export function table(headers: string[], rows: Array<Array<string | number | null | undefined>>): string {
  const cells = [headers, ...rows.map((r) => r.map((c) => (c === null || c === undefined ? '-' : String(c))))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return cells.map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]))).join('  ')).join('\n');
}

/** The error as a JSON-able problem: the API's problem body, or a CLI-side one. */
export function problemOf(err: unknown): Record<string, unknown> {
  if (err instanceof ClientError) {
    return { ...err.body, code: err.code, status: err.status, detail: err.detail, ...(err.requestId ? { requestId: err.requestId } : {}) };
  }
  if (err instanceof UsageError) return { code: 'usage_error', detail: err.message };
  if (err instanceof AuthError) return { code: 'no_credentials', detail: err.message };
  if (err instanceof ChunkerError) return { code: 'invalid_tree', detail: err.message, paths: err.paths.slice(0, 100) };
  const e = err as { code?: unknown; message?: unknown };
  if (typeof e?.code === 'string' && e.code.startsWith('commander.')) return { code: 'usage_error', detail: String(e.message ?? err) };
  return { code: 'cli_error', detail: err instanceof Error ? err.message : String(err) };
}

/**
 * Reports a failure: `error: <code>: <detail>` plus useful extras on stderr (validation errors by path,
 * the required scope, missing chunks, the request id); with --json also `{"error": …}` on stdout.
 * Returns the exit code to use (exitCodeOf).
 */
export function reportError(err: unknown, json: boolean): number {
  const p = problemOf(err);
  // --verbose: the failure is one JSON line (with the failing request's id) and stderr stays JSON only.
  const log = activeCliLogger();
  if (log) {
    log.error({ code: p.code, status: p.status, requestId: p.requestId }, String(p.detail));
    if (json) process.stdout.write(`${JSON.stringify({ error: p }, null, 2)}\n`);
    return exitCodeOf(p);
  }
  const lines = [`error: ${String(p.code)}: ${String(p.detail)}`];
  const errors = p.errors as Record<string, unknown> | undefined;
  if (errors && typeof errors === 'object')
    for (const [k, v] of Object.entries(errors)) lines.push(`  ${k}: ${Array.isArray(v) ? v.join('; ') : String(v)}`);
  const required = p.required as { resource?: string; id?: string; permission?: string } | undefined;
  if (required && typeof required === 'object') lines.push(`  required scope: ${required.resource}=${required.id}:${required.permission}`);
  if (Array.isArray(p.missingChunks))
    lines.push(`  missing chunks: ${(p.missingChunks as string[]).slice(0, 5).join(', ')}${p.missingChunks.length > 5 ? ', …' : ''}`);
  if (typeof p.status === 'number' && p.status > 0)
    lines.push(`  (HTTP ${p.status}${p.requestId ? `, request ${String(p.requestId)}` : ''})`);
  process.stderr.write(`${lines.join('\n')}\n`);
  if (json) process.stdout.write(`${JSON.stringify({ error: p }, null, 2)}\n`);
  return exitCodeOf(p);
}

/**
 * The exit code of a failure (EXIT): usage 2; 409, 412 and 422 (conflict, stale precondition, a reused
 * Idempotency-Key) 3; 404 and 410 4; 401, 403 and a missing credential 5; anything else 1.
 */
export function exitCodeOf(problem: Record<string, unknown>): number {
  if (problem.code === 'usage_error') return EXIT.usage;
  if (problem.code === 'no_credentials') return EXIT.auth;
  switch (problem.status) {
    case 401:
    case 403:
      return EXIT.auth;
    case 404:
    case 410:
      return EXIT.notFound;
    case 409:
    case 412:
    case 422:
      return EXIT.conflict;
    default:
      return EXIT.failure;
  }
}
