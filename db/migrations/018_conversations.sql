-- Conversations with the fleet assistant (`/api/cortex/conversations`, aliases `/api/chat/*`; db/conversations.ts;
-- docs/decisions/cortex.md). Portable to CockroachDB: text ids, no sequences (message order is a per-conversation
-- counter kept on the conversation row and bumped in the inserting transaction).

-- A conversation: site-wide (machine_id NULL) or narrowed to one machine of the site. Soft delete sets
-- deleted_at; it is recoverable until deleted_at + 30 days, after which the purge sweep removes it with its messages.
CREATE TABLE IF NOT EXISTS conversations (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  conversation_id TEXT NOT NULL,
  machine_id TEXT,
  title TEXT,
  created_by TEXT NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  message_count INT8 NOT NULL DEFAULT 0,
  -- Token usage over every reply (as the model reported it).
  input_tokens INT8 NOT NULL DEFAULT 0,
  output_tokens INT8 NOT NULL DEFAULT 0,
  deleted_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, conversation_id),
  -- Routes address a conversation by id alone; ids are globally unique.
  UNIQUE (conversation_id)
);
CREATE INDEX IF NOT EXISTS conversations_by_creator ON conversations (site_id, created_by, created_at, conversation_id);
CREATE INDEX IF NOT EXISTS conversations_deleted ON conversations (deleted_at) WHERE deleted_at IS NOT NULL;

-- One message of a conversation, in order (`seq` 1, 2, …). A user message carries the digest of the
-- Idempotency-Key scope that sent it: a send with the same key is refused (streams are never replayed).
-- An assistant message is `streaming` while its reply is produced, then `complete`, `interrupted` (the
-- client went away: the partial text is kept) or `failed` (the model failed: `error` says why).
CREATE TABLE IF NOT EXISTS conversation_messages (
  site_id TEXT NOT NULL,
  conversation_id TEXT NOT NULL,
  seq INT8 NOT NULL,
  message_id TEXT NOT NULL,
  role TEXT NOT NULL,                     -- user | assistant
  content TEXT NOT NULL,
  status TEXT NOT NULL,                   -- complete | streaming | interrupted | failed
  tool_calls JSONB NOT NULL DEFAULT '[]',
  error TEXT,
  idempotency_digest TEXT,
  model TEXT,
  input_tokens INT8,
  output_tokens INT8,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  completed_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, conversation_id, seq),
  UNIQUE (message_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS conversation_messages_idempotency
  ON conversation_messages (site_id, conversation_id, idempotency_digest) WHERE idempotency_digest IS NOT NULL;
