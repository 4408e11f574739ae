/**
 * storage/blob-list.ts parseBlobList: the three fields of every blob of a List Blobs page, the next marker,
 * names the service sends URL-encoded or XML-escaped, and bodies that are not a listing.
 */
import { parseBlobList } from '../../storage/blob-list';

const page = (blobs: string, marker = '') =>
  `<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="http://x/" ContainerName="c"><Prefix>p</Prefix><MaxResults>2</MaxResults><Blobs>${blobs}</Blobs><NextMarker>${marker}</NextMarker></EnumerationResults>`;
const blob = (name: string, size: number, etag: string, encoded = false) =>
  `<Blob><Name${encoded ? ' Encoded="true"' : ''}>${name}</Name><Properties><Creation-Time>Sat, 28 Nov 2026 10:25:17 GMT</Creation-Time><Etag>${etag}</Etag><Content-Length>${size}</Content-Length><Content-Type>application/octet-stream</Content-Type><Content-MD5 /></Properties><OrMetadata /></Blob>`;

describe('parseBlobList', () => {
  it('reads name, size and ETag of every blob, and the next marker', () => {
    const r = parseBlobList(page(blob('sites/s/chunks/ab', 12, '0x1') + blob('sites/s/chunks/cd', 0, '"0x2"'), '2!72!MDAw'));
    expect(r).toEqual({
      blobs: [
        { name: 'sites/s/chunks/ab', size: 12, etag: '0x1' },
        { name: 'sites/s/chunks/cd', size: 0, etag: '"0x2"' },
      ],
      nextMarker: '2!72!MDAw',
    });
  });

  it('has no next marker on the last page, empty or absent', () => {
    expect(parseBlobList(page('')).nextMarker).toBeUndefined();
    expect(parseBlobList('<EnumerationResults><Blobs/></EnumerationResults>')).toEqual({ blobs: [], nextMarker: undefined });
  });

  it('unescapes XML entities and decodes names marked Encoded', () => {
    const r = parseBlobList(page(blob('a &amp; &lt;b&gt; &quot;c&quot;', 1, 'e') + blob('x%20y%C3%A9%0A', 2, 'f', true)));
    expect(r.blobs.map((b) => b.name)).toEqual(['a & <b> "c"', 'x yé\n']);
  });

  it('ignores a Name outside Blobs/Blob (the container name of other documents)', () => {
    const r = parseBlobList(`<EnumerationResults><Name>not a blob</Name><Blobs>${blob('n', 3, 'e')}</Blobs></EnumerationResults>`);
    expect(r.blobs).toEqual([{ name: 'n', size: 3, etag: 'e' }]);
  });

  it.each([
    ['malformed XML', '<EnumerationResults><Blobs><Blob></Blobs>'],
    ['an error document', '<?xml version="1.0"?><Error><Code>AuthenticationFailed</Code></Error>'],
    ['no element at all', ''],
  ])('throws on %s', (_what, body) => {
    expect(() => parseBlobList(body)).toThrow();
  });
});
