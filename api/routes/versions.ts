/**
 * Roost versions and rollback (SPEC.md "Roost versions, rollback, deploy", all rows but deploy):
 * publish, list, fetch, files, diff, patch description, rollback. Version refs everywhere follow
 * SPEC.md "Version id and version refs" (`%23` for a literal `#` in a path).
 */
import type { FastifyInstance } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import { ApiError } from '../../domain/errors';
import { sha256Hex } from '../../domain/hex';
import { canonicalJson, type ChunkRef, type FileEntry, summarize, validateVersionBody, type VersionBody } from '../../domain/version';
import { parseVersionRef } from '../../domain/versionRef';
import {
  checkExpectedCurrent,
  findMissingChunks,
  getVersion,
  listVersions,
  loadVersionBody,
  publishVersion,
  requireRoost,
  resolveVersionIn,
  rollbackRoost,
  updateVersionDescription,
  type VersionRow,
  versionUrlOf,
} from '../../db/roosts';
import { type BlobStore, versionBlobName } from '../../storage/blob';
import { encodePageToken, PagingQuery, pageTokens, parsePaging } from '../pagination';
import { authorizeSite, roostRequirement } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';
import { quotaTiers, recordChunks } from '../../db/quota';
import { ensureVersionSignatures, sealKeyOf, signVersionFor } from '../../services/signing';
import { ExtractPath, RoostName, RoostParams, Targets } from './roosts';
import { DateTime, Nullable, problems, SiteId } from '../../domain/schemas';

// ---------------------------------------------------------------------------------------------------
// Limits and shared shapes

/** Largest publish request body (a version body of tens of MB plus the envelope). */
export const PUBLISH_BODY_LIMIT = 64 * 1024 * 1024;
/** Most missing chunk hashes named on a failed publish (SPEC.md Limits). */
export const MAX_MISSING_CHUNKS = 20;
export const VERSION_PAGE = { defaultSize: 20, maxSize: 100 };
export const FILES_PAGE = { defaultSize: 100, maxSize: 500 };
export const DESCRIPTION_MAX = 500;

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
type VersionRecord = Static<typeof VersionRecord>;

/**
 * The version record of SPEC.md (list shape: no roostId/siteId), plus the additive `signature` and
 * `signingKeyId` (issue #5). The row must be signed first (`ensureVersionSignatures`).
 */
export function versionRecord(row: VersionRow, blob: BlobStore): VersionRecord {
  return {
    versionId: row.version_id,
    versionNumber: row.version_number,
    description: row.description,
    versionUrl: versionUrlOf(blob, row),
    createdAt: row.created_at.toISOString(),
    createdBy: row.created_by,
    totalSize: row.total_size,
    totalFiles: row.total_files,
    parentVersionId: row.parent_version_id,
    signature: row.signature ?? '',
    signingKeyId: row.signing_key_id ?? '',
  };
}

const FileItem = Type.Object({
  path: Type.String(),
  size: Type.Number(),
  chunks: Type.Array(Type.Object({ hash: Type.String(), size: Type.Number() })),
});

// ---------------------------------------------------------------------------------------------------
// Diff (pure)

export const DiffEntry = Type.Object({ path: Type.String(), size: Type.Number(), reason: Type.String(), chunks: Type.Integer() });
export const DiffModified = Type.Object({
  path: Type.String(),
  fromSize: Type.Number(),
  toSize: Type.Number(),
  reason: Type.String(),
  fromChunks: Type.Integer(),
  toChunks: Type.Integer(),
});
export const DiffSummary = Type.Object({
  added: Type.Integer(),
  removed: Type.Integer(),
  changed: Type.Integer(),
  unchanged: Type.Integer(),
  hasChanges: Type.Boolean(),
  netBytesDelta: Type.Number(),
});

export interface VersionDiff {
  summary: Static<typeof DiffSummary>;
  added: Static<typeof DiffEntry>[];
  removed: Static<typeof DiffEntry>[];
  modified: Static<typeof DiffModified>[];
}

function sameChunks(a: FileEntry, b: FileEntry): boolean {
  if (a.size !== b.size || a.chunks.length !== b.chunks.length) return false;
  for (let i = 0; i < a.chunks.length; i++) if (a.chunks[i].hash !== b.chunks[i].hash) return false;
  return true;
}

/**
 * File-level diff of two version bodies, `from` (the base) to `to` (the target), by path. A file in
 * both is modified when its size or its ordered chunk hash sequence differs (reason `size_changed` when
 * the size differs, else `content_changed`); added/removed carry reason `added`/`removed` and their
 * chunk count. Lists are sorted by path; summary.changed = modified.length; netBytesDelta = total
 * bytes of `to` minus total bytes of `from`.
 */
export function diffBodies(from: VersionBody, to: VersionBody): VersionDiff {
  const base = new Map(from.files.map((f) => [f.path, f]));
  const target = new Map(to.files.map((f) => [f.path, f]));
  const added: VersionDiff['added'] = [];
  const removed: VersionDiff['removed'] = [];
  const modified: VersionDiff['modified'] = [];
  let unchanged = 0;
  for (const f of to.files) {
    const old = base.get(f.path);
    if (!old) added.push({ path: f.path, size: f.size, reason: 'added', chunks: f.chunks.length });
    else if (sameChunks(old, f)) unchanged++;
    else
      modified.push({
        path: f.path,
        fromSize: old.size,
        toSize: f.size,
        reason: old.size !== f.size ? 'size_changed' : 'content_changed',
        fromChunks: old.chunks.length,
        toChunks: f.chunks.length,
      });
  }
  for (const f of from.files)
    if (!target.has(f.path)) removed.push({ path: f.path, size: f.size, reason: 'removed', chunks: f.chunks.length });
  const byPath = (a: { path: string }, b: { path: string }) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
  added.sort(byPath);
  removed.sort(byPath);
  modified.sort(byPath);
  const netBytesDelta = summarize(to).totalSize - summarize(from).totalSize;
  return {
    summary: {
      added: added.length,
      removed: removed.length,
      changed: modified.length,
      unchanged,
      hasChanges: added.length + removed.length + modified.length > 0,
      netBytesDelta,
    },
    added,
    removed,
    modified,
  };
}

/**
 * Distinct chunks of a valid body in first-use order, each with the number of files that reference
 * it. A hash referenced with two different sizes is a body error (a digest has exactly one length):
 * reported at the later reference's dotted path (at most 20 paths).
 */
export function chunkTable(body: VersionBody): { refs: (ChunkRef & { fileCount: number })[]; errors: Record<string, string[]> | null } {
  const table = new Map<string, ChunkRef & { fileCount: number; lastFile: number }>();
  const errors: Record<string, string[]> = {};
  let n = 0;
  body.files.forEach((f, i) =>
    f.chunks.forEach((c, j) => {
      const seen = table.get(c.hash);
      if (seen === undefined) table.set(c.hash, { hash: c.hash, size: c.size, fileCount: 1, lastFile: i });
      else {
        if (seen.lastFile !== i) {
          seen.fileCount++;
          seen.lastFile = i;
        }
        if (seen.size !== c.size && n++ < MAX_MISSING_CHUNKS) {
          errors[`version.files.${i}.chunks.${j}.size`] = [`chunk ${c.hash} is referenced elsewhere with size ${seen.size}`];
        }
      }
    }),
  );
  const refs = [...table.values()].map(({ hash, size, fileCount }) => ({ hash, size, fileCount }));
  return { refs, errors: Object.keys(errors).length ? errors : null };
}

// ---------------------------------------------------------------------------------------------------
// Route schemas

const VersionParams = Type.Object({
  roostId: RoostParams.properties.roostId,
  versionRef: Type.String({ description: 'id, vrs_<hex>, 3, %233, v3, current, previous, first' }),
});
const SiteQuery = Type.Object({ siteId: SiteId });

const PublishBody = Type.Object(
  {
    siteId: SiteId,
    version: Type.Unknown({ description: 'the version body (SPEC.md "Version body")' }),
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

const ListQuery = Type.Object({ siteId: SiteId, ...PagingQuery });
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

const FilesQuery = Type.Object({ siteId: SiteId, prefix: Type.Optional(Type.String({ maxLength: 1024 })), ...PagingQuery });
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

const DiffQuery = Type.Object({ siteId: SiteId, against: Type.String({ description: 'base version ref' }) });
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

const PatchBody = Type.Object({ siteId: SiteId, description: Type.Optional(Nullable(Description)) });
const PATCH_FIELDS = new Set(['siteId', 'description']);
const PatchResponse = Type.Object({ ...VersionRecord.properties, roostId: Type.String(), siteId: Type.String(), updatedAt: DateTime });

const RollbackBody = Type.Object(
  { siteId: SiteId, targetVersion: Type.Optional(Type.String({ description: 'any version ref; default previous' })) },
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

/** Empty or absent description is stored as null. */
function normalizeDescription(d: string | null | undefined): string | null {
  return d === undefined || d === null || d === '' ? null : d;
}

function badToken(query: Record<string, unknown>): ApiError {
  const param = query.page_token !== undefined ? 'page_token' : 'cursor';
  return new ApiError('validation_failed', `${param} is not a token this server issued`, {
    extras: { param, errors: { [param]: ['unrecognised page token'] } },
  });
}

/** Dotted-path errors for chunks whose recorded size differs from the size the body references. */
function conflictErrors(body: VersionBody, conflicts: Map<string, number>): Record<string, string[]> {
  const errors: Record<string, string[]> = {};
  let n = 0;
  body.files.forEach((f, i) =>
    f.chunks.forEach((c, j) => {
      const stored = conflicts.get(c.hash);
      if (stored !== undefined && n++ < MAX_MISSING_CHUNKS)
        errors[`version.files.${i}.chunks.${j}.size`] = [`chunk ${c.hash} is stored with ${stored} bytes`];
    }),
  );
  return errors;
}

// ---------------------------------------------------------------------------------------------------
// Routes

export default async function versionRoutes(app: FastifyInstance): Promise<void> {
  const { db, blob } = app.deps;

  /** Resolves `ref` in the live roost (404 not_found when the roost is missing or tombstoned). */
  async function resolve(siteId: string, roostId: string, ref: string, param = 'versionRef'): Promise<VersionRow> {
    const parsed = parseVersionRef(ref, param);
    const roost = await requireRoost(db, siteId, roostId);
    return resolveVersionIn(db, roost, parsed, param);
  }

  const sealKey = () => sealKeyOf(app.deps.cfg);
  /** Signs rows published before signing existed (first read), in place. */
  function signed<T extends VersionRow>(siteId: string, rows: T[]): Promise<T[]> {
    return ensureVersionSignatures(db, sealKey(), siteId, rows);
  }

  function body(row: VersionRow): Promise<VersionBody> {
    return loadVersionBody(app.deps, row.site_id, row.roost_id, row.version_id, row.blob_name);
  }

  app.post<{ Params: Static<typeof RoostParams>; Body: Static<typeof PublishBody> }>(
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
      const siteId = b.siteId;
      const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'write'));

      const bodyErrors = validateVersionBody(b.version, 'version');
      if (bodyErrors) {
        const first = Object.keys(bodyErrors)[0];
        throw new ApiError('validation_failed', `version body is invalid: ${first} ${bodyErrors[first][0]}`, {
          extras: { param: first, errors: bodyErrors },
        });
      }
      const version = b.version as VersionBody;
      const table = chunkTable(version);
      if (table.errors)
        throw new ApiError('validation_failed', 'version body references a chunk with two sizes', { extras: { errors: table.errors } });
      const expected =
        b.expectedCurrentVersionId === undefined || b.expectedCurrentVersionId === null
          ? b.expectedCurrentVersionId
          : b.expectedCurrentVersionId.replace(/^vrs_/, '');

      const roost = await requireRoost(db, siteId, roostId);
      checkExpectedCurrent(roost, expected);

      const canonical = canonicalJson(version);
      const versionId = sha256Hex(canonical);
      const blobName = versionBlobName(siteId, roostId, versionId);
      if (!(await getVersion(db, siteId, roostId, versionId))) {
        const { missing, conflicts } = await findMissingChunks(db, blob, siteId, table.refs, (found) =>
          recordChunks(db, siteId, found, quotaTiers(app.deps.cfg)),
        );
        if (conflicts.size) {
          throw new ApiError('validation_failed', 'version body references chunks with a size other than their stored size', {
            extras: { errors: conflictErrors(version, conflicts) },
          });
        }
        if (missing.length) {
          throw new ApiError(
            'precondition_failed',
            `${missing.length} referenced chunk${missing.length > 1 ? 's are' : ' is'} not stored for this site; upload them, then publish again`,
            {
              extras: { missingChunks: missing.slice(0, MAX_MISSING_CHUNKS), missingCount: missing.length },
            },
          );
        }
        await blob.put('versions', blobName, Buffer.from(canonical, 'utf8'), 'application/json');
      }

      const { totalSize, totalFiles } = summarize(version);
      const changes: { name?: string; targets?: string[]; extractPath?: string } = {};
      if (b.name !== undefined) changes.name = b.name.trim();
      if (b.targets !== undefined) changes.targets = b.targets;
      if (b.extractPath !== undefined) changes.extractPath = b.extractPath;
      const r = await publishVersion(db, {
        siteId,
        roostId,
        versionId,
        blobName,
        totalSize,
        totalFiles,
        chunks: table.refs,
        description: normalizeDescription(b.description),
        expectedCurrentVersionId: expected,
        changes,
        userId: user.userId,
        signature: await signVersionFor(db, sealKey(), siteId, roostId, versionId),
      });
      return reply.code(r.outcome === 'created' ? 201 : 200).send({
        versionId: r.versionId,
        versionNumber: r.versionNumber,
        currentVersionId: r.currentVersionId,
        previousVersionId: r.previousVersionId,
      });
    },
  );

  app.get<{ Params: Static<typeof RoostParams>; Querystring: Static<typeof ListQuery> }>(
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
      const paging = parsePaging<number>(q, VERSION_PAGE);
      if (paging.after !== undefined && !(Number.isSafeInteger(paging.after) && paging.after > 0)) throw badToken(q);
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      await requireRoost(db, q.siteId, roostId);
      const page = await listVersions(db, q.siteId, roostId, { limit: paging.pageSize, beforeNumber: paging.after });
      const last = page.rows[page.rows.length - 1];
      return {
        versions: (await signed(q.siteId, page.rows)).map((r) => versionRecord(r, blob)),
        nextCursor: null,
        ...pageTokens(page.more && last ? last.version_number : undefined),
      };
    },
  );

  app.get<{ Params: Static<typeof VersionParams>; Querystring: Static<typeof SiteQuery> }>(
    '/api/roosts/:roostId/versions/:versionRef',
    {
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
      const [row] = await signed(siteId, [await resolve(siteId, roostId, versionRef)]);
      const stored = await body(row);
      const { versionId, versionNumber, description, ...metadata } = versionRecord(row, blob);
      return { versionId, versionNumber, description, roostId, siteId, version: stored, metadata, ...metadata };
    },
  );

  app.get<{ Params: Static<typeof VersionParams>; Querystring: Static<typeof FilesQuery> }>(
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
      const paging = parsePaging<number>(q, FILES_PAGE);
      if (paging.after !== undefined && !(Number.isSafeInteger(paging.after) && paging.after >= 0)) throw badToken(q);
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      const row = await resolve(q.siteId, roostId, versionRef);
      const stored = await body(row);
      const prefix = q.prefix ?? '';
      const matching = prefix ? stored.files.filter((f) => f.path.startsWith(prefix)) : stored.files;
      const offset = paging.after ?? 0;
      const page = matching
        .slice(offset, offset + paging.pageSize)
        .map((f) => ({ path: f.path, size: f.size, chunks: f.chunks.map((c) => ({ hash: c.hash, size: c.size })) }));
      const next = offset + page.length;
      const token = next < matching.length ? encodePageToken(next) : '';
      return {
        versionId: row.version_id,
        roostId,
        siteId: q.siteId,
        total: matching.length,
        files: page,
        items: page,
        next_page_token: token,
        nextPageToken: token,
      };
    },
  );

  app.get<{ Params: Static<typeof VersionParams>; Querystring: Static<typeof DiffQuery> }>(
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
      const targetRef = parseVersionRef(versionRef, 'versionRef');
      const baseRef = parseVersionRef(against, 'against');
      const roost = await requireRoost(db, siteId, roostId);
      const to = await resolveVersionIn(db, roost, targetRef, 'versionRef');
      const from = await resolveVersionIn(db, roost, baseRef, 'against');
      const [toBody, fromBody] = await Promise.all([body(to), body(from)]);
      return {
        versionId: to.version_id,
        fromVersion: from.version_id,
        toVersion: to.version_id,
        against,
        roostId,
        siteId,
        ...diffBodies(fromBody, toBody),
      };
    },
  );

  app.patch<{ Params: Static<typeof VersionParams>; Body: Static<typeof PatchBody> }>(
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
      const ref = parseVersionRef(versionRef, 'versionRef');
      const [row] = await signed(b.siteId, [
        await updateVersionDescription(db, b.siteId, roostId, ref, normalizeDescription(b.description)),
      ]);
      return { ...versionRecord(row, blob), roostId, siteId: b.siteId, updatedAt: row.updated_at.toISOString() };
    },
  );

  app.post<{ Params: Static<typeof RoostParams>; Body: Static<typeof RollbackBody> }>(
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
      const ref = parseVersionRef(targetVersion ?? 'previous', 'targetVersion');
      const r = await rollbackRoost(db, siteId, roostId, ref, user.userId);
      return { ok: true as const, ...r };
    },
  );
}
