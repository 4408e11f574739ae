/**
 * The event catalog: every event name the outbox carries (db/events.ts writes them, the stream
 * `GET /api/events/stream` and webhook subscriptions filter on them). Planned events (roost.created,
 * roost.updated, roost.deleted) are not in it. Pure.
 */

/** One entry per catalog event, in the catalog's table order; a missing or extra key is a compile error. */
const CATALOG = {
  'version.published': true,
  'version.rolled_back': true,
  'deployment.started': true,
  'deployment.completed': true,
  'deployment.failed': true,
  'machine.online': true,
  'machine.offline': true,
  'chunk.garbage_collected': true,
  'chunk.verify_failed': true,
  'quota.warning': true,
  'quota.exceeded': true,
  'api_key.used': true,
  'api_key.expired': true,
} as const;

/** An event name of the catalog. */
export type EventType = keyof typeof CATALOG;

/** Every event name of the catalog, in table order. */
export const EVENT_TYPES: readonly EventType[] = Object.keys(CATALOG) as EventType[];

/** True when `name` is an event of the catalog (exact match, case-sensitive). */
export function isEventType(name: string): name is EventType {
  return Object.prototype.hasOwnProperty.call(CATALOG, name);
}
