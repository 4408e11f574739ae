/**
 * The event names of SPEC.md "Event catalog" as a runtime list (db/events.ts `EventType` is the type).
 * The stream's `events` filter and anything else that must reject unknown names checks against it.
 * Planned events (roost.created, roost.updated, roost.deleted) are not in it.
 */
import type { EventType } from '../../db/events';

/** One entry per catalog event; a missing or extra key is a compile error. */
const CATALOG: Record<EventType, true> = {
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
};

/** Every event name of the catalog, in the spec's table order. */
export const EVENT_TYPES: readonly EventType[] = Object.keys(CATALOG) as EventType[];

/** True when `name` is an event of the catalog (exact match, case-sensitive). */
export function isEventType(name: string): name is EventType {
  return Object.prototype.hasOwnProperty.call(CATALOG, name);
}
