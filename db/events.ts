/**
 * The outbox: an event row is written in the same transaction as the state change that causes it.
 * Delivery (webhooks, the stream `GET /api/events/stream`) reads from here. Event names are the catalog
 * of domain/events.ts; decisions in docs/decisions/webhook-relay.md and docs/decisions/event-stream.md.
 */
import type { Pool } from 'pg';
import type { EventType } from '../domain/events';
import { newId } from '../domain/hex';
import { withTx, type Queryable } from './pool';

export type { EventType };

/** Records one event inside the caller's transaction; returns its id (`evt_…`). */
export async function recordEvent(
  tx: Queryable,
  siteId: string,
  type: EventType,
  data: Record<string, unknown>,
  eventId = newId('evt'),
): Promise<string> {
  await tx.query('INSERT INTO events (event_id, site_id, type, data) VALUES ($1, $2, $3, $4) ON CONFLICT (event_id) DO NOTHING', [
    eventId,
    siteId,
    type,
    JSON.stringify(data),
  ]);
  return eventId;
}

/** A sequenced event as consumers (stream, webhook fan-out) read it. */
export interface SequencedEvent {
  eventId: string;
  siteId: string;
  /** Per-site sequence number (1, 2, …), assigned by `sequenceEvents`. */
  seq: number;
  type: EventType;
  data: Record<string, unknown>;
  occurredAt: Date;
}

/** Most events numbered per site in one `sequenceEvents` transaction. */
export const SEQUENCE_BATCH = 1000;

/**
 * Numbers the committed, not yet numbered events of `siteId` (or of every site with such events when
 * `siteId` is null) in observation order, continuing the site's counter (`event_sequences`). Safe to run
 * concurrently from many processes: each site's batch is one SERIALIZABLE transaction, so two
 * sequencers never give two numbers to one event or one number to two events (the loser retries and
 * finds the rows numbered). Returns how many events this call numbered.
 */
export async function sequenceEvents(pool: Pool, siteId: string | null = null): Promise<number> {
  const sites = siteId
    ? [siteId]
    : (await pool.query<{ site_id: string }>('SELECT DISTINCT site_id FROM events WHERE seq IS NULL LIMIT 1000')).rows.map(
        (r) => r.site_id,
      );
  let numbered = 0;
  for (const site of sites) {
    for (;;) {
      const n = await withTx(pool, async (tx) => {
        const pending = await tx.query<{ event_id: string }>(
          'SELECT event_id FROM events WHERE site_id = $1 AND seq IS NULL ORDER BY occurred_at, event_id LIMIT $2',
          [site, SEQUENCE_BATCH],
        );
        if (pending.rows.length === 0) return 0;
        const last = await tx.query<{ last_seq: string }>('SELECT last_seq FROM event_sequences WHERE site_id = $1', [site]);
        const from = last.rows.length ? Number(last.rows[0].last_seq) : 0;
        const ids = pending.rows.map((r) => r.event_id);
        await tx.query(
          `UPDATE events AS e SET seq = $2::INT8 + t.ord
             FROM UNNEST($3::text[]) WITH ORDINALITY AS t (event_id, ord)
            WHERE e.site_id = $1 AND e.event_id = t.event_id AND e.seq IS NULL`,
          [site, from, ids],
        );
        await tx.query(
          `INSERT INTO event_sequences (site_id, last_seq) VALUES ($1, $2)
           ON CONFLICT (site_id) DO UPDATE SET last_seq = excluded.last_seq`,
          [site, from + ids.length],
        );
        return ids.length;
      });
      numbered += n;
      if (n < SEQUENCE_BATCH) break;
    }
  }
  return numbered;
}

/**
 * The site's sequenced events with seq > `afterSeq`, in seq order, at most `limit`, optionally only the
 * given types (exact match). Does not sequence: call `sequenceEvents` first to see the newest commits.
 */
export async function listEventsAfter(
  q: Queryable,
  siteId: string,
  afterSeq: number,
  opts: { limit?: number; types?: readonly string[] | null } = {},
): Promise<SequencedEvent[]> {
  const types = opts.types && opts.types.length ? [...opts.types] : null;
  const { rows } = await q.query<{
    event_id: string;
    site_id: string;
    seq: string;
    type: EventType;
    data: Record<string, unknown>;
    occurred_at: Date;
  }>(
    `SELECT event_id, site_id, seq, type, data, occurred_at FROM events
      WHERE site_id = $1 AND seq > $2 AND ($3::text[] IS NULL OR type = ANY($3::text[]))
      ORDER BY seq LIMIT $4`,
    [siteId, afterSeq, types, opts.limit ?? 500],
  );
  return rows.map((r) => ({
    eventId: r.event_id,
    siteId: r.site_id,
    seq: Number(r.seq),
    type: r.type,
    data: r.data,
    occurredAt: r.occurred_at,
  }));
}

/** The site's last assigned sequence number (0 when none). */
export async function lastEventSeq(q: Queryable, siteId: string): Promise<number> {
  const { rows } = await q.query<{ last_seq: string }>('SELECT last_seq FROM event_sequences WHERE site_id = $1', [siteId]);
  return rows.length ? Number(rows[0].last_seq) : 0;
}
