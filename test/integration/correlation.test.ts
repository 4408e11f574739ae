/**
 * Correlated logs and traces of one real run (docs/observability.md "Logs", "Traces"): tracing on with the
 * SDK's in-memory exporter, the API's and the worker's JSON logs (telemetry/logging.ts, worker/logging.ts)
 * captured, a webhook created, two real agents enrolled over HTTP and a rollout to them. Then: the deploy's
 * request id and trace id are on the API's lines and on the rollout activities' lines; the agents' reports
 * (sent with the `traceparent` of their sync_pull command) are spans of the deploy's trace under the
 * dispatching activity; and no secret of the run (API key, enrolment secret, agent tokens, webhook secret,
 * SAS signature) is in any captured line.
 */
import path from 'node:path';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace';
import { startFleet } from '../../agent/fleet';
import { createLogger, SECRET_PATTERNS } from '../../telemetry/logging';
import { startTracing, type Tracing } from '../../telemetry/tracing';
import { installRuntime } from '../../worker/worker';
import { createHarness, type Harness } from '../support/harness';
import { appendTestLog } from '../support/test-log';
import { closeRolloutSuite, seedRoost, startTestWorker, type TestWorker } from './rollout-fixtures';
import { rolloutWorkflowId } from '../../workflows/client';
import fs from 'node:fs/promises';
import os from 'node:os';

const lines: string[] = [];
const capture = {
  write: (line: string) => {
    lines.push(line);
    appendTestLog(line);
  },
};
const exporter = new InMemorySpanExporter();
let tracing: Tracing;
let h: Harness;
let w: TestWorker;
let tmpRoot: string;
const workflows: string[] = [];

beforeAll(async () => {
  process.env.ROOST_WORKER_LOG_LEVEL = 'INFO';
  tracing = startTracing({ OTEL_SERVICE_NAME: 'roost-correlation-test' }, { spanProcessor: new SimpleSpanProcessor({ exporter }) })!;
  // The first Runtime of the process decides where the SDK's and the activities' lines go.
  installRuntime(undefined, { logger: createLogger({ service: 'roost-worker', level: 'info', destination: capture }) });
  h = await createHarness({}, { logger: createLogger({ service: 'roost-api', level: 'debug', destination: capture }) });
  w = await startTestWorker(h);
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-correlation-test-'));
});

afterAll(async () => {
  delete process.env.ROOST_WORKER_LOG_LEVEL;
  await closeRolloutSuite({ h, w, tmpRoot }, workflows);
  await tracing?.shutdown();
});

it('one request id and one trace from the deploy request to the activities and the agents; no secret in any log line', async () => {
  const secrets: string[] = [h.apiKey];
  const webhook = await h.request({
    method: 'POST',
    url: `/api/sites/${h.siteId}/webhooks`,
    body: { url: 'https://hooks.example.test/roost', name: 'correlation', events: ['deployment.completed'] },
    idempotencyKey: true,
  });
  expect(webhook.statusCode).toBe(201);
  secrets.push(webhook.json().signingSecret);
  const enrolmentSecret = await h.enrolmentSecret();
  secrets.push(enrolmentSecret);

  const fleet = await startFleet({
    baseUrl: await h.listen(),
    siteId: h.siteId,
    enrolmentSecret,
    count: 2,
    rootDir: path.join(tmpRoot, 'fleet'),
    pollWaitSeconds: 5,
    heartbeatMs: 0,
  });
  let deploy;
  try {
    for (const id of fleet.machineIds) secrets.push(fleet.agent(id)!.token!);
    const roost = await seedRoost(h, { targets: fleet.machineIds, extractPath: 'apps/correlation' });
    deploy = await h.request({
      method: 'POST',
      url: `/api/roosts/${roost.roostId}/deploy`,
      body: { siteId: h.siteId },
      idempotencyKey: true,
    });
    expect(deploy.statusCode).toBe(202);
    const workflowId = rolloutWorkflowId(h.siteId, roost.roostId, deploy.json().versionId);
    workflows.push(workflowId);
    expect(await h.deps.temporal.workflow.getHandle(workflowId).result()).toMatchObject({ stage: 'completed', succeeded: 2 });
    // A download answer holds SAS URLs: their signatures are secrets too.
    const urls = await h.request({
      method: 'GET',
      url: `/api/agent/roosts/${roost.roostId}/versions/${deploy.json().versionId}`,
      key: fleet.agent(fleet.machineIds[0])!.token!,
    });
    for (const m of urls.body.matchAll(/[?&]sig=([^&"]+)/g)) secrets.push(decodeURIComponent(m[1]));
  } finally {
    await fleet.stop();
  }
  await tracing.forceFlush();

  // Every line is one JSON object from the one logger.
  const records = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  expect(records.length).toBeGreaterThan(20);
  for (const r of records) expect(['roost-api', 'roost-worker']).toContain(r.service);

  // The deploy request: its id on every line it logged, with its trace id.
  const requestId = deploy.headers['x-request-id'] as string;
  const deployLines = records.filter((r) => r.service === 'roost-api' && r.requestId === requestId);
  expect(deployLines.map((r) => r.msg)).toEqual(expect.arrayContaining(['incoming request', 'request completed']));
  const spans = exporter.getFinishedSpans();
  const deploySpan = spans.find((s) => s.name === 'POST /api/roosts/:roostId/deploy')!;
  const traceId = deploySpan.spanContext().traceId;
  expect(deployLines.some((r) => r.traceId === traceId)).toBe(true);

  // The rollout's activities: their lines carry the deploy's request id and trace id.
  const dispatched = records.find((r) => r.service === 'roost-worker' && r.msg === 'rollout wave dispatched');
  expect(dispatched).toMatchObject({ requestId, traceId, activityType: 'dispatchWave' });

  // The agents' target-state reports joined the deploy's trace, under the activity that dispatched them.
  const byId = new Map(spans.map((s) => [s.spanContext().spanId, s]));
  const ancestors = (s: (typeof spans)[number]) => {
    const names: string[] = [];
    for (let p = s.parentSpanContext?.spanId; p && byId.has(p); p = byId.get(p)!.parentSpanContext?.spanId) names.push(byId.get(p)!.name);
    return names;
  };
  // The reference agent sends its target states with its command reports (docs/agent-protocol.md "Inline sync").
  const REPORT_ROUTES = ['POST /api/agent/commands/:commandId', 'PUT /api/agent/roosts/:roostId/state'];
  const reports = spans.filter((s) => REPORT_ROUTES.includes(s.name) && s.spanContext().traceId === traceId);
  expect(reports.length).toBeGreaterThanOrEqual(2);
  for (const r of reports)
    expect(ancestors(r)).toEqual(expect.arrayContaining(['RunActivity:dispatchWave', 'POST /api/roosts/:roostId/deploy']));
  // Their log lines carry that trace too.
  const stateIds = new Set(
    records
      .filter((r) => /\/state$|\/api\/agent\/commands\/cmd_/.test(String((r.req as { url?: string } | undefined)?.url)))
      .map((r) => r.requestId),
  );
  expect(records.some((r) => stateIds.has(r.requestId) && r.traceId === traceId)).toBe(true);

  // No secret of the run in any line, by value or by shape.
  const text = lines.join('');
  expect(secrets.length).toBeGreaterThanOrEqual(6);
  for (const secret of secrets) expect(text.includes(secret) ? secret : null).toBeNull();
  const shaped = SECRET_PATTERNS.flatMap((re) => [...text.matchAll(re)].map((m) => m[0])).filter((m) => !m.endsWith('[redacted]'));
  expect(shaped).toEqual([]);
});

it('a secret written into a log line by mistake is redacted before the line is written', () => {
  const out: string[] = [];
  const log = createLogger({ service: 'roost-api', level: 'info', destination: { write: (l: string) => void out.push(l) } });
  const key = `svk_live_${'A'.repeat(43)}`;
  log.info(
    { url: 'https://acct.blob.core.windows.net/c/b?sv=2024-01-01&sig=abc%2Bdef%3D&se=x', headers: { authorization: `Bearer ${key}` } },
    `failed for ${key} with ses_${'b'.repeat(43)}, sat_${'c'.repeat(43)}, sst_${'d'.repeat(43)} and whsec_${'e'.repeat(43)}`,
  );
  const line = out.join('');
  expect(line).not.toMatch(/A{43}|b{43}|c{43}|d{43}|e{43}|abc%2Bdef/);
  expect(JSON.parse(line)).toMatchObject({ msg: expect.stringContaining('svk_live_[redacted]'), headers: { authorization: '[redacted]' } });
  expect(line).toContain('sig=[redacted]');
});
