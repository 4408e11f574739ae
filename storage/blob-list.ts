/**
 * A lean List Blobs (Azure Storage REST API "List Blobs", `GET {container}?restype=container&comp=list`):
 * one page fetched through a container SAS with list permission and parsed with a streaming XML parser
 * (saxes) for the three fields chunk presence needs: name, Content-Length and ETag.
 *
 * Why not the SDK's `listBlobsFlat`: it builds a full object model of every property of every blob, and on a
 * cold push's early confirmations (services/chunks.ts, docs/decisions/cli-push-pipeline.md) that cost the API
 * about 1 s of CPU per 4,400 blobs listed, against ~40 ms for this parse of the same 3 MB body
 * (docs/benchmarks.md "Cold push: the push's own CPU"). storage/blob.ts falls back to the SDK whenever this
 * path fails, so it only ever saves work.
 */
import { SaxesParser } from 'saxes';

/** One blob of a listing page: its full name, size in bytes (Content-Length) and ETag as the XML spells it. */
export interface ListedBlob {
  name: string;
  size: number;
  etag: string;
}

/** One page: its blobs in listing order, and the marker of the next page (undefined on the last page). */
export interface BlobListPage {
  blobs: ListedBlob[];
  nextMarker: string | undefined;
}

/** Blobs per page asked for (the service's maximum). */
export const LIST_PAGE_SIZE = 5000;
/** Per-request limit of a page fetch, ms. */
export const LIST_TIMEOUT_MS = 60_000;

/** A List Blobs request the service refused (status and its error code, if any). */
export class BlobListError extends Error {
  constructor(
    readonly status: number,
    readonly code: string | undefined,
  ) {
    super(`List Blobs answered ${status}${code ? ` ${code}` : ''}`);
    this.name = 'BlobListError';
  }
}

/**
 * Parses one List Blobs response body (`EnumerationResults`): every `Blobs/Blob` with its `Name` (decoded
 * when the service marks it `Encoded="true"`), `Properties/Content-Length` and `Properties/Etag`, and
 * `NextMarker` (empty or absent: last page). Elements it does not need are skipped.
 * @throws Error when the body is not well-formed XML or not an `EnumerationResults` document.
 */
export function parseBlobList(xml: string): BlobListPage {
  const parser = new SaxesParser();
  const path: string[] = [];
  const blobs: ListedBlob[] = [];
  let text = '';
  let encoded = false;
  let blob: ListedBlob | undefined;
  let nextMarker: string | undefined;
  let root: string | undefined;
  parser.on('opentag', (tag) => {
    root ??= tag.name;
    path.push(tag.name);
    text = '';
    if (path.length === 3 && tag.name === 'Blob' && path[1] === 'Blobs') blob = { name: '', size: 0, etag: '' };
    if (tag.name === 'Name') encoded = tag.attributes.Encoded === 'true';
  });
  parser.on('text', (t) => {
    text += t;
  });
  parser.on('closetag', (tag) => {
    const depth = path.length;
    if (blob && depth === 4 && tag.name === 'Name') blob.name = encoded ? decodeURIComponent(text) : text;
    else if (blob && depth === 5 && path[3] === 'Properties' && tag.name === 'Content-Length') blob.size = Number(text);
    else if (blob && depth === 5 && path[3] === 'Properties' && tag.name === 'Etag') blob.etag = text;
    else if (blob && depth === 3 && tag.name === 'Blob') {
      blobs.push(blob);
      blob = undefined;
    } else if (depth === 2 && tag.name === 'NextMarker') nextMarker = text || undefined;
    path.pop();
    text = '';
  });
  parser.write(xml).close();
  if (root !== 'EnumerationResults') throw new Error(`List Blobs: expected EnumerationResults, got ${root ?? 'no element'}`);
  return { blobs, nextMarker };
}

/**
 * Fetches one page of the blobs under `prefix` in the container at `containerUrl` (no query string) with the
 * container SAS query `sas` (list permission), at most `pageSize` blobs (1..5000), from `marker` on.
 * @throws BlobListError when the service answers other than 200; the fetch error (network, timeout); Error
 * from `parseBlobList`.
 */
export async function fetchBlobListPage(
  containerUrl: string,
  sas: string,
  prefix: string,
  marker?: string,
  pageSize = LIST_PAGE_SIZE,
): Promise<BlobListPage> {
  const query = new URLSearchParams({ restype: 'container', comp: 'list', prefix, maxresults: String(pageSize) });
  if (marker) query.set('marker', marker);
  const res = await fetch(`${containerUrl}?${query.toString()}&${sas}`, { signal: AbortSignal.timeout(LIST_TIMEOUT_MS) });
  const body = await res.text();
  if (res.status !== 200) throw new BlobListError(res.status, res.headers.get('x-ms-error-code') ?? undefined);
  return parseBlobList(body);
}
