/**
 * Cursor pagination, the one helper every paged list route uses (docs/contract.md Conventions, Limits):
 * canonical `page_size`/`page_token`, legacy aliases `limit`/`cursor` (the canonical name wins when both
 * are sent). Responses carry `next_page_token` ('' at the end) and its alias `nextPageToken`.
 *
 * A route calls `parsePaging(request, limits)` once and answers with `paging.tokens(next)`: the request is
 * a required argument because a token is bound to it. Tokens are HMAC-tagged under a key derived from the
 * server secret (config/secrets.ts `derivedKeyOf`) over the route, its path parameters (site, roost,
 * version…), its filters (every other query parameter) and the caller (domain/paging.ts), so a token of
 * one roost's version list is refused on another roost, on `/files`, with other filters or from another
 * user: 400 validation_failed naming `page_token` or `cursor`, the one answer to every token this server
 * did not issue for this request. docs/decisions/pagination-tokens.md.
 */
import type { FastifyRequest } from 'fastify';
import { derivedKeyOf } from '../config/secrets';
import { ApiError } from '../domain/errors';
import { badPageToken, openPageToken, type PageBinding, signPageToken } from '../domain/paging';

export { pagingQuery } from '../domain/schemas';
export { badPageToken } from '../domain/paging';

/** The HKDF purpose of the page-token key (a new purpose retires every token issued before). */
export const PAGE_TOKEN_KEY_PURPOSE = 'roost.page_token.v2';

/** Query parameters that are paging or credentials, not filters: they take no part in a token's binding. */
const NOT_FILTERS = new Set(['page_size', 'page_token', 'limit', 'cursor', 'api_key']);

/** Default and maximum page size of a route (docs/contract.md Limits) and the shape of its positions. */
export interface PageLimits<T> {
  defaultSize: number;
  maxSize: number;
  /**
   * True for a position this route issues. Tokens are tagged, so this only guards against a route's own
   * change of position shape; anything else is the same 400 as a forged token.
   */
  accept: (position: unknown) => position is T;
  /**
   * The list's name in the binding when several routes serve one list (an alias path); default
   * `METHOD /registered/url`.
   */
  list?: string;
}

export interface Paging<T> {
  pageSize: number;
  /** Decoded token position, or undefined on the first page. */
  after: T | undefined;
  /** Which query parameter carried the token ('page_token' or 'cursor'), for error messages. */
  tokenParam: 'page_token' | 'cursor';
  /** The pagination fields of this request's response; `next` is the next position, undefined on the last page. */
  tokens(next: T | undefined): { next_page_token: string; nextPageToken: string };
}

function present(v: unknown): boolean {
  return v !== undefined && v !== null && v !== '';
}

/** What a token of this request is bound to (domain/paging.ts PageBinding). */
export function pageBinding(request: FastifyRequest, list?: string): PageBinding {
  const filters: Record<string, unknown> = {};
  const q = (request.query ?? {}) as Record<string, unknown>;
  for (const [k, v] of Object.entries(q)) if (!NOT_FILTERS.has(k) && v !== undefined) filters[k] = v;
  const params: Record<string, unknown> = { ...((request.params ?? {}) as Record<string, unknown>) };
  const p = request.principal;
  const caller = p === undefined ? 'anonymous' : p.kind === 'user' ? `user:${p.userId}` : `agent:${p.siteId}/${p.machineId}`;
  return { route: list ?? `${request.method} ${request.routeOptions.url ?? request.url}`, params, filters, caller };
}

/**
 * Reads page size and token from the request's query and returns them with the encoder of this request's
 * tokens. A size parameter (either, when sent, empty included) that is not an integer from 1 to
 * `maxSize` → 400 validation_failed (param page_size or limit; page_size wins when both are valid); a token that does not decode, whose tag does not match this server's key and this request's
 * binding, or whose position `limits.accept` refuses → 400 validation_failed (param page_token or
 * cursor). An empty token counts as absent (the first page).
 */
export function parsePaging<T>(request: FastifyRequest, limits: PageLimits<T>): Paging<T> {
  const query = (request.query ?? {}) as Record<string, unknown>;
  // Both size parameters must be valid when sent (the document types them as integers); page_size wins.
  const sizes: Partial<Record<'page_size' | 'limit', number>> = {};
  for (const sizeParam of ['page_size', 'limit'] as const) {
    const rawSize = query[sizeParam];
    if (rawSize === undefined) continue;
    const s = String(rawSize);
    const n = /^[0-9]{1,9}$/.test(s) ? Number(s) : NaN;
    if (!Number.isInteger(n) || n < 1 || n > limits.maxSize) {
      throw new ApiError('validation_failed', `${sizeParam} must be an integer from 1 to ${limits.maxSize}`, {
        extras: { param: sizeParam, errors: { [sizeParam]: [`must be an integer from 1 to ${limits.maxSize}`] } },
      });
    }
    sizes[sizeParam] = n;
  }
  const pageSize = sizes.page_size ?? sizes.limit ?? limits.defaultSize;
  const key = derivedKeyOf(request.server.deps.cfg, PAGE_TOKEN_KEY_PURPOSE);
  const binding = pageBinding(request, limits.list);
  const tokenParam = present(query.page_token) ? 'page_token' : 'cursor';
  const rawToken = query[tokenParam];
  let after: T | undefined;
  if (present(rawToken)) {
    const p = openPageToken(key, binding, String(rawToken));
    if (p === undefined || !limits.accept(p)) throw badPageToken(tokenParam);
    after = p;
  }
  return {
    pageSize,
    after,
    tokenParam,
    tokens(next) {
      const t = next === undefined ? '' : signPageToken(key, binding, next);
      return { next_page_token: t, nextPageToken: t };
    },
  };
}
