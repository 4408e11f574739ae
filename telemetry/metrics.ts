/**
 * Prometheus metrics of a Roost process (docs/observability.md lists every series, its labels and their
 * bounds). One prom-client registry per process: the API and the worker add their series to it, the API's
 * `GET /metrics` (api/plugins/metrics.ts) and the separate listener of `startMetricsListener` serve it.
 *
 * Labels are bounded by construction: route templates (never raw URLs), HTTP methods, status classes,
 * rate-limit bucket and capability names, activity and workflow type names, fixed outcome words and site
 * ids (one value per site that reports, at most ROOST_METRICS_MAX_SITES of them, then `_other`: siteLabel).
 * Nothing here carries a machine id, a key or a request id.
 */
import type { EventEmitter } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import client, { Counter, Gauge, Histogram, type Registry } from 'prom-client';

/** The process registry (prom-client's default one, so default Node.js metrics land here too). */
export const registry: Registry = client.register;

/** Histogram buckets for request and activity durations, seconds (5 ms … 30 s). */
export const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** Returns the metric of that name when already registered (hot reload, several apps per process), else creates it. */
function once<T>(name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

let defaultsOn = false;
/** Registers Node.js process metrics (CPU, memory, event-loop lag, GC) once per process, prefixed `roost_`. */
export function collectProcessMetrics(): void {
  if (defaultsOn) return;
  defaultsOn = true;
  if (registry.getSingleMetric('roost_process_cpu_seconds_total')) return;
  client.collectDefaultMetrics({ register: registry, prefix: 'roost_' });
}

// ---------------------------------------------------------------- API

/** `roost_http_requests_total{method,route,status_class}`: every answered request. */
export const httpRequests = once(
  'roost_http_requests_total',
  () =>
    new Counter({
      name: 'roost_http_requests_total',
      help: 'HTTP requests answered by the API, by method, route template and status class (2xx, 4xx, ...)',
      labelNames: ['method', 'route', 'status_class'] as const,
    }),
);

/** `roost_http_request_duration_seconds{method,route,status_class}`: time from request start to response sent. */
export const httpDuration = once(
  'roost_http_request_duration_seconds',
  () =>
    new Histogram({
      name: 'roost_http_request_duration_seconds',
      help: 'Time from receiving a request to its response being sent, seconds, by method, route template and status class',
      labelNames: ['method', 'route', 'status_class'] as const,
      buckets: DURATION_BUCKETS,
    }),
);

/** `roost_rate_limit_refusals_total{bucket}`: 429 answers by the bucket or capability that refused. */
export const rateLimitRefusals = once(
  'roost_rate_limit_refusals_total',
  () =>
    new Counter({
      name: 'roost_rate_limit_refusals_total',
      help: 'Requests refused with 429 rate_limited, by counter (bucket:<name> or capability:<NAME>)',
      labelNames: ['bucket'] as const,
    }),
);

/** `roost_idempotency_replays_total{route}`: responses replayed for a repeated Idempotency-Key. */
export const idempotencyReplays = once(
  'roost_idempotency_replays_total',
  () =>
    new Counter({
      name: 'roost_idempotency_replays_total',
      help: 'Responses replayed from the idempotency store (Idempotent-Replayed: true), by route template',
      labelNames: ['route'] as const,
    }),
);

// ---------------------------------------------------------------- database

/** `roost_db_tx_retries_total{pool,code}`: SERIALIZABLE transactions retried after 40001/40P01. */
export const txRetries = once(
  'roost_db_tx_retries_total',
  () =>
    new Counter({
      name: 'roost_db_tx_retries_total',
      help: 'Transactions retried by withTx after a serialization failure or deadlock, by pool and SQLSTATE',
      labelNames: ['pool', 'code'] as const,
    }),
);

/** A PostgreSQL pool as `pg` exposes its counts (an EventEmitter: db/pool.ts emits `txRetry` on it). */
export interface PoolLike {
  totalCount: number;
  idleCount: number;
  waitingCount: number;
  options?: { max?: number };
}

const pools = new Map<PoolLike, string>();

/** `roost_db_pool_connections{pool,state}`: connections of the process's pools (total, idle, waiting clients, max). */
export const poolConnections = once(
  'roost_db_pool_connections',
  () =>
    new Gauge({
      name: 'roost_db_pool_connections',
      help: 'PostgreSQL pool connections by pool (api, worker) and state: total, idle, waiting (clients queued for a connection), max',
      labelNames: ['pool', 'state'] as const,
      collect() {
        this.reset();
        for (const [pool, name] of pools) {
          this.set({ pool: name, state: 'total' }, pool.totalCount);
          this.set({ pool: name, state: 'idle' }, pool.idleCount);
          this.set({ pool: name, state: 'waiting' }, pool.waitingCount);
          this.set({ pool: name, state: 'max' }, pool.options?.max ?? 0);
        }
      },
    }),
);

/**
 * Reports a pool's connection counts and its transaction retries (db/pool.ts emits `txRetry`) under
 * `name` (a fixed word: `api`, `worker`). Returns a function that stops reporting it (call on close).
 */
export function observePool(pool: PoolLike, name: string): () => void {
  const onRetry = (info: { code: string }) => txRetries.inc({ pool: name, code: info.code });
  const emitter = pool as unknown as EventEmitter;
  emitter.on('txRetry', onRetry);
  pools.set(pool, name);
  // Make sure the series exist at 0 before the first retry.
  txRetries.inc({ pool: name, code: '40001' }, 0);
  return () => {
    pools.delete(pool);
    emitter.off('txRetry', onRetry);
  };
}

// ---------------------------------------------------------------- event stream

const streamSources = new Set<() => number>();

/** `roost_event_stream_connections`: clients connected to `GET /api/sites/{siteId}/events` in this process. */
export const streamConnections = once(
  'roost_event_stream_connections',
  () =>
    new Gauge({
      name: 'roost_event_stream_connections',
      help: 'Event-stream (server-sent events) clients connected to this process',
      collect() {
        let n = 0;
        for (const count of streamSources) n += count();
        this.set(n);
      },
    }),
);

/** Adds a source of connected event-stream clients (an API app's hub); returns its removal. */
export function observeStreamConnections(count: () => number): () => void {
  streamSources.add(count);
  return () => streamSources.delete(count);
}

// ---------------------------------------------------------------- worker

/** `roost_activity_duration_seconds{activity,outcome}`: each activity execution (attempt) run by this worker. */
export const activityDuration = once(
  'roost_activity_duration_seconds',
  () =>
    new Histogram({
      name: 'roost_activity_duration_seconds',
      help: 'Activity executions (each attempt) run by this worker, seconds, by activity type and outcome (completed, failed, cancelled)',
      labelNames: ['activity', 'outcome'] as const,
      buckets: DURATION_BUCKETS,
    }),
);

/** `roost_activity_failures_total{activity,failure}`: failed activity attempts by type and failure kind. */
export const activityFailures = once(
  'roost_activity_failures_total',
  () =>
    new Counter({
      name: 'roost_activity_failures_total',
      help: 'Failed activity attempts by activity type and failure: the ApplicationFailure type the code names, else cancelled, timeout or error',
      labelNames: ['activity', 'failure'] as const,
    }),
);

// ---------------------------------------------------------------- business

/** `roost_webhook_attempts_total{outcome}`: delivery POSTs: succeeded, failed (will retry or give up), refused (address rules), skipped. */
export const webhookAttempts = once(
  'roost_webhook_attempts_total',
  () =>
    new Counter({
      name: 'roost_webhook_attempts_total',
      help: 'Webhook delivery attempts by outcome: succeeded (2xx), failed (non-2xx, timeout, network), refused (address rules), skipped (subscription gone, disabled or paused)',
      labelNames: ['outcome'] as const,
    }),
);

/** `roost_webhook_deliveries_total{outcome}`: deliveries that ended: delivered or failed (after all attempts). */
export const webhookDeliveries = once(
  'roost_webhook_deliveries_total',
  () =>
    new Counter({
      name: 'roost_webhook_deliveries_total',
      help: 'Webhook deliveries that ended, by outcome: delivered (an attempt got a 2xx) or failed (attempts exhausted or refused)',
      labelNames: ['outcome'] as const,
    }),
);

/** `roost_sweep_items_total{sweep,result}`: what the background sweeps did (docs/decisions/sweeps.md). */
export const sweepItems = once(
  'roost_sweep_items_total',
  () =>
    new Counter({
      name: 'roost_sweep_items_total',
      help: 'Items handled by the background sweeps, by sweep activity and result (processed, emitted, scanned, condemned, reclaimed, …)',
      labelNames: ['sweep', 'result'] as const,
    }),
);

/** `roost_chunk_bytes_total{direction}`: `uploaded` (new chunks recorded at publish), `served` (bytes agents report fetched). */
export const chunkBytes = once(
  'roost_chunk_bytes_total',
  () =>
    new Counter({
      name: 'roost_chunk_bytes_total',
      help: 'Chunk bytes: uploaded (new chunks recorded by publish after their stored size was checked) and served (bytes agents report they fetched for a sync)',
      labelNames: ['direction'] as const,
    }),
);

/** The `site` label value that counts every site past the cap (ROOST_METRICS_MAX_SITES); no site id starts with `_`. */
export const OTHER_SITES = '_other';

/** Sites that have their own `site` label value in this process, in the order they first reported. */
const labelledSites = new Set<string>();

/**
 * The `site` label value for `siteId`: the site id itself for the first `maxSites` distinct sites this
 * process counts, OTHER_SITES for every later one, so a metric labelled by site has at most `maxSites` + 1
 * values per process (docs/observability.md "Labels and cardinality").
 */
export function siteLabel(siteId: string, maxSites: number): string {
  if (labelledSites.has(siteId)) return siteId;
  if (labelledSites.size >= maxSites) return OTHER_SITES;
  labelledSites.add(siteId);
  return siteId;
}

/** `roost_machine_reports_total{site,status}`: agents' target-state reports (committed, failed, cancelled, …) per site (capped: siteLabel). */
export const machineReports = once(
  'roost_machine_reports_total',
  () =>
    new Counter({
      name: 'roost_machine_reports_total',
      help: 'Target-state reports of agents (a machine committed or failed a version), by site and reported status',
      labelNames: ['site', 'status'] as const,
    }),
);

/** Rows of `roost_rollouts`: how many rollouts are at each stage and control state. */
export interface RolloutCount {
  stage: string;
  state: string;
  count: number;
}

const rolloutSources = new Set<() => Promise<RolloutCount[]>>();

/** `roost_rollouts{stage,state}`: rollouts by stage and control state, read from the database at scrape time. */
export const rollouts = once(
  'roost_rollouts',
  () =>
    new Gauge({
      name: 'roost_rollouts',
      help: 'Rollouts by stage (canary, started, completed, failed) and control state (running, paused, awaiting_promotion, …), all sites; read from the database at scrape',
      labelNames: ['stage', 'state'] as const,
      async collect() {
        this.reset();
        // One source is enough (every API process reads the same database): the first that answers.
        for (const source of rolloutSources) {
          try {
            for (const r of await source()) this.set({ stage: r.stage, state: r.state }, r.count);
            return;
          } catch {
            /* database unreachable: no series this scrape (readiness reports the outage) */
          }
        }
      },
    }),
);

/** Adds a source of rollout counts (an API app's database); returns its removal. */
export function observeRollouts(source: () => Promise<RolloutCount[]>): () => void {
  rolloutSources.add(source);
  return () => rolloutSources.delete(source);
}

// ---------------------------------------------------------------- serving

/** The exposition text of the process registry and its content type. */
export async function metricsText(): Promise<{ contentType: string; body: string }> {
  return { contentType: registry.contentType, body: await registry.metrics() };
}

/** A running metrics listener. */
export interface MetricsListener {
  /** `http://host:port/metrics` */
  url: string;
  close(): Promise<void>;
}

/**
 * Serves `GET /metrics` (the process registry, no authentication: bind it to a private address) on
 * `host:port`; port 0 picks a free one. Everything else is 404.
 * @throws when the address cannot be bound.
 */
export async function startMetricsListener(host: string, port: number): Promise<MetricsListener> {
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' || path !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
      return;
    }
    metricsText().then(
      ({ contentType, body }) => res.writeHead(200, { 'content-type': contentType }).end(body),
      (err: Error) => res.writeHead(500, { 'content-type': 'text/plain' }).end(`${err.message}\n`),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const shownHost = host.includes(':') ? `[${host}]` : host;
  return {
    url: `http://${shownHost}:${addr.port}/metrics`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
