/**
 * Which hash prefixes a listing of a site's chunk blobs reads (storage/blob.ts chunkListingPrefixes): a push
 * confirms its uploaded chunks a hash range at a time (cli/push.ts), and each range must cost a listing of
 * that range, not of the whole site; a scattered set of hashes is one listing of everything.
 */
import { chunkListingPrefixes, listingShare } from '../../storage/blob';
import { confirmBatchSize } from '../../cli/push';

const hash = (prefix: string) => prefix + '0'.repeat(64 - prefix.length);

it('lists the two-digit prefixes of a narrow range, the first digits of a wider one, else the whole site', () => {
  expect(chunkListingPrefixes([hash('3a1'), hash('3a2'), hash('3b'), hash('3c')])).toEqual(['3a', '3b', '3c']);
  expect(chunkListingPrefixes(['40', '41', '42', '43', '44'].map(hash))).toEqual(['4']);
  expect(chunkListingPrefixes(['e0', 'e9', 'f1', 'f2', 'f3'].map(hash))).toEqual(['e', 'f']);
  expect(chunkListingPrefixes(['0', '1', '2', '3', '4', '5', '6', '7', '8'].map(hash))).toEqual(['']);
  expect(chunkListingPrefixes([])).toEqual([]);
  expect(listingShare(['3a', '3b'])).toBeCloseTo(2 / 256);
  expect(listingShare(['e', 'f'])).toBeCloseTo(1 / 8);
  expect(listingShare([''])).toBe(1);
});

it('confirms early only for pushes of 512 uploads or more, about an eighth at a time, 256..1000 hashes a call', () => {
  expect(confirmBatchSize(0)).toBe(0);
  expect(confirmBatchSize(511)).toBe(0);
  expect(confirmBatchSize(512)).toBe(256);
  expect(confirmBatchSize(4386)).toBe(549);
  expect(confirmBatchSize(17_547)).toBe(1000);
});
