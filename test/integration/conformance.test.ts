/**
 * OpenAPI conformance (docs/decisions/openapi-document.md): Schemathesis, pinned and installed into the
 * project's venv by scripts/ensure-deps.sh, runs against this suite's real stack over HTTP with every
 * default check, the positive and negative modes and all four phases (examples, coverage, fuzzing,
 * stateful), bounded by an example count and a wall-clock budget. Any response that disagrees with
 * /api/openapi.json (a 500, an undocumented status, header or body, a valid-by-the-document request that
 * is refused, an invalid one that is accepted) fails the test with Schemathesis's report and the curl
 * line that reproduces it.
 *
 * Opt-in (docs/decisions/openapi-document.md says why: a run over every operation and phase costs minutes, not
 * seconds, on a loaded 2-core machine): runs when ROOST_CONFORMANCE=1
 * (`ROOST_CONFORMANCE=1 npx jest test/integration/conformance.test.ts`). test/conformance/hooks.py supplies
 * real ids (a user, the site, an enrolled machine) to cases generated as valid.
 * ROOST_CONFORMANCE_BUDGET_S bounds the run (default 1200 s); SCHEMATHESIS_BIN overrides the binary; ROOST_CONFORMANCE_EXAMPLES the examples per operation;
 * ROOST_CONFORMANCE_PHASES the phases (default all four).
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createHarness, type Harness } from '../support/harness';

let h: Harness;
let base: string;

/** Examples per operation and phase: small enough for a ~2-minute run over every operation. */
const EXAMPLES = Number(process.env.ROOST_CONFORMANCE_EXAMPLES ?? 12);
/** Wall-clock budget of the run (ms); past it the run is stopped and the test fails. */
const BUDGET_MS = Number(process.env.ROOST_CONFORMANCE_BUDGET_S ?? 1200) * 1000;
const PHASES = process.env.ROOST_CONFORMANCE_PHASES ?? 'examples,coverage,fuzzing,stateful';
const REPORT_DIR = path.join(process.cwd(), '.data', 'conformance');
const maybe = process.env.ROOST_CONFORMANCE === '1' ? it : it.skip;
const MACHINE = 'conformance-1';

function schemathesisBin(): string {
  const bin = process.env.SCHEMATHESIS_BIN ?? path.join(process.cwd(), '.data', 'tools', 'venv', 'bin', 'st');
  if (!fs.existsSync(bin)) throw new Error(`Schemathesis not found at ${bin}: run bash scripts/ensure-deps.sh test`);
  return bin;
}

beforeAll(async () => {
  if (process.env.ROOST_CONFORMANCE !== '1') return;
  h = await createHarness({ ROOST_WEBHOOK_ALLOW_PRIVATE: 'false' });
  base = await h.listen();
  // Something to find: a roost with a published version, so reads and links reach real rows.
  const roost = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'conformance' } });
  expect(roost.statusCode).toBe(201);
  // An enrolled machine, for the fields that must name one (test/conformance/hooks.py).
  const enrol = await h.request({
    method: 'POST',
    url: '/api/agent/enrol',
    key: null,
    idempotencyKey: true,
    body: { siteId: h.siteId, enrolmentSecret: await h.enrolmentSecret(), machineId: MACHINE, hostname: MACHINE, agentVersion: '3.1.0' },
  });
  expect(enrol.statusCode).toBe(201);
});
afterAll(async () => h?.close());

function run(args: string[]): Promise<{ code: number | null; out: string }> {
  fs.mkdirSync(REPORT_DIR, { recursive: true });
  return new Promise((resolve, reject) => {
    // Schemathesis keeps its example cache in the working folder: .data/conformance, not the clone.
    // test/conformance/hooks.py supplies real ids to valid-by-the-document cases (see its docstring).
    const env = {
      ...process.env,
      NO_COLOR: '1',
      PYTHONUNBUFFERED: '1',
      SCHEMATHESIS_HOOKS: 'hooks',
      PYTHONPATH: path.join(process.cwd(), 'test', 'conformance'),
      ROOST_CONF_USER: h.userId,
      ROOST_CONF_SITE: h.siteId,
      ROOST_CONF_MACHINE: MACHINE,
    };
    const child = spawn(schemathesisBin(), args, { cwd: REPORT_DIR, env });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => child.kill('SIGTERM'), BUDGET_MS);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

maybe(
  'Schemathesis finds no response that disagrees with the document (all checks, positive + negative, all phases)',
  async () => {
    const { code, out } = await run([
      '--config-file',
      path.join(process.cwd(), 'test', 'conformance', 'schemathesis.toml'),
      'run',
      `${base}/api/openapi.json`,
      '--url',
      base,
      '--header',
      `Authorization: Bearer ${h.apiKey}`,
      '--mode',
      'all',
      '--phases',
      PHASES,
      '--max-examples',
      String(EXAMPLES),
      '--seed',
      '20261124',
      '--generation-deterministic',
      '--workers',
      '2',
      '--request-timeout',
      '10',
      '--no-color',
      // The event stream never ends by design (text/event-stream); tested in test/integration/stream.test.ts.
      '--exclude-path',
      '/api/events/stream',
      '--report',
      'junit',
      '--report-dir',
      REPORT_DIR,
    ]);
    if (code !== 0) throw new Error(`schemathesis exited ${code}:\n${out.slice(-20000)}`);
    expect(out).toMatch(/No issues found|passed/i);
  },
  BUDGET_MS + 30_000,
);
