/**
 * The outbox (DESIGN.md "Events"): an event row is written in the same transaction as the state change
 * that causes it. Delivery (webhooks, stream) reads from here. Event names and data fields are the
 * SPEC.md "Event catalog".
 */
import { newId } from '../domain/hex';
import type { Queryable } from './pool';

export type EventType =
  | 'version.published'
  | 'version.rolled_back'
  | 'deployment.started'
  | 'deployment.completed'
  | 'deployment.failed'
  | 'machine.online'
  | 'machine.offline'
  | 'chunk.garbage_collected'
  | 'chunk.verify_failed'
  | 'quota.warning'
  | 'quota.exceeded'
  | 'api_key.used'
  | 'api_key.expired';

/** Records one event inside the caller's transaction; returns its id (`evt_…`). */
export async function recordEvent(tx: Queryable, siteId: string, type: EventType, data: Record<string, unknown>, eventId = newId('evt')): Promise<string> {
  await tx.query('INSERT INTO events (event_id, site_id, type, data) VALUES ($1, $2, $3, $4) ON CONFLICT (event_id) DO NOTHING', [
    eventId,
    siteId,
    type,
    JSON.stringify(data),
  ]);
  return eventId;
}
