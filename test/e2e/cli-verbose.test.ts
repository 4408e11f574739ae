/**
 * `roost --verbose` (cli/log.ts, docs/observability.md "CLI"): the real binary against a real API that
 * traces into the SDK's in-memory exporter. Its stderr is JSON lines only, one per API answer carrying
 * the requestId the API logged for that request and the traceId of the invocation (TRACEPARENT), which
 * is the trace of the API's spans for it; a refused request's line and the failure line carry its
 * requestId; stdout stays the one `--json` document. Without --verbose nothing is logged.
 */
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace';
import { cliRunner } from '../support/cli';
import { createHarness, type Harness } from '../support/harness';
import { appendTestLog } from '../support/test-log';
import { createLogger } from '../../telemetry/logging';
import { startTracing, type Tracing } from '../../telemetry/tracing';
import { cliTrace } from '../../cli/log';

const exporter = new InMemorySpanExporter();
const apiLines: string[] = [];
let tracing: Tracing;
let h: Harness;
let api: string;
const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';

const { roost } = cliRunner(() => ({ ROOST_API_URL: api, ROOST_API_KEY: h.apiKey, ROOST_SITE_ID: h.siteId, ROOST_CONFIG: '/nonexistent' }));

beforeAll(async () => {
  tracing = startTracing({ OTEL_SERVICE_NAME: 'roost-cli-verbose-test' }, { spanProcessor: new SimpleSpanProcessor({ exporter }) })!;
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
  api = await h.listen();
});

afterAll(async () => {
  await h.close();
  await tracing?.shutdown();
});

const jsonLines = (stderr: string) => {
  appendTestLog(stderr);
  return stderr
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
};

it('logs each API answer as a JSON line on stderr with the API request id and the trace id; stdout stays the result', async () => {
  const created = await roost(['roosts', 'create', `verbose ${Date.now()}`, '--extract-path', 'apps/verbose', '--json', '--verbose'], {
    TRACEPARENT: `00-${TRACE_ID}-00f067aa0ba902b7-01`,
  });
  expect(created.code).toBe(0);
  const roost_ = JSON.parse(created.stdout);
  expect(roost_.roostId).toMatch(/^rst_/);
  const lines = jsonLines(created.stderr);
  const answered = lines.filter((l) => l.msg === 'api request');
  expect(answered.length).toBeGreaterThanOrEqual(1);
  for (const l of lines) expect(l).toMatchObject({ service: 'roost-cli', traceId: TRACE_ID });
  const post = answered.find((l) => l.method === 'POST' && l.path === '/api/roosts')!;
  expect(post).toMatchObject({ status: 201, requestId: expect.stringMatching(/^req_/), durationMs: expect.any(Number) });

  // The API logged that request under the same id, in the same trace; its span is in the CLI's trace.
  const api = apiLines.map((l) => JSON.parse(l) as Record<string, unknown>);
  expect(api.find((r) => r.requestId === post.requestId && r.msg === 'request completed')).toMatchObject({ traceId: TRACE_ID });
  await tracing.forceFlush();
  expect(exporter.getFinishedSpans().some((s) => s.name === 'POST /api/roosts' && s.spanContext().traceId === TRACE_ID)).toBe(true);
  // No credential in the lines.
  expect(created.stderr).not.toContain(h.apiKey);
});

it("a refused request's lines carry its request id; without --verbose stderr has no JSON", async () => {
  const missing = await roost(['roosts', 'show', 'rst_0000000000000000000000', '--json', '--verbose']);
  expect(missing.code).toBe(4);
  expect(JSON.parse(missing.stdout).error.code).toBe('not_found');
  const lines = jsonLines(missing.stderr);
  const answer = lines.find((l) => l.msg === 'api request')!;
  expect(answer).toMatchObject({ level: 40, status: 404, code: 'not_found', requestId: expect.stringMatching(/^req_/) });
  expect(lines.find((l) => l.level === 50)).toMatchObject({ code: 'not_found', status: 404, requestId: answer.requestId });
  expect(lines.every((l) => l.traceId === undefined)).toBe(true);

  const plain = await roost(['roosts', 'show', 'rst_0000000000000000000000', '--json']);
  expect(plain.stderr).toContain('error: not_found: ');
  expect(plain.stderr).not.toContain('{"level"');
});

it('takes part in a trace when TRACEPARENT or an OTLP endpoint is set, and in none otherwise', () => {
  expect(cliTrace({ TRACEPARENT: `00-${TRACE_ID}-00f067aa0ba902b7-01` })).toEqual({
    traceparent: `00-${TRACE_ID}-00f067aa0ba902b7-01`,
    traceId: TRACE_ID,
  });
  expect(cliTrace({ TRACEPARENT: 'garbage' })).toBeUndefined();
  expect(cliTrace({})).toBeUndefined();
  const own = cliTrace({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' })!;
  expect(own.traceparent).toMatch(new RegExp(`^00-${own.traceId}-[0-9a-f]{16}-01$`));
});
