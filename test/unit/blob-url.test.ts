/**
 * storage/blob.ts spells plain blob URLs (`blobUrl`, the base of every signed URL) itself for names of unreserved
 * characters and memoises the SDK's for the others: either way the URL must be exactly the one the SDK's blob
 * client spells, for ordinary and awkward blob names alike.
 */
import { BlobServiceClient } from '@azure/storage-blob';
import { azuriteConnectionString, loadConfig } from '../../config/env';
import { BlobStore } from '../../storage/blob';

const names = [
  'sites/ste_0123456789abcdef/roosts/rst_1/versions/0f.json',
  'sites/a b/é ü/100%/x?y#z.json',
  'sites//double/slash/',
  'plain',
  'sites/site_0123456789abcdef01234567/chunks/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',
  'installers/1.2.3/roost-agent-1.2.3-x64.msi',
  'a~b/c-d/e_f/g.h',
  'sites/./x',
  'sites/../x',
  '../x',
  'sites/x/..',
  'sites/.hidden/..x/x..',
  'sites/x/',
  '/lead',
  'UPPER/lower/0123',
  'sites/x:y/z',
  "sites/x'y/(z)*!",
];

describe('BlobStore.blobUrl', () => {
  const conn = azuriteConnectionString(10000);
  const cfg = { ...loadConfig({}), AZURE_STORAGE_CONNECTION_STRING: conn, ROOST_BLOB_CONTAINER_PREFIX: 'unit-' };
  const store = BlobStore.fromConfig(cfg);
  const sdk = BlobServiceClient.fromConnectionString(conn);

  it.each(names)('equals the SDK URL for %j, first and second time', (name) => {
    const expected = sdk.getContainerClient(store.containerName('versions')).getBlobClient(name).url;
    expect(store.blobUrl('versions', name)).toBe(expected);
    expect(store.blobUrl('versions', name)).toBe(expected);
    // Same name, other container: another URL.
    expect(store.blobUrl('chunks', name)).toBe(sdk.getContainerClient(store.containerName('chunks')).getBlobClient(name).url);
  });
});

describe('BlobStore.blobUrl with a container URL that carries a query', () => {
  it('falls back to the SDK spelling', () => {
    const conn = `BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;SharedAccessSignature=sv=2021-08-06&ss=b&srt=sco&sp=rl&se=2030-01-01T00:00:00Z&sig=abc`;
    const sdk = BlobServiceClient.fromConnectionString(conn);
    const store = BlobStore.fromConfig({ ...loadConfig({}), AZURE_STORAGE_CONNECTION_STRING: conn });
    const name = 'sites/s/chunks/ab';
    expect(store.blobUrl('chunks', name)).toBe(sdk.getContainerClient(store.containerName('chunks')).getBlobClient(name).url);
  });
});
