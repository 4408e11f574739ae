/**
 * Chunk routes (the use cases are services/chunks.ts):
 *
 *   POST /api/chunks/check                  site write   → { missing }
 *   POST /api/chunks/upload-urls            site write   → { urls, expiresAt }   (60 min create+write SAS)
 *   POST /api/chunks/download-urls          site read or an agent token of the site
 *   GET  /api/chunks/download-urls          same, query siteId and repeated `hash` → { urls, expiresAt, missing }
 *   POST /api/chunks/{digest}/mount         site write   → 201 { digest, siteId, from, to, mounted, zeroByte }
 *   GET  /api/chunks/{digest}/referrers     site read    → { digest, siteId, referrers, items, next_page_token, nextPageToken }
 *
 * Bytes never pass through the API: clients PUT to and GET from per-blob SAS URLs. Decisions:
 * docs/decisions/chunk-*.md.
 */
import type { FastifyRequest } from 'fastify';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { isReferrerPosition, ReferrerEntry } from '../../domain/chunks';
import { ApiError } from '../../domain/errors';
import { SHA256_HEX } from '../../domain/hex';
import { Problem, RoostId, SiteId } from '../../domain/schemas';
import type { Requirement } from '../../domain/scopes';
import { checkChunks, downloadUrls, mount, referrers, uploadUrls } from '../../services/chunks';
import { authorizeSite } from '../plugins/auth';
import { pagingQuery, parsePaging } from '../pagination';

/** Hashes per check, upload-urls or download-urls call. */
export const MAX_HASHES = 1000;
/** Referrers page size (`GET /api/chunks/{digest}/referrers`). */
export const REFERRERS_PAGE = { defaultSize: 50, maxSize: 200 };

// ---------------------------------------------------------------------------------------------- schemas

const Digest = Type.String({ pattern: SHA256_HEX.source, description: 'lowercase bare SHA-256 hex (64 chars)' });
const Hashes = Type.Array(Digest, { minItems: 1, maxItems: MAX_HASHES, description: `1..${MAX_HASHES} chunk digests` });

const Errors = { '4xx': Problem, '5xx': Problem };

const SiteHashesBody = Type.Object({ siteId: SiteId, hashes: Hashes });

const CheckResponse = Type.Object({
  missing: Type.Array(Type.String(), { description: 'digests the site lacks, request order, distinct' }),
});
type CheckResponse = Static<typeof CheckResponse>;

const UrlMap = Type.Record(Type.String(), Type.String(), { description: 'digest → signed URL' });
const UploadUrlsResponse = Type.Object({ urls: UrlMap, expiresAt: Type.String({ description: 'RFC 3339 UTC' }) });
type UploadUrlsResponse = Static<typeof UploadUrlsResponse>;

const DownloadUrlsQuery = Type.Object({ siteId: SiteId, hash: Hashes });
const DownloadUrlsResponse = Type.Object({
  urls: UrlMap,
  expiresAt: Type.String({ description: 'RFC 3339 UTC' }),
  missing: Type.Array(Type.String(), { description: 'requested digests the site does not hold (no URL issued)' }),
});
type DownloadUrlsResponse = Static<typeof DownloadUrlsResponse>;

const DigestParams = Type.Object({ digest: Digest });

const MountFields = Type.Object(
  { siteId: Type.Optional(SiteId), from: Type.Optional(RoostId), to: Type.Optional(RoostId) },
  {
    'x-roost-required': ['siteId', 'from', 'to'],
    description:
      'each field is required here unless sent as the query parameter of the same name (both: they must agree); to differs from from',
  },
);
type MountFields = Static<typeof MountFields>;
// The query repeats the body's names for clients that build URLs; the document states the body form only (api/openapi.ts `x-roost-alias`).
const MountQuery = Type.Object({
  siteId: Type.Optional({ ...SiteId, 'x-roost-alias': true }),
  from: Type.Optional({ ...RoostId, 'x-roost-alias': true }),
  to: Type.Optional({ ...RoostId, 'x-roost-alias': true }),
});
const MountResponse = Type.Object({
  digest: Type.String(),
  siteId: Type.String(),
  from: Type.String(),
  to: Type.String(),
  mounted: Type.Literal(true),
  zeroByte: Type.Literal(true),
});
type MountResponse = Static<typeof MountResponse>;

const ReferrersQuery = Type.Object({ siteId: SiteId, ...pagingQuery(REFERRERS_PAGE) });
const ReferrersResponse = Type.Object({
  digest: Type.String(),
  siteId: Type.String(),
  referrers: Type.Array(ReferrerEntry),
  items: Type.Array(ReferrerEntry),
  next_page_token: Type.String(),
  nextPageToken: Type.String(),
});
type ReferrersResponse = Static<typeof ReferrersResponse>;

// ---------------------------------------------------------------------------------------------- helpers

function siteNeeds(siteId: string, permission: Requirement['permission']): Requirement[] {
  return [{ resource: 'site', id: siteId, permission }];
}

/**
 * Download access: an agent token bound to `siteId` (another site's agent gets 404 not_found, the site
 * stays hidden), or a user with site read.
 */
async function authorizeDownload(request: FastifyRequest, siteId: string): Promise<void> {
  const p = request.principal;
  if (p?.kind === 'agent') {
    if (p.siteId !== siteId) throw new ApiError('not_found', 'site not found');
    return;
  }
  await authorizeSite(request, siteId, siteNeeds(siteId, 'read'));
}

/**
 * Merges mount fields sent in the body and the query (either place is accepted; a field sent in both
 * must carry the same value). Throws 400 validation_failed listing every missing or conflicting field,
 * or `to` equal to `from`.
 */
function mountFields(body: MountFields, query: MountFields): { siteId: string; from: string; to: string } {
  const errs: Record<string, string[]> = {};
  const pick = (name: keyof MountFields): string => {
    const b = body[name];
    const q = query[name];
    if (b !== undefined && q !== undefined && b !== q) (errs[name] ??= []).push('sent in both body and query with different values');
    const v = b ?? q;
    if (v === undefined) (errs[name] ??= []).push('is required (body or query)');
    return v ?? '';
  };
  const siteId = pick('siteId');
  const from = pick('from');
  const to = pick('to');
  if (!errs.from && !errs.to && from === to) errs.to = ['must differ from from'];
  const keys = Object.keys(errs);
  if (keys.length) throw new ApiError('validation_failed', `${keys[0]} ${errs[keys[0]][0]}`, { extras: { errors: errs, param: keys[0] } });
  return { siteId, from, to };
}

// ---------------------------------------------------------------------------------------------- routes

/** Registers the chunk routes. */
const chunkRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const deps = app.deps;

  app.post(
    '/api/chunks/check',
    {
      schema: {
        summary: 'Which of these chunks does the site lack?',
        tags: ['chunks'],
        body: SiteHashesBody,
        response: { 200: CheckResponse, ...Errors },
      },
    },
    async (request): Promise<CheckResponse> => {
      const { siteId, hashes } = request.body;
      // The membership check and the lookup's queries run side by side; the service awaits the check
      // before it touches storage or records anything, and rejects with its error.
      return checkChunks(deps, { siteId, hashes, access: authorizeSite(request, siteId, siteNeeds(siteId, 'write')) });
    },
  );

  app.post(
    '/api/chunks/upload-urls',
    {
      config: { idempotency: 'ignored' },
      schema: {
        summary: 'Signed PUT URLs (create+write, one blob each, 60 minutes)',
        tags: ['chunks'],
        body: SiteHashesBody,
        response: { 200: UploadUrlsResponse, ...Errors },
      },
    },
    async (request): Promise<UploadUrlsResponse> => {
      const { siteId, hashes } = request.body;
      await authorizeSite(request, siteId, siteNeeds(siteId, 'write'));
      return uploadUrls(deps, { siteId, hashes });
    },
  );

  const download = async (request: FastifyRequest, siteId: string, hashes: string[]): Promise<DownloadUrlsResponse> => {
    await authorizeDownload(request, siteId);
    return downloadUrls(deps, { siteId, hashes });
  };

  app.post(
    '/api/chunks/download-urls',
    {
      config: { auth: 'userOrAgent' },
      schema: {
        summary: 'Signed GET URLs (read only, 15 minutes) for chunks the site holds',
        tags: ['chunks'],
        body: SiteHashesBody,
        response: { 200: DownloadUrlsResponse, ...Errors },
      },
    },
    async (request) => download(request, request.body.siteId, request.body.hashes),
  );

  app.get(
    '/api/chunks/download-urls',
    {
      config: { auth: 'userOrAgent' },
      schema: {
        summary: 'Signed GET URLs; query siteId and repeated hash',
        tags: ['chunks'],
        querystring: DownloadUrlsQuery,
        response: { 200: DownloadUrlsResponse, ...Errors },
      },
    },
    async (request) => download(request, request.query.siteId, request.query.hash),
  );

  app.post(
    '/api/chunks/:digest/mount',
    {
      config: { idempotency: 'optional' },
      // The fields may all come in the query: a POST without a body validates as an empty object.
      preValidation: async (request) => {
        request.body ??= {};
      },
      schema: {
        summary: 'Mount a stored chunk from one roost into another (no bytes move)',
        tags: ['chunks'],
        params: DigestParams,
        querystring: MountQuery,
        body: MountFields,
        response: { 201: MountResponse, ...Errors },
      },
    },
    async (request, reply): Promise<MountResponse> => {
      const { digest } = request.params;
      const { siteId, from, to } = mountFields(request.body, request.query);
      const user = await authorizeSite(request, siteId, siteNeeds(siteId, 'write'));
      await mount(deps, { siteId, digest, from, to, createdBy: user.userId });
      reply.code(201);
      return { digest, siteId, from, to, mounted: true, zeroByte: true };
    },
  );

  app.get(
    '/api/chunks/:digest/referrers',
    {
      schema: {
        summary: 'Mount and version entries that reference a chunk',
        tags: ['chunks'],
        params: DigestParams,
        querystring: ReferrersQuery,
        response: { 200: ReferrersResponse, ...Errors },
      },
    },
    async (request): Promise<ReferrersResponse> => {
      const { digest } = request.params;
      const { siteId } = request.query;
      const paging = parsePaging(request, { ...REFERRERS_PAGE, accept: isReferrerPosition });
      await authorizeSite(request, siteId, siteNeeds(siteId, 'read'));
      const { entries, next } = await referrers(deps, { siteId, digest, pageSize: paging.pageSize, after: paging.after });
      return { digest, siteId, referrers: entries, items: entries, ...paging.tokens(next) };
    },
  );
};

export default chunkRoutes;
