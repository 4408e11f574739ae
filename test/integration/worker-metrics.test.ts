/**
 * Worker and business metrics after a real rollout to real agents, a real webhook delivery and a real
 * sweep (docs/observability.md "Worker", "Business"; worker/metrics.ts, services/observability.ts): the
 * activity histogram and failures by type, machine reports per site, chunk bytes uploaded and served,
 * rollouts by stage and state, webhook attempts and deliveries by outcome, sweep results; and the Temporal
 * SDK's own Prometheus exporter (ROOST_TEMPORAL_METRICS_ADDRESS) serving its runtime metrics; and the Grafana
 * dashboard (docs/grafana/roost-dashboard.json) querying only series that are exported.
 */
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { startFleet } from '../../agent/fleet';
import { installRuntime } from '../../worker/worker';
import { ensureEventRelay, eventRelayWorkflowId } from '../../worker/background';
import { type Harness } from '../support/harness';
import { parseMetrics, type Exposition } from '../support/metrics';
import { registry } from '../../telemetry/metrics';
import { closeRolloutSuite, deployRoute, openRolloutSuite, seedRoost, type TestWorker } from './rollout-fixtures';
import { waitFor } from '../support/wait';

const TOKEN = 'worker-metrics-token-0123456789';
let h: Harness;
let w: TestWorker;
let tmpRoot: string;
let temporalMetrics: string;
let receiver: http.Server;
let receiverBase: string;
const workflows: string[] = [];

/** A free loopback port (bound and released). */
async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

const until = <T>(what: string, fn: () => Promise<T>, timeoutMs = 60_000) => waitFor(what, fn, timeoutMs, 100);

async function scrape(): Promise<Exposition> {
  const res = await h.request({ method: 'GET', url: '/metrics', key: null, headers: { authorization: `Bearer ${TOKEN}` } });
  expect(res.statusCode).toBe(200);
  return parseMetrics(res.body);
}

beforeAll(async () => {
  temporalMetrics = `127.0.0.1:${await freePort()}`;
  process.env.ROOST_TEMPORAL_METRICS_ADDRESS = temporalMetrics;
  process.env.ROOST_METRICS_TOKEN = TOKEN;
  process.env.ROOST_WEBHOOK_ALLOW_PRIVATE = 'true';
  process.env.ROOST_WEBHOOK_MAX_ATTEMPTS = '1';
  process.env.ROOST_WEBHOOK_RELAY_POLL_MS = '50';
  process.env.ROOST_WORKER_LOG_LEVEL = 'ERROR';
  // The first Runtime of the process decides its telemetry: install it from this configuration.
  installRuntime({ ROOST_TEMPORAL_METRICS_ADDRESS: temporalMetrics });
  ({ h, w, tmpRoot } = await openRolloutSuite('worker-metrics'));
  receiver = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(req.url === '/broken' ? 500 : 200).end());
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  receiverBase = `http://127.0.0.1:${(receiver.address() as net.AddressInfo).port}`;
  workflows.push(await ensureEventRelay(h.deps.temporal, h.deps.cfg));
});

afterAll(async () => {
  for (const k of [
    'ROOST_TEMPORAL_METRICS_ADDRESS',
    'ROOST_METRICS_TOKEN',
    'ROOST_WEBHOOK_ALLOW_PRIVATE',
    'ROOST_WEBHOOK_MAX_ATTEMPTS',
    'ROOST_WEBHOOK_RELAY_POLL_MS',
    'ROOST_WORKER_LOG_LEVEL',
  ])
    delete process.env[k];
  await closeRolloutSuite({ h, w, tmpRoot }, [...workflows, eventRelayWorkflowId(h?.deps.cfg.ROOST_TASK_QUEUE ?? '')]);
  await new Promise((r) => receiver?.close(r));
});

it('counts a real rollout, its agents, a webhook delivery and a sweep; the SDK exporter serves its runtime metrics', async () => {
  const before = await scrape();
  const hooks: Record<string, string> = {};
  for (const p of ['/ok', '/broken']) {
    const res = await h.request({
      method: 'POST',
      url: `/api/sites/${h.siteId}/webhooks`,
      body: { url: `${receiverBase}${p}`, name: `metrics ${p}`, events: ['deployment.completed'] },
      idempotencyKey: true,
    });
    expect(res.statusCode).toBe(201);
    hooks[p] = (res.json() as { webhookId: string }).webhookId;
  }

  const fleet = await startFleet({
    baseUrl: await h.listen(),
    siteId: h.siteId,
    enrolmentSecret: await h.enrolmentSecret(),
    count: 2,
    rootDir: path.join(tmpRoot, 'fleet'),
    pollWaitSeconds: 5,
    heartbeatMs: 0,
  });
  try {
    const roost = await seedRoost(h, { targets: fleet.machineIds, extractPath: 'apps/metrics' });
    const deployed = await deployRoute(h, roost.roostId);
    workflows.push(deployed.workflowId);
    const out = await h.deps.temporal.workflow.getHandle(deployed.workflowId).result();
    expect(out).toMatchObject({ stage: 'completed', succeeded: 2, failed: 0 });
  } finally {
    await fleet.stop();
  }

  // A sweep over the shared database that changes nothing another test relies on: chunk verification.
  const sweep = await h.deps.temporal.workflow.execute('chunkVerifySweepWorkflow', {
    taskQueue: h.deps.cfg.ROOST_TASK_QUEUE,
    workflowId: `metrics-sweep-${randomBytes(4).toString('hex')}`,
    args: [{ batchSize: 4, maxBatches: 1 }],
  });
  expect((sweep as { processed: number }).processed).toBeGreaterThan(0);

  // This site's two deliveries, read through the API. The event relay works over the whole (shared)
  // test database, so this worker may also deliver other suites' events: its counters below are
  // lower bounds, never exact.
  const deliveries = async (p: string) => {
    const res = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/webhooks/${hooks[p]}/deliveries` });
    expect(res.statusCode).toBe(200);
    return (res.json() as { deliveries: { status: string; attempts: unknown[] }[] }).deliveries;
  };
  await until('both webhook deliveries to end', async () => {
    const [ok, broken] = [await deliveries('/ok'), await deliveries('/broken')];
    return ok.length === 1 && ok[0].status === 'succeeded' && broken.length === 1 && broken[0].status === 'failed';
  });
  expect((await deliveries('/broken'))[0].attempts).toHaveLength(1); // ROOST_WEBHOOK_MAX_ATTEMPTS=1
  // The counters move when the activities return, a moment after the rows change.
  const m = await until('the delivery counters to move', async () => {
    const s = await scrape();
    const done = (o: string) =>
      s.value('roost_webhook_deliveries_total', { outcome: o }) - before.value('roost_webhook_deliveries_total', { outcome: o });
    return done('delivered') >= 1 && done('failed') >= 1 && s;
  });
  const delta = (name: string, labels?: Record<string, string>) => m.value(name, labels) - before.value(name, labels);
  // Activities by type and outcome.
  expect(m.types.get('roost_activity_duration_seconds')).toBe('histogram');
  for (const activity of ['loadRollout', 'dispatchWave', 'watchWave', 'attemptWebhookDelivery', 'verifyChunkSample'])
    expect(delta('roost_activity_duration_seconds_count', { activity, outcome: 'completed' })).toBeGreaterThanOrEqual(1);
  expect(delta('roost_activity_duration_seconds_count', { activity: 'attemptWebhookDelivery', outcome: 'failed' })).toBeGreaterThanOrEqual(
    1,
  );
  expect(
    delta('roost_activity_failures_total', { activity: 'attemptWebhookDelivery', failure: 'delivery_attempt_failed' }),
  ).toBeGreaterThanOrEqual(1);

  // Business counters.
  expect(delta('roost_machine_reports_total', { site: h.siteId, status: 'committed' })).toBe(2);
  expect(delta('roost_chunk_bytes_total', { direction: 'uploaded' })).toBeGreaterThan(0);
  expect(delta('roost_chunk_bytes_total', { direction: 'served' })).toBeGreaterThan(0);
  expect(m.value('roost_rollouts', { stage: 'completed', state: 'completed' })).toBeGreaterThanOrEqual(1);
  expect(m.types.get('roost_rollouts')).toBe('gauge');
  expect(delta('roost_webhook_attempts_total', { outcome: 'succeeded' })).toBeGreaterThanOrEqual(1);
  expect(delta('roost_webhook_attempts_total', { outcome: 'failed' })).toBeGreaterThanOrEqual(1);
  expect(delta('roost_webhook_deliveries_total', { outcome: 'delivered' })).toBeGreaterThanOrEqual(1);
  expect(delta('roost_webhook_deliveries_total', { outcome: 'failed' })).toBeGreaterThanOrEqual(1);
  expect(delta('roost_sweep_items_total', { sweep: 'chunk-verify', result: 'processed' })).toBe((sweep as { processed: number }).processed);

  // The Temporal SDK's own exporter: runtime metrics by activity and workflow type.
  const res = await fetch(`http://${temporalMetrics}/metrics`);
  expect(res.status).toBe(200);
  const sdk = parseMetrics(await res.text());
  const names = new Set(sdk.samples.map((s) => s.name));
  expect([...names].every((n) => n.startsWith('temporal_'))).toBe(true);
  expect(
    sdk.samples.some((s) => s.name.startsWith('temporal_activity_execution_latency') && s.labels.activity_type === 'dispatchWave'),
  ).toBe(true);
  expect(sdk.samples.some((s) => s.name.startsWith('temporal_workflow_completed') && s.labels.workflow_type === 'rolloutWorkflow')).toBe(
    true,
  );
});

it('every series the Grafana dashboard (docs/grafana/roost-dashboard.json) queries is exported, with the labels it uses', async () => {
  const dashboard = JSON.parse(fs.readFileSync(path.join(__dirname, '../../docs/grafana/roost-dashboard.json'), 'utf8')) as {
    panels: { targets?: { expr: string }[] }[];
    templating: { list: { query?: { query: string } }[] };
  };
  const exprs = [
    ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)),
    ...dashboard.templating.list.flatMap((v) => (v.query?.query ? [v.query.query] : [])),
  ];
  expect(exprs.length).toBeGreaterThanOrEqual(20);

  // What is exported: every sample of Roost's /metrics and of the Temporal SDK exporter after the rollout
  // above, and every family Roost's registry declares (a labelled series appears once something counts).
  const exported = new Map<string, Set<string>>();
  const add = (name: string, labels: string[]) => {
    const set = exported.get(name) ?? new Set<string>();
    for (const l of labels) set.add(l);
    exported.set(name, set);
  };
  const roost = await scrape();
  const sdk = parseMetrics(await (await fetch(`http://${temporalMetrics}/metrics`)).text());
  for (const s of [...roost.samples, ...sdk.samples]) add(s.name, Object.keys(s.labels));
  for (const [family, type] of roost.types) {
    const metric = registry.getSingleMetric(family) as unknown as { labelNames?: string[] } | undefined;
    const labels = metric?.labelNames ?? [];
    if (type === 'histogram') {
      add(`${family}_bucket`, [...labels, 'le']);
      add(`${family}_sum`, labels);
      add(`${family}_count`, labels);
    } else add(family, labels);
  }

  const scrapeLabels = new Set(['job', 'instance']); // added by Prometheus
  const missing: string[] = [];
  for (const expr of exprs) {
    const names = [...expr.matchAll(/\b((?:roost|temporal)_[a-zA-Z0-9_]+)\b/g)].map((m) => m[1]);
    expect(names.length).toBeGreaterThan(0);
    for (const name of names) if (!exported.has(name)) missing.push(`${name} (in ${expr})`);
    // Labels in selectors belong to the metric they select; grouping labels to some metric of the expression.
    for (const m of expr.matchAll(/\b((?:roost|temporal)_[a-zA-Z0-9_]+)\{([^}]*)\}/g))
      for (const l of m[2].matchAll(/([a-zA-Z_]+)\s*(?:=~|!~|!=|=)/g))
        if (!scrapeLabels.has(l[1]) && !exported.get(m[1])?.has(l[1])) missing.push(`label ${l[1]} of ${m[1]} (in ${expr})`);
    for (const by of expr.matchAll(/\bby\s*\(([^)]*)\)/g))
      for (const l of by[1].split(',').map((x) => x.trim()))
        if (!scrapeLabels.has(l) && !names.some((n) => exported.get(n)?.has(l))) missing.push(`label ${l} (in ${expr})`);
  }
  expect(missing).toEqual([]);
});
