/**
 * The event hub of one API process (`GET /api/events/stream`; docs/decisions/event-stream.md). One poller
 * per site that has connected clients: every `pollMs` it numbers the site's newly committed outbox rows
 * (services/events.ts `sequenceSiteEvents`, shared with every other API process and the event relay),
 * reads the rows after its cursor (`siteEventsAfter`) and fans them
 * out to the site's clients. Every API process runs its own hub over the same table, so each client
 * sees every event of its site whichever process serves it.
 *
 * Hand-over (no gap, no duplicate): each client has its own cursor (the last seq it has). A tick first
 * catches up, from the database, every client whose cursor is behind the feed's cursor (a bounded
 * number of pages per tick), then reads the next live batch and delivers it only to clients that are
 * caught up, each getting the events with seq above its own cursor. Ticks of one site never overlap, so
 * the feed's cursor is stable while clients catch up, and seq never changes once given.
 *
 * Backpressure: writing to a client stops when its unsent bytes pass its bound (sse.ts); the rest of
 * the rows in hand (at most one page) is held for it and written when its socket drains (the drain
 * kicks the feed), after which it catches up from the database like any client behind. Others are
 * never waited for; a client that stays over its bound is dropped and resumes with Last-Event-ID.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { ServiceDeps } from '../../services/deps';
import { lastSiteEventSeq, type SequencedEvent, sequenceSiteEvents, siteEventsAfter } from '../../services/events';
import { usableKeyIds } from '../../services/identity';
import type { SseConnection } from './sse';
import { sseFrame } from './sse';

/** Events read per live batch. */
export const HUB_PAGE = 500;
/** Events read per catch-up page of one client. */
export const HUB_CATCHUP_PAGE = 200;
/** Catch-up pages one client may take per tick before the others get their turn. */
export const HUB_CATCHUP_PAGES_PER_TICK = 5;

export interface EventHubOptions {
  /** Milliseconds between two ticks of a site's poller. */
  pollMs: number;
  log?: FastifyBaseLogger;
}

/** The stream's data for one event: the dispatcher envelope (event, siteId, occurredAt, data). */
export function streamEnvelope(e: SequencedEvent): { event: string; siteId: string; occurredAt: string; data: Record<string, unknown> } {
  return { event: e.type, siteId: e.siteId, occurredAt: e.occurredAt.toISOString(), data: e.data };
}

/** The poller of one site. */
class SiteFeed {
  readonly clients = new Set<SseConnection>();
  /** Last seq read by the live feed; null until the first tick. */
  cursor: number | null = null;
  /** Rows read for a client but not yet written to it (its buffer filled midway), up to `through`. */
  private readonly backlogs = new WeakMap<SseConnection, { rows: readonly SequencedEvent[]; through: number }>();
  private wake?: () => void;
  private kicked = false;
  /** The poll loop; set by `start` once the first client is in. */
  done: Promise<void> = Promise.resolve();

  constructor(
    private readonly hub: EventHub,
    readonly siteId: string,
  ) {}

  /** Starts the poll loop (call once, after adding the first client). */
  start(): void {
    this.done = this.loop();
  }

  /** Runs a tick as soon as the current one (or sleep) ends. */
  kick(): void {
    this.kicked = true;
    this.wake?.();
  }

  private async loop(): Promise<void> {
    while (!this.hub.closed && this.clients.size > 0) {
      try {
        await this.tick();
      } catch (err) {
        this.hub.log?.warn({ err, siteId: this.siteId }, 'event stream poll failed; retrying');
      }
      if (this.hub.closed || this.clients.size === 0) break;
      if (!this.kicked) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, this.hub.opts.pollMs);
          this.wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.wake = undefined;
      }
      this.kicked = false;
    }
    this.hub.forget(this);
  }

  private async tick(): Promise<void> {
    const deps = this.hub.deps;
    await sequenceSiteEvents(deps, this.siteId);
    // The live feed starts at the current end; clients with an older cursor catch up page by page.
    if (this.cursor === null) this.cursor = await lastSiteEventSeq(deps, this.siteId);
    const feedCursor = this.cursor;
    // Keys are checked once per tick, before the first event of the tick is written.
    let keysChecked = false;
    const checkKeys = async () => {
      if (!keysChecked) await this.endRevoked();
      keysChecked = true;
    };
    for (const client of [...this.clients]) {
      if (client.cursor < feedCursor) {
        await checkKeys();
        if (client.open) await this.catchUp(client, feedCursor);
      }
    }
    for (;;) {
      const from = this.cursor;
      const batch = await siteEventsAfter(deps, this.siteId, from, { limit: HUB_PAGE });
      if (batch.length === 0) return;
      await checkKeys();
      const last = batch[batch.length - 1].seq;
      for (const client of this.clients) {
        // Clients behind (catching up, or over their buffer) get these rows by catching up later.
        if (client.cursor < from || !client.ready()) continue;
        this.writeRun(client, batch, last);
      }
      this.cursor = last;
      if (batch.length < HUB_PAGE || this.hub.closed) return;
    }
  }

  /**
   * Ends the streams whose API key no longer authenticates (revoked, retired, expired, or its user
   * deleted) or whose user may no longer act on this site (removed from it, or no longer superadmin), one
   * database read for all of this site's clients: such a key gets no further event ("Revocation is
   * permanent and immediate", docs/contract.md Authentication 8). A key's scopes never change; streams
   * opened with a session or an ID token are re-checked at the keepalive (SseConnectionOptions.recheck).
   */
  private async endRevoked(): Promise<void> {
    const keyIds = new Set<string>();
    for (const c of this.clients) if (c.open && c.keyId) keyIds.add(c.keyId);
    if (keyIds.size === 0) return;
    const usable = await usableKeyIds(this.hub.deps, [...keyIds], this.siteId);
    for (const c of [...this.clients]) if (c.keyId && !usable.has(c.keyId)) c.revoke();
  }

  /**
   * Replays to `client` the events after its cursor up to `upTo`: at most a few pages per tick, and
   * only while its unsent bytes are within the bound (it continues when its socket drains).
   */
  private async catchUp(client: SseConnection, upTo: number): Promise<void> {
    const held = this.backlogs.get(client);
    if (held) {
      if (!client.ready()) return;
      this.backlogs.delete(client);
      if (!this.writeRun(client, held.rows, held.through)) return;
    }
    const types = client.types ? [...client.types] : null;
    for (let page = 0; page < HUB_CATCHUP_PAGES_PER_TICK; page++) {
      if (client.cursor >= upTo || !client.ready()) return;
      const rows = await siteEventsAfter(this.hub.deps, this.siteId, client.cursor, { limit: HUB_CATCHUP_PAGE, types });
      const done = rows.length < HUB_CATCHUP_PAGE || rows[rows.length - 1].seq >= upTo;
      const through = done ? upTo : rows[rows.length - 1].seq;
      if (
        !this.writeRun(
          client,
          rows.filter((e) => e.seq <= upTo),
          through,
        ) ||
        done
      )
        return;
    }
    // More to replay: come back at once rather than after a poll interval.
    this.kick();
  }

  /**
   * Writes `rows` (seq order; every event of the client's filter in (cursor, through]) to `client`,
   * moving its cursor, and then moves the cursor to `through`. When the client's buffer fills midway,
   * the unwritten rest is held (at most one page) and written on a later tick, once it has drained,
   * without reading it again. Returns whether the whole run was written.
   */
  private writeRun(client: SseConnection, rows: readonly SequencedEvent[], through: number): boolean {
    for (let i = 0; i < rows.length; i++) {
      const e = rows[i];
      if (e.seq <= client.cursor) continue;
      if (client.wants(e.type)) client.write(sseFrame(e.type, streamEnvelope(e), e.seq));
      client.cursor = e.seq;
      if (!client.hasRoom && (i < rows.length - 1 || through > client.cursor)) {
        this.backlogs.set(client, { rows: rows.slice(i + 1), through });
        return false;
      }
    }
    if (through > client.cursor) client.cursor = through;
    return true;
  }

  /** True when `client` still has events to catch up on (the hub kicks the feed when it drains). */
  isBehind(client: SseConnection): boolean {
    return this.cursor !== null && client.cursor < this.cursor;
  }
}

/**
 * Fans the outbox out to the stream clients of this process. Create one per app; `close()` on app
 * close ends every stream and waits for the pollers to stop.
 */
export class EventHub {
  closed = false;
  private readonly feeds = new Map<string, SiteFeed>();

  constructor(
    readonly deps: Pick<ServiceDeps, 'db'>,
    readonly opts: EventHubOptions,
  ) {}

  get log(): FastifyBaseLogger | undefined {
    return this.opts.log;
  }

  /** Number of connected clients (all sites). */
  get clientCount(): number {
    let n = 0;
    for (const f of this.feeds.values()) n += f.clients.size;
    return n;
  }

  /** Number of sites with a running poller. */
  get pollerCount(): number {
    return this.feeds.size;
  }

  /**
   * Adds a started connection to its site's feed (starting the site's poller if needed) and asks for
   * an immediate tick, so a resuming client gets its missed events without waiting a poll interval.
   */
  subscribe(client: SseConnection): void {
    if (!client.open) return;
    if (this.closed) {
      client.end();
      return;
    }
    const existing = this.feeds.get(client.siteId);
    if (existing) {
      existing.clients.add(client);
      existing.kick();
      return;
    }
    const feed = new SiteFeed(this, client.siteId);
    this.feeds.set(client.siteId, feed);
    feed.clients.add(client);
    feed.start();
  }

  /** A client's socket drained: run its site's tick now if it has events to catch up on. */
  drained(client: SseConnection): void {
    const feed = this.feeds.get(client.siteId);
    if (feed && feed.clients.has(client) && feed.isBehind(client)) feed.kick();
  }

  /** Removes a client (its connection ended); the site's poller stops after its last client leaves. */
  unsubscribe(client: SseConnection): void {
    const feed = this.feeds.get(client.siteId);
    if (!feed) return;
    feed.clients.delete(client);
    if (feed.clients.size === 0) feed.kick();
  }

  /** @internal called by a feed whose loop ended. */
  forget(feed: SiteFeed): void {
    if (this.feeds.get(feed.siteId) === feed) this.feeds.delete(feed.siteId);
  }

  /** Ends every stream and waits for the pollers to stop (app close). */
  async close(): Promise<void> {
    this.closed = true;
    const feeds = [...this.feeds.values()];
    for (const f of feeds) {
      for (const c of [...f.clients]) c.end();
      f.kick();
    }
    await Promise.all(feeds.map((f) => f.done));
  }
}
