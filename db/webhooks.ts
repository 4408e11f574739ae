/**
 * Webhook subscriptions, deliveries and attempts (docs/contract.md "Webhook subscription", "Events" › Delivery;
 * migration 009; docs/decisions/webhooks.md). Every query names the site. Secrets are stored sealed
 * (domain/seal.ts) with associated data `webhookAad(siteId, webhookId)`; this module never sees them in
 * clear text.
 *
 * Fan-out (`fanOutSite`): the site's sequenced events after its cursor become one delivery row per
 * matching active subscription, and the cursor advances, in one SERIALIZABLE transaction; the unique key
 * (webhook_id, event_id) makes a second relay or a retried activity harmless.
 */
import type { Pool } from 'pg';
import { newId } from '../domain/hex';
import { isCreatedAtPosition } from '../domain/schemas';
import { listEventsAfter } from './events';
import { withTx, type Queryable } from './pool';

/** `wh_` + 24 hex chars. */
export const WEBHOOK_ID_RE = /^wh_[0-9a-f]{24}$/;
/** `dlv_` + 24 hex chars. */
export const DELIVERY_ID_RE = /^dlv_[0-9a-f]{24}$/;

/** Associated data binding a sealed secret to its site and subscription. */
export function webhookAad(siteId: string, webhookId: string): string {
  return `webhook:${siteId}:${webhookId}`;
}

/** A subscription row. */
export interface WebhookRow {
  site_id: string;
  webhook_id: string;
  url: string;
  name: string;
  events: string[];
  enabled: boolean;
  paused: boolean;
  secret_sealed: string;
  previous_secret_sealed: string | null;
  previous_secret_expires_at: Date | null;
  secret_rotated_at: Date | null;
  created_at: Date;
  created_at_text: string;
  created_by: string;
  updated_at: Date;
  last_triggered_at: Date | null;
  last_status: string | null;
  last_response_code: number | null;
  fail_count: number;
}

const WEBHOOK_COLUMNS = `site_id, webhook_id, url, name, events, enabled, paused, secret_sealed, previous_secret_sealed,
  previous_secret_expires_at, secret_rotated_at, created_at, CAST(created_at AS TEXT) AS created_at_text, created_by, updated_at,
  last_triggered_at, last_status, last_response_code, fail_count`;

/** Creates a subscription; returns its row. */
export async function insertWebhook(
  q: Queryable,
  w: {
    siteId: string;
    webhookId: string;
    url: string;
    name: string;
    events: string[];
    enabled: boolean;
    secretSealed: string;
    createdBy: string;
  },
): Promise<WebhookRow> {
  const { rows } = await q.query<WebhookRow>(
    `INSERT INTO webhooks (site_id, webhook_id, url, name, events, enabled, secret_sealed, created_by)
     VALUES ($1, $2, $3, $4, $5::text[], $6, $7, $8) RETURNING ${WEBHOOK_COLUMNS}`,
    [w.siteId, w.webhookId, w.url, w.name, w.events, w.enabled, w.secretSealed, w.createdBy],
  );
  return rows[0];
}

/** The subscription, or undefined. */
export async function getWebhook(q: Queryable, siteId: string, webhookId: string): Promise<WebhookRow | undefined> {
  const { rows } = await q.query<WebhookRow>(`SELECT ${WEBHOOK_COLUMNS} FROM webhooks WHERE site_id = $1 AND webhook_id = $2`, [
    siteId,
    webhookId,
  ]);
  return rows[0];
}

/** A list position: [created_at as text, webhook_id] of the last row of a page. */
export type WebhookPosition = [string, string];

/** True for a position `listWebhooks` issues. */
export function isWebhookPosition(p: unknown): p is WebhookPosition {
  return isCreatedAtPosition(p) && WEBHOOK_ID_RE.test(p[1]);
}

/** The site's subscriptions, newest first, `limit` + 1 rows (the extra one says there is a next page). */
export async function listWebhooks(q: Queryable, siteId: string, opts: { after?: WebhookPosition; limit: number }): Promise<WebhookRow[]> {
  const { rows } = await q.query<WebhookRow>(
    `SELECT ${WEBHOOK_COLUMNS} FROM webhooks
      WHERE site_id = $1 AND ($2::timestamptz IS NULL OR (created_at, webhook_id) < ($2::timestamptz, $3::text))
      ORDER BY created_at DESC, webhook_id DESC LIMIT $4`,
    [siteId, opts.after?.[0] ?? null, opts.after?.[1] ?? '', opts.limit + 1],
  );
  return rows;
}

/** Fields PATCH may change. */
export interface WebhookChanges {
  url?: string;
  name?: string;
  events?: string[];
  enabled?: boolean;
  paused?: boolean;
}

/**
 * Applies `changes`; unpausing (paused false on a paused subscription) also resets fail_count, so the
 * next failure does not pause it again at once. Returns the new row, or undefined when absent.
 */
export async function updateWebhook(
  q: Queryable,
  siteId: string,
  webhookId: string,
  changes: WebhookChanges,
): Promise<WebhookRow | undefined> {
  const { rows } = await q.query<WebhookRow>(
    `UPDATE webhooks SET
        url = COALESCE($3, url),
        name = COALESCE($4, name),
        events = COALESCE($5::text[], events),
        enabled = COALESCE($6, enabled),
        fail_count = CASE WHEN $7::boolean = false AND paused THEN 0 ELSE fail_count END,
        paused = COALESCE($7, paused),
        updated_at = now()
      WHERE site_id = $1 AND webhook_id = $2 RETURNING ${WEBHOOK_COLUMNS}`,
    [siteId, webhookId, changes.url ?? null, changes.name ?? null, changes.events ?? null, changes.enabled ?? null, changes.paused ?? null],
  );
  return rows[0];
}

/** Deletes the subscription with its deliveries and attempts; false when it did not exist. */
export async function deleteWebhook(pool: Pool, siteId: string, webhookId: string): Promise<boolean> {
  return withTx(pool, async (tx) => {
    await tx.query(
      `DELETE FROM webhook_attempts a USING webhook_deliveries d
        WHERE a.site_id = $1 AND d.site_id = $1 AND d.webhook_id = $2 AND a.delivery_id = d.delivery_id`,
      [siteId, webhookId],
    );
    await tx.query('DELETE FROM webhook_deliveries WHERE site_id = $1 AND webhook_id = $2', [siteId, webhookId]);
    const r = await tx.query('DELETE FROM webhooks WHERE site_id = $1 AND webhook_id = $2', [siteId, webhookId]);
    return (r.rowCount ?? 0) > 0;
  });
}

/**
 * Rotates the secret: the current sealed secret becomes the previous one until `previousExpiresAt` (null
 * or a past time: the previous one stops signing at once), and `newSealed` signs from now on.
 */
export async function rotateWebhookSecret(
  q: Queryable,
  siteId: string,
  webhookId: string,
  newSealed: string,
  previousExpiresAt: Date | null,
): Promise<WebhookRow | undefined> {
  const { rows } = await q.query<WebhookRow>(
    `UPDATE webhooks SET
        previous_secret_sealed = CASE WHEN $4::timestamptz IS NULL THEN NULL ELSE secret_sealed END,
        previous_secret_expires_at = $4::timestamptz,
        secret_sealed = $3, secret_rotated_at = now(), updated_at = now()
      WHERE site_id = $1 AND webhook_id = $2 RETURNING ${WEBHOOK_COLUMNS}`,
    [siteId, webhookId, newSealed, previousExpiresAt],
  );
  return rows[0];
}

// ---------------------------------------------------------------------------------------------------
// Deliveries

/** Delivery states. */
export type DeliveryStatus = 'pending' | 'succeeded' | 'failed';

/** A delivery row. */
export interface DeliveryRow {
  site_id: string;
  delivery_id: string;
  webhook_id: string;
  event_id: string;
  event_type: string;
  payload: string;
  status: DeliveryStatus;
  attempts: number;
  last_error: string | null;
  next_attempt_at: Date | null;
  created_at: Date;
  created_at_text: string;
  updated_at: Date;
  completed_at: Date | null;
}

/** An attempt row. */
export interface AttemptRow {
  delivery_id: string;
  attempt_no: number;
  started_at: Date;
  latency_ms: number;
  response_code: number | null;
  error: string | null;
}

const DELIVERY_COLUMNS = `site_id, delivery_id, webhook_id, event_id, event_type, payload, status, attempts, last_error, next_attempt_at,
  created_at, CAST(created_at AS TEXT) AS created_at_text, updated_at, completed_at`;

/** A delivery page position: [created_at as text, delivery_id]. */
export type DeliveryPosition = [string, string];

/** True for a position `listDeliveries` issues. */
export function isDeliveryPosition(p: unknown): p is DeliveryPosition {
  return isCreatedAtPosition(p) && DELIVERY_ID_RE.test(p[1]);
}

/** The subscription's deliveries, newest first, `limit` + 1 rows, each with its attempts (oldest first). */
export async function listDeliveries(
  q: Queryable,
  siteId: string,
  webhookId: string,
  opts: { after?: DeliveryPosition; limit: number },
): Promise<{ rows: DeliveryRow[]; attempts: Map<string, AttemptRow[]> }> {
  const { rows } = await q.query<DeliveryRow>(
    `SELECT ${DELIVERY_COLUMNS} FROM webhook_deliveries
      WHERE site_id = $1 AND webhook_id = $2 AND ($3::timestamptz IS NULL OR (created_at, delivery_id) < ($3::timestamptz, $4::text))
      ORDER BY created_at DESC, delivery_id DESC LIMIT $5`,
    [siteId, webhookId, opts.after?.[0] ?? null, opts.after?.[1] ?? '', opts.limit + 1],
  );
  const attempts = await attemptsOf(
    q,
    siteId,
    rows.map((r) => r.delivery_id),
  );
  return { rows, attempts };
}

/** Attempts of `deliveryIds`, grouped by delivery, oldest first. */
export async function attemptsOf(q: Queryable, siteId: string, deliveryIds: string[]): Promise<Map<string, AttemptRow[]>> {
  const out = new Map<string, AttemptRow[]>();
  if (deliveryIds.length === 0) return out;
  const { rows } = await q.query<AttemptRow>(
    `SELECT delivery_id, attempt_no, started_at, latency_ms, response_code, error FROM webhook_attempts
      WHERE site_id = $1 AND delivery_id = ANY($2::text[]) ORDER BY delivery_id, attempt_no`,
    [siteId, deliveryIds],
  );
  for (const r of rows) {
    const list = out.get(r.delivery_id) ?? [];
    list.push(r);
    out.set(r.delivery_id, list);
  }
  return out;
}

/** One delivery, or undefined. */
export async function getDelivery(q: Queryable, siteId: string, deliveryId: string): Promise<DeliveryRow | undefined> {
  const { rows } = await q.query<DeliveryRow>(
    `SELECT ${DELIVERY_COLUMNS} FROM webhook_deliveries WHERE site_id = $1 AND delivery_id = $2`,
    [siteId, deliveryId],
  );
  return rows[0];
}

/**
 * Puts a finished delivery of `webhookId` back to pending for a manual retry. Outcomes: `ok` (the
 * caller starts a new delivery run), `not_found`, `in_progress` (still pending: a run is under way).
 */
export async function reopenDelivery(
  q: Queryable,
  siteId: string,
  webhookId: string,
  deliveryId: string,
): Promise<'ok' | 'not_found' | 'in_progress'> {
  const { rows } = await q.query<{ status: DeliveryStatus; reopened: boolean }>(
    `WITH cur AS (SELECT status FROM webhook_deliveries WHERE site_id = $1 AND webhook_id = $2 AND delivery_id = $3),
          upd AS (UPDATE webhook_deliveries SET status = 'pending', completed_at = NULL, next_attempt_at = now(), dispatched_at = now(), updated_at = now()
                   WHERE site_id = $1 AND webhook_id = $2 AND delivery_id = $3 AND status <> 'pending' RETURNING delivery_id)
     SELECT cur.status, EXISTS (SELECT 1 FROM upd) AS reopened FROM cur`,
    [siteId, webhookId, deliveryId],
  );
  if (!rows[0]) return 'not_found';
  return rows[0].reopened ? 'ok' : 'in_progress';
}

// ---------------------------------------------------------------------------------------------------
// Fan-out (the event relay)

/** A site whose sequenced events are ahead of its fan-out cursor. */
export interface LaggingSite {
  siteId: string;
  cursor: number;
  lastSeq: number;
}

/** Up to `limit` sites with events past their fan-out cursor. */
export async function laggingSites(q: Queryable, limit = 200): Promise<LaggingSite[]> {
  const { rows } = await q.query<{ site_id: string; cursor: string; last_seq: string }>(
    `SELECT s.site_id, COALESCE(c.last_seq, 0) AS cursor, s.last_seq FROM event_sequences s
       LEFT JOIN webhook_cursors c ON c.site_id = s.site_id
      WHERE s.last_seq > COALESCE(c.last_seq, 0) LIMIT $1`,
    [limit],
  );
  return rows.map((r) => ({ siteId: r.site_id, cursor: Number(r.cursor), lastSeq: Number(r.last_seq) }));
}

/** The dispatcher envelope (docs/contract.md "Events" › Envelopes): event, siteId, occurredAt, data; no top-level id. */
export interface DispatcherEnvelope {
  event: string;
  siteId: string;
  occurredAt: string;
  data: Record<string, unknown>;
}

/** A delivery created by fan-out. */
export interface NewDelivery {
  siteId: string;
  deliveryId: string;
}

/** Events read per fan-out transaction. */
export const FANOUT_BATCH = 200;

/**
 * Turns the site's events after its cursor (at most `limit`) into deliveries for every enabled, unpaused
 * subscription listing the event type that existed when the event occurred, and advances the cursor, in
 * one SERIALIZABLE transaction. Returns the deliveries this call created (none when another relay got
 * there first) and how many events it consumed.
 */
export async function fanOutSite(pool: Pool, siteId: string, limit = FANOUT_BATCH): Promise<{ created: NewDelivery[]; events: number }> {
  return withTx(pool, async (tx) => {
    const cur = await tx.query<{ last_seq: string }>('SELECT last_seq FROM webhook_cursors WHERE site_id = $1', [siteId]);
    const cursor = cur.rows.length ? Number(cur.rows[0].last_seq) : 0;
    const subs = (
      await tx.query<{ webhook_id: string; events: string[]; created_at: Date }>(
        'SELECT webhook_id, events, created_at FROM webhooks WHERE site_id = $1 AND enabled AND NOT paused',
        [siteId],
      )
    ).rows;
    let newCursor: number;
    let consumed = 0;
    const rows: { d: string; w: string; e: string; t: string; p: string }[] = [];
    if (subs.length === 0) {
      // Nothing listens: skip straight to the site's last number.
      const last = await tx.query<{ last_seq: string }>('SELECT last_seq FROM event_sequences WHERE site_id = $1', [siteId]);
      newCursor = last.rows.length ? Number(last.rows[0].last_seq) : cursor;
      consumed = Math.max(0, newCursor - cursor);
    } else {
      const events = await listEventsAfter(tx, siteId, cursor, { limit });
      consumed = events.length;
      newCursor = events.length ? events[events.length - 1].seq : cursor;
      for (const ev of events) {
        const envelope: DispatcherEnvelope = { event: ev.type, siteId, occurredAt: ev.occurredAt.toISOString(), data: ev.data };
        const payload = JSON.stringify(envelope);
        for (const s of subs) {
          if (!s.events.includes(ev.type) || ev.occurredAt.getTime() < s.created_at.getTime()) continue;
          rows.push({ d: newId('dlv'), w: s.webhook_id, e: ev.eventId, t: ev.type, p: payload });
        }
      }
    }
    let created: NewDelivery[] = [];
    if (rows.length) {
      const ins = await tx.query<{ delivery_id: string }>(
        `INSERT INTO webhook_deliveries (site_id, delivery_id, webhook_id, event_id, event_type, payload, next_attempt_at)
         SELECT $1, t.d, t.w, t.e, t.ty, t.p, now() FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS t (d, w, e, ty, p)
         ON CONFLICT (webhook_id, event_id) DO NOTHING RETURNING delivery_id`,
        [siteId, rows.map((r) => r.d), rows.map((r) => r.w), rows.map((r) => r.e), rows.map((r) => r.t), rows.map((r) => r.p)],
      );
      created = ins.rows.map((r) => ({ siteId, deliveryId: r.delivery_id }));
    }
    if (newCursor > cursor) {
      await tx.query(
        `INSERT INTO webhook_cursors (site_id, last_seq) VALUES ($1, $2)
         ON CONFLICT (site_id) DO UPDATE SET last_seq = GREATEST(webhook_cursors.last_seq, excluded.last_seq)`,
        [siteId, newCursor],
      );
    }
    return { created, events: consumed };
  });
}

/** Records that delivery workflows were started for `deliveryIds`. */
export async function markDispatched(q: Queryable, siteId: string, deliveryIds: string[]): Promise<void> {
  if (deliveryIds.length === 0) return;
  await q.query(
    'UPDATE webhook_deliveries SET dispatched_at = now() WHERE site_id = $1 AND delivery_id = ANY($2::text[]) AND dispatched_at IS NULL',
    [siteId, deliveryIds],
  );
}

/**
 * Pending deliveries created more than `olderThanSeconds` ago whose workflow start was never recorded
 * (a relay stopped between its commit and the start); the relay starts them again (harmless when the
 * start did happen: the workflow id is the delivery's).
 */
export async function undispatchedDeliveries(q: Queryable, olderThanSeconds: number, limit = 100): Promise<NewDelivery[]> {
  const { rows } = await q.query<{ site_id: string; delivery_id: string }>(
    `SELECT site_id, delivery_id FROM webhook_deliveries
      WHERE dispatched_at IS NULL AND status = 'pending' AND created_at < now() - ($1::INT8 * INTERVAL '1 second') LIMIT $2`,
    [olderThanSeconds, limit],
  );
  return rows.map((r) => ({ siteId: r.site_id, deliveryId: r.delivery_id }));
}

// ---------------------------------------------------------------------------------------------------
// Sending (the delivery workflow's activities)

/** What one attempt needs: the delivery and its subscription (secrets still sealed). */
export async function loadDeliveryForSend(
  q: Queryable,
  siteId: string,
  deliveryId: string,
): Promise<{ delivery: DeliveryRow; webhook: WebhookRow } | undefined> {
  const delivery = await getDelivery(q, siteId, deliveryId);
  if (!delivery) return undefined;
  const webhook = await getWebhook(q, siteId, delivery.webhook_id);
  if (!webhook) return undefined;
  return { delivery, webhook };
}

/** The outcome of one HTTP attempt. */
export interface AttemptRecord {
  siteId: string;
  deliveryId: string;
  webhookId: string;
  startedAt: Date;
  latencyMs: number;
  responseCode: number | null;
  error: string | null;
  succeeded: boolean;
}

/**
 * Appends an attempt (next number) and updates the delivery; on success also marks the delivery
 * succeeded and the subscription's last_status/last_triggered, resetting fail_count. One transaction.
 * Returns the attempt number.
 */
export async function recordAttempt(pool: Pool, a: AttemptRecord): Promise<number> {
  return withTx(pool, async (tx) => {
    const { rows } = await tx.query<{ attempt_no: number }>(
      `INSERT INTO webhook_attempts (site_id, delivery_id, attempt_no, started_at, latency_ms, response_code, error)
       SELECT $1, $2, COALESCE(MAX(attempt_no), 0) + 1, $3, $4, $5, $6 FROM webhook_attempts WHERE site_id = $1 AND delivery_id = $2
       RETURNING attempt_no`,
      [a.siteId, a.deliveryId, a.startedAt, a.latencyMs, a.responseCode, a.error],
    );
    await tx.query(
      `UPDATE webhook_deliveries SET attempts = attempts + 1, last_error = $3, updated_at = now(),
          status = CASE WHEN $4::boolean THEN 'succeeded' ELSE status END,
          completed_at = CASE WHEN $4::boolean THEN now() ELSE completed_at END
        WHERE site_id = $1 AND delivery_id = $2`,
      [a.siteId, a.deliveryId, a.error, a.succeeded],
    );
    await tx.query(
      `UPDATE webhooks SET last_triggered_at = $3::timestamptz, last_response_code = $4::INT,
          last_status = CASE WHEN $5::boolean THEN 'succeeded' ELSE last_status END,
          fail_count = CASE WHEN $5::boolean THEN 0 ELSE fail_count END
        WHERE site_id = $1 AND webhook_id = $2`,
      [a.siteId, a.webhookId, a.startedAt, a.responseCode, a.succeeded],
    );
    return Number(rows[0].attempt_no);
  });
}

/**
 * Marks a pending delivery failed after its last attempt. When `countFailure`, the subscription's
 * fail_count grows by one and it is paused once fail_count reaches `pauseAfter`. Idempotent: a delivery
 * that is no longer pending changes nothing. Returns whether this call failed it, and the subscription's
 * fail_count and paused flag afterwards.
 */
export async function failDelivery(
  pool: Pool,
  f: { siteId: string; deliveryId: string; error: string; countFailure: boolean; pauseAfter: number },
): Promise<{ failed: boolean; failCount: number; paused: boolean }> {
  return withTx(pool, async (tx) => {
    const d = await tx.query<{ webhook_id: string }>(
      `UPDATE webhook_deliveries SET status = 'failed', last_error = $3, completed_at = now(), next_attempt_at = NULL, updated_at = now()
        WHERE site_id = $1 AND delivery_id = $2 AND status = 'pending' RETURNING webhook_id`,
      [f.siteId, f.deliveryId, f.error],
    );
    if (!d.rows[0]) return { failed: false, failCount: 0, paused: false };
    const w = await tx.query<{ fail_count: number; paused: boolean }>(
      `UPDATE webhooks SET last_status = 'failed',
          fail_count = fail_count + CASE WHEN $3::boolean THEN 1 ELSE 0 END,
          paused = paused OR ($3::boolean AND fail_count + 1 >= $4::INT),
          updated_at = CASE WHEN NOT paused AND $3::boolean AND fail_count + 1 >= $4::INT THEN now() ELSE updated_at END
        WHERE site_id = $1 AND webhook_id = $2 RETURNING fail_count, paused`,
      [f.siteId, d.rows[0].webhook_id, f.countFailure, f.pauseAfter],
    );
    return { failed: true, failCount: Number(w.rows[0]?.fail_count ?? 0), paused: Boolean(w.rows[0]?.paused) };
  });
}

/** Sets the delivery's next attempt time (informational, shown in the history). */
export async function noteNextAttempt(q: Queryable, siteId: string, deliveryId: string, at: Date | null): Promise<void> {
  await q.query('UPDATE webhook_deliveries SET next_attempt_at = $3 WHERE site_id = $1 AND delivery_id = $2 AND status = $4', [
    siteId,
    deliveryId,
    at,
    'pending',
  ]);
}
