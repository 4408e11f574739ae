/**
 * OpenAPI conformance (docs/decisions/openapi-document.md): Schemathesis, pinned and installed into the
 * project's venv by scripts/ensure-deps.sh, runs against this suite's real stack over HTTP (with a worker on
 * its task queue, so workflow-backed routes answer as they do in service) with every default check and the
 * positive and negative modes. Any response that disagrees with /api/openapi.json (a 500, an undocumented
 * status, header or body, a valid-by-the-document request that is refused, an invalid one that is accepted)
 * fails the test with Schemathesis's report and the curl line that reproduces it.
 *
 * Two runs, both deterministic (fixed generation, so a failure reproduces):
 * - the bounded run, part of the normal suite: the examples, fuzzing and stateful phases with
 *   ROOST_CONFORMANCE_EXAMPLES (default 4) examples per operation, stopped and failed past
 *   ROOST_CONFORMANCE_BUDGET_S (default 240 s);
 * - the full run, opt-in (`ROOST_CONFORMANCE=full npx jest test/integration/conformance.test.ts`): all four
 *   phases, the coverage phase's boundary values of every schema included (4.5–13.5 min on the shared 2-core
 *   machine), default 5 examples and a 1200 s budget.
 * test/conformance/hooks.py supplies real ids (a user, the site, an enrolled machine) and the cross-field rules
 * to cases generated as valid. SCHEMATHESIS_BIN overrides the binary; ROOST_CONFORMANCE_PHASES the phases.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createHarness, type Harness } from '../support/harness';
import { startTestWorker, type TestWorker } from './rollout-fixtures';
import { ownDatabase, type OwnDatabase } from '../support/own-database';

let h: Harness;
let worker: TestWorker;
let base: string;

const FULL = process.env.ROOST_CONFORMANCE === 'full' || process.env.ROOST_CONFORMANCE === '1';
/** Examples per operation and phase. */
const EXAMPLES = Number(process.env.ROOST_CONFORMANCE_EXAMPLES ?? (FULL ? 5 : 4));
/** Wall-clock budget of the run (ms); past it the run is stopped and the test fails. */
const BUDGET_MS = Number(process.env.ROOST_CONFORMANCE_BUDGET_S ?? (FULL ? 1200 : 240)) * 1000;
const PHASES = process.env.ROOST_CONFORMANCE_PHASES ?? (FULL ? 'examples,coverage,fuzzing,stateful' : 'examples,fuzzing,stateful');
const REPORT_DIR = path.join(process.cwd(), '.data', 'conformance');
const MACHINE = 'conformance-1';

function schemathesisBin(): string {
  const bin = process.env.SCHEMATHESIS_BIN ?? path.join(process.cwd(), '.data', 'tools', 'venv', 'bin', 'st');
  if (!fs.existsSync(bin)) throw new Error(`Schemathesis not found at ${bin}: run bash scripts/ensure-deps.sh test`);
  return bin;
}

/**
 * A database of its own: the harness key is a superadmin's, so Schemathesis lists and follows every site it
 * can see, and in the suite's shared database that included other files' deliberately broken fixtures
 * (a stored version body tampered with, answered 500 internal_error by design).
 */
let db: OwnDatabase | undefined;

beforeAll(async () => {
  db = await ownDatabase('conformance');
  h = await createHarness({ ROOST_WEBHOOK_ALLOW_PRIVATE: 'false', ...db.overrides });
  // Workflow-backed routes (classic deployment control, the installer finalise) wait for a worker.
  worker = await startTestWorker(h, 'conformance');
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
afterAll(async () => {
  await worker?.stop();
  await h?.close();
  db?.drop();
});

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
    const timer = setTimeout(() => {
      out += `\n[conformance] stopped: over the ${BUDGET_MS / 1000} s budget\n`;
      child.kill('SIGTERM');
    }, BUDGET_MS);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

it(
  `Schemathesis finds no response that disagrees with the document (all checks, positive + negative, ${PHASES})`,
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
    fs.writeFileSync(path.join(REPORT_DIR, 'last-run.txt'), out);
    expect(out).toMatch(/No issues found|passed/i);
  },
  BUDGET_MS + 60_000,
);
