/**
 * `npm test`: runs the whole Jest suite (unit, integration, e2e, replay) against the real services that
 * Jest's global setup starts, then prints one plain closing line `jest: N passed, N failed[, N skipped]`.
 * Exits non-zero when anything failed or when no test ran. Extra arguments go to Jest.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';

const root = path.resolve(__dirname, '..');
const out = path.join(root, '.data', 'jest-results.json');
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.rmSync(out, { force: true });
const jest = require.resolve('jest/bin/jest');
const args = [jest, '--json', `--outputFile=${out}`, ...process.argv.slice(2)];
if (process.env.CI) args.push('--ci');
const r = spawnSync(process.execPath, args, { stdio: 'inherit', cwd: root, env: process.env });
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
process.stdout.write(`\njest: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}\n`);
if (r.status !== 0 || failed > 0) process.exit(r.status || 1);
if (total === 0) {
  process.stderr.write('no test ran\n');
  process.exit(1);
}
