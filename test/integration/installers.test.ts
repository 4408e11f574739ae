/**
 * The agent-installer catalog (docs/decisions/installer-catalog.md) through HTTP against real PostgreSQL,
 * Azurite and Temporal (a real worker runs the finalise workflow): the three-step upload with the bytes
 * PUT to the signed URL, checksum_mismatch / upload_missing / version_exists, set-latest, the delete rules,
 * paging, Idempotency-Key replays and the refusals (malformed versions, scopes, non-superadmins) that
 * change nothing. The catalog is platform-wide: versions here use a major number of their own, counts are
 * read before they are asserted on, and each test holds the catalog lock (test/support/catalog-lock.ts) so
 * no other file moves latest meanwhile.
 */
import { createHash, randomInt } from 'node:crypto';
import path from 'node:path';
import { recordHistory } from '../../scripts/record-history';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { idTokenFor, makeUser, scopedKey } from '../support/identity';
import { lockCatalog } from '../support/catalog-lock';
import { startTestWorker, type TestWorker } from './rollout-fixtures';
import { closeWorkerConnections } from '../../worker/worker';

/** Set ROOST_RECORD_HISTORIES=1 to refresh the replay histories of test/replay/installers.replay.test.ts. */
const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories', 'installers');
const record = async (version: string, name: string) => {
  if (RECORD) await recordHistory(h.deps.temporal, `installer-finalize:${version}`, path.join(HISTORIES, name));
};

let h: Harness;
let w: TestWorker;
let unlock: (() => Promise<void>) | undefined;
const major = randomInt(100_000, 900_000);
const v = (minor: number, patch = 0) => `${major}.${minor}.${patch}`;
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

type Res = Awaited<ReturnType<Harness['request']>>;
function expectProblem(res: Res, status: number, code: string): any {
  expect({ status: res.statusCode, code: res.json().code }).toEqual({ status, code });
  return res.json();
}

beforeAll(async () => {
  h = await createHarness();
  w = await startTestWorker(h, 'installers-test-worker');
});
beforeEach(async () => {
  unlock = await lockCatalog(h);
});
afterEach(async () => {
  await unlock?.();
});
afterAll(async () => {
  await w?.stop();
  await closeWorkerConnections();
  await h?.close();
});

const putBytes = (url: string, bytes: Buffer) =>
  fetch(url, { method: 'PUT', body: bytes, headers: { 'x-ms-blob-type': 'BlockBlob', 'Content-Type': 'application/octet-stream' } });

async function reserve(version: string, declared: string, key = idemKey(), releaseNotes?: string) {
  const res = await h.request({
    method: 'POST',
    url: '/api/installer/upload',
    body: { version, sha256: declared, releaseNotes },
    idempotencyKey: key,
  });
  return { res, key };
}
const finalize = (version: string, key: string, extra: Record<string, unknown> = {}) =>
  h.request({ method: 'PUT', url: '/api/installer/upload', body: { version, ...extra }, idempotencyKey: key });

/** The three steps for `bytes`; returns the finalise answer. */
async function upload(version: string, bytes: Buffer, opts: { setAsLatest?: boolean } = {}) {
  const { res, key } = await reserve(version, sha(bytes), undefined, `notes of ${version}`);
  expect(res.statusCode).toBe(201);
  expect((await putBytes(res.json().uploadUrl, bytes)).status).toBe(201);
  const fin = await finalize(version, key, opts.setAsLatest === undefined ? {} : { setAsLatest: opts.setAsLatest });
  expect(fin.statusCode).toBe(200);
  return fin.json();
}

const catalogFingerprint = async () =>
  (
    await h.deps.db.query(
      `SELECT version, state, sha256, deleted_at, upload_key_hash, (SELECT version FROM installer_latest) AS latest FROM installer_versions
        WHERE major = $1 ORDER BY version`,
      [major],
    )
  ).rows;

describe('upload, finalise, latest', () => {
  const bytesA = Buffer.from(`#!/bin/sh\necho roost-agent ${v(1)}\n`);

  it('reserves, takes the bytes through the signed URL, re-hashes them in the workflow and makes the version latest', async () => {
    const key = idemKey();
    const step1 = await reserve(v(1), sha(bytesA), key, 'first');
    expect(step1.res.statusCode).toBe(201);
    const r = step1.res.json();
    expect(r).toEqual({ version: v(1), uploadUrl: expect.stringContaining('sig='), expiresAt: expect.any(String) });
    expect(Date.parse(r.expiresAt) - Date.now()).toBeGreaterThan(55 * 60 * 1000);
    // Step 1 replayed with its key: the same reservation, marked replayed.
    const again = await reserve(v(1), sha(bytesA), key, 'first');
    expect(again.res.statusCode).toBe(201);
    expect(again.res.headers['idempotent-replayed']).toBe('true');
    expect(again.res.json().uploadUrl).toBe(r.uploadUrl);

    expect((await putBytes(r.uploadUrl, bytesA)).status).toBe(201);
    const fin = await finalize(v(1), key);
    expect(fin.statusCode).toBe(200);
    expect(fin.json()).toMatchObject({
      version: v(1),
      sha256: sha(bytesA),
      sizeBytes: bytesA.length,
      releaseNotes: 'first',
      latest: true,
      status: 'active',
    });
    const replay = await finalize(v(1), key);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(fin.json());

    const latest = await h.request({ method: 'GET', url: '/api/installer/latest' });
    expect(latest.json()).toMatchObject({ version: v(1), latest: true });
    // A finalised installer is immutable: its upload URL cannot overwrite it.
    expect((await putBytes(r.uploadUrl, Buffer.from('tampered'))).status).toBeGreaterThanOrEqual(400);
    expect((await h.deps.blob.get('installers', `agent/${v(1)}/roost-agent`))?.equals(bytesA)).toBe(true);
    // The finalise ran as a workflow with its own id.
    const desc = await h.deps.temporal.workflow.getHandle(`installer-finalize:${v(1)}`).describe();
    expect(desc.status.name).toBe('COMPLETED');
    await record(v(1), 'finalize-activated.json');
  });

  it('refuses bytes that do not hash to the declared checksum (422), discards them, and accepts the right ones through the same URL', async () => {
    const right = Buffer.from('right bytes');
    const latestBefore = (await h.request({ method: 'GET', url: '/api/installer/latest' })).json().version;
    const { res, key } = await reserve(v(2), sha(right));
    const url = res.json().uploadUrl;
    expect((await putBytes(url, Buffer.from('wrong bytes!'))).status).toBe(201);
    const before = await catalogFingerprint();
    const bad = expectProblem(await finalize(v(2), key), 422, 'checksum_mismatch');
    expect(bad).toMatchObject({
      reason: 'bytes',
      expectedSha256: sha(right),
      actualSha256: sha(Buffer.from('wrong bytes!')),
      sizeBytes: 12,
    });
    expect(await catalogFingerprint()).toEqual(before);
    expect(await h.deps.blob.get('installers', `agent/${v(2)}/roost-agent`)).toBeNull();
    await record(v(2), 'finalize-mismatch.json');
    // A sha256 on finalise that differs from step 1's.
    expect(expectProblem(await finalize(v(2), key, { sha256: sha(Buffer.from('x')) }), 422, 'checksum_mismatch').reason).toBe('declared');

    expect((await putBytes(url, right)).status).toBe(201);
    const ok = await finalize(v(2), key, { sha256: sha(right), setAsLatest: false });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toMatchObject({ version: v(2), latest: false, status: 'active' });
    expect((await h.request({ method: 'GET', url: '/api/installer/latest' })).json().version).toBe(latestBefore);
  });

  it('answers a finalise without uploaded bytes 409 upload_missing, another key 409 conflict, an unknown version 404', async () => {
    const { res, key } = await reserve(v(3), sha(Buffer.from('never sent')));
    expect(res.statusCode).toBe(201);
    const before = await catalogFingerprint();
    expectProblem(await finalize(v(3), key), 409, 'upload_missing');
    await record(v(3), 'finalize-missing.json');
    expectProblem(await finalize(v(3), idemKey()), 409, 'conflict');
    expectProblem(await finalize(v(99), idemKey()), 404, 'not_found');
    expect(await catalogFingerprint()).toEqual(before);
  });

  it('refuses a version that exists or that another live upload holds (409 version_exists); an expired reservation is taken over', async () => {
    expectProblem((await reserve(v(1), sha(bytesA))).res, 409, 'version_exists');
    expectProblem((await reserve(v(3), sha(Buffer.from('other')))).res, 409, 'version_exists');
    // The v(3) reservation's URL expired without a finalise: a new upload takes the version over.
    await h.deps.db.query(`UPDATE installer_versions SET upload_expires_at = now() - interval '1 minute' WHERE version = $1`, [v(3)]);
    const bytes = Buffer.from('taken over');
    const fin = await upload(v(3), bytes, { setAsLatest: false });
    expect(fin).toMatchObject({ version: v(3), sha256: sha(bytes), latest: false });
  });

  it('refuses malformed input with 400 and changes nothing', async () => {
    const before = await catalogFingerprint();
    const bad = async (method: string, url: string, body?: unknown, idem: string | true | undefined = true) =>
      expectProblem(await h.request({ method, url, body, idempotencyKey: idem }), 400, 'validation_failed');
    await bad('POST', '/api/installer/upload', { version: '1.2', sha256: sha(bytesA) });
    await bad('POST', '/api/installer/upload', { version: '01.2.3', sha256: sha(bytesA) });
    await bad('POST', '/api/installer/upload', { version: '1.2.3-beta', sha256: sha(bytesA) });
    await bad('POST', '/api/installer/upload', { version: v(7), sha256: sha(bytesA).toUpperCase() });
    await bad('POST', '/api/installer/upload', { version: v(7), sha256: sha(bytesA), extra: 1 });
    await bad('POST', '/api/installer/upload', { version: v(7), sha256: sha(bytesA), releaseNotes: 'x'.repeat(10_001) });
    await bad('PUT', '/api/installer/upload', { version: v(1), setAsLatest: 'yes' });
    await bad('POST', '/api/installer/1.02.3/set-latest');
    await bad('GET', '/api/installer?page_size=101', undefined, undefined);
    await bad('GET', '/api/installer?page_token=forged', undefined, undefined);
    // `latest` is no version: DELETE /api/installer/{version} does not match, and the path allows only GET.
    const del = await h.request({ method: 'DELETE', url: '/api/installer/latest', idempotencyKey: true });
    expectProblem(del, 405, 'method_not_allowed');
    expect(String(del.headers.allow)).not.toContain('DELETE');
    expectProblem(
      await h.request({ method: 'POST', url: '/api/installer/upload', body: { version: v(7), sha256: sha(bytesA) } }),
      400,
      'idempotency_key_required',
    );
    expectProblem(await h.request({ method: 'POST', url: `/api/installer/${v(1)}/set-latest` }), 400, 'idempotency_key_required');
    expect(await catalogFingerprint()).toEqual(before);
  });
});

describe('who may', () => {
  it('needs installer read / write / admin scopes and a superadmin; refusals change nothing', async () => {
    const before = await catalogFingerprint();
    const readOnly = await scopedKey(h, [{ resource: 'installer', id: '*', permissions: ['read'] }]);
    const writeOnly = await scopedKey(h, [{ resource: 'installer', id: '*', permissions: ['write'] }]);
    const noInstaller = await scopedKey(h, [{ resource: 'site', id: '*', permissions: ['admin'] }]);
    const body = { version: v(8), sha256: sha(bytesOf(8)) };

    expect((await h.request({ method: 'GET', url: '/api/installer', key: readOnly })).statusCode).toBe(200);
    expectProblem(await h.request({ method: 'GET', url: '/api/installer', key: noInstaller }), 403, 'scope_insufficient');
    expectProblem(await h.request({ method: 'GET', url: '/api/installer/latest', key: writeOnly }), 403, 'scope_insufficient');
    expectProblem(
      await h.request({ method: 'POST', url: '/api/installer/upload', body, key: readOnly, idempotencyKey: true }),
      403,
      'scope_insufficient',
    );
    expectProblem(
      await h.request({ method: 'POST', url: `/api/installer/${v(2)}/set-latest`, key: writeOnly, idempotencyKey: true }),
      403,
      'scope_insufficient',
    );
    expectProblem(await h.request({ method: 'DELETE', url: `/api/installer/${v(2)}`, key: writeOnly }), 403, 'scope_insufficient');

    const member = await makeUser(h.deps.db, { role: 'admin' });
    const token = await idTokenFor(h, member);
    expectProblem(await h.request({ method: 'GET', url: '/api/installer', key: token }), 403, 'forbidden');
    expectProblem(
      await h.request({ method: 'POST', url: '/api/installer/upload', body, key: token, idempotencyKey: true }),
      403,
      'forbidden',
    );
    expectProblem(await h.request({ method: 'DELETE', url: `/api/installer/${v(2)}`, key: token }), 403, 'forbidden');
    expectProblem(await h.request({ method: 'GET', url: '/api/installer', key: null }), 401, 'unauthorized');
    expect(await catalogFingerprint()).toEqual(before);
  });
});

function bytesOf(n: number): Buffer {
  return Buffer.from(`installer bytes ${major}.${n}`);
}

describe('set-latest and delete', () => {
  it('promotes an active version, protects latest, keeps two active versions, soft-deletes idempotently', async () => {
    // v(1), v(2) and v(3) active (from the tests above); v(1) was made latest (another file may have moved it since).
    const latestBefore = (await h.request({ method: 'GET', url: '/api/installer/latest' })).json().version;
    const sl = await h.request({ method: 'POST', url: `/api/installer/${v(2)}/set-latest`, idempotencyKey: true });
    expect(sl.json()).toEqual({ version: v(2), previousVersion: latestBefore, changed: true });
    const same = await h.request({ method: 'POST', url: `/api/installer/${v(2)}/set-latest`, idempotencyKey: true });
    expect(same.json()).toEqual({ version: v(2), previousVersion: v(2), changed: false });
    expectProblem(await h.request({ method: 'POST', url: `/api/installer/${v(50)}/set-latest`, idempotencyKey: true }), 404, 'not_found');

    let before = await catalogFingerprint();
    expectProblem(await h.request({ method: 'DELETE', url: `/api/installer/${v(2)}` }), 409, 'latest_version_protected');
    expect(await catalogFingerprint()).toEqual(before);

    const del = await h.request({ method: 'DELETE', url: `/api/installer/${v(1)}`, idempotencyKey: true });
    expect(del.statusCode).toBe(200);
    expect(del.json()).toMatchObject({ version: v(1), deleted: true, alreadyDeleted: false });
    const repeat = await h.request({ method: 'DELETE', url: `/api/installer/${v(1)}` });
    expect(repeat.json()).toMatchObject({ version: v(1), alreadyDeleted: true, deletedAt: del.json().deletedAt });
    expectProblem(await h.request({ method: 'POST', url: `/api/installer/${v(1)}/set-latest`, idempotencyKey: true }), 409, 'conflict');
    expectProblem(await h.request({ method: 'DELETE', url: `/api/installer/${v(60)}` }), 404, 'not_found');

    // The minimum of two active versions. The catalog is platform-wide: other files' active versions are
    // parked for this check (every file that touches the catalog holds the lock) and restored after it.
    const parked = (
      await h.deps.db.query<{ version: string }>(
        `UPDATE installer_versions SET state = 'parked' WHERE state = 'active' AND major <> $1 RETURNING version`,
        [major],
      )
    ).rows.map((r) => r.version);
    try {
      before = await catalogFingerprint();
      const third = await h.request({ method: 'DELETE', url: `/api/installer/${v(3)}` });
      expect(expectProblem(third, 409, 'min_versions_violated')).toMatchObject({ activeVersions: 2, minimum: 2 });
      expect(await catalogFingerprint()).toEqual(before);
    } finally {
      await h.deps.db.query(`UPDATE installer_versions SET state = 'active' WHERE version = ANY($1::text[])`, [parked]);
    }
  });

  it('lists newest first, paged, with soft-deleted versions only on request', async () => {
    await upload(v(10), bytesOf(10), { setAsLatest: false });
    await upload(v(9, 5), bytesOf(95), { setAsLatest: false });
    const mine = (rows: { version: string }[]) => rows.map((r) => r.version).filter((x) => x.startsWith(`${major}.`));
    const all = await h.request({ method: 'GET', url: '/api/installer?page_size=100&includeDeleted=true' });
    const listed = mine(all.json().versions);
    expect(listed).toEqual([v(10), v(9, 5), v(3), v(2), v(1)]);
    const active = mine((await h.request({ method: 'GET', url: '/api/installer?page_size=100' })).json().versions);
    expect(active).not.toContain(v(1));
    expect(all.json().versions.find((x: any) => x.version === v(1))).toMatchObject({ status: 'deleted', deletedAt: expect.any(String) });

    // Paging: one per page, in order, bound to its filters.
    const seen: string[] = [];
    let token = '';
    for (let i = 0; i < 50; i++) {
      const page = await h.request({
        method: 'GET',
        url: `/api/installer?page_size=1&includeDeleted=true${token ? `&page_token=${token}` : ''}`,
      });
      expect(page.statusCode).toBe(200);
      seen.push(...page.json().versions.map((x: any) => x.version));
      token = page.json().next_page_token;
      if (!token) break;
      if (i === 0) {
        expectProblem(await h.request({ method: 'GET', url: `/api/installer?page_size=1&page_token=${token}` }), 400, 'validation_failed');
      }
    }
    expect(mine(seen.map((version) => ({ version })))).toEqual(listed);
  });
});
