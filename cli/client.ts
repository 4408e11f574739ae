/**
 * HTTP client of the `roost` CLI (docs/contract.md Conventions, Errors, Authentication).
 *
 * - JSON in and out, `Authorization: Bearer <key>`, base URL from `--api`; JSON calls and blob PUTs go
 *   through undici's `request` (cheaper than `fetch`: `send` below), streamed answers through `fetch`.
 * - Any non-2xx answer becomes a ClientError carrying the problem's `code`, `status`, `detail` and the
 *   whole problem body; network failures and timeouts become ClientError code `network_error`
 *   (status 0) once retries are spent.
 * - Retries (docs/contract.md Errors, "Retry with backoff"): 429 always, honouring Retry-After; 500, 502, 503,
 *   504, network failures and timeouts only for GET/HEAD, for read-only POSTs marked `retrySafe`, and
 *   for mutations that carry an Idempotency-Key. 503 honours Retry-After too. Fallback delay
 *   min(60000, 500 * 2^attempt) ms times a random factor in 0.5..1.0; at most 6 attempts, except that an
 *   outage (503, or no answer once the API has answered this client) is retried for up to 5 minutes from
 *   the first attempt (DEFAULT_OUTAGE_WINDOW_MS). Nothing else is retried (400, 401, 403, 404, 409,
 *   412, 422, 402 surface at once). docs/decisions/cli-http-retries.md says why no retry library.
 * - `idempotencyKey: true` generates one key per logical call; every retry of that call reuses it
 *   with the identical method, path, query and body bytes.
 */
import { randomUUID } from 'node:crypto';
import { STATUS_CODES } from 'node:http';
import { request as undiciRequest } from 'undici';
import type { Logger } from 'pino';
import { CLI_VERSION } from './version';

/** HTTP statuses retried with backoff (429 also, with Retry-After). */
export const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([429, 500, 502, 503, 504]);
/** Attempts per logical request, first try included (docs/contract.md: at most 6 for interactive requests). */
export const DEFAULT_MAX_ATTEMPTS = 6;
/** Per-attempt timeout in ms before the attempt counts as a network failure. */
export const DEFAULT_TIMEOUT_MS = 60_000;
/** Shortest time one blob PUT attempt may take (ms), whatever `timeoutMs` says: a 4 MiB chunk over a slow link takes minutes. */
export const PUT_TIMEOUT_MIN_MS = 5 * 60_000;
/** Longest Retry-After the client is willing to sleep through (ms); longer waits surface the 429. */
export const MAX_RETRY_AFTER_MS = 10 * 60_000;
/**
 * Storage error code of a PUT through a create-only chunk upload URL to a blob that exists (Azure Storage
 * and Azurite): the chunk is stored and its bytes cannot be overwritten.
 */
export const BLOB_EXISTS_CODE = 'AuthorizationPermissionMismatch';
/**
 * How long a replayable call keeps retrying through an outage (ms, from its first attempt): while the answer
 * is 503 (the API's database, blob storage or Temporal is down; it says when to come back in Retry-After) or
 * no answer comes at all, attempts go on past `maxAttempts` for this long (docs/decisions/outages.md).
 */
export const DEFAULT_OUTAGE_WINDOW_MS = 5 * 60_000;

/** A failed request: the problem+json body of the API (or a synthesized one for network failures). */
export class ClientError extends Error {
  /** Stable problem code (`validation_failed`, `rate_limited`, …; `network_error` when no answer came). */
  readonly code: string;
  /** HTTP status (0 when no answer came). */
  readonly status: number;
  readonly detail: string;
  /** The parsed problem body (or `{}`), for extras such as `errors`, `missingChunks`, `required`. */
  readonly body: Record<string, unknown>;
  readonly requestId?: string;
  readonly method: string;
  readonly url: string;
  /** How many attempts were made. */
  readonly attempts: number;

  constructor(init: {
    code: string;
    status: number;
    detail: string;
    body?: Record<string, unknown>;
    requestId?: string;
    method: string;
    url: string;
    attempts: number;
    cause?: unknown;
  }) {
    super(`${init.code}: ${init.detail}`, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = 'ClientError';
    this.code = init.code;
    this.status = init.status;
    this.detail = init.detail;
    this.body = init.body ?? {};
    this.requestId = init.requestId;
    this.method = init.method;
    this.url = init.url;
    this.attempts = init.attempts;
  }
}

/** Told before each retry sleep (for progress output). `attempt` is the 1-based attempt that failed. */
export interface RetryInfo {
  method: string;
  url: string;
  attempt: number;
  delayMs: number;
  reason: string;
}

export interface ClientOptions {
  /** API base URL, e.g. http://127.0.0.1:8080 (a trailing slash is ignored). */
  baseUrl: string;
  /** Raw API key (`svk_…`) or agent token; omitted for unauthenticated calls. */
  apiKey?: string;
  maxAttempts?: number;
  /** How long outage answers (503, no answer) keep being retried past `maxAttempts` (ms; default DEFAULT_OUTAGE_WINDOW_MS). */
  outageWindowMs?: number;
  timeoutMs?: number;
  onRetry?: (info: RetryInfo) => void;
  /** Sleep used between attempts (default: a real timer). */
  sleep?: (ms: number) => Promise<void>;
  /** Source of the jitter factor in [0, 1) (default Math.random). */
  random?: () => number;
  /** `--verbose` log (cli/log.ts): a line per API answer with its requestId, per failed attempt, per blob upload. */
  logger?: Logger;
  /** W3C trace context sent as `traceparent` on every API request (cli/log.ts cliTrace). */
  traceparent?: string;
}

export type QueryValue = string | number | boolean | undefined | null | Array<string | number>;

export interface RequestOptions {
  /** Query parameters; arrays become repeated keys; undefined/null are left out. */
  query?: Record<string, QueryValue>;
  /** JSON body (serialised once; every attempt sends the same bytes). */
  body?: unknown;
  /** An explicit Idempotency-Key, or true to generate one for this logical call. */
  idempotencyKey?: string | true;
  /** A POST that changes nothing (chunk check, upload-urls): retried like a GET. */
  retrySafe?: boolean;
  headers?: Record<string, string>;
  /** Per-attempt timeout in ms for this call (default: the client's). Publishing a large version takes minutes. */
  timeoutMs?: number;
}

export interface ApiResponse<T> {
  status: number;
  body: T;
  headers: Headers;
  /** True when the server answered from its idempotency cache (`Idempotent-Replayed: true`). */
  replayed: boolean;
  requestId?: string;
  /** The Idempotency-Key sent, if any. */
  idempotencyKey?: string;
  attempts: number;
}

/** A fresh Idempotency-Key for one logical mutation. */
export function newIdempotencyKey(): string {
  return `roost-cli-${randomUUID()}`;
}

/** Fallback backoff (ms) after the failed attempt number `attempt` (0-based): min(60000, 500·2^attempt)·[0.5, 1.0). */
export function backoffDelayMs(attempt: number, random: () => number = Math.random): number {
  return Math.min(60_000, 500 * 2 ** attempt) * (0.5 + 0.5 * random());
}

/**
 * Retry-After as ms: delta-seconds or an HTTP-date (RFC 9110 §10.2.3). Falls back to a body's
 * `retryAfter` (seconds). Undefined when neither is usable.
 */
export function retryAfterMs(header: string | null | undefined, body?: unknown, now: number = Date.now()): number | undefined {
  if (header) {
    const h = header.trim();
    if (/^\d+(\.\d+)?$/.test(h)) return Math.round(Number(h) * 1000);
    const date = Date.parse(h);
    if (!Number.isNaN(date)) return Math.max(0, date - now);
  }
  const b = body as { retryAfter?: unknown } | undefined;
  if (b && typeof b.retryAfter === 'number' && b.retryAfter >= 0) return Math.round(b.retryAfter * 1000);
  return undefined;
}

/**
 * Whether a failed attempt may be retried (docs/contract.md Errors). `status` undefined means no HTTP answer
 * (network failure or timeout). `replayable`: GET/HEAD, retrySafe, or a mutation with an Idempotency-Key.
 */
export function isRetryable(status: number | undefined, replayable: boolean, code?: string): boolean {
  if (status === 429) return true;
  // A 503 with its own code is a state of what was asked about, not an outage (`cortex_unavailable`: the
  // machine is offline or no assistant model is configured): it does not pass by waiting a few seconds.
  if (status === 503 && code !== undefined && code !== 'service_unavailable') return false;
  // The first attempt of this keyed request is still running on the server: wait for its replay.
  if (status === 409 && code === 'idempotency_key_in_use') return replayable;
  if (status === undefined) return replayable;
  return replayable && RETRYABLE_STATUSES.has(status);
}

const defaultSleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function buildQuery(query: Record<string, QueryValue> | undefined): string {
  if (!query) return '';
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v === undefined || v === null) continue;
    if (Array.isArray(v)) for (const item of v) params.append(k, String(item));
    else params.append(k, String(v));
  }
  const s = params.toString();
  return s ? `?${s}` : '';
}

/** Encodes one path segment (a `#3` version ref becomes `%233`, docs/contract.md "Version id and version refs"). */
export function seg(value: string): string {
  return encodeURIComponent(value);
}

function describeNetworkError(err: unknown): string {
  const e = err as { name?: string; message?: string; code?: string; cause?: { code?: string; message?: string } };
  if (e?.name === 'TimeoutError') return 'request timed out';
  // fetch wraps the socket's error as `cause`; undici's `request` throws it, with its own `code`.
  const cause = e?.cause?.code ?? e?.cause?.message ?? e?.code;
  if (!cause || e?.message?.includes(cause)) return e?.message ?? String(err);
  return `${e?.message ?? 'fetch failed'} (${cause})`;
}

/** One HTTP answer (the API's or blob storage's), read whole: status, headers and the body's text. */
interface Answer {
  status: number;
  ok: boolean;
  statusText: string;
  headers: Headers;
  text: string;
}

/**
 * Sends one request with undici's `request` and reads the whole answer: the JSON API calls and the blob
 * PUTs. A 1,000-hash chunks/check costs ~0.9 ms of round trip on loopback against ~1.7 ms through `fetch`,
 * and a 60 KB PUT ~0.14 ms of CPU against ~0.5 ms (docs/benchmarks.md "chunks/check: where the API's added
 * time goes"): the client needs none of fetch's WHATWG streams and Response objects. No redirects are
 * followed and no content coding is asked for (neither the API nor blob storage sends them). A failure
 * while the body is read rejects like a failure to connect (the caller's retry policy decides).
 */
async function send(
  method: string,
  url: string,
  headers: Record<string, string>,
  payload: string | Buffer | undefined,
  signal: AbortSignal,
): Promise<Answer> {
  const res = await undiciRequest(url, { method: method as 'GET', headers, body: payload, signal });
  const text = await res.body.text();
  const h = new Headers();
  for (const [name, value] of Object.entries(res.headers)) {
    if (Array.isArray(value)) for (const v of value) h.append(name, v);
    else if (value !== undefined) h.set(name, value);
  }
  return {
    status: res.statusCode,
    ok: res.statusCode >= 200 && res.statusCode < 300,
    statusText: STATUS_CODES[res.statusCode] ?? '',
    headers: h,
    text,
  };
}

/** Headers of a chunk PUT to a signed blob URL (`bytes` long): a block blob of octets. */
export function blockBlobHeaders(bytes: number): Record<string, string> {
  return { 'x-ms-blob-type': 'BlockBlob', 'content-type': 'application/octet-stream', 'content-length': String(bytes) };
}

/** Parses a JSON API answer's text: JSON when the content type says so, else the text (or undefined when empty). */
function parseBody(text: string, contentType: string | null): unknown {
  if (!text) return undefined;
  if ((contentType ?? '').includes('json')) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return text;
}

/** `parseBody` over a streamed `fetch` Response (cli/client.ts `openStream`'s failures). */
async function readBody(res: Response): Promise<unknown> {
  return parseBody(await res.text(), res.headers.get('content-type'));
}

/** The Roost HTTP API as the CLI sees it. Stateless apart from its options; safe to share. */
export class RoostClient {
  readonly baseUrl: string;
  private readonly apiKey?: string;
  private readonly maxAttempts: number;
  private readonly outageWindowMs: number;
  /**
   * Whether the API has answered this client at least once. Until it has, "no answer" is an API that is not
   * there (a wrong --api, a stack not started), which gets the 6 attempts of an interactive request, not the
   * outage window: the window is for an outage that starts while a command works (docs/decisions/outages.md).
   */
  private reached = false;
  /**
   * Whether blob storage has answered a PUT of this client at least once: from then on a PUT that gets no
   * answer, or 503, rides out the outage window as API calls do (a storage restart mid-push), while storage
   * never reached (a wrong endpoint in the upload URLs) fails after the 6 attempts.
   */
  private storageReached = false;
  private readonly timeoutMs: number;
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly random: () => number;
  private readonly onRetry?: (info: RetryInfo) => void;
  private readonly log?: Logger;
  private readonly traceparent?: string;

  constructor(opts: ClientOptions) {
    this.log = opts.logger;
    this.traceparent = opts.traceparent;
    this.baseUrl = opts.baseUrl.replace(/\/+$/, '');
    this.apiKey = opts.apiKey;
    this.maxAttempts = Math.max(1, opts.maxAttempts ?? DEFAULT_MAX_ATTEMPTS);
    this.outageWindowMs = opts.outageWindowMs ?? DEFAULT_OUTAGE_WINDOW_MS;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.sleep = opts.sleep ?? defaultSleep;
    this.random = opts.random ?? Math.random;
    this.onRetry = opts.onRetry;
  }

  /**
   * The URL, headers and JSON payload every call shares: `accept` as given, the CLI's user agent, the
   * caller's extra headers, the bearer key, the Idempotency-Key (`true` draws a fresh one) and the body.
   */
  private prepare(
    path: string,
    opts: Pick<RequestOptions, 'query' | 'idempotencyKey' | 'headers' | 'body'>,
    accept: string,
  ): { url: string; idempotencyKey?: string; headers: Record<string, string>; payload?: string } {
    const url = `${this.baseUrl}${path}${buildQuery(opts.query)}`;
    const idempotencyKey = opts.idempotencyKey === true ? newIdempotencyKey() : opts.idempotencyKey;
    const headers: Record<string, string> = {
      accept,
      'user-agent': `roost-cli/${CLI_VERSION}`,
      ...(this.traceparent ? { traceparent: this.traceparent } : {}),
      ...opts.headers,
    };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    if (idempotencyKey) headers['idempotency-key'] = idempotencyKey;
    let payload: string | undefined;
    if (opts.body !== undefined) {
      payload = JSON.stringify(opts.body);
      headers['content-type'] = 'application/json';
    }
    return { url, idempotencyKey, headers, payload };
  }

  /**
   * One logical API call with the retry policy above. Resolves with the 2xx response.
   * @throws ClientError for any non-2xx answer (after retries where allowed) and for network failures.
   */
  async request<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<ApiResponse<T>> {
    const m = method.toUpperCase();
    const { url, idempotencyKey, headers, payload } = this.prepare(path, opts, 'application/json, application/problem+json');
    const replayable = m === 'GET' || m === 'HEAD' || opts.retrySafe === true || idempotencyKey !== undefined;

    const started = Date.now();
    /** Sum of the retry pauses so far (ms): the outage window counts them even where the clock does not move (tests). */
    let waited = 0;
    for (let attempt = 0; ; attempt++) {
      const spent = attempt + 1 >= this.maxAttempts;
      /** Out of attempts, unless this failure is an outage and the outage window (ms) has room for `delayMs` more. */
      const lastFor = (outage: boolean, delayMs: number) =>
        spent && !(outage && this.reached && Math.max(Date.now() - started, waited) + delayMs <= this.outageWindowMs);
      let res: Answer;
      const sent = Date.now();
      try {
        res = await send(m, url, headers, payload, AbortSignal.timeout(opts.timeoutMs ?? this.timeoutMs));
      } catch (err) {
        const reason = describeNetworkError(err);
        this.log?.warn({ method: m, path, attempt: attempt + 1, durationMs: Date.now() - sent, err: reason }, 'api request failed');
        const delay = backoffDelayMs(attempt, this.random);
        if (!lastFor(true, delay) && isRetryable(undefined, replayable)) {
          waited += delay;
          await this.pause(m, url, attempt, delay, reason);
          continue;
        }
        throw new ClientError({
          code: 'network_error',
          status: 0,
          detail: `${m} ${url}: ${reason}`,
          method: m,
          url,
          attempts: attempt + 1,
          cause: err,
        });
      }
      this.reached = true;
      const body = parseBody(res.text, res.headers.get('content-type'));
      const requestId = res.headers.get('x-request-id') ?? undefined;
      const code = (body as { code?: unknown } | undefined)?.code;
      this.log?.[res.ok ? 'info' : 'warn'](
        {
          method: m,
          path,
          status: res.status,
          attempt: attempt + 1,
          durationMs: Date.now() - sent,
          requestId,
          ...(idempotencyKey ? { idempotencyKey } : {}),
          ...(res.headers.get('idempotent-replayed') === 'true' ? { replayed: true } : {}),
          ...(!res.ok && typeof code === 'string' ? { code } : {}),
        },
        'api request',
      );
      if (res.ok) {
        return {
          status: res.status,
          body: body as T,
          headers: res.headers,
          replayed: res.headers.get('idempotent-replayed') === 'true',
          requestId,
          idempotencyKey,
          attempts: attempt + 1,
        };
      }
      const problem = body && typeof body === 'object' && !Array.isArray(body) ? (body as Record<string, unknown>) : {};
      const after =
        res.status === 429 || res.status === 409 || res.status === 503 ? retryAfterMs(res.headers.get('retry-after'), problem) : undefined;
      const delay = after ?? backoffDelayMs(attempt, this.random);
      if (
        !lastFor(res.status === 503, delay) &&
        isRetryable(res.status, replayable, typeof problem.code === 'string' ? problem.code : undefined)
      ) {
        if (after === undefined || after <= MAX_RETRY_AFTER_MS) {
          waited += delay;
          await this.pause(m, url, attempt, delay, `HTTP ${res.status}${typeof problem.code === 'string' ? ` ${problem.code}` : ''}`);
          continue;
        }
      }
      throw new ClientError({
        code: typeof problem.code === 'string' ? problem.code : `http_${res.status}`,
        status: res.status,
        detail:
          typeof problem.detail === 'string'
            ? problem.detail
            : typeof body === 'string' && body
              ? body.slice(0, 500)
              : res.statusText || `HTTP ${res.status}`,
        body: problem,
        requestId: requestId ?? (typeof problem.requestId === 'string' ? problem.requestId : undefined),
        method: m,
        url,
        attempts: attempt + 1,
      });
    }
  }

  private async pause(method: string, url: string, attempt: number, delayMs: number, reason: string, signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    this.onRetry?.({ method, url, attempt: attempt + 1, delayMs, reason });
    if (!signal) return this.sleep(delayMs);
    // An abort ends the wait at once (the caller gave up on the whole operation).
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      this.sleep(delayMs).then(
        () => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        },
        (err: unknown) => {
          signal.removeEventListener('abort', onAbort);
          reject(err instanceof Error ? err : new Error(String(err)));
        },
      );
    });
  }

  /**
   * One request whose 2xx answer is read as a stream (the conversation reply of
   * `POST /api/cortex/conversations/{conversationId}`): a single attempt, never retried, because the API
   * never replays a stream (a second send with the same Idempotency-Key is 422). The caller reads
   * `response.body`. `signal` aborts the request and the body.
   * @throws ClientError for a non-2xx answer (its problem) or when no answer came (`network_error`)
   */
  async openStream(
    method: string,
    path: string,
    opts: Omit<RequestOptions, 'retrySafe' | 'timeoutMs'> & { signal?: AbortSignal } = {},
  ): Promise<{ response: Response; requestId?: string; idempotencyKey?: string }> {
    const m = method.toUpperCase();
    const { url, idempotencyKey, headers, payload } = this.prepare(path, opts, 'text/plain, application/problem+json');
    let res: Response;
    try {
      res = await fetch(url, { method: m, headers, body: payload, signal: opts.signal });
    } catch (err) {
      throw new ClientError({
        code: 'network_error',
        status: 0,
        detail: `${m} ${url}: ${describeNetworkError(err)}`,
        method: m,
        url,
        attempts: 1,
        cause: err,
      });
    }
    this.reached = true;
    const requestId = res.headers.get('x-request-id') ?? undefined;
    this.log?.[res.ok ? 'info' : 'warn']({ method: m, path, status: res.status, requestId, stream: true }, 'api request');
    if (res.ok) return { response: res, requestId, idempotencyKey };
    const body = await readBody(res);
    const problem = body && typeof body === 'object' && !Array.isArray(body) ? (body as Record<string, unknown>) : {};
    throw new ClientError({
      code: typeof problem.code === 'string' ? problem.code : `http_${res.status}`,
      status: res.status,
      detail: typeof problem.detail === 'string' ? problem.detail : res.statusText || `HTTP ${res.status}`,
      body: problem,
      requestId: requestId ?? (typeof problem.requestId === 'string' ? problem.requestId : undefined),
      method: m,
      url,
      attempts: 1,
    });
  }

  /** GET returning the body. */
  async get<T = unknown>(path: string, query?: Record<string, QueryValue>): Promise<T> {
    return (await this.request<T>('GET', path, { query })).body;
  }

  /** POST returning the body. */
  async post<T = unknown>(path: string, body: unknown, opts: Omit<RequestOptions, 'body'> = {}): Promise<T> {
    return (await this.request<T>('POST', path, { ...opts, body })).body;
  }

  /** PATCH returning the body. */
  async patch<T = unknown>(path: string, body: unknown, opts: Omit<RequestOptions, 'body'> = {}): Promise<T> {
    return (await this.request<T>('PATCH', path, { ...opts, body })).body;
  }

  /** DELETE returning the body. */
  async delete<T = unknown>(path: string, opts: RequestOptions = {}): Promise<T> {
    return (await this.request<T>('DELETE', path, opts)).body;
  }

  /**
   * PUTs bytes to a signed blob URL (no API credential is sent; the URL carries its own SAS) as a
   * BlockBlob with `Content-Type: application/octet-stream`. Chunk upload URLs are create-only: storage
   * refuses a PUT to a blob that exists with 403 `AuthorizationPermissionMismatch`, which this answers as
   * `'exists'` (the chunk is stored already, say by an earlier attempt of this very PUT whose answer was
   * lost); a created blob answers `'created'`. So 429/5xx/network failures are always retried: 6 attempts,
   * and, once storage has answered this client, past them for the outage window on no answer or 503
   * (docs/decisions/outages.md).
   * `signal` abandons the upload (in flight or between retries): the promise then rejects with the
   * signal's reason.
   * @throws ClientError code `upload_forbidden` (other 403s, e.g. an expired URL), `upload_failed` (other
   *   statuses) or `network_error`; the abort reason when `signal` aborts.
   */
  async putBlob(url: string, bytes: Buffer, opts: { signal?: AbortSignal } = {}): Promise<'created' | 'exists'> {
    const display = url.split('?')[0];
    const { signal } = opts;
    const started = Date.now();
    /** Sum of the retry pauses so far (ms), as in `request`. */
    let waited = 0;
    for (let attempt = 0; ; attempt++) {
      signal?.throwIfAborted();
      const spent = attempt + 1 >= this.maxAttempts;
      /** Out of attempts, unless this failure is an outage and the outage window (ms) has room for `delayMs` more. */
      const lastFor = (outage: boolean, delayMs: number) =>
        spent && !(outage && this.storageReached && Math.max(Date.now() - started, waited) + delayMs <= this.outageWindowMs);
      let res: Answer;
      // One controller per attempt, ended by its own timer or by the caller's signal: a cold push sends
      // thousands of PUTs, and AbortSignal.any over AbortSignal.timeout cost about twice as much CPU a PUT.
      const attemptAbort = new AbortController();
      const timer = setTimeout(
        () => attemptAbort.abort(new DOMException('the PUT timed out', 'TimeoutError')),
        Math.max(this.timeoutMs, PUT_TIMEOUT_MIN_MS),
      );
      const onAbort = () => attemptAbort.abort(signal?.reason);
      signal?.addEventListener('abort', onAbort, { once: true });
      try {
        res = await send('PUT', url, blockBlobHeaders(bytes.length), bytes, attemptAbort.signal);
      } catch (err) {
        signal?.throwIfAborted();
        const reason = describeNetworkError(err);
        const delay = backoffDelayMs(attempt, this.random);
        if (!lastFor(true, delay)) {
          waited += delay;
          await this.pause('PUT', display, attempt, delay, reason, signal);
          continue;
        }
        throw new ClientError({
          code: 'network_error',
          status: 0,
          detail: `PUT ${display}: ${reason}`,
          method: 'PUT',
          url: display,
          attempts: attempt + 1,
          cause: err,
        });
      } finally {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      }
      this.log?.debug(
        { method: 'PUT', blob: display.replace(/^https?:\/\/[^/]+/, ''), status: res.status, attempt: attempt + 1 },
        'blob upload',
      );
      this.storageReached = true;
      if (res.ok) return 'created';
      const after = res.status === 429 || res.status === 503 ? retryAfterMs(res.headers.get('retry-after')) : undefined;
      const delay = Math.min(after ?? backoffDelayMs(attempt, this.random), MAX_RETRY_AFTER_MS);
      if (!lastFor(res.status === 503, delay) && isRetryable(res.status, true)) {
        waited += delay;
        await this.pause('PUT', display, attempt, delay, `HTTP ${res.status}`, signal);
        continue;
      }
      const storageCode = /<Code>([^<]+)<\/Code>/.exec(res.text)?.[1] ?? res.headers.get('x-ms-error-code') ?? undefined;
      if (res.status === 403 && storageCode === BLOB_EXISTS_CODE) return 'exists';
      throw new ClientError({
        code: res.status === 403 ? 'upload_forbidden' : 'upload_failed',
        status: res.status,
        detail: `PUT ${display}: HTTP ${res.status}${storageCode ? ` ${storageCode}` : ''}`,
        body: storageCode ? { storageCode } : {},
        method: 'PUT',
        url: display,
        attempts: attempt + 1,
      });
    }
  }
}
