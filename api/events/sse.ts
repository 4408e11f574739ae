/**
 * One server-sent-events connection (docs/contract.md "Event stream"; docs/decisions/event-stream.md): frames
 * `event: <kind>`, `data: <json>` and optionally `id: <seq>`, a `keepalive` frame every `keepaliveMs`,
 * and a bounded send buffer: the hub stops writing to a client whose unsent bytes exceed
 * `maxBufferedBytes` (it falls behind and catches up from the database once its socket drains), and a
 * client that stays over the bound for `stallMs` is dropped (its socket destroyed); it resumes with
 * `Last-Event-ID`, so nothing is lost and a slow reader never holds up the others.
 */
import type { ServerResponse } from 'node:http';

/** Reconnection delay the stream advises to clients (SSE `retry:` field), milliseconds. */
export const SSE_RETRY_MS = 2000;

/** Formats one SSE block. `data` is JSON (never contains a raw newline); `id` is a decimal seq. */
export function sseFrame(kind: string, data: unknown, id?: number): string {
  return `${id === undefined ? '' : `id: ${id}\n`}event: ${kind}\ndata: ${JSON.stringify(data)}\n\n`;
}

export interface SseConnectionOptions {
  siteId: string;
  /** Exact-match event filter; null delivers every event. */
  types: ReadonlySet<string> | null;
  /** The last seq this client has (events with a greater seq are still due). */
  cursor: number;
  keepaliveMs: number;
  maxBufferedBytes: number;
  /** Milliseconds a client may stay over `maxBufferedBytes` before it is dropped. */
  stallMs: number;
  /** Called once when the connection ends for any reason (client left, dropped, server closing). */
  onClose: (conn: SseConnection) => void;
  /** Called when the socket drained after being over its buffer (the hub then catches the client up). */
  onDrain: (conn: SseConnection) => void;
  /**
   * Re-checks the client's credential and access at every keepalive; false (revoked or expired key,
   * lost membership) ends the stream.
   */
  recheck?: () => Promise<boolean>;
  /**
   * The API key the stream was opened with, if any: the hub checks it before every delivery and ends the
   * stream once it no longer authenticates (api/events/hub.ts), without waiting for the keepalive.
   */
  keyId?: string;
}

/** The headers of a stream's 200 answer (also a HEAD's: api/routes/events.ts), besides the reply's own. */
export const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache, no-transform',
  'x-accel-buffering': 'no',
} as const;

/** A client of the stream, over a hijacked Fastify reply's raw response. */
export class SseConnection {
  readonly siteId: string;
  readonly types: ReadonlySet<string> | null;
  /** The API key the stream was opened with (undefined for sessions and ID tokens). */
  readonly keyId: string | undefined;
  /** Last seq delivered or skipped (filtered) for this client; only the hub moves it. */
  cursor: number;
  /** Why the connection ended; null while open. */
  closedBy: null | 'client' | 'overflow' | 'server' | 'revoked' = null;
  private checking = false;
  private keepalive?: NodeJS.Timeout;
  /** Since when (epoch ms) the unsent bytes are over the bound; null while within it. */
  private overSince: number | null = null;

  constructor(
    private readonly res: ServerResponse,
    private readonly opts: SseConnectionOptions,
  ) {
    this.siteId = opts.siteId;
    this.types = opts.types;
    this.keyId = opts.keyId;
    this.cursor = opts.cursor;
    res.on('close', () => this.finish('client'));
    res.on('error', () => this.finish('client'));
    res.on('drain', () => {
      if (this.open) opts.onDrain(this);
    });
  }

  get open(): boolean {
    return this.closedBy === null;
  }

  /**
   * Sends the status line and headers (`headers` are the reply's own, e.g. X-Request-Id and
   * Roost-Version), the `retry:` advice and the `connected` frame, then starts the keepalive timer.
   */
  start(headers: Record<string, string | number | string[]>, connected: Record<string, unknown>): void {
    // The client may have left while the request was being checked (its 'close' already fired).
    if (this.res.destroyed || !this.res.socket || this.res.socket.destroyed) {
      this.finish('client');
      return;
    }
    this.res.writeHead(200, { ...headers, ...SSE_HEADERS, connection: 'keep-alive' });
    this.res.write(`retry: ${SSE_RETRY_MS}\n\n`);
    this.res.write(sseFrame('connected', connected, this.cursor));
    this.keepalive = setInterval(() => {
      if (this.ready()) this.write(sseFrame('keepalive', { serverTime: new Date().toISOString() }));
      void this.recheck();
    }, this.opts.keepaliveMs);
    this.keepalive.unref();
  }

  /** True when this client asked for events of `type` (no filter: every type). */
  wants(type: string): boolean {
    return this.types === null || this.types.has(type);
  }

  /** True while the client's unsent bytes are within the bound (more may be written now). */
  get hasRoom(): boolean {
    return this.open && this.res.writableLength <= this.opts.maxBufferedBytes;
  }

  /**
   * True when the client may be written to now. Over the bound it is false; a client over the bound
   * for longer than `stallMs` is dropped here (its socket destroyed).
   */
  ready(now = Date.now()): boolean {
    if (!this.open) return false;
    if (this.res.writableLength <= this.opts.maxBufferedBytes) {
      this.overSince = null;
      return true;
    }
    this.overSince ??= now;
    if (now - this.overSince > this.opts.stallMs) {
      this.finish('overflow');
      this.res.destroy();
    }
    return false;
  }

  /** Writes one frame (no-op once closed). */
  write(frame: string): void {
    if (this.open) this.res.write(frame);
  }

  /** Ends the stream because its credential no longer authenticates (the client's reconnect gets the 401). */
  revoke(): void {
    if (!this.open) return;
    this.finish('revoked');
    this.res.end();
  }

  /** Ends the response (server shutdown). */
  end(): void {
    if (!this.open) return;
    this.finish('server');
    this.res.end();
  }

  /** Runs `recheck` (one at a time); ends the stream when access is gone. */
  private async recheck(): Promise<void> {
    if (!this.opts.recheck || this.checking || !this.open) return;
    this.checking = true;
    try {
      if (!(await this.opts.recheck()) && this.open) {
        this.finish('revoked');
        this.res.end();
      }
    } finally {
      this.checking = false;
    }
  }

  private finish(by: NonNullable<SseConnection['closedBy']>): void {
    if (this.closedBy !== null) return;
    this.closedBy = by;
    if (this.keepalive) clearInterval(this.keepalive);
    this.opts.onClose(this);
  }
}
