/**
 * The `roost` commands added for routes the CLI lacked, run as a person runs them: the real binary
 * (bin/roost.js) as a child process against a real API on a port (PostgreSQL, Azurite, Temporal behind it):
 * `roosts update|delete`, `versions update`, `chunks mount|referrers`, and `deploy --policy` refusing a bad
 * value. Each good path is checked by reading the state back through the API (not through the CLI); each
 * refusal by its exit code and problem code (cli/context.ts EXIT: 2 usage, 4 not found, 5 auth).
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { cliRunner } from '../support/cli';
import { createHarness, type Harness } from '../support/harness';
import { scopedKey } from '../support/identity';
import { enrolMachineRows, machineIds, seedRoost } from '../integration/rollout-fixtures';

let h: Harness;
let api: string;
let tmp: string;
let configFile: string;

/** A well-formed roost id that names no roost. */
const NO_ROOST = `rst_${'0'.repeat(24)}`;

/** `roost …` with the site's key and site (unless overridden) and a private config file. */
const { roost, json, human, refused } = cliRunner(() => ({
  ROOST_API_URL: api,
  ROOST_API_KEY: h.apiKey,
  ROOST_SITE_ID: h.siteId,
  ROOST_CONFIG: configFile,
  ROOST_ID_TOKEN: undefined,
}));

/** GET through the API (app.inject with the site's key): status and parsed body. */
async function read(url: string): Promise<{ status: number; body: any }> {
  const res = await h.request({ method: 'GET', url });
  return { status: res.statusCode, body: res.json() };
}

/** Creates a roost through the API; returns its id. */
async function createRoost(name: string): Promise<string> {
  const res = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name } });
  if (res.statusCode !== 201) throw new Error(`roost create failed: ${res.statusCode} ${res.body}`);
  return res.json().roostId as string;
}

const sha256 = (text: string) => createHash('sha256').update(Buffer.from(text)).digest('hex');

beforeAll(async () => {
  h = await createHarness();
  api = await h.listen();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-cli-more-'));
  configFile = path.join(tmp, 'config', 'config.json');
});

afterAll(async () => {
  await h?.close();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

describe('roost roosts update and delete', () => {
  it('updates name, targets and extract path (read back through the API), in JSON and human form', async () => {
    const roostId = await createRoost('before update');
    const updated = await json([
      'roosts',
      'update',
      roostId,
      '--name',
      'after update',
      '--targets',
      'm-a,m-b',
      '--extract-path',
      'apps/cli',
    ]);
    expect(updated).toMatchObject({ roostId, name: 'after update', targets: ['m-a', 'm-b'], extractPath: 'apps/cli' });
    const stored = await read(`/api/roosts/${roostId}?siteId=${h.siteId}`);
    expect(stored.status).toBe(200);
    expect(stored.body).toMatchObject({ name: 'after update', targets: ['m-a', 'm-b'], extractPath: 'apps/cli' });

    // Only the named field changes; --targets "" empties the list.
    const out = await human(['roosts', 'update', roostId, '--targets', '']);
    expect(out).toBe(`updated roost ${roostId} (after update): 0 target(s), extract apps/cli\n`);
    expect((await read(`/api/roosts/${roostId}?siteId=${h.siteId}`)).body).toMatchObject({
      name: 'after update',
      targets: [],
      extractPath: 'apps/cli',
    });
  });

  it('refuses nothing to change (2), an unknown roost (4), a bad value (1, the API validation) and a read-only key (5)', async () => {
    const roostId = await createRoost('refusals');
    await refused(['roosts', 'update', roostId], 2, 'usage_error');
    const missing = await refused(['roosts', 'update', NO_ROOST, '--name', 'x'], 4, 'not_found');
    expect(missing.status).toBe(404);
    const blank = await refused(['roosts', 'update', roostId, '--name', '   '], 1, 'validation_failed');
    expect(blank.status).toBe(400);
    const readonly = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['read'] }]);
    const denied = await refused(['roosts', 'update', roostId, '--name', 'x'], 5, 'scope_insufficient', { ROOST_API_KEY: readonly });
    expect(denied.required).toMatchObject({ resource: 'roost', permission: 'write' });
    await refused(['roosts', 'delete', roostId], 5, 'scope_insufficient', { ROOST_API_KEY: readonly });
    await refused(['roosts', 'delete', roostId], 2, 'usage_error', { ROOST_SITE_ID: '' });
    expect((await read(`/api/roosts/${roostId}?siteId=${h.siteId}`)).body).toMatchObject({ name: 'refusals', deleted: false });
  });

  it('soft-deletes without asking (the roost is gone unless tombstones are asked for); a repeat says so; unknown is 4', async () => {
    const roostId = await createRoost('to delete');
    const del = await json(['roosts', 'delete', roostId]);
    expect(del).toEqual({ roostId, siteId: h.siteId, deleted: true, deletedAt: expect.any(String), alreadyDeleted: false });
    expect((await read(`/api/roosts/${roostId}?siteId=${h.siteId}`)).status).toBe(404);
    const tomb = await read(`/api/roosts/${roostId}?siteId=${h.siteId}&includeDeleted=true`);
    expect(tomb.body).toMatchObject({ roostId, deleted: true, deletedAt: del.deletedAt });

    const again = await json(['roosts', 'delete', roostId]);
    expect(again).toMatchObject({ alreadyDeleted: true, deletedAt: del.deletedAt });
    expect(await human(['roosts', 'delete', roostId])).toBe(`${roostId} was deleted already (at ${del.deletedAt})\n`);
    // A tombstoned roost is not found for update; an unknown one for delete.
    await refused(['roosts', 'update', roostId, '--name', 'x'], 4, 'not_found');
    await refused(['roosts', 'delete', NO_ROOST], 4, 'not_found');
  });
});

describe('roost versions update', () => {
  it('sets and clears the description of a version by any ref (read back through the API)', async () => {
    const seeded = await seedRoost(h);
    const set = await json(['versions', 'update', seeded.roostId, 'v1', '--description', 'first release']);
    expect(set).toMatchObject({
      roostId: seeded.roostId,
      siteId: h.siteId,
      versionId: seeded.versionId,
      versionNumber: 1,
      description: 'first release',
      updatedAt: expect.any(String),
    });
    const stored = await read(`/api/roosts/${seeded.roostId}/versions/${seeded.versionId}?siteId=${h.siteId}`);
    expect(stored.body.description).toBe('first release');

    expect(await human(['versions', 'update', seeded.roostId, 'current', '--description', 'renamed'])).toBe(
      `updated version 1 of ${seeded.roostId} (${seeded.versionId.slice(0, 12)}): "renamed"\n`,
    );
    expect((await read(`/api/roosts/${seeded.roostId}/versions/1?siteId=${h.siteId}`)).body.description).toBe('renamed');

    const cleared = await json(['versions', 'update', seeded.roostId, seeded.versionId, '--clear-description']);
    expect(cleared.description).toBeNull();
    expect((await read(`/api/roosts/${seeded.roostId}/versions/1?siteId=${h.siteId}`)).body.description).toBeNull();
    // The content did not change: same id, same files.
    expect((await read(`/api/roosts/${seeded.roostId}/versions/current?siteId=${h.siteId}`)).body.versionId).toBe(seeded.versionId);
  });

  it('refuses missing or conflicting flags and an over-long description (2), unknown version or roost (4), a read-only key (5)', async () => {
    const seeded = await seedRoost(h);
    await refused(['versions', 'update', seeded.roostId, '1'], 2, 'usage_error');
    await refused(['versions', 'update', seeded.roostId, '1', '--description', 'x', '--clear-description'], 2, 'usage_error');
    await refused(['versions', 'update', seeded.roostId, '1', '--description', 'x'.repeat(501)], 2, 'usage_error');
    const nov = await refused(['versions', 'update', seeded.roostId, 'v99', '--description', 'x'], 4, 'version_not_found');
    expect(nov.status).toBe(404);
    await refused(['versions', 'update', NO_ROOST, '1', '--description', 'x'], 4, 'not_found');
    await refused(['versions', 'update', seeded.roostId, 'nope!', '--description', 'x'], 1, 'version_ref_malformed');
    const readonly = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['read'] }]);
    await refused(['versions', 'update', seeded.roostId, '1', '--description', 'x'], 5, 'scope_insufficient', { ROOST_API_KEY: readonly });
    expect((await read(`/api/roosts/${seeded.roostId}/versions/1?siteId=${h.siteId}`)).body.description).toBeNull();
  });
});

describe('roost chunks mount and referrers', () => {
  it('mounts a held chunk into another roost (a referrer entry, read back through the API) and lists the referrers', async () => {
    const text = `shared ${Date.now()}\n`;
    const digest = sha256(text);
    const source = await seedRoost(h, { files: { 'shared.txt': text } });
    const target = await createRoost('mount target');

    const mounted = await json(['chunks', 'mount', digest.toUpperCase(), '--from', source.roostId, '--to', target]);
    expect(mounted).toEqual({ digest, siteId: h.siteId, from: source.roostId, to: target, mounted: true, zeroByte: true });
    const stored = await read(`/api/chunks/${digest}/referrers?siteId=${h.siteId}`);
    expect(stored.status).toBe(200);
    expect(stored.body.referrers).toContainEqual(
      expect.objectContaining({ source: 'mount', roostId: target, fromRoostId: source.roostId, toRoostId: target, createdBy: h.userId }),
    );
    expect(stored.body.referrers).toContainEqual(
      expect.objectContaining({ source: 'version', roostId: source.roostId, versionId: source.versionId }),
    );
    // A repeat is retry-safe: the same answer, still one mount entry.
    expect(await json(['chunks', 'mount', digest, '--from', source.roostId, '--to', target])).toEqual(mounted);
    const after = await read(`/api/chunks/${digest}/referrers?siteId=${h.siteId}`);
    expect(after.body.referrers.filter((e: { source: string }) => e.source === 'mount')).toHaveLength(1);

    const listed = await json(['chunks', 'referrers', digest]);
    expect(listed).toEqual({ digest, siteId: h.siteId, referrers: stored.body.referrers, next_page_token: '' });
    expect(listed.referrers).toHaveLength(2);
    const first = await json(['chunks', 'referrers', digest, '--page-size', '1']);
    expect(first.referrers).toEqual([listed.referrers[0]]);
    expect(first.next_page_token).not.toBe('');
    const rest = await json(['chunks', 'referrers', digest, '--page-size', '1', '--page-token', first.next_page_token]);
    expect(rest.referrers).toEqual([listed.referrers[1]]);
    expect((await json(['chunks', 'referrers', digest, '--page-size', '1', '--all'])).referrers).toEqual(listed.referrers);
    const table = await human(['chunks', 'referrers', digest]);
    expect(table).toMatch(/^ROOST\s+SOURCE\s+REFERENCE/);
    expect(table).toContain(`mount ${source.roostId} → ${target}`);
  });

  it('refuses a bad digest or equal/missing roosts (2), an unknown chunk or roost (4), a key without site write (5)', async () => {
    const text = `refusals ${Date.now()}\n`;
    const digest = sha256(text);
    const source = await seedRoost(h, { files: { 'r.txt': text } });
    const target = await createRoost('mount refusals');
    await refused(['chunks', 'mount', 'abc', '--from', source.roostId, '--to', target], 2, 'usage_error');
    await refused(['chunks', 'mount', digest, '--from', source.roostId, '--to', source.roostId], 2, 'usage_error');
    await refused(['chunks', 'mount', digest, '--from', source.roostId], 2, 'usage_error');
    await refused(['chunks', 'referrers', 'not-a-digest'], 2, 'usage_error');
    const unknownChunk = await refused(['chunks', 'mount', 'f'.repeat(64), '--from', source.roostId, '--to', target], 4, 'not_found');
    expect(unknownChunk.param).toBe('digest');
    const unknownRoost = await refused(['chunks', 'mount', digest, '--from', source.roostId, '--to', NO_ROOST], 4, 'not_found');
    expect(unknownRoost.param).toBe('to');
    await refused(['chunks', 'referrers', 'f'.repeat(64)], 4, 'not_found');
    const roostOnly = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['read', 'write'] }]);
    const denied = await refused(['chunks', 'mount', digest, '--from', source.roostId, '--to', target], 5, 'scope_insufficient', {
      ROOST_API_KEY: roostOnly,
    });
    expect(denied.required).toMatchObject({ resource: 'site', permission: 'write' });
    // Nothing was mounted by any refusal.
    const stored = await read(`/api/chunks/${digest}/referrers?siteId=${h.siteId}`);
    expect(stored.body.referrers.map((e: { source: string }) => e.source)).toEqual(['version']);
  });
});

describe('roost deploy --policy', () => {
  it('sends a policy from @file (dry run), and refuses malformed JSON, a missing file and a non-object as usage errors (2)', async () => {
    const ids = machineIds(2);
    await enrolMachineRows(h, ids);
    const seeded = await seedRoost(h, { targets: ids });
    const policyFile = path.join(tmp, 'policy.json');
    fs.writeFileSync(policyFile, JSON.stringify({ requirePromotion: 'canary', canary: { count: 1 } }));
    const plan = await json(['deploy', seeded.roostId, '--dry-run', '--policy', `@${policyFile}`]);
    expect(plan).toMatchObject({ dryRun: true, versionId: seeded.versionId, canary: [expect.any(String)] });
    expect(plan.fleet).toHaveLength(1);
    expect(plan.policy).toMatchObject({ requirePromotion: 'canary', canary: expect.anything() });

    const bad = await refused(['deploy', seeded.roostId, '--policy', '{"canary":'], 2, 'usage_error');
    expect(bad.detail).toMatch(/--policy must be JSON/);
    const missing = await refused(['deploy', seeded.roostId, '--policy', `@${path.join(tmp, 'no-such-policy.json')}`], 2, 'usage_error');
    expect(missing.detail).toMatch(/cannot read .*no-such-policy\.json: ENOENT/);
    const notJson = path.join(tmp, 'policy.txt');
    fs.writeFileSync(notJson, 'canary: 1\n');
    await refused(['deploy', seeded.roostId, '--policy', `@${notJson}`], 2, 'usage_error');
    await refused(['deploy', seeded.roostId, '--policy', '[1,2]'], 2, 'usage_error');
    // Even without a key the bad value is the error reported: nothing was sent.
    await refused(['deploy', seeded.roostId, '--policy', 'nope'], 2, 'usage_error', { ROOST_API_KEY: '' });
    // No rollout was created by any refusal (the dry run writes nothing either).
    expect((await read(`/api/roosts/${seeded.roostId}/rollouts?siteId=${h.siteId}`)).body.rollouts).toEqual([]);
    // A plain run without --json shows the error line and the exit code too.
    const plain = await roost(['deploy', seeded.roostId, '--policy', '{']);
    expect([plain.code, plain.stdout, plain.stderr]).toEqual([
      2,
      '',
      'error: usage_error: --policy must be JSON (or @file holding JSON)\n',
    ]);
  });
});
