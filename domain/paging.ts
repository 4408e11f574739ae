/**
 * Page tokens (docs/decisions/pagination-tokens.md): opaque to clients, keyed and bound. A token is
 * base64url JSON `{ p, c }`: `p` the route's keyset position (any JSON value but null), `c` a 128-bit
 * HMAC-SHA-256 tag under the server's page-token key (config/secrets.ts `derivedKeyOf`) over the
 * binding and the position. The binding names the route, its path parameters (site, roost, version,
 * webhook…), its filters (the query without the paging parameters) and the caller, so a token issued for
 * one roost's version list is refused on another roost, on `/files`, with another `prefix` or by
 * another user. Pure: the api layer (api/pagination.ts) derives the binding from the request.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { ApiError } from './errors';
import { canonicalJson } from './version';

/** What a token is bound to. Every field takes part in the tag. */
export interface PageBinding {
  /** `METHOD /registered/url` of the list (or a shared name for alias routes of one list). */
  route: string;
  /** Path parameters as routed (site, roost, version ref, webhook…). */
  params: Record<string, unknown>;
  /** Query parameters that shape the list (filters), without page_size, page_token, limit, cursor, api_key. */
  filters: Record<string, unknown>;
  /** Who the list was issued to: `user:<userId>`, `agent:<siteId>/<machineId>` or `anonymous`. */
  caller: string;
}

/** Domain separation of the tag (bump when the token layout changes: old tokens are then refused). */
const TAG_CONTEXT = 'roost.page_token.v2';
/** Longest token accepted (characters of base64url). */
const MAX_TOKEN_CHARS = 4096;

function tagOf(key: Buffer, binding: PageBinding, positionJson: string): Buffer {
  const bound = canonicalJson([TAG_CONTEXT, binding.route, binding.params, binding.filters, binding.caller]);
  return createHmac('sha256', key).update(bound).update('\n').update(positionJson).digest().subarray(0, 16);
}

/**
 * The token of `position` for `binding` under `key` (32 bytes). Throws TypeError when the position has no
 * JSON form or is null/undefined (a route's bug, not a client's).
 */
export function signPageToken(key: Buffer, binding: PageBinding, position: unknown): string {
  if (position === undefined || position === null) throw new TypeError('a page position must be a JSON value other than null');
  const p = canonicalJson(position);
  return signedForm(p, tagOf(key, binding, p));
}

/** The token text of canonical position JSON `p` with its tag. */
function signedForm(p: string, tag: Buffer): string {
  return Buffer.from(`{"p":${p},"c":"${tag.toString('base64url')}"}`, 'utf8').toString('base64url');
}

/**
 * The position of `token` when it was issued under `key` for exactly `binding`; undefined for anything else
 * (garbage, truncated, hand-made, edited, issued for another route, resource, filter, caller or server key).
 */
export function openPageToken(key: Buffer, binding: PageBinding, token: string): unknown {
  if (token.length > MAX_TOKEN_CHARS || !/^[A-Za-z0-9_-]+$/.test(token)) return undefined;
  let parsed: { p?: unknown; c?: unknown };
  try {
    parsed = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as { p?: unknown; c?: unknown };
  } catch {
    return undefined;
  }
  if (parsed === null || typeof parsed !== 'object' || parsed.p === undefined || parsed.p === null || typeof parsed.c !== 'string')
    return undefined;
  let p: string;
  try {
    p = canonicalJson(parsed.p);
  } catch {
    return undefined;
  }
  const sent = Buffer.from(parsed.c, 'base64url');
  const want = tagOf(key, binding, p);
  if (sent.length !== want.length || !timingSafeEqual(sent, want)) return undefined;
  // Only the exact token issued: base64url decoding skips what it cannot use (a character appended to the
  // token, or to the tag), and the outer JSON could be re-spaced; none of those is a token this server issued.
  return signedForm(p, want) === token ? parsed.p : undefined;
}

/**
 * The one answer to a page token this server did not issue for this request (docs/contract.md
 * Conventions, Pagination): 400 validation_failed naming the parameter (`page_token` or `cursor`) with an
 * `errors` map.
 */
export function badPageToken(param: 'page_token' | 'cursor'): ApiError {
  return new ApiError(
    'validation_failed',
    `${param} is not a token this server issued for this list (route, resource, filters and caller); send back next_page_token exactly`,
    { extras: { param, errors: { [param]: ['unrecognised page token'] } } },
  );
}
