/**
 * Cursor pagination (SPEC.md Conventions): canonical `page_size`/`page_token`, legacy aliases `limit` and
 * `cursor` (the canonical name wins when both are sent). Tokens are opaque base64url JSON; clients
 * round-trip them exactly. Responses carry `next_page_token` ('' at the end) and `nextPageToken`.
 */
import { Type } from '@sinclair/typebox';
import { ApiError } from '../domain/errors';

/** Querystring properties of a paged route (validated by `parsePaging`, so loose here). */
export const PagingQuery = {
  page_size: Type.Optional(Type.String({ description: 'page size' })),
  page_token: Type.Optional(Type.String({ description: 'opaque token from next_page_token' })),
  limit: Type.Optional(Type.String({ description: 'legacy alias of page_size' })),
  cursor: Type.Optional(Type.String({ description: 'legacy alias of page_token' })),
};

export interface Paging<T> {
  pageSize: number;
  /** Decoded token position, or undefined on the first page. */
  after: T | undefined;
}

/**
 * Reads page size and token. Sizes outside 1..max → 400 validation_failed (param page_size); a token
 * that does not decode → 400 validation_failed (param page_token).
 */
export function parsePaging<T = unknown>(query: Record<string, unknown>, opts: { defaultSize: number; maxSize: number }): Paging<T> {
  const rawSize = query.page_size ?? query.limit;
  const sizeParam = query.page_size !== undefined ? 'page_size' : 'limit';
  let pageSize = opts.defaultSize;
  if (rawSize !== undefined && rawSize !== '') {
    const s = String(rawSize);
    const n = /^[0-9]+$/.test(s) ? Number(s) : NaN;
    if (!Number.isInteger(n) || n < 1 || n > opts.maxSize) {
      throw new ApiError('validation_failed', `${sizeParam} must be an integer from 1 to ${opts.maxSize}`, {
        extras: { param: sizeParam, errors: { [sizeParam]: [`must be an integer from 1 to ${opts.maxSize}`] } },
      });
    }
    pageSize = n;
  }
  const rawToken = query.page_token ?? query.cursor;
  const tokenParam = query.page_token !== undefined ? 'page_token' : 'cursor';
  let after: T | undefined;
  if (rawToken !== undefined && rawToken !== '') {
    try {
      after = JSON.parse(Buffer.from(String(rawToken), 'base64url').toString('utf8')).p as T;
      if (after === undefined) throw new Error('empty');
    } catch {
      throw new ApiError('validation_failed', `${tokenParam} is not a token this server issued`, {
        extras: { param: tokenParam, errors: { [tokenParam]: ['unrecognised page token'] } },
      });
    }
  }
  return { pageSize, after };
}

/** Encodes a position as an opaque token. */
export function encodePageToken(position: unknown): string {
  return Buffer.from(JSON.stringify({ p: position }), 'utf8').toString('base64url');
}

/** The pagination fields of a response. `next` is the next position, or undefined on the last page. */
export function pageTokens(next: unknown | undefined): { next_page_token: string; nextPageToken: string } {
  const t = next === undefined ? '' : encodePageToken(next);
  return { next_page_token: t, nextPageToken: t };
}
