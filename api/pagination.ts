/**
 * Cursor pagination, the one helper every paged list route uses (docs/contract.md Conventions, Limits):
 * canonical `page_size`/`page_token`, legacy aliases `limit`/`cursor` (the canonical name wins when both
 * are sent). Responses carry `next_page_token` ('' at the end) and its alias `nextPageToken`.
 *
 * Tokens are opaque to clients (round-trip them exactly): base64url JSON `{ p, c }` where `p` is the
 * route's position (for example the last id seen) and `c` an integrity tag over `p`. A token this
 * server did not issue (garbage, truncated, hand-made or edited) fails the tag and is 400
 * validation_failed; routes still check the position's shape. docs/decisions/pagination-tokens.md.
 */
import { createHash } from 'node:crypto';
import { ApiError } from '../domain/errors';

export { PagingQuery } from '../domain/schemas';

/** Default and maximum page size of a route (docs/contract.md Limits), and optionally the shape of its positions. */
export interface PageLimits {
  defaultSize: number;
  maxSize: number;
  /** True for a position this route issues; a token carrying anything else is 400 validation_failed. */
  accept?: (position: unknown) => boolean;
}

export interface Paging<T> {
  pageSize: number;
  /** Decoded token position, or undefined on the first page. */
  after: T | undefined;
  /** Which query parameter carried the token ('page_token' or 'cursor'), for error messages. */
  tokenParam: 'page_token' | 'cursor';
}

const TOKEN_TAG_CONTEXT = 'roost.page_token.v1';

function tag(positionJson: string): string {
  return createHash('sha256').update(`${TOKEN_TAG_CONTEXT}\n${positionJson}`).digest('base64url').slice(0, 16);
}

/** 400 validation_failed naming a bad page token. */
export function badPageToken(param: 'page_token' | 'cursor' | string): ApiError {
  return new ApiError('validation_failed', `${param} is not a token this server issued; send back next_page_token exactly`, {
    extras: { param, errors: { [param]: ['unrecognised page token'] } },
  });
}

function present(v: unknown): boolean {
  return v !== undefined && v !== null && v !== '';
}

/**
 * Reads page size and token from a route's query. Sizes that are not an integer from 1 to
 * `maxSize` → 400 validation_failed (param page_size or limit); a token that does not decode or whose
 * tag does not match, or whose position `opts.accept` refuses → 400 validation_failed (param page_token or
 * cursor). Empty values count as absent.
 */
export function parsePaging<T = unknown>(query: Record<string, unknown>, opts: PageLimits): Paging<T> {
  const sizeParam = present(query.page_size) ? 'page_size' : 'limit';
  const rawSize = query[sizeParam];
  let pageSize = opts.defaultSize;
  if (present(rawSize)) {
    const s = String(rawSize);
    const n = /^[0-9]{1,9}$/.test(s) ? Number(s) : NaN;
    if (!Number.isInteger(n) || n < 1 || n > opts.maxSize) {
      throw new ApiError('validation_failed', `${sizeParam} must be an integer from 1 to ${opts.maxSize}`, {
        extras: { param: sizeParam, errors: { [sizeParam]: [`must be an integer from 1 to ${opts.maxSize}`] } },
      });
    }
    pageSize = n;
  }
  const tokenParam = present(query.page_token) ? 'page_token' : 'cursor';
  const rawToken = query[tokenParam];
  let after: T | undefined;
  if (present(rawToken)) {
    after = decodePageToken<T>(String(rawToken));
    if (after === undefined || (opts.accept && !opts.accept(after))) throw badPageToken(tokenParam);
  }
  return { pageSize, after, tokenParam };
}

/** Encodes a position (any JSON value but null) as an opaque token. */
export function encodePageToken(position: unknown): string {
  const p = JSON.stringify(position);
  return Buffer.from(JSON.stringify({ p: position, c: tag(p) }), 'utf8').toString('base64url');
}

/** The position of a token this server issued, or undefined for anything else. */
export function decodePageToken<T = unknown>(token: string): T | undefined {
  if (!/^[A-Za-z0-9_-]{1,4096}$/.test(token)) return undefined;
  try {
    const parsed = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as { p?: unknown; c?: unknown };
    if (parsed === null || typeof parsed !== 'object' || parsed.p === undefined || parsed.p === null || typeof parsed.c !== 'string')
      return undefined;
    return parsed.c === tag(JSON.stringify(parsed.p)) ? (parsed.p as T) : undefined;
  } catch {
    return undefined;
  }
}

/** The pagination fields of a response. `next` is the next position, or undefined on the last page. */
export function pageTokens(next: unknown | undefined): { next_page_token: string; nextPageToken: string } {
  const t = next === undefined ? '' : encodePageToken(next);
  return { next_page_token: t, nextPageToken: t };
}
