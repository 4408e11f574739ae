/**
 * The per-site audit chain (docs/contract.md "Audit record", "Audit log"; migration 008, docs/decisions/audit-chain.md).
 *
 * Appends read the site's head row (`audit_heads`, FOR UPDATE) inside a SERIALIZABLE transaction, link
 * the new record to the head's hash, insert it and advance the head. Concurrent appenders of one site
 * serialise on that row: the loser of a conflict fails with 40001 and `withTx` runs it again against the
 * new head. No advisory locks, no sequences.
 *
 * Also the memory of API-key use per site and address that drives `api_key_used` sampling and the
 * `api_key.used` event (docs/decisions/audit-key-use.md).
 */
import { Pool } from 'pg';
import {
  type AuditContent,
  type AuditRecord,
  canonicalTime,
  sealAuditRecord,
  verifyRecord,
  type VerificationReport,
} from '../domain/audit';
import { withTx, type Queryable } from './pool';

/** What a caller appends; time, link and hash are the chain's. */
export interface AuditInput {
  kind: string;
  actor: string;
  attributes: Record<string, unknown>;
}

/** A stored record with its position in the site's chain (1 = genesis). */
export interface StoredAuditRecord extends AuditRecord {
  seq: number;
}

/** Attempts of an audit transaction: appends of one site all contend on its head row. */
export const AUDIT_TX_ATTEMPTS = 25;

interface RecordRow {
  site_id: string;
  hash: string;
  seq: number | string;
  kind: string;
  actor: string;
  occurred_at: Date;
  attributes: Record<string, unknown>;
  previous_hash: string | null;
}

const COLUMNS = 'site_id, hash, seq, kind, actor, occurred_at, attributes, previous_hash';

function fromRow(r: RecordRow): StoredAuditRecord {
  return {
    siteId: r.site_id,
    hash: r.hash,
    seq: Number(r.seq),
    kind: r.kind,
    actor: r.actor,
    occurredAt: canonicalTime(r.occurred_at),
    attributes: r.attributes,
    previousHash: r.previous_hash,
  };
}

/** Strings PostgreSQL JSONB cannot hold (NUL) are replaced, so what is hashed is what is stored. */
function storable(v: unknown): unknown {
  if (typeof v === 'string') return v.includes('\u0000') ? v.replace(/\u0000/g, '\uFFFD') : v;
  if (Array.isArray(v)) return v.map(storable);
  if (v && typeof v === 'object')
    return Object.fromEntries(
      Object.entries(v)
        .filter(([, x]) => x !== undefined)
        .map(([k, x]) => [storable(k) as string, storable(x)]),
    );
  return v;
}

/**
 * Appends `inputs` in order to `siteId`'s chain inside the caller's transaction `tx` (which must be
 * SERIALIZABLE, e.g. from `withTx`, so that concurrent appenders serialise). Returns the stored records.
 * Throws TypeError when attributes cannot be expressed as JSON; database errors propagate (40001 is
 * for the caller's `withTx` to retry).
 */
export async function appendAuditRecords(
  tx: Queryable,
  siteId: string,
  inputs: readonly AuditInput[],
  now: Date = new Date(),
): Promise<StoredAuditRecord[]> {
  if (inputs.length === 0) return [];
  const readHead = async () =>
    (
      await tx.query<{ head_hash: string | null; head_seq: number | string }>(
        'SELECT head_hash, head_seq FROM audit_heads WHERE site_id = $1 FOR UPDATE',
        [siteId],
      )
    ).rows[0];
  let head = await readHead();
  if (!head) {
    await tx.query('INSERT INTO audit_heads (site_id, head_hash, head_seq) VALUES ($1, NULL, 0) ON CONFLICT (site_id) DO NOTHING', [
      siteId,
    ]);
    head = await readHead();
  }
  let previousHash = head.head_hash;
  let seq = Number(head.head_seq);
  const out: StoredAuditRecord[] = [];
  for (const input of inputs) {
    const content: AuditContent = {
      kind: input.kind,
      actor: input.actor,
      occurredAt: now.toISOString(),
      attributes: storable(input.attributes) as Record<string, unknown>,
      previousHash,
      siteId,
    };
    const rec = sealAuditRecord(content);
    seq += 1;
    await tx.query(`INSERT INTO audit_records (${COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, [
      siteId,
      rec.hash,
      seq,
      rec.kind,
      rec.actor,
      rec.occurredAt,
      JSON.stringify(rec.attributes),
      rec.previousHash,
    ]);
    out.push({ ...rec, seq });
    previousHash = rec.hash;
  }
  await tx.query('UPDATE audit_heads SET head_hash = $2, head_seq = $3 WHERE site_id = $1', [siteId, previousHash, seq]);
  return out;
}

/**
 * Appends one record to `siteId`'s chain. Given the pool, runs its own SERIALIZABLE transaction (retried
 * on 40001); given a transaction's client, appends inside it. Returns the stored record.
 */
export async function appendAudit(q: Pool | Queryable, siteId: string, input: AuditInput): Promise<StoredAuditRecord> {
  if (q instanceof Pool) {
    return withTx(q, async (tx) => (await appendAuditRecords(tx, siteId, [input]))[0], { attempts: AUDIT_TX_ATTEMPTS });
  }
  return (await appendAuditRecords(q, siteId, [input]))[0];
}

/** One record of a site by hash, or null. */
export async function getAuditRecord(q: Queryable, siteId: string, hash: string): Promise<StoredAuditRecord | null> {
  const { rows } = await q.query<RecordRow>(`SELECT ${COLUMNS} FROM audit_records WHERE site_id = $1 AND hash = $2`, [siteId, hash]);
  return rows[0] ? fromRow(rows[0]) : null;
}

/** A record with its verification report against its stored predecessor (null when the record is unknown). */
export async function verifyStoredRecord(
  q: Queryable,
  siteId: string,
  hash: string,
): Promise<{ record: StoredAuditRecord; verification: VerificationReport } | null> {
  const record = await getAuditRecord(q, siteId, hash);
  if (!record) return null;
  const predecessor = record.previousHash === null ? null : await getAuditRecord(q, siteId, record.previousHash);
  return { record, verification: verifyRecord(record, predecessor) };
}

/** Filters and keyset position of a log page. */
export interface AuditListOptions {
  kind?: string;
  actor?: string;
  /** Only records with occurredAt at or after this time. */
  since?: Date;
  /** Only records older in the chain than this position (the previous page's last seq). */
  beforeSeq?: number;
  limit: number;
}

/** A page of the site's log, newest first (descending chain position). Fetches `limit + 1` rows to tell whether more follow. */
export async function listAuditRecords(
  q: Queryable,
  siteId: string,
  opts: AuditListOptions,
): Promise<{ records: StoredAuditRecord[]; more: boolean }> {
  const { rows } = await q.query<RecordRow>(
    `SELECT ${COLUMNS} FROM audit_records
      WHERE site_id = $1
        AND ($2::text IS NULL OR kind = $2::text)
        AND ($3::text IS NULL OR actor = $3::text)
        AND ($4::timestamptz IS NULL OR occurred_at >= $4::timestamptz)
        AND ($5::int8 IS NULL OR seq < $5::int8)
      ORDER BY seq DESC LIMIT $6`,
    [siteId, opts.kind ?? null, opts.actor ?? null, opts.since ?? null, opts.beforeSeq ?? null, opts.limit + 1],
  );
  return { records: rows.slice(0, opts.limit).map(fromRow), more: rows.length > opts.limit };
}

/** Outcome of noting one use of a key from an address. */
export interface KeyUse {
  /** No use of this key from this address on this site was known before: emit `api_key.used`. */
  firstUse: boolean;
  /** The last `api_key_used` sample is older than the window (or there is none): append one now. */
  sample: boolean;
  /** When the (possibly just taken) last sample was, epoch ms: what a cache in front of this may remember. */
  lastSampledAt: number;
}

/**
 * Notes a use of `keyId` from `ip` on `siteId` at `now` (epoch ms) inside the caller's SERIALIZABLE
 * transaction: inserts the address on first use, and advances `last_sampled_at` when the previous sample
 * is at least `windowMs` old. Several API processes agree because the row decides.
 */
export async function noteKeyUse(tx: Queryable, siteId: string, keyId: string, ip: string, now: number, windowMs: number): Promise<KeyUse> {
  const { rows } = await tx.query<{ last_sampled_at: number | string }>(
    'SELECT last_sampled_at FROM audit_key_addresses WHERE site_id = $1 AND key_id = $2 AND ip = $3',
    [siteId, keyId, ip],
  );
  if (rows.length === 0) {
    await tx.query('INSERT INTO audit_key_addresses (site_id, key_id, ip, first_used_at, last_sampled_at) VALUES ($1, $2, $3, $4, $4)', [
      siteId,
      keyId,
      ip,
      now,
    ]);
    return { firstUse: true, sample: true, lastSampledAt: now };
  }
  const last = Number(rows[0].last_sampled_at);
  if (now - last < windowMs) return { firstUse: false, sample: false, lastSampledAt: last };
  await tx.query('UPDATE audit_key_addresses SET last_sampled_at = $4 WHERE site_id = $1 AND key_id = $2 AND ip = $3', [
    siteId,
    keyId,
    ip,
    now,
  ]);
  return { firstUse: false, sample: true, lastSampledAt: now };
}

/** An audit record waiting in `audit_outbox` for its place in the site's chain (migration 014f). */
export interface AuditOutboxRow {
  outboxId: string;
  siteId: string;
  kind: string;
  actor: string;
  attributes: Record<string, unknown>;
}

/** Inserts a record into the outbox inside the caller's transaction (the mutation's); a second insert of the same id is ignored. */
export async function insertAuditOutbox(tx: Queryable, row: AuditOutboxRow): Promise<void> {
  await tx.query(
    `INSERT INTO audit_outbox (outbox_id, site_id, kind, actor, attributes) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (outbox_id) DO NOTHING`,
    [row.outboxId, row.siteId, row.kind, row.actor, JSON.stringify(storable(row.attributes))],
  );
}

/** Deletes an outbox row inside the caller's transaction and returns it; null when another linker took it first. */
export async function takeAuditOutbox(tx: Queryable, outboxId: string): Promise<AuditOutboxRow | null> {
  const { rows } = await tx.query<{ outbox_id: string; site_id: string; kind: string; actor: string; attributes: Record<string, unknown> }>(
    'DELETE FROM audit_outbox WHERE outbox_id = $1 RETURNING outbox_id, site_id, kind, actor, attributes',
    [outboxId],
  );
  const r = rows[0];
  return r ? { outboxId: r.outbox_id, siteId: r.site_id, kind: r.kind, actor: r.actor, attributes: r.attributes } : null;
}

/** Ids of outbox rows older than `olderThanMs` (their request should have linked them long ago), oldest first. */
export async function staleAuditOutbox(q: Queryable, olderThanMs: number, limit = 500): Promise<string[]> {
  const { rows } = await q.query<{ outbox_id: string }>(
    `SELECT outbox_id FROM audit_outbox WHERE created_at <= now() - $1::float8 * INTERVAL '1 millisecond' ORDER BY created_at LIMIT $2`,
    [olderThanMs, limit],
  );
  return rows.map((r) => r.outbox_id);
}
