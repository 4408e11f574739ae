/**
 * The agent-installer catalog routes (platform scope; services/installers.ts; docs/decisions/installer-catalog.md):
 *
 *   GET    /api/installer                      finalised versions newest first (paged 1..100, default 20; includeDeleted)
 *   GET    /api/installer/latest               the version the latest pointer names
 *   POST   /api/installer/upload               step 1 { version, sha256, releaseNotes? } → { version, uploadUrl, expiresAt } (Idempotency-Key)
 *   PUT    <uploadUrl>                         step 2: the bytes straight to blob storage (create only)
 *   PUT    /api/installer/upload               step 3 { version, sha256?, setAsLatest? }: re-hash, activate, move latest (same Idempotency-Key)
 *   POST   /api/installer/{version}/set-latest promote an active version (Idempotency-Key)
 *   DELETE /api/installer/{version}            soft delete; idempotent (Idempotency-Key optional)
 *
 * Who: a superadmin (else 403 forbidden); an API key also needs `installer=*` read (list, latest), write
 * (upload steps) or admin (set-latest, delete) (403 scope_insufficient). Mutations count in the
 * INSTALLER_MANAGE capability bucket. Agents download through `GET /api/agent/installer/{version}` (agent.ts).
 */
import type { FastifyRequest } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { apiKeyActor, userActor } from '../../domain/audit';
import { sha256Hex } from '../../domain/hex';
import { MAX_RELEASE_NOTES } from '../../domain/installers';
import { DateTime, InstallerVersion, Nullable, NullableDateTime, pagingQuery, PageTokens, problems, Sha256Hex } from '../../domain/schemas';
import {
  deleteInstaller,
  finalizeInstallerUpload,
  type InstallerRow,
  isInstallerPosition,
  latestInstaller,
  listInstallers,
  reserveInstallerUpload,
  setLatestInstaller,
} from '../../services/installers';
import type { UserPrincipal } from '../context';
import { parsePaging } from '../pagination';
import { enforceCapability } from '../ratelimit/limits';
import { authorizePlatform } from './users';

/** List paging (docs/contract.md Limits: installer list 1..100, default 20). */
export const INSTALLER_PAGE = { defaultSize: 20, maxSize: 100 };

const VersionParams = Type.Object({ version: InstallerVersion });

/** A catalog entry as the routes show it. */
export const InstallerEntry = Type.Object({
  version: Type.String({ description: 'semver X.Y.Z' }),
  sha256: Type.String({ description: 'SHA-256 hex of the stored bytes (verified at finalise)' }),
  sizeBytes: Nullable(Type.Number({ description: 'bytes' })),
  releaseNotes: Nullable(Type.String()),
  latest: Type.Boolean({ description: 'the latest pointer names this version' }),
  status: Type.Union([Type.Literal('active'), Type.Literal('deleted')]),
  createdAt: DateTime,
  finalizedAt: NullableDateTime,
  deletedAt: NullableDateTime,
});
type InstallerEntry = Static<typeof InstallerEntry>;

const iso = (d: Date | null) => (d === null ? null : d.toISOString());

function entryView(r: InstallerRow): InstallerEntry {
  return {
    version: r.version,
    sha256: r.sha256,
    sizeBytes: r.size_bytes,
    releaseNotes: r.release_notes,
    latest: r.is_latest,
    status: r.state === 'deleted' ? 'deleted' : 'active',
    createdAt: r.created_at.toISOString(),
    finalizedAt: iso(r.finalized_at),
    deletedAt: iso(r.deleted_at),
  };
}

const actorOf = (u: UserPrincipal) => (u.key ? apiKeyActor(u.key.keyId) : userActor(u.userId));
const bucket = (request: FastifyRequest) => () => enforceCapability(request, 'INSTALLER_MANAGE', 'platform');
/** SHA-256 of the request's Idempotency-Key: what binds step 3 to step 1 (the key itself is never stored). */
const keyHashOf = (request: FastifyRequest) => sha256Hex(String(request.headers['idempotency-key'] ?? ''));

const installerRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/api/installer',
    {
      schema: {
        tags: ['installer'],
        summary: 'Agent installer versions, newest first (semver); includeDeleted adds soft-deleted ones',
        querystring: Type.Object({
          ...pagingQuery(INSTALLER_PAGE),
          includeDeleted: Type.Optional(Type.Union([Type.Literal('true'), Type.Literal('false')], { description: 'default false' })),
        }),
        response: { 200: Type.Object({ versions: Type.Array(InstallerEntry), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      authorizePlatform(request, 'installer', '*', 'read');
      const paging = parsePaging(request, { ...INSTALLER_PAGE, accept: isInstallerPosition });
      const { rows, next } = await listInstallers(app.deps, {
        includeDeleted: request.query.includeDeleted === 'true',
        after: paging.after,
        pageSize: paging.pageSize,
      });
      return { versions: rows.map(entryView), ...paging.tokens(next) };
    },
  );

  app.get(
    '/api/installer/latest',
    {
      schema: {
        tags: ['installer'],
        summary: 'The latest agent installer version (404 not_found before one is made latest)',
        response: { 200: InstallerEntry, ...problems() },
      },
    },
    async (request) => {
      authorizePlatform(request, 'installer', '*', 'read');
      return entryView(await latestInstaller(app.deps));
    },
  );

  app.post(
    '/api/installer/upload',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['installer'],
        summary: 'Upload step 1: reserve a version and get a create-only signed upload URL (60 min)',
        body: Type.Object(
          { version: InstallerVersion, sha256: Sha256Hex, releaseNotes: Type.Optional(Type.String({ maxLength: MAX_RELEASE_NOTES })) },
          { additionalProperties: false },
        ),
        response: {
          201: Type.Object({
            version: Type.String(),
            uploadUrl: Type.String({ description: 'PUT the bytes here (x-ms-blob-type: BlockBlob), once' }),
            expiresAt: Type.String({ description: 'RFC 3339 UTC' }),
          }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request, reply) => {
      const user = authorizePlatform(request, 'installer', '*', 'write');
      const r = await reserveInstallerUpload(app.deps, {
        version: request.body.version,
        sha256: request.body.sha256,
        releaseNotes: request.body.releaseNotes ?? null,
        keyHash: keyHashOf(request),
        actor: actorOf(user),
        beforeChange: bucket(request),
      });
      reply.code(201);
      return { version: r.version, uploadUrl: r.uploadUrl, expiresAt: r.expiresAt.toISOString() };
    },
  );

  app.put(
    '/api/installer/upload',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['installer'],
        summary: 'Upload step 3: re-hash the stored bytes, activate the version, move latest unless setAsLatest is false',
        body: Type.Object(
          { version: InstallerVersion, sha256: Type.Optional(Sha256Hex), setAsLatest: Type.Optional(Type.Boolean({ default: true })) },
          { additionalProperties: false },
        ),
        response: { 200: InstallerEntry, ...problems(409, 422, 429, 503) },
      },
    },
    async (request) => {
      const user = authorizePlatform(request, 'installer', '*', 'write');
      const row = await finalizeInstallerUpload(app.deps, {
        version: request.body.version,
        sha256: request.body.sha256,
        setAsLatest: request.body.setAsLatest !== false,
        keyHash: keyHashOf(request),
        actor: actorOf(user),
        beforeChange: bucket(request),
      });
      return entryView(row);
    },
  );

  app.post(
    '/api/installer/:version/set-latest',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['installer'],
        summary: 'Make an active version latest (changed false when it already is)',
        params: VersionParams,
        response: {
          200: Type.Object({ version: Type.String(), previousVersion: Nullable(Type.String()), changed: Type.Boolean() }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request) => {
      const user = authorizePlatform(request, 'installer', '*', 'admin');
      return setLatestInstaller(app.deps, { version: request.params.version, actor: actorOf(user), beforeChange: bucket(request) });
    },
  );

  app.delete(
    '/api/installer/:version',
    {
      config: { idempotency: 'optional' },
      schema: {
        tags: ['installer'],
        summary: 'Soft-delete a version; refuses latest (latest_version_protected) and below 2 active (min_versions_violated)',
        params: VersionParams,
        response: {
          200: Type.Object({ version: Type.String(), deleted: Type.Literal(true), alreadyDeleted: Type.Boolean(), deletedAt: DateTime }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request) => {
      const user = authorizePlatform(request, 'installer', '*', 'admin');
      const r = await deleteInstaller(app.deps, { version: request.params.version, actor: actorOf(user), beforeChange: bucket(request) });
      return { version: r.version, deleted: true as const, alreadyDeleted: r.alreadyDeleted, deletedAt: r.deletedAt.toISOString() };
    },
  );
};

export default installerRoutes;
