/**
 * The event relay's activity (workflows/events.ts; docs/decisions/webhooks.md,
 * docs/decisions/webhook-relay.md):
 * a heartbeating loop that, every ROOST_WEBHOOK_RELAY_POLL_MS,
 *
 * 1. numbers newly committed outbox rows (`sequenceEvents(pool, null)`),
 * 2. per site whose events are ahead of its fan-out cursor, turns the events into delivery rows for the
 *    matching enabled, unpaused subscriptions and advances the cursor in the same transaction
 *    (`fanOutSite`: idempotent, safe with several relays),
 * 3. starts one delivery workflow per new delivery (`webhook-delivery:<id>`, REJECT_DUPLICATE: starting
 *    twice is harmless) on the relay's own task queue, and records the start,
 * 4. restarts deliveries whose start was never recorded (a relay died between commit and start).
 *
 * It returns after ROOST_WEBHOOK_RELAY_RUN_SECONDS so the workflow can continue as new.
 */
import { CancelledFailure, Context } from '@temporalio/activity';
import type { Client } from '@temporalio/client';
import type { Pool } from 'pg';
import type { Config } from '../config/env';
import { sequenceEvents } from '../db/events';
import { FANOUT_BATCH, fanOutSite, laggingSites, markDispatched, type NewDelivery, undispatchedDeliveries } from '../db/webhooks';
import { startDeliveryWorkflow } from './webhooks';

/** Seconds after which an undispatched pending delivery is started again by any relay. */
export const REDISPATCH_AFTER_SECONDS = 30;

/** What one relay pass did. */
export interface RelayPass {
  sequenced: number;
  events: number;
  deliveries: number;
}

/**
 * One relay pass over every lagging site (steps 1–4 of the module comment). `start` starts one
 * delivery workflow; `beat` is called after each fan-out batch (the activity heartbeats there).
 * Exported for tests and tools; the activity calls it in a loop.
 */
export async function relayPass(
  db: Pool,
  start: (d: NewDelivery) => Promise<unknown>,
  beat: () => void = () => undefined,
): Promise<RelayPass> {
  const sequenced = await sequenceEvents(db, null);
  let events = 0;
  let deliveries = 0;
  const dispatch = async (list: NewDelivery[]) => {
    for (const d of list) await start(d);
    const bySite = new Map<string, string[]>();
    for (const d of list) bySite.set(d.siteId, [...(bySite.get(d.siteId) ?? []), d.deliveryId]);
    for (const [siteId, ids] of bySite) await markDispatched(db, siteId, ids);
    deliveries += list.length;
  };
  for (const site of await laggingSites(db)) {
    // Drain the site in batches (each batch one transaction).
    for (;;) {
      const r = await fanOutSite(db, site.siteId);
      events += r.events;
      await dispatch(r.created);
      beat();
      if (r.events < FANOUT_BATCH) break;
    }
  }
  await dispatch(await undispatchedDeliveries(db, REDISPATCH_AFTER_SECONDS));
  return { sequenced, events, deliveries };
}

/** What the relay activity needs. */
export interface EventActivityDeps {
  db: Pool;
  cfg: Config;
}

/** The relay activity over `deps`. */
export function createEventActivities(deps: EventActivityDeps) {
  const { db, cfg } = deps;
  return {
    /**
     * Runs relay passes every ROOST_WEBHOOK_RELAY_POLL_MS for ROOST_WEBHOOK_RELAY_RUN_SECONDS, heartbeating
     * after each pass; starts delivery workflows with the worker's client on the activity's task queue.
     * A pass that fails (database briefly unavailable) is retried at the next poll. Returns totals.
     * @throws CancelledFailure when the activity is cancelled (worker shutdown, workflow cancelled).
     */
    async relayEvents(): Promise<{ passes: number; events: number; deliveries: number }> {
      const ctx = Context.current();
      const client: Client = ctx.client;
      const taskQueue = ctx.info.taskQueue;
      const deadline = Date.now() + cfg.ROOST_WEBHOOK_RELAY_RUN_SECONDS * 1000;
      const totals = { passes: 0, events: 0, deliveries: 0 };
      const start = (d: NewDelivery) => startDeliveryWorkflow(client, taskQueue, { siteId: d.siteId, deliveryId: d.deliveryId });
      while (Date.now() < deadline) {
        try {
          const p = await relayPass(db, start, () => ctx.heartbeat(totals));
          totals.passes += 1;
          totals.events += p.events;
          totals.deliveries += p.deliveries;
        } catch (err) {
          if (err instanceof CancelledFailure) throw err;
          ctx.log.warn('event relay pass failed; retrying at the next poll', { error: (err as Error).message });
        }
        ctx.heartbeat(totals);
        await ctx.sleep(cfg.ROOST_WEBHOOK_RELAY_POLL_MS);
      }
      return totals;
    },
  };
}
