/**
 * Small HTTP helper for the reference agent: JSON calls to the Roost API with the agent token, problem+json
 * errors surfaced as `HttpError`, and raw GETs of signed blob URLs. Uses undici's `request` (the client
 * under Node's fetch, without fetch's WHATWG streams and per-request objects) through the global
 * dispatcher or the one given, which keeps connections alive and reuses them across requests to the same
 * origin. Redirects are not followed: neither the API nor blob storage sends them.
 */

import { AsyncLocalStorage } from 'node:async_hooks';
import { type Dispatcher, request } from 'undici';

/**
 * Requests this process made so far: `api` to the Roost API (ApiClient), `blob` GETs of signed URLs
 * (fetchBytes). Of `api`: `command` the ones made while working on a command (withCommandContext: reports,
 * version answers, download URLs), `delivering` the long-polls answered with at least one command
 * (agent/transport.ts pollCommands); the rest is liveness (heartbeats, empty polls, config reads). The fleet
 * simulator (agent/fleet.ts) reports them as requests per synced machine.
 */
export const requestCounters = { api: 0, blob: 0, command: 0, delivering: 0 };

/** A W3C `traceparent` value: version, 32-hex trace id, 16-hex parent id, flags. */
const TRACEPARENT_RE = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** What the API sent with the command being worked on: its trace context and the request it was queued for. */
interface CommandContext {
  traceparent?: string;
  requestId?: string;
}

const commandContext = new AsyncLocalStorage<CommandContext>();

/**
 * Runs `fn` as the work of `cmd`: its `traceparent` (W3C trace context; ignored unless well formed) is sent
 * as the `traceparent` header on every API request `fn` makes, so the server joins them to the trace the
 * command was queued in (docs/observability.md "Traces"), and commandLogFields() returns its request id
 * and trace id for the log lines `fn` writes.
 */
export function withCommandContext<T>(cmd: { traceparent?: string; requestId?: string }, fn: () => T): T {
  const ctx: CommandContext = {};
  if (cmd.traceparent && TRACEPARENT_RE.test(cmd.traceparent)) ctx.traceparent = cmd.traceparent;
  if (typeof cmd.requestId === 'string' && cmd.requestId.length > 0 && cmd.requestId.length <= 200) ctx.requestId = cmd.requestId;
  return commandContext.run(ctx, fn);
}

/**
 * Runs `fn` outside any command's context: what it starts (a restarted agent's poll and heartbeat loops
 * after a reboot_machine) sends no command's `traceparent` and logs no command's ids.
 */
export function outsideCommandContext<T>(fn: () => T): T {
  return commandContext.exit(fn);
}

/**
 * Log fields of the command being worked on (agent/service.ts): `requestId` (the API request it was queued
 * for) and `traceId` (of its `traceparent`), each only when the API sent it.
 */
export function commandLogFields(): { requestId?: string; traceId?: string } {
  const ctx = commandContext.getStore();
  if (!ctx) return {};
  return {
    ...(ctx.requestId ? { requestId: ctx.requestId } : {}),
    ...(ctx.traceparent ? { traceId: ctx.traceparent.slice(3, 35) } : {}),
  };
}

/** The first value of response header `name` (lowercase) of an undici answer. */
function headerOf(headers: Record<string, string | string[] | undefined>, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** A non-2xx answer. `problem` is the parsed problem+json body when there was one. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string | undefined,
    message: string,
    readonly problem?: Record<string, unknown>,
    /** The answer's Retry-After in ms (delta-seconds or an HTTP date), when it had a usable one. */
    readonly retryAfterMs?: number,
    /** The answer's `X-Request-Id` (the API's id of this request), when it had one. */
    readonly requestId?: string,
  ) {
    super(message);
    this.name = 'HttpError';
  }
}

/**
 * Retry-After as ms: delta-seconds or an HTTP date (RFC 9110 §10.2.3); undefined when absent or unusable.
 * A 503 `service_unavailable` (a dependency of the API is down) and a 429 carry one.
 */
export function parseRetryAfter(header: string | null | undefined, now: number = Date.now()): number | undefined {
  if (!header) return undefined;
  const t = header.trim();
  if (/^\d+$/.test(t)) return Number(t) * 1000;
  const at = Date.parse(t);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/**
 * True for failures worth retrying later: network errors, 408, 409 idempotency_key_in_use, 429, 5xx (503
 * `service_unavailable` is what the API answers while its database, blob storage or Temporal is down).
 */
export function isTransient(err: unknown): boolean {
  if (err instanceof HttpError)
    return err.status === 408 || err.status === 429 || err.status >= 500 || err.code === 'idempotency_key_in_use';
  return !(err instanceof Error && err.name === 'AbortError');
}

export interface RequestOptions {
  body?: unknown;
  /** Raw body (e.g. a PNG); sent with `contentType`. */
  raw?: Buffer;
  contentType?: string;
  signal?: AbortSignal;
  query?: Record<string, string | number | undefined>;
  /** Connection pool of this request (an undici Dispatcher, e.g. the long-poll's); default: the client's. */
  dispatcher?: Dispatcher;
  /** A long-poll: it waits on purpose, so its duration is no round trip (ApiClient `lastRoundTripMs`). */
  longPoll?: boolean;
}

/** A JSON client of the Roost API for one credential. */
export class ApiClient {
  token: string | undefined;
  /**
   * Duration (ms) of the last request answered, long-polls left out: how loaded the API looked to this
   * client lately (agent/sync.ts starts a sync's report gap from it); 0 before the first answer.
   */
  lastRoundTripMs = 0;

  /**
   * @param dispatcher connection pool of every request (an undici Dispatcher, e.g. an Agent with bounded
   *        keep-alive connections); default: Node's global one
   */
  constructor(
    readonly baseUrl: string,
    token?: string,
    readonly dispatcher?: Dispatcher,
  ) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.token = token;
  }

  /**
   * Calls `method path` and returns the parsed JSON body.
   * @throws HttpError on non-2xx (with the problem's `code`), the fetch error on network failure.
   */
  async json<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    let url = `${this.baseUrl}${path}`;
    if (opts.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(opts.query)) if (v !== undefined) q.set(k, String(v));
      const s = q.toString();
      if (s) url += `?${s}`;
    }
    const headers: Record<string, string> = { accept: 'application/json' };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const traceparent = commandContext.getStore()?.traceparent;
    if (traceparent) headers.traceparent = traceparent;
    let body: string | Buffer | undefined;
    if (opts.raw) {
      body = opts.raw;
      headers['content-type'] = opts.contentType ?? 'application/octet-stream';
    } else if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers['content-type'] = 'application/json';
    }
    // undici's request, not fetch: a fleet process of 2,500 simulated agents spent a third of its CPU in
    // fetch's WHATWG streams and per-request objects (docs/benchmarks.md "On a quiet machine").
    const started = Date.now();
    const { res, text } = await withRequestSignal(opts.signal, async (signal) => {
      requestCounters.api++;
      if (commandContext.getStore()) requestCounters.command++;
      const dispatcher = opts.dispatcher ?? this.dispatcher;
      const r = await request(url, {
        method: method as Dispatcher.HttpMethod,
        headers,
        body,
        signal,
        ...(dispatcher ? { dispatcher } : {}),
      });
      return { res: r, text: await r.body.text() };
    });
    if (!opts.longPoll) this.lastRoundTripMs = Date.now() - started;
    let parsed: unknown = undefined;
    if (text.length > 0) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
    }
    if (res.statusCode < 200 || res.statusCode > 299) {
      const problem = parsed !== null && typeof parsed === 'object' ? (parsed as Record<string, unknown>) : undefined;
      const code = typeof problem?.code === 'string' ? problem.code : undefined;
      const detail = typeof problem?.detail === 'string' ? problem.detail : text.slice(0, 200);
      throw new HttpError(
        res.statusCode,
        code,
        `${method} ${path} → ${res.statusCode}${code ? ` ${code}` : ''}: ${detail}`,
        problem,
        parseRetryAfter(headerOf(res.headers, 'retry-after')),
        headerOf(res.headers, 'x-request-id') ?? (typeof problem?.requestId === 'string' ? problem.requestId : undefined),
      );
    }
    return parsed as T;
  }
}

/**
 * GETs a signed blob URL and returns its bytes.
 * @throws HttpError with the blob service's status (403 when the SAS expired, 404 when absent).
 */
export async function fetchBytes(url: string, signal?: AbortSignal): Promise<Buffer> {
  return withRequestSignal(signal, async (s) => {
    requestCounters.blob++;
    const res = await request(url, { signal: s });
    if (res.statusCode < 200 || res.statusCode > 299) {
      await res.body.dump().catch(() => undefined);
      throw new HttpError(res.statusCode, undefined, `GET blob → ${res.statusCode}`);
    }
    return Buffer.from(await res.body.arrayBuffer());
  });
}

/**
 * Runs one request under its own AbortSignal that follows `signal`. fetch leaves its abort listener on
 * the signal it is given until the request is garbage-collected, so thousands of requests on one agent's
 * long-lived signal piled up listeners (MaxListenersExceededWarning); the per-request signal takes them
 * instead, and the one listener added here is removed when the request ends.
 */
export async function withRequestSignal<T>(signal: AbortSignal | undefined, fn: (s: AbortSignal | undefined) => Promise<T>): Promise<T> {
  if (!signal) return fn(undefined);
  const ac = new AbortController();
  const forward = () => ac.abort(signal.reason);
  if (signal.aborted) forward();
  else signal.addEventListener('abort', forward, { once: true });
  try {
    return await fn(ac.signal);
  } finally {
    signal.removeEventListener('abort', forward);
  }
}

/** Sleeps `ms`, resolving early (without error) when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}
