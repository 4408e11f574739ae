/**
 * One deploy is one trace (docs/observability.md "Traces"; telemetry/tracing.ts, api/plugins/tracing.ts,
 * the Temporal interceptors in services/deps.ts and worker/worker.ts): tracing started by startTracing (what
 * telemetry/instrument.ts calls when OTEL_EXPORTER_OTLP_ENDPOINT is set) with the SDK's in-memory exporter,
 * and the HTTP span of POST /api/roosts/{roostId}/deploy is the ancestor of the workflow start, the
 * workflow run and each activity run, all under the configured service name.
 */
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace';
import { startTracing, type Tracing } from '../../telemetry/tracing';
import type { Harness } from '../support/harness';
import { closeRolloutSuite, dbFleet, deployRoute, openRolloutSuite, seedRoost, type TestWorker } from './rollout-fixtures';

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  service: string;
}

let h: Harness;
let w: TestWorker;
let tmpRoot: string;
let tracing: Tracing;
const exporter = new InMemorySpanExporter();
const workflows: string[] = [];

beforeAll(async () => {
  // The real set-up (NodeSDK, propagation, instrumentations, Temporal interceptors) with the SDK's
  // in-memory exporter in place of OTLP: Jest cannot run the OTLP/HTTP transport (it loads node:http
  // through a dynamic import).
  tracing = startTracing({ OTEL_SERVICE_NAME: 'roost-tracing-test' }, { spanProcessor: new SimpleSpanProcessor({ exporter }) })!;
  ({ h, w, tmpRoot } = await openRolloutSuite('tracing'));
});

afterAll(async () => {
  await closeRolloutSuite({ h, w, tmpRoot }, workflows);
  await tracing?.shutdown();
});

it('follows a deploy from the HTTP span through the workflow start into the workflow and its activities', async () => {
  const fleet = dbFleet(h);
  let rolloutWorkflowId: string;
  try {
    const roost = await seedRoost(h, { targets: ['tr-m1', 'tr-m2'] });
    await h.deps.db.query(
      `INSERT INTO machines (site_id, machine_id, hostname, online) SELECT $1, m, m, true FROM UNNEST($2::text[]) AS t (m) ON CONFLICT DO NOTHING`,
      [h.siteId, ['tr-m1', 'tr-m2']],
    );
    const deployed = await deployRoute(h, roost.roostId);
    rolloutWorkflowId = deployed.workflowId;
    workflows.push(deployed.workflowId);
    expect(await h.deps.temporal.workflow.getHandle(deployed.workflowId).result()).toMatchObject({ stage: 'completed', succeeded: 2 });
  } finally {
    await fleet.stop();
  }
  await tracing.forceFlush();
  const spans: OtlpSpan[] = exporter.getFinishedSpans().map((s) => ({
    traceId: s.spanContext().traceId,
    spanId: s.spanContext().spanId,
    parentSpanId: s.parentSpanContext?.spanId,
    name: s.name,
    service: String(s.resource.attributes['service.name']),
  }));

  const httpSpan = spans.find((s) => s.name === 'POST /api/roosts/:roostId/deploy');
  expect(httpSpan).toBeDefined();
  const trace = spans.filter((s) => s.traceId === httpSpan!.traceId);
  const byId = new Map(trace.map((s) => [s.spanId, s]));
  /** Whether `span` descends from `ancestor` through recorded parents. */
  const descends = (span: OtlpSpan, ancestor: OtlpSpan): boolean => {
    for (let p = span.parentSpanId; p; p = byId.get(p)?.parentSpanId) if (p === ancestor.spanId) return true;
    return false;
  };
  const named = (name: string) => trace.filter((s) => s.name === name);
  const [start] = named('StartWorkflow:rolloutWorkflow');
  expect(start).toBeDefined();
  expect(descends(start, httpSpan!)).toBe(true);
  const [run] = named('RunWorkflow:rolloutWorkflow');
  expect(run).toBeDefined();
  expect(descends(run, start)).toBe(true);
  for (const activity of ['loadRollout', 'dispatchWave', 'watchWave']) {
    const runs = named(`RunActivity:${activity}`);
    expect(runs.length).toBeGreaterThanOrEqual(1);
    for (const r of runs) expect(descends(r, run)).toBe(true);
  }
  expect(trace.every((s) => s.service === 'roost-tracing-test')).toBe(true);
  expect(rolloutWorkflowId!).toBeDefined();
});
