/**
 * Conversations with the fleet assistant and their messages (migration 018; `POST /api/cortex/conversations`
 * and the rest of api/routes/conversations.ts; docs/decisions/cortex.md). All SQL of the aggregate.
 *
 * Conversation ids are globally unique (`cnv_<24 hex>`): `locateConversation` is the one query by id alone,
 * every other query names the site. Times are timestamptz (Date); token counts are integers.
 */
import type { Pool } from 'pg';
import { newId } from '../domain/hex';
import { withTx, type Queryable } from './pool';

/** A conversation row. */
export interface ConversationRow {
  site_id: string;
  conversation_id: string;
  machine_id: string | null;
  title: string | null;
  created_by: string;
  created_at: Date;
  updated_at: Date;
  message_count: number;
  input_tokens: number;
  output_tokens: number;
  deleted_at: Date | null;
}

/** Status of a stored message (assistant messages move from `streaming` to one of the others). */
export type MessageStatus = 'complete' | 'streaming' | 'interrupted' | 'failed';

/**
 * One tool call the assistant made while producing a reply, as stored: the tool, its arguments and the
 * outcome. The result itself is not kept (only its size): it was read with the sender's key, and the
 * reply text is what the conversation keeps of it (docs/decisions/cortex.md).
 */
export interface StoredToolCall {
  toolCallId: string;
  toolName: string;
  input: unknown;
  /** Characters of the JSON result the model saw; null when the call failed or never finished. */
  resultChars: number | null;
  error: string | null;
}

/** A message row. */
export interface MessageRow {
  site_id: string;
  conversation_id: string;
  seq: number;
  message_id: string;
  role: 'user' | 'assistant';
  content: string;
  status: MessageStatus;
  tool_calls: StoredToolCall[];
  error: string | null;
  model: string | null;
  input_tokens: number | null;
  output_tokens: number | null;
  created_at: Date;
  completed_at: Date | null;
}

/** A list position: `[created_at as the database prints it, conversation id]`. */
export type ConversationPosition = [string, string];

const COLUMNS = `site_id, conversation_id, machine_id, title, created_by, created_at, updated_at, message_count,
  input_tokens, output_tokens, deleted_at`;

/** Creates a conversation; returns its row. */
export async function insertConversation(
  q: Queryable,
  c: { siteId: string; machineId: string | null; title: string | null; createdBy: string },
): Promise<ConversationRow> {
  const { rows } = await q.query<ConversationRow>(
    `INSERT INTO conversations (site_id, conversation_id, machine_id, title, created_by)
     VALUES ($1, $2, $3, $4, $5) RETURNING ${COLUMNS}`,
    [c.siteId, newId('cnv'), c.machineId, c.title, c.createdBy],
  );
  return rows[0];
}

/** Where a conversation lives (its site and machine), deleted or not; null when no conversation has this id. */
export async function locateConversation(
  q: Queryable,
  conversationId: string,
): Promise<{ siteId: string; machineId: string | null; createdBy: string; deleted: boolean } | null> {
  const { rows } = await q.query<{ site_id: string; machine_id: string | null; created_by: string; deleted_at: Date | null }>(
    'SELECT site_id, machine_id, created_by, deleted_at FROM conversations WHERE conversation_id = $1',
    [conversationId],
  );
  const r = rows[0];
  return r ? { siteId: r.site_id, machineId: r.machine_id, createdBy: r.created_by, deleted: r.deleted_at !== null } : null;
}

/** One conversation of the site; tombstoned ones only with `includeDeleted`. */
export async function getConversation(
  q: Queryable,
  siteId: string,
  conversationId: string,
  opts: { includeDeleted?: boolean; forUpdate?: boolean } = {},
): Promise<ConversationRow | null> {
  const { rows } = await q.query<ConversationRow>(
    `SELECT ${COLUMNS} FROM conversations WHERE site_id = $1 AND conversation_id = $2 ${opts.includeDeleted ? '' : 'AND deleted_at IS NULL'}
     ${opts.forUpdate ? 'FOR UPDATE' : ''}`,
    [siteId, conversationId],
  );
  return rows[0] ?? null;
}

/**
 * One page of `createdBy`'s conversations in the site, newest first (created_at, then id, descending),
 * after `after`. Fetches `limit + 1` rows; `more` says whether another page follows.
 */
export async function listConversations(
  q: Queryable,
  siteId: string,
  opts: { createdBy: string; limit: number; after?: ConversationPosition; includeDeleted: boolean; machineId?: string },
): Promise<{ rows: (ConversationRow & { position: string })[]; more: boolean }> {
  const { rows } = await q.query<ConversationRow & { position: string }>(
    `SELECT ${COLUMNS}, created_at::TEXT AS position FROM conversations
      WHERE site_id = $1 AND created_by = $7
        AND ($2::BOOL OR deleted_at IS NULL)
        AND ($3::TEXT IS NULL OR machine_id = $3)
        AND ($4::TIMESTAMPTZ IS NULL OR (created_at, conversation_id) < ($4::TIMESTAMPTZ, $5::TEXT))
      ORDER BY created_at DESC, conversation_id DESC
      LIMIT $6`,
    [siteId, opts.includeDeleted, opts.machineId ?? null, opts.after?.[0] ?? null, opts.after?.[1] ?? null, opts.limit + 1, opts.createdBy],
  );
  return { rows: rows.slice(0, opts.limit), more: rows.length > opts.limit };
}

/** Sets the title of a live conversation; null when there is none. */
export async function renameConversation(
  q: Queryable,
  siteId: string,
  conversationId: string,
  title: string | null,
): Promise<ConversationRow | null> {
  const { rows } = await q.query<ConversationRow>(
    `UPDATE conversations SET title = $3, updated_at = now()
      WHERE site_id = $1 AND conversation_id = $2 AND deleted_at IS NULL RETURNING ${COLUMNS}`,
    [siteId, conversationId, title],
  );
  return rows[0] ?? null;
}

/**
 * Tombstones a conversation (deleted_at = now) unless it already is. Returns the row and whether it was
 * already deleted; null when the site has no such conversation.
 */
export async function softDeleteConversation(
  pool: Pool,
  siteId: string,
  conversationId: string,
): Promise<{ row: ConversationRow; alreadyDeleted: boolean } | null> {
  return withTx(pool, async (tx) => {
    const row = await getConversation(tx, siteId, conversationId, { includeDeleted: true, forUpdate: true });
    if (!row) return null;
    if (row.deleted_at !== null) return { row, alreadyDeleted: true };
    const { rows } = await tx.query<ConversationRow>(
      `UPDATE conversations SET deleted_at = now() WHERE site_id = $1 AND conversation_id = $2 RETURNING ${COLUMNS}`,
      [siteId, conversationId],
    );
    return { row: rows[0], alreadyDeleted: false };
  });
}

/**
 * Clears the tombstone of a conversation deleted less than `windowSeconds` ago. Returns the row and
 * whether it was deleted (false: it was live, nothing changed); 'expired' when the recovery window has
 * passed (the purge sweep will remove it); null when the site has no such conversation.
 */
export async function restoreConversation(
  pool: Pool,
  siteId: string,
  conversationId: string,
  windowSeconds: number,
): Promise<{ row: ConversationRow; restored: boolean } | 'expired' | null> {
  return withTx(pool, async (tx) => {
    const row = await getConversation(tx, siteId, conversationId, { includeDeleted: true, forUpdate: true });
    if (!row) return null;
    if (row.deleted_at === null) return { row, restored: false };
    const { rows } = await tx.query<ConversationRow>(
      `UPDATE conversations SET deleted_at = NULL, updated_at = now()
        WHERE site_id = $1 AND conversation_id = $2 AND deleted_at > now() - ($3::INT8 * INTERVAL '1 second')
        RETURNING ${COLUMNS}`,
      [siteId, conversationId, windowSeconds],
    );
    return rows.length ? { row: rows[0], restored: true } : 'expired';
  });
}

/** The last `limit` messages of a conversation, oldest first. */
export async function listMessages(q: Queryable, siteId: string, conversationId: string, limit: number): Promise<MessageRow[]> {
  const { rows } = await q.query<MessageRow>(
    `SELECT * FROM (
       SELECT site_id, conversation_id, seq, message_id, role, content, status, tool_calls, error, model, input_tokens,
              output_tokens, created_at, completed_at
         FROM conversation_messages WHERE site_id = $1 AND conversation_id = $2 ORDER BY seq DESC LIMIT $3
     ) AS last ORDER BY seq`,
    [siteId, conversationId, limit],
  );
  return rows;
}

/** What `beginTurn` did. */
export type TurnStart =
  | { kind: 'started'; conversation: ConversationRow; userMessage: MessageRow; assistantMessageId: string }
  | { kind: 'not_found' }
  | { kind: 'busy' }
  | { kind: 'key_used'; messageId: string };

/**
 * Appends a user message and an empty `streaming` assistant message to a live conversation in one
 * transaction (message_count + 2, updated_at = now). Refuses when another reply of the conversation is
 * still streaming (`busy`; one started more than `abandonAfterSeconds` ago counts as interrupted and is
 * closed as such) and when `idempotencyDigest` already sent a message here (`key_used`).
 */
export async function beginTurn(
  pool: Pool,
  t: { siteId: string; conversationId: string; content: string; idempotencyDigest: string; model: string; abandonAfterSeconds: number },
): Promise<TurnStart> {
  return withTx(pool, async (tx) => {
    const conversation = await getConversation(tx, t.siteId, t.conversationId, { forUpdate: true });
    if (!conversation) return { kind: 'not_found' as const };
    const used = await tx.query<{ message_id: string }>(
      `SELECT message_id FROM conversation_messages WHERE site_id = $1 AND conversation_id = $2 AND idempotency_digest = $3`,
      [t.siteId, t.conversationId, t.idempotencyDigest],
    );
    if (used.rows.length) return { kind: 'key_used' as const, messageId: used.rows[0].message_id };
    await tx.query(
      `UPDATE conversation_messages SET status = 'interrupted', completed_at = now(), error = 'the reply was abandoned (server restart)'
        WHERE site_id = $1 AND conversation_id = $2 AND status = 'streaming'
          AND created_at < now() - ($3::INT8 * INTERVAL '1 second')`,
      [t.siteId, t.conversationId, t.abandonAfterSeconds],
    );
    const streaming = await tx.query(
      `SELECT 1 FROM conversation_messages WHERE site_id = $1 AND conversation_id = $2 AND status = 'streaming' LIMIT 1`,
      [t.siteId, t.conversationId],
    );
    if (streaming.rows.length) return { kind: 'busy' as const };
    const seq = conversation.message_count + 1;
    const user = await tx.query<MessageRow>(
      `INSERT INTO conversation_messages (site_id, conversation_id, seq, message_id, role, content, status, idempotency_digest, completed_at)
       VALUES ($1, $2, $3, $4, 'user', $5, 'complete', $6, now()) RETURNING *`,
      [t.siteId, t.conversationId, seq, newId('msg'), t.content, t.idempotencyDigest],
    );
    const assistantMessageId = newId('msg');
    await tx.query(
      `INSERT INTO conversation_messages (site_id, conversation_id, seq, message_id, role, content, status, model)
       VALUES ($1, $2, $3, $4, 'assistant', '', 'streaming', $5)`,
      [t.siteId, t.conversationId, seq + 1, assistantMessageId, t.model],
    );
    const { rows } = await tx.query<ConversationRow>(
      `UPDATE conversations SET message_count = message_count + 2, updated_at = now()
        WHERE site_id = $1 AND conversation_id = $2 RETURNING ${COLUMNS}`,
      [t.siteId, t.conversationId],
    );
    return { kind: 'started' as const, conversation: rows[0], userMessage: user.rows[0], assistantMessageId };
  });
}

/**
 * Closes a streaming assistant message with its final text, status, tool calls, error and token usage, and
 * adds the usage to the conversation's totals (updated_at = now), in one transaction. A message no longer
 * streaming is left as it is (returns false).
 */
export async function finishTurn(
  pool: Pool,
  f: {
    siteId: string;
    conversationId: string;
    messageId: string;
    content: string;
    status: Exclude<MessageStatus, 'streaming'>;
    toolCalls: StoredToolCall[];
    error: string | null;
    inputTokens: number;
    outputTokens: number;
  },
): Promise<boolean> {
  return withTx(pool, async (tx) => {
    const { rowCount } = await tx.query(
      `UPDATE conversation_messages
          SET content = $4, status = $5, tool_calls = $6, error = $7, input_tokens = $8, output_tokens = $9, completed_at = now()
        WHERE site_id = $1 AND conversation_id = $2 AND message_id = $3 AND status = 'streaming'`,
      [f.siteId, f.conversationId, f.messageId, f.content, f.status, JSON.stringify(f.toolCalls), f.error, f.inputTokens, f.outputTokens],
    );
    if (!rowCount) return false;
    await tx.query(
      `UPDATE conversations SET input_tokens = input_tokens + $3, output_tokens = output_tokens + $4, updated_at = now()
        WHERE site_id = $1 AND conversation_id = $2`,
      [f.siteId, f.conversationId, f.inputTokens, f.outputTokens],
    );
    return true;
  });
}

/**
 * Purges up to `limit` conversations tombstoned more than `windowSeconds` ago, with their messages (one
 * transaction per conversation, re-checking the tombstone so a restore in between wins). Returns how many
 * were purged and whether a full batch suggests more.
 */
export async function purgeExpiredConversations(
  pool: Pool,
  windowSeconds: number,
  limit: number,
): Promise<{ purged: number; more: boolean }> {
  const { rows } = await pool.query<{ site_id: string; conversation_id: string }>(
    `SELECT site_id, conversation_id FROM conversations
      WHERE deleted_at IS NOT NULL AND deleted_at < now() - ($1::INT8 * INTERVAL '1 second')
      ORDER BY deleted_at LIMIT $2`,
    [windowSeconds, limit],
  );
  let purged = 0;
  for (const r of rows) {
    const done = await withTx(pool, async (tx) => {
      const gone = await tx.query(
        `DELETE FROM conversations WHERE site_id = $1 AND conversation_id = $2
            AND deleted_at IS NOT NULL AND deleted_at < now() - ($3::INT8 * INTERVAL '1 second')`,
        [r.site_id, r.conversation_id, windowSeconds],
      );
      if (!gone.rowCount) return false;
      await tx.query('DELETE FROM conversation_messages WHERE site_id = $1 AND conversation_id = $2', [r.site_id, r.conversation_id]);
      return true;
    });
    if (done) purged++;
  }
  return { purged, more: rows.length === limit };
}
