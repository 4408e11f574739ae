/**
 * Configuration, read once from the environment through a TypeBox schema (docs/architecture.md: only configuration
 * differs between the embedded default and production, never code paths).
 *
 * Call `loadConfig()` at process start; nothing reads the environment at module load.
 */
import path from 'node:path';
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';

const Port = Type.Integer({ minimum: 1, maximum: 65535 });

export const EnvSchema = Type.Object({
  /** Folder holding every piece of local state (PostgreSQL cluster, Azurite files, Temporal SQLite, tools). */
  ROOST_DATA_DIR: Type.String({ default: path.resolve(__dirname, '..', '.data') }),
  /** Port the API listens on. */
  ROOST_API_PORT: Type.Integer({ minimum: 0, maximum: 65535, default: 8080 }),
  /** Host the API binds to. */
  ROOST_API_HOST: Type.String({ default: '127.0.0.1' }),
  /** Public base URL of the API, used in problem `type` URIs and docs links. Defaults to http://ROOST_API_HOST:ROOST_API_PORT. */
  ROOST_PUBLIC_URL: Type.Optional(Type.String()),
  /** PostgreSQL/CockroachDB connection string. When unset the embedded cluster on ROOST_PG_PORT is used. */
  DATABASE_URL: Type.Optional(Type.String()),
  /**
   * The API's longest wait for one database statement's answer (ms; pg `query_timeout`): a database that stops
   * answering (frozen, or a network path that drops packets) fails the request with 503 service_unavailable
   * instead of holding it open (docs/decisions/outages.md). The worker and the CLI set none.
   */
  ROOST_DB_QUERY_TIMEOUT_MS: Type.Integer({ minimum: 100, maximum: 3_600_000, default: 30_000 }),
  /** The API's longest wait for a new database connection to be set up (ms; pg `connectionTimeoutMillis` of each client). */
  ROOST_DB_CONNECT_TIMEOUT_MS: Type.Integer({ minimum: 100, maximum: 600_000, default: 10_000 }),
  /** Port of the embedded PostgreSQL cluster. */
  ROOST_PG_PORT: Port,
  /** Database name on the embedded cluster. */
  ROOST_PG_DATABASE: Type.String({ default: 'roost' }),
  /** Azure Storage connection string (shared key). When unset and AZURE_STORAGE_ACCOUNT_URL is unset, the embedded Azurite is used. */
  AZURE_STORAGE_CONNECTION_STRING: Type.Optional(Type.String()),
  /** Azure Storage account URL for Entra ID (DefaultAzureCredential) with user-delegation SAS. */
  AZURE_STORAGE_ACCOUNT_URL: Type.Optional(Type.String()),
  /** Port of the embedded Azurite blob service. */
  ROOST_AZURITE_PORT: Port,
  /** Temporal frontend address host:port. */
  TEMPORAL_ADDRESS: Type.Optional(Type.String()),
  /** Temporal namespace. */
  TEMPORAL_NAMESPACE: Type.String({ default: 'default' }),
  /** Port of the embedded Temporal dev server frontend. */
  ROOST_TEMPORAL_PORT: Port,
  /** Port of the embedded Temporal Web UI. */
  ROOST_TEMPORAL_UI_PORT: Port,
  /** Base URL of the Temporal Web UI (for workflow links). Defaults to the embedded UI. */
  TEMPORAL_UI_URL: Type.Optional(Type.String()),
  /** Task queue served by the worker. */
  ROOST_TASK_QUEUE: Type.String({ default: 'roost' }),
  /**
   * Classic deployments (docs/decisions/classic-deployments.md): ms between the workflow's reconcile passes over
   * agent reports. Each pass heartbeats, so the bound stays below the drive activity's 15 s heartbeat timeout.
   */
  ROOST_CLASSIC_POLL_MS: Type.Integer({ minimum: 20, maximum: 10000, default: 1000 }),
  /** Most concurrent installs of a `parallel_install` classic deployment (serial deployments run one at a time). */
  ROOST_CLASSIC_PARALLELISM: Type.Integer({ minimum: 1, maximum: 10000, default: 50 }),
  /** Seconds without a heartbeat after which a machine counts as offline. */
  ROOST_HEARTBEAT_STALE_SECONDS: Type.Integer({ minimum: 5, default: 90 }),
  /**
   * Seconds between the API's passes over rollouts and classic deployments whose workflow start was lost to a
   * killed API process (api/lost-starts.ts; docs/decisions/outages.md); 0 turns the pass off.
   */
  ROOST_LOST_START_PASS_SECONDS: Type.Integer({ minimum: 0, default: 60 }),
  /** Background sweeps (docs/decisions/sweeps.md): seconds between heartbeat-staleness runs (machine.offline). */
  ROOST_SWEEP_STALENESS_INTERVAL_SECONDS: Type.Integer({ minimum: 1, default: 30 }),
  /** Seconds between chunk garbage-collection runs (chunk.garbage_collected). */
  ROOST_SWEEP_CHUNK_GC_INTERVAL_SECONDS: Type.Integer({ minimum: 1, default: 3600 }),
  /** Seconds between chunk verification runs (chunk.verify_failed). */
  ROOST_SWEEP_CHUNK_VERIFY_INTERVAL_SECONDS: Type.Integer({ minimum: 1, default: 600 }),
  /** Seconds between key expiry runs (api_key.expired). */
  ROOST_SWEEP_KEY_EXPIRY_INTERVAL_SECONDS: Type.Integer({ minimum: 1, default: 300 }),
  /** Chunks re-hashed per verification run (the sample), never-verified and oldest-verified first. */
  ROOST_SWEEP_CHUNK_VERIFY_SAMPLE: Type.Integer({ minimum: 1, maximum: 100000, default: 128 }),
  /** docs/contract.md Limits: seconds a chunk stays unreferenced (or unreferenced since upload) before collection. Default 30 days. */
  ROOST_CHUNK_GC_GRACE_SECONDS: Type.Integer({ minimum: 0, default: 2592000 }),
  /**
   * Seconds between a chunk's condemnation (row removed, blob kept) and its blob's deletion: longer than
   * any publish takes between checking chunk presence and committing (docs/decisions/sweeps.md). Default 1 hour.
   */
  ROOST_CHUNK_GC_SAFETY_SECONDS: Type.Integer({ minimum: 0, default: 3600 }),
  /** Secret from which `roost admin bootstrap` derives its reproducible key. Embedded default: a random secret kept in DATA/bootstrap-secret. */
  ROOST_BOOTSTRAP_SECRET: Type.Optional(Type.String({ minLength: 16 })),
  /**
   * Key that seals secrets at rest (webhook signing secrets, per-site manifest signing keys): 32 bytes as
   * 64 hex chars or base64. Embedded default: a random key kept in DATA/secret-key (config/secrets.ts).
   */
  ROOST_SECRET_KEY: Type.Optional(Type.String({ minLength: 32 })),
  /**
   * Whether worker start-up (worker/main.ts, `roost stack`, the demo) ensures the background workflows of
   * its task queue: the event relay (webhook fan-out) and the sweep schedules (worker/background.ts).
   */
  ROOST_BACKGROUND_WORKFLOWS: Type.Boolean({ default: true }),
  /** How often a rollout's wave watcher polls the database for agent reports (ms; stored with each new rollout). */
  ROOST_ROLLOUT_POLL_MS: Type.Integer({ minimum: 50, maximum: 60_000, default: 2000 }),
  /**
   * Prefix of every blob container name (lowercase letters, digits, hyphens). Unset in production; each
   * test run sets its own and deletes its containers at the end, so runs leave no blobs behind.
   */
  ROOST_BLOB_CONTAINER_PREFIX: Type.Optional(Type.String({ pattern: '^[a-z0-9][a-z0-9-]{0,30}$' })),
  /** Log level for the API (pino levels). */
  ROOST_LOG_LEVEL: Type.String({ default: 'warn' }),
  /**
   * Rate-limit counter store (docs/contract.md Limits; docs/decisions/rate-limit-store.md). `memory`: per-process
   * counters (the embedded default). `redis`: counters shared by every API process, in ROOST_REDIS_URL.
   */
  ROOST_RATE_LIMIT_STORE: Type.Union([Type.Literal('memory'), Type.Literal('redis')], { default: 'memory' }),
  /** Redis URL of the shared rate-limit store. Unset with ROOST_RATE_LIMIT_STORE=redis: the embedded redis-server on ROOST_REDIS_PORT. */
  ROOST_REDIS_URL: Type.Optional(Type.String({ minLength: 1 })),
  /** Port of the embedded redis-server (started only when ROOST_RATE_LIMIT_STORE=redis and ROOST_REDIS_URL is unset). */
  ROOST_REDIS_PORT: Type.Integer({ minimum: 1, maximum: 65535, default: 56379 }),
  /** Which of the spec's rate-limit numbers apply where they differ (tokenExchange, upload). */
  ROOST_RATE_LIMIT_PROFILE: Type.Union([Type.Literal('production'), Type.Literal('development')], { default: 'production' }),
  /** Multiplies every rate limit (the fallback's too); 1 keeps the spec's numbers. The test suite runs with a large factor. */
  ROOST_RATE_LIMIT_SCALE: Type.Number({ exclusiveMinimum: 0, default: 1 }),
  /**
   * JSON object replacing individual limits, e.g. `{"api":{"points":5,"durationSeconds":60},
   * "MACHINE_EXEC_COMMAND":{"user":2},"fallback":{"points":15}}` (api/ratelimit/buckets.ts).
   */
  ROOST_RATE_LIMIT_OVERRIDES: Type.Optional(Type.String({ minLength: 1 })),
  /**
   * JSON object of storage limits in bytes per site tier, merged over the defaults (db/quota.ts
   * DEFAULT_QUOTA_TIERS: free 10 GiB, standard 100 GiB, pro 1 TiB, enterprise 10 TiB). A tier missing
   * from the map gets the `standard` limit.
   */
  ROOST_QUOTA_TIERS: Type.Optional(Type.String({ minLength: 1 })),
  /**
   * OIDC issuer (`iss`) whose ID tokens are accepted. Unset: the embedded local issuer (config/oidc.ts, key
   * pair under DATA/oidc, issuer = the public URL, JWKS at /.well-known/jwks.json). Set with ROOST_OIDC_JWKS_URL.
   */
  ROOST_OIDC_ISSUER: Type.Optional(Type.String({ minLength: 1 })),
  /** JWKS URL of ROOST_OIDC_ISSUER (keys fetched over HTTPS and cached). Required when ROOST_OIDC_ISSUER is set. */
  ROOST_OIDC_JWKS_URL: Type.Optional(Type.String({ minLength: 1 })),
  /** Audience (`aud`) ID tokens must carry. Default `roost`. */
  ROOST_OIDC_AUDIENCE: Type.String({ minLength: 1, default: 'roost' }),
  /**
   * The active-superadmin floor: `POST /api/users/{uid}/demote` and `DELETE /api/users/{uid}` refuse
   * (409 last_superadmin) to leave fewer active superadmins than this. Default 1.
   */
  ROOST_SUPERADMIN_FLOOR: Type.Integer({ minimum: 0, maximum: 100, default: 1 }),
  /** Lifetime of a first-party session (`sst_`) in minutes, from its creation (not sliding). Default 12 hours. */
  ROOST_SESSION_TTL_MINUTES: Type.Integer({ minimum: 1, maximum: 43200, default: 720 }),
  /**
   * Audit sampling of API-key use (docs/decisions/audit-key-use.md): an `api_key_used` record is appended
   * at most once per this many seconds per site, key and client address. Default one hour.
   */
  ROOST_AUDIT_KEY_USE_SAMPLE_SECONDS: Type.Integer({ minimum: 1, default: 3600 }),
  /**
   * Rollouts (docs/decisions/outages.md): a sync whose agent took its command but has reported no progress
   * for this many milliseconds, watched that long without a break by the rollout's watcher, is given up and
   * re-dispatched within the retry budget. Default 2 minutes.
   */
  ROOST_COMMAND_STALL_MS: Type.Integer({ minimum: 1000, default: 120000 }),
  /**
   * Idempotency-Key reservations (docs/decisions/idempotency-concurrency.md): a keyed request holds its key
   * for this many milliseconds and renews the lease every third of it while it runs, so the key of a request
   * whose process died is free again this long after its last renewal. Default 10 seconds.
   */
  ROOST_IDEMPOTENCY_LEASE_MS: Type.Integer({ minimum: 300, maximum: 600000, default: 10000 }),
  /**
   * Webhooks (docs/decisions/webhook-urls.md): allow delivery URLs that resolve to loopback, private,
   * link-local or other non-public addresses, and plain http. Off in production; tests and local
   * development turn it on.
   */
  ROOST_WEBHOOK_ALLOW_PRIVATE: Type.Boolean({ default: false }),
  /** Webhooks: attempts per delivery run (the first included) before the delivery counts as failed. */
  ROOST_WEBHOOK_MAX_ATTEMPTS: Type.Integer({ minimum: 1, maximum: 50, default: 12 }),
  /** Webhooks: delay before the second attempt, milliseconds; it doubles per attempt up to ROOST_WEBHOOK_RETRY_MAX_MS. */
  ROOST_WEBHOOK_RETRY_INITIAL_MS: Type.Integer({ minimum: 10, default: 30000 }),
  /** Webhooks: longest delay between two attempts, milliseconds (default 1 hour). */
  ROOST_WEBHOOK_RETRY_MAX_MS: Type.Integer({ minimum: 10, default: 3600000 }),
  /** Webhooks: timeout of one delivery POST, milliseconds (connect to last response byte). */
  ROOST_WEBHOOK_TIMEOUT_MS: Type.Integer({ minimum: 100, maximum: 60000, default: 10000 }),
  /** Webhooks: consecutive failed deliveries (each after all its attempts) that pause a subscription. */
  ROOST_WEBHOOK_PAUSE_AFTER_FAILURES: Type.Integer({ minimum: 1, maximum: 1000, default: 5 }),
  /** Event relay: milliseconds between two polls of the outbox for webhook fan-out. */
  ROOST_WEBHOOK_RELAY_POLL_MS: Type.Integer({ minimum: 20, maximum: 20000, default: 400 }),
  /** Event relay: seconds one relay activity runs before the workflow continues as new (bounded history). */
  ROOST_WEBHOOK_RELAY_RUN_SECONDS: Type.Integer({ minimum: 1, maximum: 600, default: 240 }),
  /**
   * Observability (docs/observability.md): bearer token that `GET /metrics` on the API listener requires.
   * Unset: `/metrics` on the API listener answers 404 (use ROOST_METRICS_PORT instead).
   */
  ROOST_METRICS_TOKEN: Type.Optional(Type.String({ minLength: 16 })),
  /**
   * Port of a separate, unauthenticated metrics listener (`GET /metrics` only) on ROOST_METRICS_HOST, in
   * every API and worker process (0 picks a free port). Unset: no separate listener.
   */
  ROOST_METRICS_PORT: Type.Optional(Type.Integer({ minimum: 0, maximum: 65535 })),
  /**
   * Most distinct `site` label values a process gives `roost_machine_reports_total` (the first sites to report);
   * reports of later sites count under `site="_other"`. Bounds that family to (this + 1) × 3 series per process.
   */
  ROOST_METRICS_MAX_SITES: Type.Integer({ minimum: 0, maximum: 10000, default: 100 }),
  /** Address the separate metrics listener binds to. Default loopback: expose it to the scraper on purpose. */
  ROOST_METRICS_HOST: Type.String({ default: '127.0.0.1' }),
  /**
   * host:port the Temporal SDK's own Prometheus exporter binds to in worker processes (its `temporal_*`
   * runtime metrics: task slots, polls, activity and workflow latencies by type). Unset: off.
   */
  ROOST_TEMPORAL_METRICS_ADDRESS: Type.Optional(Type.String({ pattern: '^[^\\s:]+:[0-9]{1,5}$|^\\[[0-9a-fA-F:]+\\]:[0-9]{1,5}$' })),
  /** Event stream (docs/contract.md "Event stream", Limits): milliseconds between two `keepalive` frames of one client. Default about 15 s. */
  ROOST_STREAM_KEEPALIVE_MS: Type.Integer({ minimum: 50, maximum: 300000, default: 15000 }),
  /** Event stream: milliseconds between two polls of the outbox per site with connected clients (each API process polls its own). */
  ROOST_STREAM_POLL_MS: Type.Integer({ minimum: 10, maximum: 60000, default: 250 }),
  /** Event stream: unsent bytes per client above which the stream stops writing to it (it falls behind and catches up from the database once drained). */
  ROOST_STREAM_CLIENT_BUFFER_BYTES: Type.Integer({ minimum: 1024, default: 1048576 }),
  /** Event stream: a client whose unsent bytes stay above ROOST_STREAM_CLIENT_BUFFER_BYTES this long (ms) is dropped; it resumes with Last-Event-ID. */
  ROOST_STREAM_STALL_MS: Type.Integer({ minimum: 100, default: 30000 }),
  /**
   * Fleet assistant (`/api/cortex/conversations`; docs/decisions/cortex.md): which model answers sends.
   * `local` (default): the built-in retrieval assistant, which answers from the fleet tools' results without a
   * language model; `openai-compatible`: an OpenAI-compatible chat completions endpoint (llama.cpp's
   * llama-server, vLLM, Ollama, Azure OpenAI's /openai/v1) at ROOST_CORTEX_BASE_URL; `none`: sends answer 503
   * cortex_unavailable (everything else of the conversations works).
   */
  ROOST_CORTEX_PROVIDER: Type.Union([Type.Literal('local'), Type.Literal('openai-compatible'), Type.Literal('none')], {
    default: 'local',
  }),
  /** Base URL of the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8081/v1 (required with `openai-compatible`). */
  ROOST_CORTEX_BASE_URL: Type.Optional(Type.String({ minLength: 1 })),
  /** Model id sent to the endpoint (an Azure OpenAI deployment name there); required with `openai-compatible`. */
  ROOST_CORTEX_MODEL: Type.Optional(Type.String({ minLength: 1 })),
  /** API key of the endpoint (optional for local servers). */
  ROOST_CORTEX_API_KEY: Type.Optional(Type.String({ minLength: 1 })),
  /** Header carrying ROOST_CORTEX_API_KEY: `authorization` (Bearer, the default) or `api-key` (Azure OpenAI). */
  ROOST_CORTEX_API_KEY_HEADER: Type.Union([Type.Literal('authorization'), Type.Literal('api-key')], { default: 'authorization' }),
  /** Most model steps (tool-call rounds plus the answer) of one reply. */
  ROOST_CORTEX_MAX_STEPS: Type.Integer({ minimum: 1, maximum: 20, default: 6 }),
  /** Milliseconds one reply may take before it is ended with a `3:` error frame (stored as failed). */
  ROOST_CORTEX_REPLY_TIMEOUT_MS: Type.Integer({ minimum: 1000, maximum: 600000, default: 120000 }),
  /** docs/contract.md Limits: seconds a deleted conversation stays recoverable before the purge sweep removes it. Default 30 days. */
  ROOST_CONVERSATION_RECOVERY_SECONDS: Type.Integer({ minimum: 0, default: 2592000 }),
  /** Seconds between conversation purge sweep runs. */
  ROOST_SWEEP_CONVERSATION_PURGE_INTERVAL_SECONDS: Type.Integer({ minimum: 1, default: 3600 }),
});

export type Env = Static<typeof EnvSchema>;

/** Resolved configuration: the raw env plus derived connection settings. */
export interface Config extends Env {
  databaseUrl: string;
  temporalAddress: string;
  temporalUiUrl: string;
  publicUrl: string;
  /** Embedded default: true when this process (or `roost stack`) owns the local services. */
  embedded: { postgres: boolean; azurite: boolean; temporal: boolean };
}

const DEFAULT_PORTS = {
  ROOST_PG_PORT: 55432,
  ROOST_AZURITE_PORT: 10000,
  ROOST_TEMPORAL_PORT: 7233,
  ROOST_TEMPORAL_UI_PORT: 8233,
};

/**
 * Reads and validates the environment. Throws an Error naming each invalid variable.
 * @param source defaults to process.env; tests pass overrides.
 */
export function loadConfig(source: NodeJS.ProcessEnv = process.env): Config {
  const raw: Record<string, unknown> = { ...DEFAULT_PORTS };
  for (const key of Object.keys(EnvSchema.properties)) {
    const v = source[key];
    if (v !== undefined && v !== '') raw[key] = v;
  }
  const withDefaults = Value.Default(EnvSchema, raw);
  const converted = Value.Convert(EnvSchema, withDefaults);
  const errors = [...Value.Errors(EnvSchema, converted)];
  if (errors.length > 0) {
    throw new Error(`invalid configuration: ${errors.map((e) => `${e.path.slice(1)} ${e.message}`).join('; ')}`);
  }
  const env = converted as Env;
  const databaseUrl = env.DATABASE_URL ?? `postgres://roost@127.0.0.1:${env.ROOST_PG_PORT}/${env.ROOST_PG_DATABASE}`;
  const temporalAddress = env.TEMPORAL_ADDRESS ?? `127.0.0.1:${env.ROOST_TEMPORAL_PORT}`;
  return {
    ...env,
    databaseUrl,
    temporalAddress,
    temporalUiUrl: env.TEMPORAL_UI_URL ?? `http://127.0.0.1:${env.ROOST_TEMPORAL_UI_PORT}`,
    publicUrl: env.ROOST_PUBLIC_URL ?? `http://${env.ROOST_API_HOST}:${env.ROOST_API_PORT}`,
    embedded: {
      postgres: env.DATABASE_URL === undefined,
      azurite: env.AZURE_STORAGE_CONNECTION_STRING === undefined && env.AZURE_STORAGE_ACCOUNT_URL === undefined,
      temporal: env.TEMPORAL_ADDRESS === undefined,
    },
  };
}

/** Azurite's well-known development account (public, documented by Microsoft). */
export const AZURITE_ACCOUNT = 'devstoreaccount1';
export const AZURITE_KEY = 'Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==';

/** Connection string of the embedded Azurite blob endpoint. */
export function azuriteConnectionString(port: number): string {
  return `DefaultEndpointsProtocol=http;AccountName=${AZURITE_ACCOUNT};AccountKey=${AZURITE_KEY};BlobEndpoint=http://127.0.0.1:${port}/${AZURITE_ACCOUNT};`;
}
