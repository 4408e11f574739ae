/**
 * `npm test`: runs the whole Jest suite (unit, integration, e2e, replay) against the real services that
 * Jest's global setup starts, then prints one plain closing line `jest: N passed, N failed[, N skipped]`.
 * Then greps the logs of every app, worker and agent the run started for secrets (test/support/log-leaks.ts)
 * and prints `log check: …`. Exits non-zero when anything failed, a secret was found in the logs, or no
 * test ran. Extra arguments go to Jest.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { checkLogDir, describeCheck } from '../test/support/log-leaks';

const root = path.resolve(__dirname, '..');
const out = path.join(root, '.data', 'jest-results.json');
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.rmSync(out, { force: true });
// Every app, worker and agent the suite starts logs into this folder (test/support/test-log.ts); after
// the run every file is grepped for secrets and a finding fails the run (test/support/log-leaks.ts).
const logDir = path.join(root, '.data', 'test-logs', `run-${Date.now()}-${process.pid}`);
fs.mkdirSync(logDir, { recursive: true });
const jest = require.resolve('jest/bin/jest');
const args = [jest, '--json', `--outputFile=${out}`, ...process.argv.slice(2)];
if (process.env.CI) args.push('--ci');
const r = spawnSync(process.execPath, args, {
  stdio: 'inherit',
  cwd: root,
  env: { ...process.env, ROOST_TEST_LOG_DIR: logDir, ROOST_TEST_LOG_CHECKED_BY_RUNNER: '1' },
});
let passed = 0;
let failed = 0;
let skipped = 0;
let total = 0;
if (fs.existsSync(out)) {
  const res = JSON.parse(fs.readFileSync(out, 'utf8'));
  passed = res.numPassedTests;
  failed = res.numFailedTests + (res.numRuntimeErrorTestSuites ?? 0);
  skipped = res.numPendingTests + (res.numTodoTests ?? 0);
  total = res.numTotalTests;
}
const logs = checkLogDir(logDir);
process.stdout.write(`\n${describeCheck(logDir, logs)}`);
if (logs.leaks.length === 0 && !process.env.ROOST_KEEP_TEST_LOGS) fs.rmSync(logDir, { recursive: true, force: true });
process.stdout.write(`\njest: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}\n`);
if (logs.leaks.length > 0) process.exit(1);
if (r.status !== 0 || failed > 0) process.exit(r.status || 1);
if (total === 0) {
  process.stderr.write('no test ran\n');
  process.exit(1);
}
