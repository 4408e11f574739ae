-- The id of the API request (`X-Request-Id`, `req_…`) a command was queued for: the request that queued it,
-- or the request that started or last steered the workflow whose activity queued it (docs/observability.md
-- "Logs"). The agent logs it on every line about that command, beside the trace id of `traceparent`
-- (migration 019). NULL when no request is known (sweeps, commands queued before this migration).
ALTER TABLE commands ADD COLUMN IF NOT EXISTS request_id TEXT;
