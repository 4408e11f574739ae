/**
 * storage/blob.ts memoises plain blob URLs (`blobUrl`, the base of every signed URL): the memoised URL must be
 * exactly the one the SDK's blob client spells, for ordinary and awkward blob names alike.
 */
import { BlobServiceClient } from '@azure/storage-blob';
import { azuriteConnectionString, loadConfig } from '../../config/env';
import { BlobStore } from '../../storage/blob';

const names = [
  'sites/ste_0123456789abcdef/roosts/rst_1/versions/0f.json',
  'sites/a b/é ü/100%/x?y#z.json',
  'sites//double/slash/',
  'plain',
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
