/**
 * A chunk PUT cut by the network is retried and the push publishes what it would have without the failure; and
 * `roost push` stops at its first fatal error: with Azure Blob unreachable (the API's blob endpoint is a TCP
 * proxy in front of the suite's Azurite, closed for the test), the upload stage rejects once the first chunk
 * has used its retries, uploads in flight are abandoned and queued ones never start (cli/push.ts).
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { azuriteConnectionString } from '../../config/env';
import { RoostClient, type RetryInfo } from '../../cli/client';
import { scanTree } from '../../cli/chunker';
import { findMissing, push, uploadChunks } from '../../cli/push';
import { computeVersionId } from '../../domain/version';
import { createHarness, type Harness } from '../support/harness';
import { testConfig } from '../support/env';

let h: Harness;
let proxy: net.Server;
const sockets = new Set<net.Socket>();
let tmp: string;
/** Trees of single tests, removed after the file. */
const dirs: string[] = [];
let refuse = 0;
let refused = 0;

/** The proxy's connection handler: forwards to the suite's Azurite, cutting refused PUTs (`refuse`). */
function forward(client: net.Socket): void {
  const azurite = testConfig().ROOST_AZURITE_PORT;
  sockets.add(client);
  client.once('data', (first: Buffer) => {
    // While `refuse` > 0, a new connection whose first request is a PUT is cut (a failed chunk PUT the client retries).
    if (refuse > 0 && first.toString('latin1', 0, 4) === 'PUT ') {
      refuse -= 1;
      refused += 1;
      client.destroy();
      return;
    }
    const upstream = net.connect(azurite, '127.0.0.1');
    sockets.add(upstream);
    upstream.write(first);
    client.pipe(upstream).pipe(client);
    upstream.on('error', () => (client.destroy(), upstream.destroy())).on('close', () => (client.destroy(), upstream.destroy()));
    client.on('close', () => upstream.destroy());
  });
  client.on('error', () => client.destroy());
}

/** Azure Blob goes away: the proxy stops listening and drops its connections. */
async function proxyDown(): Promise<void> {
  // close() stops accepting at once but calls back only once every connection has ended: cut them first.
  const closed = new Promise<void>((resolve) => proxy.close(() => resolve()));
  for (const s of sockets) s.destroy();
  sockets.clear();
  await closed;
}

/** The proxy listens (again) on `port` (0: a free one); returns the port. */
async function proxyUp(port = 0): Promise<number> {
  proxy = net.createServer(forward);
  await new Promise<void>((resolve) => proxy.listen(port, '127.0.0.1', resolve));
  return (proxy.address() as net.AddressInfo).port;
}

beforeAll(async () => {
  const port = await proxyUp();
  h = await createHarness({ AZURE_STORAGE_CONNECTION_STRING: azuriteConnectionString(port) });
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'roost-push-abort-'));
  for (let i = 0; i < 24; i++) fs.writeFileSync(path.join(tmp, `f${i}.bin`), randomBytes(1024 + i));
});

afterAll(async () => {
  await h?.close();
  proxy?.close();
  for (const s of sockets) s.destroy();
  await fsp.rm(tmp, { recursive: true, force: true });
  for (const d of dirs) await fsp.rm(d, { recursive: true, force: true });
});

test('a PUT that fails is retried and the pipelined push publishes the same version as without failures', async () => {
  const base = await h.listen();
  const retries: RetryInfo[] = [];
  // A site of its own: the next test expects every chunk of the tree to be missing from the harness's site.
  const other = await h.other();
  const client = new RoostClient({
    baseUrl: base,
    apiKey: other.apiKey,
    maxAttempts: 4,
    onRetry: (r) => retries.push(r),
    sleep: (ms) => new Promise((r) => setTimeout(r, Math.min(ms, 50))),
  });
  const roost = await client.post<{ roostId: string }>('/api/roosts', {
    siteId: other.siteId,
    name: `retry-${randomBytes(3).toString('hex')}`,
  });
  const config = { producer: 'roost-cli', cliVersion: 'test', createdAt: '2024-01-01T00:00:00.000Z', hostname: 'h', platform: 'linux' };
  refuse = 2;
  const res = await push({ client, siteId: other.siteId, roostId: roost.roostId, dir: tmp, config, concurrency: 2 });
  expect(refused).toBe(2);
  expect(retries.filter((r) => r.method === 'PUT').length).toBeGreaterThanOrEqual(1);
  expect(res).toMatchObject({ versionNumber: 1, chunksTotal: 24, chunksUploaded: 24 });
  const scan = await scanTree(tmp, { config });
  expect(res.versionId).toBe(computeVersionId(scan.body));
  for (const f of res.body.files) for (const c of f.chunks) expect(await h.deps.blob.chunkSize(other.siteId, c.hash)).toBe(c.size);
});

test('a push rides out a blob storage outage that starts mid-upload and outlasts the 6 attempts: it publishes once storage is back', async () => {
  const base = await h.listen();
  const retries: RetryInfo[] = [];
  const other = await h.other();
  const client = new RoostClient({
    baseUrl: base,
    apiKey: other.apiKey,
    maxAttempts: 3,
    // The requested pauses count toward the window (cli/client.ts putBlob); they are cut short here.
    outageWindowMs: 3_600_000,
    onRetry: (r) => retries.push(r),
    sleep: (ms) => new Promise((r) => setTimeout(r, Math.min(ms, 300))),
  });
  const roost = await client.post<{ roostId: string }>('/api/roosts', {
    siteId: other.siteId,
    name: `outage-${randomBytes(3).toString('hex')}`,
  });
  // Enough chunks that most are still to upload when the first is stored.
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'roost-push-outage-'));
  dirs.push(dir);
  for (let i = 0; i < 200; i++) fs.writeFileSync(path.join(dir, `g${i}.bin`), randomBytes(32 * 1024));
  const port = (proxy.address() as net.AddressInfo).port;
  let outage: Promise<void> | undefined;
  const res = await push({
    client,
    siteId: other.siteId,
    roostId: roost.roostId,
    dir,
    concurrency: 2,
    onProgress: (p) => {
      // Storage goes away once the first chunk is stored, and comes back 6 s later on the same port.
      if (p.stage === 'upload' && p.done > 0 && !outage) {
        outage = proxyDown()
          .then(() => new Promise((r) => setTimeout(r, 6000)))
          .then(() => proxyUp(port))
          .then(() => undefined);
      }
    },
  });
  await outage;
  expect(outage).toBeDefined();
  expect(res).toMatchObject({ versionNumber: 1, chunksTotal: 200, chunksUploaded: 200 });
  // Some PUT went on past its 3 attempts through the outage.
  const perUrl = new Map<string, number>();
  for (const r of retries.filter((x) => x.method === 'PUT')) perUrl.set(r.url, (perUrl.get(r.url) ?? 0) + 1);
  expect(Math.max(...perUrl.values())).toBeGreaterThan(3);
  for (const f of res.body.files) for (const c of f.chunks) expect(await h.deps.blob.chunkSize(other.siteId, c.hash)).toBe(c.size);
});

test('an unreachable blob store ends the upload stage at the first fatal error, with nothing left running', async () => {
  const base = await h.listen();
  const retries: RetryInfo[] = [];
  const client = new RoostClient({
    baseUrl: base,
    apiKey: h.apiKey,
    maxAttempts: 3,
    onRetry: (r) => retries.push(r),
    sleep: (ms) => new Promise((r) => setTimeout(r, Math.min(ms, 150))),
  });
  const scan = await scanTree(tmp);
  const missing = await findMissing({ client, siteId: h.siteId, scan });
  expect(missing).toHaveLength(24);

  await proxyDown();

  const started = Date.now();
  const err = (await uploadChunks({ client, siteId: h.siteId, scan, concurrency: 4 }, missing).catch((e: unknown) => e)) as {
    code?: string;
  };
  const elapsed = Date.now() - started;
  expect(err.code).toBe('network_error');
  const atRejection = retries.length;
  // Without the abort, the other 23 chunks would each go on through their own retries after this point.
  await new Promise((r) => setTimeout(r, 1500));
  expect(retries.length).toBe(atRejection);
  // At most the first `concurrency` chunks were ever tried, each at most maxAttempts - 1 retry sleeps.
  const tried = new Set(retries.map((r) => r.url));
  expect(tried.size).toBeLessThanOrEqual(4);
  expect(atRejection).toBeLessThanOrEqual(4 * 2);
  expect(elapsed).toBeLessThan(15_000); // not each chunk's retries in turn (the counts above are the proof)
});
