/**
 * The secret grep over the suite's logs (test/support/log-leaks.ts, run by scripts/run-tests.ts after every
 * `npm test`): planted lines of each kind are found in a log folder, their redacted forms and ordinary lines
 * are not, and a line written through the real logger (telemetry/logging.ts) with every kind of secret in
 * it comes out clean.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { checkLogDir, describeCheck, findLeaks } from '../support/log-leaks';
import { createLogger, redactSecrets } from '../../telemetry/logging';

const raw = (prefix: string) => `${prefix}${'Ab3_'.repeat(11)}`;

const PLANTED: Record<string, string> = {
  'api key': `{"msg":"auth failed for ${raw('svk_live_')}"}`,
  'enrolment secret': `{"msg":"enrol","body":"${raw('ses_')}"}`,
  'agent token': `{"msg":"token ${raw('sat_')} refused"}`,
  'session token': `{"session":"${raw('sst_')}"}`,
  'webhook secret': `{"secret_value":"${raw('whsec_')}"}`,
  'api_key parameter': `{"url":"/api/events/stream?siteId=s&api_key=${raw('svk%5Flive%5F')}"}`,
  'percent-encoded secret': `{"url":"/x?token=${raw('sat%5F')}"}`,
  'SAS signature': `{"url":"https://acct.blob.core.windows.net/c/b?sv=2024-01-01&se=2026&sr=b&sp=r&sig=AbCdEf%2B123%3D"}`,
  'Authorization header': `GET /api/roosts HTTP/1.1 authorization: Bearer eyJhbGciOiJSUzI1NiJ9.payload.sig`,
  'credential field': `{"req":{"headers":{"x-api-key":"k3y-without-a-prefix-0123"}}}`,
};

const CLEAN = [
  `{"msg":"auth failed for svk_live_[redacted]","url":"/x?sig=[redacted]&a=1"}`,
  `{"authorization":"[redacted]","enrolmentSecret":"[redacted]","msg":"Bearer [redacted]"}`,
  `{"msg":"request completed","requestId":"req_0123456789abcdef0123","responseTime":1.2}`,
  `error: unauthorized: send Authorization: Bearer <key>`,
  `{"msg":"session_expired","sat_count":3}`,
  `{"url":"/api/events/stream?siteId=site_1&api_key=[redacted]&events=version.published%2Croost.deleted"}`,
];

it('redacts a query credential whatever its encoding: api_key by name, any parameter whose decoded value is a secret', () => {
  const key = raw('svk_live_');
  const encoded = key.replace(/_/g, '%5F');
  const everyChar = [...key].map((c) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`).join('');
  for (const url of [
    `/s?siteId=a&api_key=${key}`,
    `/s?siteId=a&api_key=${encoded}`,
    `/s?siteId=a&api%5Fkey=${everyChar}`,
    `/s?api_key=${everyChar}&siteId=a`,
    `/s?x=${encoded}`,
  ]) {
    const line = redactSecrets(JSON.stringify({ url }));
    expect(line).not.toContain(key.slice(9));
    expect(line).not.toContain(encoded.slice(13));
    expect(line).not.toContain(everyChar.slice(30));
    expect(findLeaks(line)).toEqual([]);
  }
  expect(redactSecrets('/s?siteId=a&api_key=abc&b=1')).toBe('/s?siteId=a&api_key=[redacted]&b=1');
  // Ordinary encoded parameters stay as they were.
  expect(redactSecrets('/s?events=a%2Cb&q=%E2%9C%93&bad=%ZZ')).toBe('/s?events=a%2Cb&q=%E2%9C%93&bad=%ZZ');
});

let dir: string;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-log-leaks-'));
});
afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

it('finds a planted secret of each kind in a log folder, with file, line and kind, and prints the secret cut short', () => {
  fs.writeFileSync(path.join(dir, 'worker-1.log'), `${CLEAN.join('\n')}\n`);
  fs.writeFileSync(path.join(dir, 'worker-2.log'), `${CLEAN[2]}\n${Object.values(PLANTED).join('\n')}\n`);
  fs.writeFileSync(path.join(dir, 'notes.txt'), PLANTED['api key']);
  const check = checkLogDir(dir);
  expect(check.files).toBe(2);
  expect(check.leaks.map((l) => [path.basename(l.file), l.line, l.kind])).toEqual(
    Object.keys(PLANTED).map((kind, i) => ['worker-2.log', i + 2, kind]),
  );
  const report = describeCheck(dir, check);
  expect(report).toContain(`${Object.keys(PLANTED).length} secret(s) found`);
  expect(report).not.toContain(raw('svk_live_'));
});

it('finds nothing in ordinary and redacted lines, nor in an absent folder', () => {
  expect(findLeaks(CLEAN.join('\n'))).toEqual([]);
  expect(checkLogDir(path.join(dir, 'absent'))).toEqual({ files: 0, bytes: 0, leaks: [] });
});

it('a line the real logger writes with every kind of secret comes out clean, but for a prefix-less credential the grep alone catches', () => {
  const out: string[] = [];
  const log = createLogger({ service: 'roost-api', level: 'info', destination: { write: (l: string) => void out.push(l) } });
  log.info(
    { req: { headers: { authorization: `Bearer ${raw('svk_test_')}` } }, url: PLANTED['SAS signature'] },
    Object.values(PLANTED).join(' '),
  );
  expect(out).toHaveLength(1);
  expect(findLeaks(out.join(''))).toEqual([
    // A credential under a header name the logger does not know (x-api-key nested in a message) is only caught by the grep.
    expect.objectContaining({ kind: 'credential field' }),
  ]);
});
