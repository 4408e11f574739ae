/**
 * The lean blob listing (storage/blob-list.ts, BlobStore.listPages in storage/blob.ts) against real Azurite:
 * the same names, sizes and ETags as the SDK's `listBlobsFlat`, across pages, for awkward names too; and
 * when the lean path fails mid-listing (a dropped connection, a refusal), the listing goes on through the
 * SDK from the failed page, complete and without repeats, and a refusal turns the lean path off.
 */
import { randomBytes } from 'node:crypto';
import { BlobStore, chunkBlobName } from '../../storage/blob';
import { testConfig } from '../support/env';

const store = BlobStore.fromConfig({ ...testConfig(), ROOST_BLOB_CONTAINER_PREFIX: `bl${randomBytes(4).toString('hex')}-` });
const siteId = `site_${randomBytes(12).toString('hex')}`;
const prefix = `sites/${siteId}/`;
const names = [
  ...Array.from({ length: 7 }, () => chunkBlobName(siteId, randomBytes(32).toString('hex'))),
  `${prefix}odd/a b & <c> "d" 'e'.txt`,
  `${prefix}odd/é ü 100%/x?y#z`,
  `${prefix}odd/tab\there`,
];

beforeAll(async () => {
  await store.ensureContainers();
  await Promise.all(names.map((n, i) => store.put('versions', n, randomBytes(1 + i * 37), 'application/octet-stream')));
  // Outside the prefix: never listed.
  await store.put('versions', `sites/other/${randomBytes(4).toString('hex')}`, Buffer.from('x'), 'application/octet-stream');
});
afterAll(async () => {
  jest.restoreAllMocks();
  await store.deleteContainers();
});

async function sdkListing(): Promise<{ name: string; size: number; etag: string }[]> {
  const out: { name: string; size: number; etag: string }[] = [];
  for await (const b of store.container('versions').listBlobsFlat({ prefix })) {
    out.push({ name: b.name, size: b.properties.contentLength ?? 0, etag: b.properties.etag ?? '' });
  }
  return out;
}

async function leanListing(pageSize: number): Promise<{ pages: number; blobs: { name: string; size: number; etag: string }[] }> {
  const blobs: { name: string; size: number; etag: string }[] = [];
  let pages = 0;
  for await (const page of store.listPages('versions', prefix, pageSize)) {
    pages += 1;
    blobs.push(...page);
  }
  return { pages, blobs };
}

it('lists exactly what the SDK lists, page by page, awkward names included', async () => {
  const expected = await sdkListing();
  expect(expected).toHaveLength(names.length);
  expect(expected.map((b) => b.name).sort()).toEqual([...names].sort());
  const fetchSpy = jest.spyOn(globalThis, 'fetch');
  const lean = await leanListing(3);
  expect(fetchSpy).toHaveBeenCalledTimes(4); // 10 blobs, 3 a page: the lean path served every page
  fetchSpy.mockRestore();
  expect(lean.pages).toBe(4);
  expect(lean.blobs).toEqual(expected);
});

it('goes on through the SDK from the page that failed, without repeats', async () => {
  const expected = await sdkListing();
  const realFetch = globalThis.fetch;
  let calls = 0;
  const fetchSpy = jest.spyOn(globalThis, 'fetch').mockImplementation((input, init) => {
    calls += 1;
    if (calls === 2) return Promise.reject(new TypeError('fetch failed')); // the connection drops on page 2
    return realFetch(input, init);
  });
  const lean = await leanListing(4);
  fetchSpy.mockRestore();
  expect(calls).toBe(2);
  expect(lean.blobs).toEqual(expected);
  expect(lean.pages).toBe(3);
});

it('turns the lean path off after a refusal and lists through the SDK', async () => {
  const expected = await sdkListing();
  const fetchSpy = jest.spyOn(globalThis, 'fetch').mockResolvedValue(
    new Response('<Error><Code>AuthorizationFailure</Code></Error>', {
      status: 403,
      headers: { 'x-ms-error-code': 'AuthorizationFailure' },
    }),
  );
  expect((await leanListing(5000)).blobs).toEqual(expected);
  expect(fetchSpy).toHaveBeenCalledTimes(1);
  // Off for this store from now on: no further lean attempt.
  expect((await leanListing(5000)).blobs).toEqual(expected);
  expect(fetchSpy).toHaveBeenCalledTimes(1);
  fetchSpy.mockRestore();
});

it('finds chunks by listing with the lean path as with property reads', async () => {
  const fresh = BlobStore.fromConfig({
    ...testConfig(),
    ROOST_BLOB_CONTAINER_PREFIX: store.containerName('chunks').replace(/chunks$/, ''),
  });
  const unquoted = (etag: string) => etag.replace(/"/g, ''); // a listing spells ETags bare, a property read quoted
  const site = `site_${randomBytes(12).toString('hex')}`;
  const stored = await Promise.all(
    Array.from({ length: 12 }, async (_, i) => {
      const hash = randomBytes(32).toString('hex');
      await fresh.put('chunks', chunkBlobName(site, hash), randomBytes(10 + i), 'application/octet-stream');
      return hash;
    }),
  );
  const absent = randomBytes(32).toString('hex');
  const found = await fresh.chunkBlobsByListing(site, new Set([...stored, absent]));
  expect([...found.keys()].sort()).toEqual([...stored].sort());
  for (const hash of stored) {
    const head = (await fresh.chunkBlob(site, hash))!;
    expect(found.get(hash)!.size).toBe(head.size);
    expect(unquoted(found.get(hash)!.etag)).toBe(unquoted(head.etag));
  }
});
