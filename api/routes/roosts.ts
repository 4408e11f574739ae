/**
 * Roosts: `POST /api/roosts`, `GET /api/roosts`, `GET/PATCH/DELETE /api/roosts/{roostId}`
 * (docs/decisions/roost-create-update-delete.md); the use cases are services/roosts.ts. Version pointer
 * fields are server-managed (publish and rollback, api/routes/versions.ts); a client sending them gets
 * 400 forbidden_field.
 *
 * Also exports the roost schemas other route files share (`RoostParams`, `RoostName`, `Targets`,
 * `ExtractPath`) and `rejectForeignFields`.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { ApiError } from '../../domain/errors';
import type { Requirement } from '../../domain/scopes';
import {
  DateTime,
  ExtractPath,
  MachineId,
  Nullable,
  problems,
  RoostId,
  SiteId,
  isCreatedAtPosition,
  NON_BLANK_TEXT,
} from '../../domain/schemas';
import { createRoost, deleteRoost, getRoost, listRoosts, type RoostDetail, updateRoost } from '../../services/roosts';
import { abortRoostRollouts } from '../../services/rollouts';
import { pagingQuery, parsePaging } from '../pagination';
import { authorizeSite, roostRequirement } from '../plugins/auth';

// ---------------------------------------------------------------------------------------------------
// Shared schemas

export const RoostParams = Type.Object({ roostId: RoostId });
export const SiteQuery = Type.Object({ siteId: SiteId });

/** Display name: 1..200 characters, not blank. */
export const RoostName = Type.String({ minLength: 1, maxLength: 200, pattern: NON_BLANK_TEXT });
export const Targets = Type.Array(MachineId, { maxItems: 10000, uniqueItems: true, description: 'target machine ids' });
/** Destination root on the target machines (domain/schemas.ts). */
export { ExtractPath };

export const VersionSummary = Type.Object({
  versionId: Type.String(),
  versionNumber: Type.Integer(),
  description: Nullable(Type.String()),
  totalFiles: Type.Integer(),
  totalSize: Type.Number(),
  createdBy: Type.String(),
  createdAt: DateTime,
});

/** The roost record: its fields plus ids, tombstone fields and the resolved current/previous summaries. */
export const RoostRecord = Type.Object({
  roostId: Type.String(),
  siteId: Type.String(),
  schemaVersion: Type.Literal(2),
  name: Type.String(),
  targets: Type.Array(Type.String()),
  extractPath: Type.String(),
  versionCounter: Type.Integer(),
  currentVersionId: Nullable(Type.String()),
  currentVersionNumber: Nullable(Type.Integer()),
  currentVersionDescription: Nullable(Type.String()),
  previousVersionId: Nullable(Type.String()),
  versionUrl: Nullable(Type.String()),
  totalFiles: Type.Integer(),
  totalSize: Type.Number(),
  createdAt: DateTime,
  createdBy: Type.String(),
  updatedAt: DateTime,
  deleted: Type.Boolean(),
  deletedAt: Nullable(DateTime),
  current: Nullable(VersionSummary),
  previous: Nullable(VersionSummary),
});
export type RoostRecord = Static<typeof RoostRecord>;

function summary(s: RoostDetail['current']): Static<typeof VersionSummary> | null {
  if (!s) return null;
  return {
    versionId: s.version_id,
    versionNumber: s.version_number,
    description: s.description,
    totalFiles: s.total_files,
    totalSize: s.total_size,
    createdBy: s.created_by,
    createdAt: s.created_at.toISOString(),
  };
}

/** Maps a roost to its wire record. `versionUrl` and totals describe the current version (0 when none). */
function roostRecord(v: RoostDetail): RoostRecord {
  return {
    roostId: v.roost_id,
    siteId: v.site_id,
    schemaVersion: 2,
    name: v.name,
    targets: v.targets,
    extractPath: v.extract_path,
    versionCounter: v.version_counter,
    currentVersionId: v.current_version_id,
    currentVersionNumber: v.current?.version_number ?? null,
    currentVersionDescription: v.current?.description ?? null,
    previousVersionId: v.previous_version_id,
    versionUrl: v.versionUrl,
    totalFiles: v.current?.total_files ?? 0,
    totalSize: v.current?.total_size ?? 0,
    createdAt: v.created_at.toISOString(),
    createdBy: v.created_by,
    updatedAt: v.updated_at.toISOString(),
    deleted: v.deleted_at !== null,
    deletedAt: v.deleted_at ? v.deleted_at.toISOString() : null,
    current: summary(v.current),
    previous: summary(v.previous),
  };
}

/** Version pointer and audit fields of the roost record: only the server sets them. */
const SERVER_FIELDS = new Set([
  'roostId',
  'schemaVersion',
  'versionCounter',
  'currentVersionId',
  'currentVersionNumber',
  'currentVersionDescription',
  'previousVersionId',
  'versionUrl',
  'totalFiles',
  'totalSize',
  'createdAt',
  'createdBy',
  'updatedAt',
  'deleted',
  'deletedAt',
  'current',
  'previous',
]);

/** Throws 400 forbidden_field when `body` has keys outside `allowed` (listed in `fields`). */
export function rejectForeignFields(body: Record<string, unknown>, allowed: ReadonlySet<string>): void {
  const extra = Object.keys(body).filter((k) => !allowed.has(k));
  if (!extra.length) return;
  const pointer = extra.filter((k) => SERVER_FIELDS.has(k));
  const detail = pointer.length
    ? `${pointer.join(', ')} ${pointer.length > 1 ? 'are' : 'is'} set by the server (publish and rollback move the version pointers)`
    : `unknown field${extra.length > 1 ? 's' : ''}: ${extra.join(', ')}`;
  throw new ApiError('forbidden_field', detail, { extras: { param: extra[0], fields: extra } });
}

// ---------------------------------------------------------------------------------------------------
// Route schemas

// `x-roost-closed`: the handlers refuse unknown fields with 400 forbidden_field; the document says so (api/openapi.ts).
const CreateBody = Type.Object(
  {
    siteId: SiteId,
    name: RoostName,
    targets: Type.Optional(Targets),
    extractPath: Type.Optional(ExtractPath),
  },
  { 'x-roost-closed': true },
);
const CREATE_FIELDS = new Set(['siteId', 'name', 'targets', 'extractPath']);

/** Roost list paging: default 20, max 100 (`GET /api/roosts`). */
export const ROOST_PAGE = { defaultSize: 20, maxSize: 100 };

const ListQuery = Type.Object({
  siteId: SiteId,
  includeDeleted: Type.Optional(Type.Boolean({ description: 'include tombstoned roosts' })),
  ...pagingQuery(ROOST_PAGE),
});
const ListResponse = Type.Object({
  roosts: Type.Array(RoostRecord),
  next_page_token: Type.String(),
  nextPageToken: Type.String(),
});

const GetQuery = Type.Object({ siteId: SiteId, includeDeleted: Type.Optional(Type.Boolean()) });

const PatchBody = Type.Object(
  {
    siteId: SiteId,
    name: Type.Optional(RoostName),
    targets: Type.Optional(Targets),
    extractPath: Type.Optional(ExtractPath),
  },
  { 'x-roost-closed': true, minProperties: 2, description: 'siteId and at least one of name, targets, extractPath' },
);

const DeleteResponse = Type.Object({
  roostId: Type.String(),
  siteId: Type.String(),
  deleted: Type.Literal(true),
  deletedAt: DateTime,
  alreadyDeleted: Type.Boolean(),
});

function createRequirement(siteId: string): Requirement[] {
  return [
    { resource: 'site', id: siteId, permission: 'write' },
    { resource: 'roost', id: '*', permission: 'write' },
  ];
}

function listRequirement(siteId: string): Requirement[] {
  return [
    { resource: 'site', id: siteId, permission: 'read' },
    { resource: 'roost', id: '*', permission: 'read' },
  ];
}

// ---------------------------------------------------------------------------------------------------
// Routes

/** Registers the roost routes. */
const roostRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const deps = app.deps;

  app.post(
    '/api/roosts',
    {
      config: { idempotency: 'ignored' },
      schema: {
        summary: 'Create a roost',
        tags: ['roosts'],
        body: CreateBody,
        response: { 201: RoostRecord, ...problems() },
      },
    },
    async (request, reply) => {
      const body = request.body;
      rejectForeignFields(body, CREATE_FIELDS);
      const user = await authorizeSite(request, body.siteId, createRequirement(body.siteId));
      const roost = await createRoost(deps, { ...body, createdBy: user.userId });
      return reply.code(201).send(roostRecord(roost));
    },
  );

  app.get(
    '/api/roosts',
    {
      schema: {
        summary: 'List roosts, newest first',
        tags: ['roosts'],
        querystring: ListQuery,
        response: { 200: ListResponse, ...problems() },
      },
    },
    async (request) => {
      const q = request.query;
      const paging = parsePaging(request, { ...ROOST_PAGE, accept: isCreatedAtPosition });
      await authorizeSite(request, q.siteId, listRequirement(q.siteId));
      const page = await listRoosts(deps, {
        siteId: q.siteId,
        pageSize: paging.pageSize,
        after: paging.after,
        includeDeleted: q.includeDeleted === true,
        tokenParam: paging.tokenParam,
      });
      return { roosts: page.roosts.map(roostRecord), ...paging.tokens(page.next) };
    },
  );

  app.get(
    '/api/roosts/:roostId',
    {
      schema: {
        summary: 'Fetch a roost with its current and previous version summaries',
        tags: ['roosts'],
        params: RoostParams,
        querystring: GetQuery,
        response: { 200: RoostRecord, ...problems() },
      },
    },
    async (request) => {
      const { roostId } = request.params;
      const { siteId, includeDeleted } = request.query;
      await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'read'));
      return roostRecord(await getRoost(deps, { siteId, roostId, includeDeleted: includeDeleted === true }));
    },
  );

  app.patch(
    '/api/roosts/:roostId',
    {
      config: { idempotency: 'optional' },
      schema: {
        summary: 'Update a roost (name, targets, extractPath)',
        tags: ['roosts'],
        params: RoostParams,
        body: PatchBody,
        response: { 200: RoostRecord, ...problems() },
      },
    },
    async (request) => {
      const { roostId } = request.params;
      const body = request.body;
      rejectForeignFields(body, CREATE_FIELDS);
      await authorizeSite(request, body.siteId, roostRequirement(body.siteId, roostId, 'write'));
      return roostRecord(await updateRoost(deps, { ...body, roostId }));
    },
  );

  app.delete(
    '/api/roosts/:roostId',
    {
      config: { idempotency: 'optional' },
      schema: {
        summary: 'Soft-delete (tombstone) a roost and abort its running rollouts; repeating is harmless',
        tags: ['roosts'],
        params: RoostParams,
        querystring: SiteQuery,
        response: { 200: DeleteResponse, ...problems() },
      },
    },
    async (request) => {
      const { roostId } = request.params;
      const { siteId } = request.query;
      const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'write'));
      const r = await deleteRoost(deps, { siteId, roostId });
      // Its rollouts would otherwise wait unseen (their routes are 404 now); a repeated delete retries any left.
      await abortRoostRollouts(deps, { siteId, roostId, by: user.userId, log: request.log });
      return { roostId, siteId, deleted: true as const, deletedAt: r.deletedAt.toISOString(), alreadyDeleted: r.alreadyDeleted };
    },
  );
};

export default roostRoutes;
