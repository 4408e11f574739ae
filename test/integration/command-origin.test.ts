/**
 * Commands queued through the API carry where they come from (docs/observability.md "Traces", "Logs"):
 * tracing on with the SDK's in-memory exporter, a real agent service (agent/service.ts runService, its JSON
 * lines captured) enrolled over HTTP. A user command (`POST …/machines/{machineId}/commands`), a process
 * command and a classic install queued by the deployment workflow each store the request's (or the
 * workflow's) `traceparent` and request id; the agent's requests for the user command are spans of that
 * request's trace, and its lines about the command carry the request id and the trace id. A classic retry
 * (an update of the finished deployment's workflow) carries its own request id into the command it queues
 * and into the lines of the activities it causes.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace';
import { enrolService, runService } from '../../agent/service';
import { classicDeploymentWorkflowId } from '../../domain/classic';
import { createLogger } from '../../telemetry/logging';
import { startTracing, type Tracing } from '../../telemetry/tracing';
import { installRuntime } from '../../worker/worker';
import { createHarness, type Harness } from '../support/harness';
import { appendTestLog } from '../support/test-log';
import { closeRolloutSuite, startTestWorker, type TestWorker } from './rollout-fixtures';
import { waitFor } from '../support/wait';

const apiLines: string[] = [];
const workerLines: string[] = [];
const agentLines: string[] = [];
const exporter = new InMemorySpanExporter();
const workflows: string[] = [];
let tracing: Tracing;
let h: Harness;
let w: TestWorker;
let tmpRoot: string;
let machineId: string;
const stopAgent = new AbortController();
let agentRun: Promise<number> | undefined;

type Rec = Record<string, unknown>;
const parse = (lines: string[]): Rec[] =>
  lines
    .join('')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Rec);

async function commandRow(commandId: string): Promise<{ traceparent: string | null; request_id: string | null; status: string }> {
  const { rows } = await h.deps.db.query('SELECT traceparent, request_id, status FROM commands WHERE site_id = $1 AND command_id = $2', [
    h.siteId,
    commandId,
  ]);
  return rows[0];
}

beforeAll(async () => {
  process.env.ROOST_WORKER_LOG_LEVEL = 'INFO';
  process.env.ROOST_CLASSIC_POLL_MS = '100';
  tracing = startTracing({ OTEL_SERVICE_NAME: 'roost-command-origin-test' }, { spanProcessor: new SimpleSpanProcessor({ exporter }) })!;
  installRuntime(undefined, {
    logger: createLogger({
      service: 'roost-worker',
      level: 'info',
      destination: { write: (l: string) => void (workerLines.push(l), appendTestLog(l)) },
    }),
  });
  h = await createHarness(
    {},
    {
      logger: createLogger({
        service: 'roost-api',
        level: 'info',
        destination: { write: (l: string) => void (apiLines.push(l), appendTestLog(l)) },
      }),
    },
  );
  w = await startTestWorker(h);
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-command-origin-'));
  machineId = `origin-${Date.now().toString(36)}`;
  const rootDir = path.join(tmpRoot, 'agent');
  await enrolService({
    api: await h.listen(),
    siteId: h.siteId,
    secret: await h.enrolmentSecret(),
    machineId,
    rootDir,
    agentVersion: '1.0.0',
  });
  agentRun = runService({
    rootDir,
    agentVersion: '1.0.0',
    logStream: { write: (l: string) => void (agentLines.push(l), appendTestLog(l)) } as unknown as NodeJS.WritableStream,
    logLevel: 'info',
    heartbeatMs: 1000,
    pollWaitSeconds: 1,
    stopGraceMs: 1000,
    stop: stopAgent.signal,
    handleSignals: false,
  });
  await waitFor('the agent online', async () => {
    const res = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/machines/${machineId}` });
    return res.statusCode === 200 && res.json().online === true;
  });
});

afterAll(async () => {
  stopAgent.abort();
  await agentRun;
  delete process.env.ROOST_WORKER_LOG_LEVEL;
  delete process.env.ROOST_CLASSIC_POLL_MS;
  await closeRolloutSuite({ h, w, tmpRoot }, workflows);
  await tracing?.shutdown();
});

it("a user command stores the request's traceparent and id; the agent's requests join its trace and its lines name both", async () => {
  const res = await h.request({
    method: 'POST',
    url: `/api/sites/${h.siteId}/machines/${machineId}/commands`,
    body: { type: 'capture_screenshot' },
    idempotencyKey: true,
  });
  expect(res.statusCode).toBe(202);
  const requestId = res.headers['x-request-id'] as string;
  const commandId = res.json().commandId as string;
  await waitFor('the agent to log the command finished', async () =>
    parse(agentLines).some((r) => r.commandId === commandId && r.msg === 'command finished'),
  );
  expect((await commandRow(commandId)).status).toBe('completed');
  await tracing.forceFlush();

  const spans = exporter.getFinishedSpans();
  const post = spans.find((s) => s.name === 'POST /api/sites/:siteId/machines/:machineId/commands')!;
  const traceId = post.spanContext().traceId;
  const row = await commandRow(commandId);
  expect(row.request_id).toBe(requestId);
  expect(row.traceparent).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));

  // The agent's report of the command is a span of the queuing request's trace, under its span.
  const reports = spans.filter((s) => s.name === 'POST /api/agent/commands/:commandId' && s.spanContext().traceId === traceId);
  expect(reports.length).toBeGreaterThanOrEqual(1);
  const byId = new Map(spans.map((s) => [s.spanContext().spanId, s]));
  for (const r of reports) {
    const names: string[] = [];
    for (let p = r.parentSpanContext?.spanId; p && byId.has(p); p = byId.get(p)!.parentSpanContext?.spanId) names.push(byId.get(p)!.name);
    expect(names).toContain('POST /api/sites/:siteId/machines/:machineId/commands');
  }

  // The agent's lines about the command carry the queuing request's id and trace id.
  const lines = parse(agentLines).filter((r) => r.commandId === commandId);
  expect(lines.map((r) => r.msg)).toEqual(expect.arrayContaining(['command started', 'command finished']));
  for (const l of lines) expect(l).toMatchObject({ service: 'roost-agent', requestId, traceId, machineId });
  // And the API's lines of that request carry the same pair.
  expect(parse(apiLines).some((r) => r.requestId === requestId && r.traceId === traceId && r.msg === 'request completed')).toBe(true);
});

it('a process command stores its request id and traceparent', async () => {
  const created = await h.request({
    method: 'POST',
    url: `/api/sites/${h.siteId}/machines/${machineId}/processes`,
    body: { name: 'origin-proc', exe_path: '/bin/true', launch_mode: 'off' },
    idempotencyKey: true,
  });
  expect(created.statusCode).toBe(201);
  const processId = created.json().processId as string;
  const res = await h.request({
    method: 'POST',
    url: `/api/sites/${h.siteId}/machines/${machineId}/processes/${processId}/stop`,
    idempotencyKey: true,
  });
  expect(res.statusCode).toBe(202);
  await tracing.forceFlush();
  const span = exporter.getFinishedSpans().find((s) => s.name === 'POST /api/sites/:siteId/machines/:machineId/processes/:processId/stop')!;
  const row = await commandRow(res.json().commandId as string);
  expect(row.request_id).toBe(res.headers['x-request-id']);
  expect(row.traceparent?.split('-')[1]).toBe(span.spanContext().traceId);
});

it("a classic install carries the creating request's id and trace; a retry carries its own into its command and activities", async () => {
  const create = await h.request({
    method: 'POST',
    url: `/api/sites/${h.siteId}/deployments`,
    // Nothing listens on port 1: the download fails at once and the target fails.
    body: {
      name: 'origin',
      installer_url: 'https://127.0.0.1:1/setup.sh',
      installer_name: 'setup.sh',
      silent_flags: '',
      machines: [machineId],
    },
    idempotencyKey: true,
  });
  expect(create.statusCode).toBe(201);
  const deploymentId = create.json().deploymentId as string;
  const workflowId = classicDeploymentWorkflowId(h.siteId, deploymentId);
  workflows.push(workflowId);
  const attemptCommand = async (attempts: number) =>
    waitFor(`attempt ${attempts}'s command`, async () => {
      const { rows } = await h.deps.db.query(
        `SELECT command_id FROM classic_deployment_targets WHERE site_id = $1 AND deployment_id = $2 AND attempts = $3 AND command_id IS NOT NULL`,
        [h.siteId, deploymentId, attempts],
      );
      return rows[0]?.command_id as string | undefined;
    });
  const first = await commandRow(await attemptCommand(1));
  await tracing.forceFlush();
  const createSpan = exporter.getFinishedSpans().find((s) => s.name === 'POST /api/sites/:siteId/deployments')!;
  expect(first.request_id).toBe(create.headers['x-request-id']);
  expect(first.traceparent?.split('-')[1]).toBe(createSpan.spanContext().traceId);

  await h.deps.temporal.workflow.getHandle(workflowId).result();
  const retry = await h.request({
    method: 'POST',
    url: `/api/sites/${h.siteId}/deployments/${deploymentId}/retry`,
    idempotencyKey: true,
  });
  expect(retry.statusCode).toBe(200);
  const retryId = retry.headers['x-request-id'] as string;
  const second = await commandRow(await attemptCommand(2));
  expect(second.request_id).toBe(retryId);
  await h.deps.temporal.workflow.getHandle(workflowId).result();
  // The activities the retry caused log the retry's request id.
  const dispatched = parse(workerLines).filter((r) => r.workflowId === workflowId && r.msg === 'classic targets dispatched');
  expect(dispatched.map((r) => r.requestId)).toEqual([create.headers['x-request-id'], retryId]);
  for (const r of dispatched) expect(r).toMatchObject({ activityType: expect.any(String), deploymentId, dispatched: 1 });
});
