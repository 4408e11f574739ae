/**
 * Reading the outbox for the event stream `GET /api/events/stream` (docs/decisions/event-stream.md): each
 * API process's hub (api/events/hub.ts) numbers a site's newly committed events and reads them after a
 * cursor. Sequencing is shared with every other API process and the event relay (db/events.ts
 * `sequenceEvents`); seq never changes once given.
 */
import { lastEventSeq, listEventsAfter, sequenceEvents, type SequencedEvent } from '../db/events';
import type { ServiceDeps } from './deps';

export type { SequencedEvent } from '../db/events';

/** Numbers the site's committed, not yet numbered events; returns how many were numbered. */
export function sequenceSiteEvents(deps: Pick<ServiceDeps, 'db'>, siteId: string): Promise<number> {
  return sequenceEvents(deps.db, siteId);
}

/** Numbers the site's newest events, then returns its last seq (0 when it has none): where a live stream starts. */
export async function siteEventHead(deps: Pick<ServiceDeps, 'db'>, siteId: string): Promise<number> {
  await sequenceEvents(deps.db, siteId);
  return lastEventSeq(deps.db, siteId);
}

/** The site's last assigned seq (0 when none), without numbering anything. */
export function lastSiteEventSeq(deps: Pick<ServiceDeps, 'db'>, siteId: string): Promise<number> {
  return lastEventSeq(deps.db, siteId);
}

/**
 * The site's numbered events with seq > `afterSeq`, in seq order, at most `limit` (default 500), only
 * `types` when given (exact names).
 */
export function siteEventsAfter(
  deps: Pick<ServiceDeps, 'db'>,
  siteId: string,
  afterSeq: number,
  opts: { limit?: number; types?: readonly string[] | null } = {},
): Promise<SequencedEvent[]> {
  return listEventsAfter(deps.db, siteId, afterSeq, opts);
}
