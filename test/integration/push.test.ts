/**
 * The CLI push pipeline and commands over real HTTP: the harness app listens on a real port, chunks go
 * to Azurite through signed URLs, and the `roost` binary itself is run for the --json contract.
 */
import { EXIT } from '../../cli/context';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ClientError, RoostClient } from '../../cli/client';
import { findMissing, publishScan, push, type PushProgress, uploadChunks } from '../../cli/push';
import { scanTree } from '../../cli/chunker';
import { listAllFiles, listVersions } from '../../cli/commands/versions';
import { type Rollout, watchRollout } from '../../cli/commands/deploy';
import { rolloutWorkflowId } from '../../workflows/client';
import { sha256Hex } from '../../domain/hex';
import { CHUNK_SIZE, computeVersionId } from '../../domain/version';
import { cliRunner } from '../support/cli';
import { createHarness, type Harness } from '../support/harness';
import type { Scope } from '../../domain/scopes';
import { scopedKey as scopedKeyOf } from '../support/identity';

const ROOT = path.resolve(__dirname, '..', '..');

let h: Harness;
let base: string;
let client: RoostClient;
let tmp: string;

beforeAll(async () => {
  h = await createHarness();
  base = await h.listen();
  client = new RoostClient({ baseUrl: base, apiKey: h.apiKey });
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'roost-push-'));
});
afterAll(async () => {
  await fsp.rm(tmp, { recursive: true, force: true });
  await h.close();
});

async function createRoost(name = `r-${randomBytes(3).toString('hex')}`): Promise<string> {
  const res = await client.post<{ roostId: string }>('/api/roosts', { siteId: h.siteId, name });
  return res.roostId;
}

async function write(dir: string, rel: string, data: Buffer | string): Promise<void> {
  const abs = path.join(dir, ...rel.split('/'));
  await fsp.mkdir(path.dirname(abs), { recursive: true });
  await fsp.writeFile(abs, data);
}

/** A tree with a 3-chunk file, a zero-byte file, nested folders, duplicate content and a symlink. */
async function makeTree(name: string): Promise<{ dir: string; big: Buffer }> {
  const dir = path.join(tmp, name);
  const big = randomBytes(2 * CHUNK_SIZE + 1234);
  await write(dir, 'bin/app.bin', big);
  await write(dir, 'empty.txt', '');
  await write(dir, 'config/deep/settings.json', '{"mode":"a"}');
  await write(dir, 'readme.md', '# hello\n');
  await write(dir, 'docs/copy-of-readme.md', '# hello\n');
  await fsp.symlink(path.join(dir, 'readme.md'), path.join(dir, 'link.md'));
  return { dir, big };
}

/** Runs the real `roost` binary with this harness's key (or `key`) and site. */
const cli = cliRunner(() => ({ ROOST_API_URL: base, ROOST_API_KEY: h.apiKey, ROOST_SITE_ID: h.siteId }), { cwd: ROOT });
const roost = (args: string[], key = h.apiKey) => cli.roost(args, { ROOST_API_KEY: key });

const scopedKey = (scopes: unknown[]) => scopedKeyOf(h, scopes as Scope[]);

describe('push pipeline', () => {
  let roostId: string;
  let tree: { dir: string; big: Buffer };
  let v1: Awaited<ReturnType<typeof push>>;

  beforeAll(async () => {
    roostId = await createRoost();
    tree = await makeTree('tree');
  });

  it('uploads every chunk of a fresh tree and publishes version 1', async () => {
    const stages = new Set<string>();
    const ticks: PushProgress[] = [];
    v1 = await push({
      client,
      siteId: h.siteId,
      roostId,
      dir: tree.dir,
      concurrency: 3,
      description: 'first',
      onProgress: (p) => (stages.add(p.stage), ticks.push(p)),
    });
    // app.bin: 3 chunks; settings.json: 1; readme + its copy: 1 shared; empty.txt: none
    expect(v1).toMatchObject({
      versionNumber: 1,
      previousVersionId: null,
      filesTotal: 5,
      chunksTotal: 5,
      chunksUploaded: 5,
      chunksSkipped: 0,
      replayed: false,
    });
    expect(v1.bytesUploaded).toBe(tree.big.length + '{"mode":"a"}'.length + '# hello\n'.length);
    expect(v1.skipped).toEqual([{ path: 'link.md', reason: 'symlink' }]);
    expect(v1.versionId).toBe(computeVersionId(v1.body));
    expect([...stages]).toEqual(['hash', 'check', 'upload', 'publish']);
    const lastUpload = ticks.filter((t) => t.stage === 'upload').pop()!;
    expect(lastUpload.done).toBe(lastUpload.total);
    for (const stage of ['hash', 'check', 'upload', 'publish'] as const) expect(v1.timings[stage]).toBeGreaterThanOrEqual(0);

    const app = v1.body.files.find((f) => f.path === 'bin/app.bin')!;
    expect(app.chunks.map((c) => c.size)).toEqual([CHUNK_SIZE, CHUNK_SIZE, 1234]);
    expect(app.chunks[0].hash).toBe(sha256Hex(tree.big.subarray(0, CHUNK_SIZE)));
    expect(v1.body.files.find((f) => f.path === 'empty.txt')).toEqual({ path: 'empty.txt', size: 0, chunks: [] });
    // the bytes really are in storage, at their size
    for (const c of app.chunks) expect(await h.deps.blob.chunkSize(h.siteId, c.hash)).toBe(c.size);
  });

  it('the published version lists exactly the tree, and its stored body hashes to its id', async () => {
    const files = await listAllFiles(client, h.siteId, roostId, 'current');
    expect(files).toEqual(v1.body.files);
    expect(files.map((f) => f.path)).toEqual([
      'bin/app.bin',
      'config/deep/settings.json',
      'docs/copy-of-readme.md',
      'empty.txt',
      'readme.md',
    ]);
    const fetched = await client.get<{ versionId: string; version: unknown; description: string }>(`/api/roosts/${roostId}/versions/1`, {
      siteId: h.siteId,
    });
    expect(fetched.versionId).toBe(v1.versionId);
    expect(fetched.description).toBe('first');
    expect(computeVersionId(fetched.version)).toBe(v1.versionId);
  });

  let v2: Awaited<ReturnType<typeof push>>;
  it('after one file changes, uploads only the new chunks', async () => {
    const changed = Buffer.from(tree.big);
    changed[changed.length - 1] ^= 0xff; // only the last chunk of app.bin differs
    await write(tree.dir, 'bin/app.bin', changed);
    await write(tree.dir, 'config/deep/settings.json', '{"mode":"b"}');
    v2 = await push({ client, siteId: h.siteId, roostId, dir: tree.dir });
    expect(v2).toMatchObject({ versionNumber: 2, previousVersionId: v1.versionId, chunksTotal: 5, chunksUploaded: 2, chunksSkipped: 3 });
    expect(v2.bytesUploaded).toBe(1234 + '{"mode":"b"}'.length);
    expect(v2.versionId).toBe(computeVersionId(v2.body));
    const files = await listAllFiles(client, h.siteId, roostId, v2.versionId);
    expect(files).toEqual(v2.body.files);
  });

  it('an unchanged tree uploads nothing', async () => {
    const v3 = await push({ client, siteId: h.siteId, roostId, dir: tree.dir });
    expect(v3).toMatchObject({ versionNumber: 3, chunksUploaded: 0, chunksSkipped: 5, bytesUploaded: 0 });
  });

  it('a retried push with the same Idempotency-Key and body is replayed, not published twice', async () => {
    const config = { producer: 'roost-cli', cliVersion: 'test', createdAt: '2024-01-01T00:00:00.000Z', hostname: 'h', platform: 'linux' };
    const idempotencyKey = `push-${randomBytes(6).toString('hex')}`;
    const first = await push({ client, siteId: h.siteId, roostId, dir: tree.dir, config, idempotencyKey });
    const again = await push({ client, siteId: h.siteId, roostId, dir: tree.dir, config, idempotencyKey });
    expect(again).toMatchObject({ versionId: first.versionId, versionNumber: first.versionNumber, replayed: true });
    const page = await listVersions(client, h.siteId, roostId, 100);
    expect(page.items.map((v) => v.versionNumber)).toEqual([4, 3, 2, 1]);
  });

  it('a stale expectedCurrentVersionId is refused with 412 version_stale and publishes nothing', async () => {
    const err = (await push({ client, siteId: h.siteId, roostId, dir: tree.dir, expectedCurrentVersionId: v1.versionId }).catch(
      (e) => e,
    )) as ClientError;
    expect(err).toBeInstanceOf(ClientError);
    expect(err).toMatchObject({ code: 'version_stale', status: 412 });
    expect((await listVersions(client, h.siteId, roostId, 100)).items).toHaveLength(4);
  });
});

describe('push refusals', () => {
  let roostId: string;
  let dir: string;
  beforeAll(async () => {
    roostId = await createRoost();
    dir = path.join(tmp, 'small');
    await write(dir, 'a.txt', `small ${randomBytes(8).toString('hex')}`);
  });

  it("another site's key gets 404 not_found and nothing is published", async () => {
    const other = await h.other();
    const foreign = new RoostClient({ baseUrl: base, apiKey: other.apiKey });
    await expect(push({ client: foreign, siteId: h.siteId, roostId, dir })).rejects.toMatchObject({ code: 'not_found', status: 404 });
    expect((await listVersions(client, h.siteId, roostId)).items).toHaveLength(0);
  });

  it('a key without site write gets 403 scope_insufficient naming the required scope', async () => {
    const key = await scopedKey([{ resource: 'roost', id: '*', permissions: ['read', 'write'] }]);
    const limited = new RoostClient({ baseUrl: base, apiKey: key });
    const err = (await push({ client: limited, siteId: h.siteId, roostId, dir }).catch((e) => e)) as ClientError;
    expect(err).toMatchObject({ code: 'scope_insufficient', status: 403 });
    expect(err.body.required).toEqual({ resource: 'site', id: h.siteId, permission: 'write' });
  });

  it('a malformed site id is 400 validation_failed; an unknown roost is 404 at publish', async () => {
    await expect(push({ client, siteId: 'not a site!', roostId, dir })).rejects.toMatchObject({ code: 'validation_failed', status: 400 });
    await expect(push({ client, siteId: h.siteId, roostId: 'rst_000000000000000000000000', dir })).rejects.toMatchObject({
      code: 'not_found',
      status: 404,
    });
  });

  it('an empty tree is refused before any request', async () => {
    const empty = path.join(tmp, 'empty-tree');
    await fsp.mkdir(path.join(empty, 'sub'), { recursive: true });
    await expect(push({ client, siteId: h.siteId, roostId, dir: empty })).rejects.toMatchObject({ name: 'ChunkerError' });
  });
});

describe('publish recovery', () => {
  it('a publish refused with 412 missingChunks uploads those chunks and publishes again', async () => {
    const roostId = await createRoost();
    const dir = path.join(tmp, 'recover');
    for (const name of ['a.txt', 'b/c.txt', 'd.bin']) await write(dir, name, randomBytes(64));
    const scan = await scanTree(dir);
    const stages: string[] = [];
    // No check and no upload first: the server names the missing chunks, the publisher supplies them.
    const res = await publishScan({ client, siteId: h.siteId, roostId, scan, onProgress: (p) => stages.push(p.stage) });
    expect(res.response).toMatchObject({ versionNumber: 1, versionId: computeVersionId(scan.body) });
    expect(res.tally.uploaded).toEqual(new Set(scan.locations.keys()));
    expect(stages).toEqual(['publish', 'upload', 'upload', 'upload', 'upload', 'publish', 'publish']);
    expect(await listAllFiles(client, h.siteId, roostId, 'current')).toEqual(scan.body.files);
  });

  it('gives up with precondition_failed when three publish attempts cannot supply every missing chunk', async () => {
    const roostId = await createRoost();
    const dir = path.join(tmp, 'recover-many');
    for (let i = 0; i < 45; i++) await write(dir, `f${i}.txt`, randomBytes(16));
    const scan = await scanTree(dir);
    const err = (await publishScan({ client, siteId: h.siteId, roostId, scan }).catch((e) => e)) as ClientError;
    expect(err).toMatchObject({ code: 'precondition_failed', status: 412 });
    expect((await listVersions(client, h.siteId, roostId)).items).toHaveLength(0);
  });
});

describe('batching', () => {
  it('checks and uploads more than 1000 distinct chunks in batches of at most 1000, and confirms finished hash ranges early', async () => {
    const roostId = await createRoost();
    const dir = path.join(tmp, 'many');
    const salt = randomBytes(4).toString('hex');
    for (let i = 0; i < 1005; i++) await write(dir, `f/${String(i).padStart(4, '0')}.txt`, `${salt}:${i}`);
    const recording = new RecordingClient({ baseUrl: base, apiKey: h.apiKey });
    const res = await push({ client: recording, siteId: h.siteId, roostId, dir, concurrency: 16 });
    const signed = recording.calls.filter((c) => c.path === '/api/chunks/upload-urls');
    // A check whose hashes were all PUT already is an early confirmation; the others are the checks before upload.
    const isConfirmation = (c: RecordedCall) => c.hashes.every((hash) => c.putBefore.has(hash));
    const checked = recording.calls.filter((c) => c.path === '/api/chunks/check' && !isConfirmation(c));
    const confirmed = recording.calls.filter((c) => c.path === '/api/chunks/check' && isConfirmation(c));
    // Pipelined: a batch leaves as soon as the pipeline would idle, never more than 1000 hashes, each hash once.
    for (const c of [...checked, ...signed, ...confirmed]) expect(c.hashes.length).toBeLessThanOrEqual(1000);
    expect(new Set(checked.flatMap((c) => c.hashes)).size).toBe(1005);
    expect(checked.flatMap((c) => c.hashes)).toHaveLength(1005);
    expect(signed.flatMap((c) => c.hashes)).toHaveLength(1005);
    // Early confirmations (cli/push.ts confirmBatchSize: 256 a call for 1005 uploads): each uploaded chunk at
    // most once, only after its PUT, in hash order, the last range left to publish; the server found and recorded every one (none came back missing).
    const early = confirmed.flatMap((c) => c.hashes);
    expect(confirmed.length).toBeGreaterThanOrEqual(1);
    for (const c of confirmed) expect(c.hashes.length).toBeGreaterThanOrEqual(256);
    // Each call ends with a first hex digit (the server lists whole digits), so no digit is listed twice.
    for (let i = 1; i < confirmed.length; i++) expect(confirmed[i].hashes[0][0]).not.toBe(confirmed[i - 1].hashes.at(-1)![0]);
    expect(new Set(early).size).toBe(early.length);
    expect(early).toEqual([...early].sort());
    expect(early.length).toBeLessThan(1005);
    expect(res.chunksConfirmedEarly).toBe(early.length);
    expect(res).toMatchObject({ filesTotal: 1005, chunksTotal: 1005, chunksUploaded: 1005, versionNumber: 1 });
    expect(res.upload).toEqual({ peakInFlight: 16, maxChunks: 16, maxBytes: null });
    const files = await listAllFiles(client, h.siteId, roostId, 'current');
    expect(files).toHaveLength(1005);
    expect(files).toEqual(res.body.files);
  });
});

interface RecordedCall {
  path: string;
  hashes: string[];
  /** Chunks whose PUT had completed when this call was made. */
  putBefore: ReadonlySet<string>;
}

/** A client that records the hashes of every chunk check and upload-urls call, and which chunk PUTs had completed by then. */
class RecordingClient extends RoostClient {
  readonly calls: RecordedCall[] = [];
  private readonly put = new Set<string>();
  override post<T = unknown>(p: string, body: unknown, opts?: Parameters<RoostClient['post']>[2]): Promise<T> {
    const hashes = (body as { hashes?: unknown }).hashes;
    if (Array.isArray(hashes)) this.calls.push({ path: p, hashes: hashes as string[], putBefore: new Set(this.put) });
    return super.post<T>(p, body, opts);
  }
  override async putBlob(url: string, bytes: Buffer, opts?: Parameters<RoostClient['putBlob']>[2]): Promise<'created' | 'exists'> {
    const res = await super.putBlob(url, bytes, opts);
    this.put.add(/\/chunks\/([0-9a-f]{64})\?/.exec(url)![1]);
    return res;
  }
}

describe('the pipelined push', () => {
  const PINNED = { producer: 'roost-cli', cliVersion: 'test', createdAt: '2024-01-01T00:00:00.000Z', hostname: 'h', platform: 'linux' };
  let dir: string;
  let sequential: { versionId: string; uploaded: Set<string> };

  /** Above the hashing pool's threshold (so files are hashed on threads, out of path order), many small chunks, duplicates. */
  beforeAll(async () => {
    dir = path.join(tmp, 'pipelined');
    const salt = randomBytes(4).toString('hex');
    await write(dir, 'big/a.bin', randomBytes(2 * CHUNK_SIZE + 17));
    await write(dir, 'big/b.bin', randomBytes(CHUNK_SIZE));
    await write(dir, 'big/c.bin', randomBytes(3 * CHUNK_SIZE - 5));
    for (let i = 0; i < 300; i++) await write(dir, `small/${String(i).padStart(3, '0')}.txt`, `${salt}:${i % 280}`);
    await write(dir, 'empty', '');
    // The same tree through the stages one after another, into a roost of its own (a fresh site: nothing deduplicated).
    const other = await h.other();
    const otherClient = new RoostClient({ baseUrl: base, apiKey: other.apiKey });
    const roost = await otherClient.post<{ roostId: string }>('/api/roosts', { siteId: other.siteId, name: 'sequential' });
    const scan = await scanTree(dir, { config: PINNED });
    const ctx = { client: otherClient, siteId: other.siteId, scan, concurrency: 4 };
    const tally = await uploadChunks(ctx, await findMissing(ctx));
    const res = await publishScan({ ...ctx, roostId: roost.roostId, tally });
    sequential = { versionId: res.response.versionId, uploaded: tally.uploaded };
  });

  it('publishes the same version and uploads the same chunks as the stages run one after another, with overlapping progress', async () => {
    const roostId = await createRoost();
    const ticks: PushProgress[] = [];
    const res = await push({ client, siteId: h.siteId, roostId, dir, config: PINNED, onProgress: (p) => ticks.push(p) });
    expect(res.versionId).toBe(sequential.versionId);
    expect(new Set(res.body.files.flatMap((f) => f.chunks.map((c) => c.hash)))).toEqual(sequential.uploaded);
    expect(res).toMatchObject({ filesTotal: 304, chunksTotal: sequential.uploaded.size, chunksUploaded: sequential.uploaded.size });
    const distinct = new Map(res.body.files.flatMap((f) => f.chunks.map((c) => [c.hash, c.size] as const)));
    expect(res.bytesUploaded).toBe([...distinct.values()].reduce((a, b) => a + b, 0));
    expect(await listAllFiles(client, h.siteId, roostId, 'current')).toEqual(res.body.files);
    for (const f of res.body.files) for (const c of f.chunks) expect(await h.deps.blob.chunkSize(h.siteId, c.hash)).toBe(c.size);
    // The 280 distinct small files went up from the bytes their hashing thread handed over (CARRY_MAX_BYTES),
    // and storage holds exactly those bytes.
    expect(res.chunksCarried).toBe(280);
    const small = res.body.files.filter((f) => f.path.startsWith('small/')).map((f) => f.chunks[0]);
    for (const c of small.slice(0, 20))
      expect(await h.deps.blob.chunkDigest(h.siteId, c.hash)).toMatchObject({ digest: c.hash, size: c.size });
    // the automatic rule: small chunks many at once
    expect(res.upload).toMatchObject({ maxChunks: 32, maxBytes: 64 * 1024 * 1024 });
    expect(res.upload.peakInFlight).toBeGreaterThan(4);
    // progress: stages start in pipeline order, each ends on a final tick with done = total, publish last
    const firsts = [...new Set(ticks.map((t) => t.stage))];
    expect(firsts).toEqual(['hash', 'check', 'upload', 'publish']);
    for (const stage of ['hash', 'check', 'upload', 'publish'] as const) {
      const last = ticks.filter((t) => t.stage === stage).pop()!;
      expect(last.final ?? true).toBe(true);
      expect(last.done).toBe(last.total);
    }
    const lastUpload = ticks.filter((t) => t.stage === 'upload').pop()!;
    expect(lastUpload.total).toBe(res.bytesUploaded);
    expect(lastUpload.detail).toEqual({ chunksDone: res.chunksUploaded, chunksTotal: res.chunksUploaded });
    // overlapped: some check or upload tick came before the last hash tick
    const lastHash = ticks.map((t) => t.stage).lastIndexOf('hash');
    expect(ticks.slice(0, lastHash).some((t) => t.stage === 'check' || t.stage === 'upload')).toBe(true);
    expect(ticks.findIndex((t) => t.stage === 'publish')).toBeGreaterThan(ticks.map((t) => t.stage).lastIndexOf('upload'));
    expect(res.wallMs).toBeGreaterThan(0);
  });

  it('with carrying off (carryMaxBytes 0) reads every chunk back from its file and publishes the same version', async () => {
    const other = await h.other();
    const otherClient = new RoostClient({ baseUrl: base, apiKey: other.apiKey });
    const roost = await otherClient.post<{ roostId: string }>('/api/roosts', { siteId: other.siteId, name: 'uncarried' });
    const res = await push({ client: otherClient, siteId: other.siteId, roostId: roost.roostId, dir, config: PINNED, carryMaxBytes: 0 });
    expect(res).toMatchObject({ versionId: sequential.versionId, chunksUploaded: sequential.uploaded.size, chunksCarried: 0 });
  });

  it('resumes: chunks an interrupted push already stored are not uploaded again', async () => {
    const roostId = await createRoost();
    const resumeDir = path.join(tmp, 'resume');
    for (let i = 0; i < 40; i++) await write(resumeDir, `f${i}.bin`, randomBytes(2000 + i));
    // The interrupted push: the first 15 chunks reached storage, nothing was published.
    const scan = await scanTree(resumeDir);
    const ctx = { client, siteId: h.siteId, scan };
    const stored = (await findMissing(ctx)).slice(0, 15);
    await uploadChunks(ctx, stored);
    const res = await push({ client, siteId: h.siteId, roostId, dir: resumeDir });
    expect(res).toMatchObject({ versionNumber: 1, chunksTotal: 40, chunksUploaded: 25, chunksSkipped: 15 });
    expect(await listAllFiles(client, h.siteId, roostId, 'current')).toEqual(res.body.files);
  });
});

describe('the roost binary', () => {
  let roostId: string;
  let dir: string;
  beforeAll(async () => {
    dir = path.join(tmp, 'cli-tree');
    await write(dir, 'one.txt', 'one');
    await write(dir, 'sub/two.txt', 'two');
  });

  it('roosts create and push --json print one JSON document on stdout', async () => {
    const created = await roost(['roosts', 'create', 'cli roost', '--targets', 'm1,m2', '--json']);
    expect(created.code).toBe(0);
    roostId = JSON.parse(created.stdout).roostId;
    expect(roostId).toMatch(/^rst_/);

    const pushed = await roost(['push', roostId, dir, '--json', '-d', 'from the cli']);
    expect(pushed.code).toBe(0);
    const out = JSON.parse(pushed.stdout);
    expect(out).toMatchObject({
      roostId,
      siteId: h.siteId,
      versionNumber: 1,
      filesTotal: 2,
      chunksTotal: 2,
      chunksUploaded: 2,
      chunksSkipped: 0,
    });
    expect(out.body).toBeUndefined();
    expect(Object.keys(out.timings).sort()).toEqual(['check', 'hash', 'publish', 'upload']);
    expect(pushed.stderr).toMatch(/hash: /); // quiet progress lines (not a TTY) go to stderr

    await write(dir, 'one.txt', 'one, changed');
    const second = await roost(['push', roostId, dir, '--json', '--quiet']);
    expect(second.code).toBe(0);
    expect(JSON.parse(second.stdout)).toMatchObject({ versionNumber: 2, chunksUploaded: 1, chunksSkipped: 1 });
    expect(second.stderr).toBe('');
  });

  it('versions list, show, diff and rollback speak JSON', async () => {
    const list = JSON.parse((await roost(['versions', 'list', roostId, '--json'])).stdout);
    expect(list.versions.map((v: { versionNumber: number }) => v.versionNumber)).toEqual([2, 1]);

    const show = JSON.parse((await roost(['versions', 'show', roostId, '#1', '--files', '--json'])).stdout);
    expect(show).toMatchObject({ versionNumber: 1, description: 'from the cli' });
    expect(show.files.map((f: { path: string }) => f.path)).toEqual(['one.txt', 'sub/two.txt']);

    const diff = JSON.parse((await roost(['diff', roostId, '1', '2', '--json'])).stdout);
    expect(diff.summary).toMatchObject({
      added: 0,
      removed: 0,
      changed: 1,
      unchanged: 1,
      hasChanges: true,
      netBytesDelta: 'one, changed'.length - 'one'.length,
    });
    expect(diff.modified.map((m: { path: string }) => m.path)).toEqual(['one.txt']);

    const rb = await roost(['rollback', roostId, '--json']);
    expect(rb.code).toBe(0);
    expect(JSON.parse(rb.stdout)).toMatchObject({
      ok: true,
      roostId,
      currentVersionNumber: 1,
      currentVersionId: list.versions[1].versionId,
    });

    const human = await roost(['versions', 'list', roostId]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/^#\s+VERSION/);
  });

  it('failures set the exit code, print code and detail on stderr, and {"error"} with --json', async () => {
    const bad = await roost(['versions', 'show', roostId, 'nope!', '--json']);
    expect(bad.code).toBe(1);
    expect(JSON.parse(bad.stdout).error).toMatchObject({ code: 'version_ref_malformed', status: 400 });
    expect(bad.stderr).toMatch(/^error: version_ref_malformed: /);

    const noop = await roost(['rollback', roostId, '--to', 'current']);
    expect(noop.code).toBe(1);
    expect(noop.stdout).toBe('');
    expect(noop.stderr).toMatch(/^error: rollback_no_op: /);

    const noKey = await roost(['roosts', 'list', '--json'], '');
    expect(noKey.code).toBe(EXIT.auth);
    expect(JSON.parse(noKey.stdout).error.code).toBe('no_credentials');
  });
});

describe('deploy --watch machine polling', () => {
  let roostId: string;
  let versionId: string;
  const agents: Record<string, RoostClient> = {};

  beforeAll(async () => {
    const dir = path.join(tmp, 'watch-tree');
    await write(dir, 'w.txt', `watch ${randomBytes(4).toString('hex')}`);
    roostId = await createRoost();
    versionId = (await push({ client, siteId: h.siteId, roostId, dir })).versionId;
    const { enrolmentSecret } = await client.post<{ enrolmentSecret: string }>(
      `/api/sites/${h.siteId}/enrolment-secret`,
      {},
      { idempotencyKey: true },
    );
    const anon = new RoostClient({ baseUrl: base });
    for (const machineId of ['watch-canary', 'watch-fleet']) {
      const { agentToken } = await anon.post<{ agentToken: string }>('/api/agent/enrol', {
        siteId: h.siteId,
        enrolmentSecret,
        machineId,
        hostname: machineId,
        agentVersion: 'test',
      });
      agents[machineId] = new RoostClient({ baseUrl: base, apiKey: agentToken });
    }
  });

  const report = (machineId: string, status: string, error?: string) =>
    agents[machineId].request('PUT', `/api/agent/roosts/${roostId}/state`, {
      body: {
        reportedVersionId: versionId,
        status,
        ...(error ? { error } : {}),
        chunks_fetched: 1,
        chunks_total: 1,
        chunks_dedup: 0,
        files_total: 1,
        files_assembled: 1,
        files_skipped: 0,
      },
    });
  const rollout = (canary: string[], fleet: string[]): Rollout => ({
    rolloutId: 'rol_test',
    versionId,
    siteId: h.siteId,
    roostId,
    stage: 'canary',
    canary,
    fleet,
    extractRoot: '',
    versionUrl: '',
  });

  it('times out while a machine has not reported the version', async () => {
    const res = await watchRollout(client, rollout(['watch-canary'], ['watch-fleet']), { intervalMs: 10, timeoutMs: 0 });
    expect(res.outcome).toBe('timeout');
    expect(res.machines.map((m) => [m.machineId, m.wave, m.status])).toEqual([
      ['watch-canary', 'canary', 'waiting'],
      ['watch-fleet', 'fleet', 'waiting'],
    ]);
  });

  it('stops as failed when the canary failed and the fleet never started', async () => {
    await report('watch-canary', 'failed', 'disk full');
    const res = await watchRollout(client, rollout(['watch-canary'], ['watch-fleet']), { intervalMs: 10, timeoutMs: 60_000 });
    expect(res.outcome).toBe('failed');
    expect(res.machines[0]).toMatchObject({
      machineId: 'watch-canary',
      status: 'failed',
      error: 'disk full',
      reportedVersionId: versionId,
    });
  });

  it('ends committed once every machine committed the version; unknown machines count as not committed', async () => {
    await report('watch-canary', 'committed');
    await report('watch-fleet', 'committed');
    const ok = await watchRollout(client, rollout(['watch-canary'], ['watch-fleet']), { intervalMs: 10, timeoutMs: 60_000 });
    expect(ok.outcome).toBe('committed');
    expect(ok.machines.every((m) => m.status === 'committed')).toBe(true);
    const ghost = await watchRollout(client, rollout(['watch-canary'], ['no-such-machine']), { intervalMs: 10, timeoutMs: 60_000 });
    expect(ghost.outcome).toBe('failed');
    expect(ghost.machines[1]).toMatchObject({ machineId: 'no-such-machine', status: 'not_found' });
  });

  describe('roost deploy', () => {
    afterAll(async () => {
      // No worker serves this harness's task queue: end the rollout workflow the deploy started.
      await h.deps.temporal.workflow
        .getHandle(rolloutWorkflowId(h.siteId, roostId, versionId))
        .terminate('test over')
        .catch(() => undefined);
    });

    it('--dry-run plans the waves and writes nothing', async () => {
      const res = await roost(['deploy', roostId, '--machines', 'watch-canary,watch-fleet', '--dry-run', '--json']);
      expect(res.code).toBe(0);
      const r = JSON.parse(res.stdout);
      expect(r).toMatchObject({ roostId, versionId, dryRun: true, alreadyRunning: false, stage: 'canary' });
      expect([...r.canary, ...r.fleet].sort()).toEqual(['watch-canary', 'watch-fleet']);
    });

    it('a key without deploy scope is refused with the required scope on stderr', async () => {
      const key = await scopedKey([{ resource: 'roost', id: '*', permissions: ['read', 'write'] }]);
      const res = await roost(['deploy', roostId, '--machines', 'watch-canary'], key);
      expect(res.code).toBe(EXIT.auth);
      expect(res.stderr).toMatch(/^error: scope_insufficient: /);
      expect(res.stderr).toContain(`required scope: roost=${roostId}:deploy`);
    });

    it('the version may be given as a number, and --watch ends committed when every machine committed it', async () => {
      const res = await roost([
        'deploy',
        roostId,
        '1',
        '--machines',
        'watch-canary,watch-fleet',
        '--watch',
        '--interval',
        '1',
        '--timeout',
        '60',
        '--json',
      ]);
      expect(res.code).toBe(0);
      const out = JSON.parse(res.stdout);
      expect(out.rollout).toMatchObject({ roostId, versionId, dryRun: false, alreadyRunning: false });
      expect(out.rollout.rolloutId).toMatch(/^rol_/);
      expect(out.watch.outcome).toBe('committed');
      expect(out.watch.machines.map((m: { machineId: string }) => m.machineId).sort()).toEqual(['watch-canary', 'watch-fleet']);

      const again = await roost(['deploy', roostId, '--machines', 'watch-canary,watch-fleet', '--json']);
      expect(JSON.parse(again.stdout)).toMatchObject({ rolloutId: out.rollout.rolloutId, alreadyRunning: true });
    });
  });
});
