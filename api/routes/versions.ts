/**
 * Roost versions and rollback: publish, list, fetch, files, diff and description patch under
 * `/api/roosts/{roostId}/versions`, and `POST /api/roosts/{roostId}/rollback` (docs/decisions/version-publish.md,
 * docs/decisions/version-reads.md); the use cases are services/versions.ts. Version refs everywhere follow
 * docs/decisions/version-refs.md (`%23` for a literal `#` in a path).
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { DiffEntry, DiffModified, DiffSummary } from '../../domain/diff';
import { ApiError } from '../../domain/errors';
import { DateTime, Nullable, problems, SiteId, VersionRefString } from '../../domain/schemas';
import { CHUNK_SIZE, DESCRIPTION_MAX, MAX_MISSING_CHUNKS, VERSION_MEDIA_TYPE, VERSION_SCHEMA_VERSION } from '../../domain/version';
import {
  diffVersions,
  getVersion,
  listFiles,
  listVersions,
  publish,
  rollback,
  setDescription,
  type VersionDetail,
} from '../../services/versions';
import { pagingQuery, parsePaging } from '../pagination';
import { authorizeSite, roostReadFor, roostRequirement } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';
import { ExtractPath, RoostName, RoostParams, Targets } from './roosts';

// ---------------------------------------------------------------------------------------------------
// Limits and shared shapes

/** Largest publish request body in bytes (a version body of tens of MB plus the envelope). */
export const PUBLISH_BODY_LIMIT = 64 * 1024 * 1024;
/** Most missing chunk hashes named on a failed publish. */
export { MAX_MISSING_CHUNKS };
export const VERSION_PAGE = { defaultSize: 20, maxSize: 100 };
export const FILES_PAGE = { defaultSize: 100, maxSize: 500 };

/** Plaintext description: at most 500 characters, no control characters other than tab, CR and LF. */
const Description = Type.String({ maxLength: DESCRIPTION_MAX, pattern: '^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f]*$' });

const VersionRecord = Type.Object({
  versionId: Type.String(),
  versionNumber: Type.Integer(),
  description: Nullable(Type.String()),
  versionUrl: Type.String(),
  createdAt: DateTime,
  createdBy: Type.String(),
  totalSize: Type.Number(),
  totalFiles: Type.Integer(),
  parentVersionId: Nullable(Type.String()),
  signature: Type.String({
    description: 'Ed25519 signature (base64url) of `roost-version-v1:<siteId>:<roostId>:<versionId>` (docs/decisions/signed-manifests.md)',
  }),
  signingKeyId: Type.String({ description: 'kid of the site signing key that made `signature` (GET /api/sites/{siteId}/signing-keys)' }),
});

/**
 * The version record (list shape: no roostId/siteId), with `signature` and `signingKeyId`
 * (docs/decisions/signed-manifests.md) of the signed row.
 */
function versionRecord(v: VersionDetail): Static<typeof VersionRecord> {
  return {
    versionId: v.version_id,
    versionNumber: v.version_number,
    description: v.description,
    versionUrl: v.versionUrl,
    createdAt: v.created_at.toISOString(),
    createdBy: v.created_by,
    totalSize: v.total_size,
    totalFiles: v.total_files,
    parentVersionId: v.parent_version_id,
    signature: v.signature ?? '',
    signingKeyId: v.signing_key_id ?? '',
  };
}

const FileItem = Type.Object({
  path: Type.String(),
  size: Type.Number(),
  chunks: Type.Array(Type.Object({ hash: Type.String(), size: Type.Number() })),
});

// ---------------------------------------------------------------------------------------------------
// Route schemas

const VersionParams = Type.Object({
  roostId: RoostParams.properties.roostId,
  versionRef: VersionRefString('id, vrs_<hex>, 3, %233, v3, current, previous, first'),
});
const SiteQuery = Type.Object({ siteId: SiteId });

/**
 * The version body's shape for the document (`x-roost-document`, api/openapi.ts): domain/version.ts
 * validateVersionBody checks it and the rules JSON Schema cannot state (listed in the description), with 400
 * validation_failed naming each field. The version id covers the body as received, extra keys included.
 */
const VersionBodyDocument = Type.Object(
  {
    schemaVersion: Type.Literal(VERSION_SCHEMA_VERSION),
    mediaType: Type.Literal(VERSION_MEDIA_TYPE),
    config: Type.Object({}, { additionalProperties: true }),
    files: Type.Array(
      Type.Object(
        {
          path: Type.String({ minLength: 1, description: 'safe forward-slash relative path (domain/paths.ts filePathProblem)' }),
          size: Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }),
          chunks: Type.Array(
            Type.Object(
              { hash: Type.String({ pattern: '^[0-9a-f]{64}$' }), size: Type.Integer({ minimum: 1, maximum: CHUNK_SIZE }) },
              { additionalProperties: true },
            ),
          ),
        },
        { additionalProperties: true },
      ),
      { minItems: 1 },
    ),
  },
  {
    additionalProperties: true,
    description:
      `also: paths unique and distinct on Windows (case, trailing dots, a file used as a folder); every chunk but a file's last is exactly ${CHUNK_SIZE} bytes; ` +
      'a zero-byte file has no chunks and a non-empty file has some',
  },
);

const PublishBody = Type.Object(
  {
    siteId: SiteId,
    version: Type.Unknown({
      description: 'the version body: schemaVersion 2, mediaType, config, files (docs/decisions/version-publish.md)',
      'x-roost-document': VersionBodyDocument,
    }),
    description: Type.Optional(Nullable(Description)),
    expectedCurrentVersionId: Type.Optional(
      Nullable(Type.String({ pattern: '^(vrs_)?[0-9a-f]{64}$', description: 'guard: the current version id (null: no version yet)' })),
    ),
    name: Type.Optional(RoostName),
    targets: Type.Optional(Targets),
    extractPath: Type.Optional(ExtractPath),
  },
  { additionalProperties: false },
);
const PublishResponse = Type.Object({
  versionId: Type.String(),
  versionNumber: Type.Integer(),
  currentVersionId: Type.String(),
  previousVersionId: Nullable(Type.String()),
});

const ListQuery = Type.Object({ siteId: SiteId, ...pagingQuery(VERSION_PAGE) });
const ListResponse = Type.Object({
  versions: Type.Array(VersionRecord),
  nextCursor: Type.Null(),
  next_page_token: Type.String(),
  nextPageToken: Type.String(),
});

const Metadata = Type.Object({
  versionUrl: Type.String(),
  createdAt: DateTime,
  createdBy: Type.String(),
  totalSize: Type.Number(),
  totalFiles: Type.Integer(),
  parentVersionId: Nullable(Type.String()),
  signature: Type.String(),
  signingKeyId: Type.String(),
});
const FetchResponse = Type.Object({
  versionId: Type.String(),
  versionNumber: Type.Integer(),
  description: Nullable(Type.String()),
  roostId: Type.String(),
  siteId: Type.String(),
  version: Type.Unknown(),
  metadata: Metadata,
  ...Metadata.properties,
});

const FilesQuery = Type.Object({ siteId: SiteId, prefix: Type.Optional(Type.String({ maxLength: 1024 })), ...pagingQuery(FILES_PAGE) });
const FilesResponse = Type.Object({
  versionId: Type.String(),
  roostId: Type.String(),
  siteId: Type.String(),
  total: Type.Integer(),
  files: Type.Array(FileItem),
  items: Type.Array(FileItem),
  next_page_token: Type.String(),
  nextPageToken: Type.String(),
});

const DiffQuery = Type.Object({ siteId: SiteId, against: VersionRefString('base version ref') });
const DiffResponse = Type.Object({
  versionId: Type.String(),
  fromVersion: Type.String(),
  toVersion: Type.String(),
  against: Type.String(),
  roostId: Type.String(),
  siteId: Type.String(),
  summary: DiffSummary,
  added: Type.Array(DiffEntry),
  removed: Type.Array(DiffEntry),
  modified: Type.Array(DiffModified),
});

// Other fields are 400 version_content_immutable and description is required (null clears it): checked in the
// handler for those codes, stated in the document by `x-roost-closed` and `x-roost-required` (api/openapi.ts).
const PatchBody = Type.Object(
  { siteId: SiteId, description: Type.Optional(Nullable(Description)) },
  { 'x-roost-closed': true, 'x-roost-required': ['description'] },
);
const PATCH_FIELDS = new Set(['siteId', 'description']);
const PatchResponse = Type.Object({ ...VersionRecord.properties, roostId: Type.String(), siteId: Type.String(), updatedAt: DateTime });

const RollbackBody = Type.Object(
  { siteId: SiteId, targetVersion: Type.Optional(VersionRefString('any version ref; default previous')) },
  { additionalProperties: false },
);
const RollbackResponse = Type.Object({
  ok: Type.Literal(true),
  roostId: Type.String(),
  siteId: Type.String(),
  currentVersionId: Type.String(),
  currentVersionNumber: Type.Integer(),
  previousVersionId: Nullable(Type.String()),
});

// ---------------------------------------------------------------------------------------------------
// Routes

/** Registers the version and rollback routes. */
const versionRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const deps = app.deps;

  app.post(
    '/api/roosts/:roostId/versions',
    {
      bodyLimit: PUBLISH_BODY_LIMIT,
      config: { idempotency: 'required' },
      schema: {
        summary: 'Publish a version (moves the current pointer)',
        tags: ['versions'],
        params: RoostParams,
        body: PublishBody,
        response: { 200: PublishResponse, 201: PublishResponse, ...problems(402, 412, 413, 422) },
      },
    },
    async (request, reply) => {
      const { roostId } = request.params;
      const b = request.body;
      const user = await authorizeSite(request, b.siteId, roostRequirement(b.siteId, roostId, 'write'));
      const r = await publish(deps, { ...b, roostId, userId: user.userId, log: request.log });
      return reply.code(r.outcome === 'created' ? 201 : 200).send({
        versionId: r.versionId,
        versionNumber: r.versionNumber,
        currentVersionId: r.currentVersionId,
        previousVersionId: r.previousVersionId,
      });
    },
  );

  app.get(
    '/api/roosts/:roostId/versions',
    {
      schema: {
        summary: 'List versions, newest first',
        tags: ['versions'],
        params: RoostParams,
        querystring: ListQuery,
        response: { 200: ListResponse, ...problems() },
      },
    },
    async (request) => {
      const { roostId } = request.params;
      const q = request.query;
      const paging = parsePaging(request, { ...VERSION_PAGE, accept: (p): p is number => Number.isSafeInteger(p) && (p as number) > 0 });
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      const page = await listVersions(deps, { siteId: q.siteId, roostId, pageSize: paging.pageSize, beforeNumber: paging.after });
      return { versions: page.versions.map(versionRecord), nextCursor: null, ...paging.tokens(page.next) };
    },
  );

  app.get(
    '/api/roosts/:roostId/versions/:versionRef',
    {
      config: { readsRoost: true },
      schema: {
        summary: 'Fetch a version with its stored body',
        tags: ['versions'],
        params: VersionParams,
        querystring: SiteQuery,
        response: { 200: FetchResponse, ...problems(410) },
      },
    },
    async (request) => {
      const { roostId, versionRef } = request.params;
      const { siteId } = request.query;
      await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'read'));
      const v = await getVersion(deps, { siteId, roostId, ref: versionRef, roost: roostReadFor(request, siteId) });
      const { versionId, versionNumber, description, ...metadata } = versionRecord(v.version);
      return { versionId, versionNumber, description, roostId, siteId, version: v.body, metadata, ...metadata };
    },
  );

  app.get(
    '/api/roosts/:roostId/versions/:versionRef/files',
    {
      schema: {
        summary: "List a version's files (path, size, chunks)",
        tags: ['versions'],
        params: VersionParams,
        querystring: FilesQuery,
        response: { 200: FilesResponse, ...problems(410) },
      },
    },
    async (request) => {
      const { roostId, versionRef } = request.params;
      const q = request.query;
      const paging = parsePaging(request, { ...FILES_PAGE, accept: (p): p is number => Number.isSafeInteger(p) && (p as number) >= 0 });
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      const page = await listFiles(deps, {
        siteId: q.siteId,
        roostId,
        ref: versionRef,
        prefix: q.prefix ?? '',
        offset: paging.after ?? 0,
        pageSize: paging.pageSize,
      });
      return {
        versionId: page.versionId,
        roostId,
        siteId: q.siteId,
        total: page.total,
        files: page.files,
        items: page.files,
        ...paging.tokens(page.next),
      };
    },
  );

  app.get(
    '/api/roosts/:roostId/versions/:versionRef/diff',
    {
      schema: {
        summary: 'Diff a version (target) against another (base)',
        tags: ['versions'],
        params: VersionParams,
        querystring: DiffQuery,
        response: { 200: DiffResponse, ...problems(410) },
      },
    },
    async (request) => {
      const { roostId, versionRef } = request.params;
      const { siteId, against } = request.query;
      await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'read'));
      const d = await diffVersions(deps, { siteId, roostId, ref: versionRef, against });
      return {
        versionId: d.toVersionId,
        fromVersion: d.fromVersionId,
        toVersion: d.toVersionId,
        against,
        roostId,
        siteId,
        ...d.diff,
      };
    },
  );

  app.patch(
    '/api/roosts/:roostId/versions/:versionRef',
    {
      config: { idempotency: 'optional' },
      schema: {
        summary: "Edit a version's description (the content is immutable)",
        tags: ['versions'],
        params: VersionParams,
        body: PatchBody,
        response: { 200: PatchResponse, ...problems() },
      },
    },
    async (request) => {
      const { roostId, versionRef } = request.params;
      const b = request.body;
      const foreign = Object.keys(b).filter((k) => !PATCH_FIELDS.has(k));
      if (foreign.length) {
        throw new ApiError('version_content_immutable', `versions are immutable; only description can change (got ${foreign.join(', ')})`, {
          extras: { param: foreign[0], fields: foreign },
        });
      }
      if (b.description === undefined) {
        throw new ApiError('validation_failed', 'description is required (null clears it)', {
          extras: { param: 'description', errors: { description: ['is required'] } },
        });
      }
      await authorizeSite(request, b.siteId, roostRequirement(b.siteId, roostId, 'write'));
      const v = await setDescription(deps, { siteId: b.siteId, roostId, ref: versionRef, description: b.description });
      return { ...versionRecord(v), roostId, siteId: b.siteId, updatedAt: v.updated_at.toISOString() };
    },
  );

  app.post(
    '/api/roosts/:roostId/rollback',
    {
      config: { idempotency: 'required' },
      schema: {
        summary: 'Move the current pointer back to an existing version',
        tags: ['versions'],
        params: RoostParams,
        body: RollbackBody,
        response: { 200: RollbackResponse, ...problems(422) },
      },
    },
    async (request) => {
      const { roostId } = request.params;
      const { siteId, targetVersion } = request.body;
      const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'rollback'));
      await enforceCapability(request, 'DISTRIBUTION_MANAGE', siteId);
      const r = await rollback(deps, { siteId, roostId, target: targetVersion, userId: user.userId });
      return { ok: true as const, ...r };
    },
  );
};

export default versionRoutes;
