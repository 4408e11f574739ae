-- The W3C trace context (`traceparent` header value) a command was queued in: a rollout's dispatch activity
-- or an API request, when tracing is on (docs/observability.md "Traces"). The agent sends it on the requests
-- it makes for that command, so a sync's reports join the rollout's trace. NULL when tracing is off.
ALTER TABLE commands ADD COLUMN IF NOT EXISTS traceparent TEXT;
