/**
 * `roost installer …` run as a person runs it: the real binary (bin/roost.js) as a child process against
 * a real API on a port, with a worker running the finalise workflow. Upload (all three steps), list,
 * latest, set-latest, a refused delete of latest (exit 3), a malformed version (exit 2) and a key without
 * the installer scope (exit 5). Holds the catalog lock (test/support/catalog-lock.ts) while it runs.
 */
import { randomInt } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { cliRunner } from '../support/cli';
import { createHarness, type Harness } from '../support/harness';
import { scopedKey } from '../support/identity';
import { lockCatalog } from '../support/catalog-lock';
import { startTestWorker, type TestWorker } from '../integration/rollout-fixtures';
import { closeWorkerConnections } from '../../worker/worker';

let h: Harness;
let w: TestWorker;
let api: string;
let tmp: string;
let unlock: (() => Promise<void>) | undefined;

const { roost, json, refused } = cliRunner(() => ({
  ROOST_API_URL: api,
  ROOST_API_KEY: h.apiKey,
  ROOST_CONFIG: path.join(tmp, 'config.json'),
}));

beforeAll(async () => {
  h = await createHarness();
  w = await startTestWorker(h, 'cli-installer-worker');
  api = await h.listen();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-cli-installer-'));
  unlock = await lockCatalog(h);
});
afterAll(async () => {
  await unlock?.();
  await w?.stop();
  await closeWorkerConnections();
  await h?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

it('uploads, lists, shows latest, promotes; refuses a delete of latest, a bad version and a key without the scope', async () => {
  const major = randomInt(100_000, 900_000);
  const [a, b] = [`${major}.1.0`, `${major}.2.0`];
  fs.writeFileSync(path.join(tmp, 'a'), `agent build ${a}`);
  fs.writeFileSync(path.join(tmp, 'b'), `agent build ${b}`);

  expect(await json(['installer', 'upload', a, path.join(tmp, 'a'), '--release-notes', 'first'])).toMatchObject({
    version: a,
    latest: true,
    status: 'active',
    releaseNotes: 'first',
  });
  const second = await roost(['installer', 'upload', b, path.join(tmp, 'b'), '--no-latest']);
  expect([second.code, second.stdout.trim()]).toEqual([0, `uploaded ${b}`]);
  expect(second.stderr).toContain('finalising');

  const listed = (await json(['installer', 'list', '--all'])).versions.map((v: { version: string }) => v.version);
  expect(listed.indexOf(b)).toBeLessThan(listed.indexOf(a));
  expect((await json(['installer', 'latest'])).version).toBe(a);

  await refused(['installer', 'delete', a], 3, 'latest_version_protected');
  expect(await json(['installer', 'set-latest', b])).toEqual({ version: b, previousVersion: a, changed: true });
  await refused(['installer', 'upload', '1.2', path.join(tmp, 'a')], 2, 'usage_error');
  const noScope = await scopedKey(h, [{ resource: 'site', id: '*', permissions: ['read'] }]);
  await refused(['installer', 'list'], 5, 'scope_insufficient', { ROOST_API_KEY: noScope });
});
