/**
 * The Users routes (platform scope; services/users.ts; docs/decisions/users.md):
 *
 *   GET    /api/users                           list, oldest first (paged: default 20, max 100; role, siteId, includeDeleted)
 *   GET    /api/users/{uid}                     one user with its delete cascade's progress
 *   POST   /api/users/{uid}/promote             { role: admin | superadmin } → previousRole, role, changed (Idempotency-Key)
 *   POST   /api/users/{uid}/demote              to member; 409 conflict for a site owner, last_superadmin below the floor (Idempotency-Key)
 *   POST   /api/users/{uid}/assign-sites        { siteIds } atomic union; 400 unknown_site (Idempotency-Key)
 *   POST   /api/users/{uid}/remove-sites        { siteIds } → removedSiteIds, cancelledCommandCount (Idempotency-Key)
 *   DELETE /api/users/{uid}?successorUid=<uid>  soft delete + the cascade workflow (Idempotency-Key)
 *
 * Who: a superadmin (else 403 forbidden), and an API key also needs `user=*` (or the uid) read for the
 * reads and admin for the mutations (403 scope_insufficient). The role is read on every request, so a
 * demoted superadmin's keys stop working here at once (docs/contract.md Authentication 5). A `svk_test_` key
 * may read but changes nothing here (403 forbidden; docs/decisions/test-keys.md).
 * Mutations count in the USER_ROLE_MANAGE, SITE_MEMBER_MANAGE or USER_DELETE capability buckets.
 */
import type { FastifyRequest } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { apiKeyActor, userActor } from '../../domain/audit';
import type { Permission } from '../../domain/scopes';
import { DateTime, Nullable, NullableDateTime, pagingQuery, PageTokens, problems, SiteId, UserId } from '../../domain/schemas';
import {
  assignSites,
  type DeletionRow,
  deleteUser,
  demoteUser,
  getUser,
  isUserPosition,
  listUsers,
  promoteUser,
  removeSites,
  type UserRow,
} from '../../services/users';
import type { UserPrincipal } from '../context';
import { parsePaging } from '../pagination';
import { requireScopes, requireSuperadmin, requireUser } from '../plugins/auth';
import { checkPlatformChange } from '../../services/identity';
import { enforceCapability } from '../ratelimit/limits';
import type { Capability } from '../ratelimit/buckets';

/** List paging (docs/contract.md Limits: users list 1..100, default 20). */
export const USER_PAGE = { defaultSize: 20, maxSize: 100 };
/** Most site ids in one assign-sites or remove-sites call. */
export const MAX_SITE_IDS = 100;
/** The capability-bucket key of platform operations (they belong to no site). */
const PLATFORM = 'platform';

// ---------------------------------------------------------------------------------------------------
// Schemas

const Role = Type.Union([Type.Literal('member'), Type.Literal('admin'), Type.Literal('superadmin')]);
const UidParams = Type.Object({ uid: UserId });
const SiteIds = Type.Array(SiteId, { minItems: 1, maxItems: MAX_SITE_IDS, description: `1..${MAX_SITE_IDS} site ids` });
const SitesBody = Type.Object({ siteIds: SiteIds }, { additionalProperties: false });

const DeletionView = Type.Object(
  {
    status: Type.Union([Type.Literal('running'), Type.Literal('completed')]),
    successorUid: Nullable(Type.String()),
    requestedAt: DateTime,
    completedAt: NullableDateTime,
    keysRevoked: Nullable(Type.Integer({ description: 'null until the step ran' })),
    sessionsRevoked: Nullable(Type.Integer()),
    commandsCancelled: Nullable(Type.Integer()),
    sitesTransferred: Nullable(Type.Array(Type.String(), { description: 'sites moved to the successor; null until the step ran' })),
    workflowId: Type.String({ description: 'the cascade workflow (Temporal Web UI)' }),
  },
  { description: "the delete cascade's progress" },
);
type DeletionView = Static<typeof DeletionView>;

const UserView = Type.Object({
  uid: Type.String(),
  email: Type.String(),
  role: Role,
  siteIds: Type.Array(Type.String(), { description: 'assigned sites (membership), ascending' }),
  ownedSiteIds: Type.Array(Type.String(), { description: 'sites this user owns, ascending' }),
  firstName: Nullable(Type.String()),
  lastName: Nullable(Type.String()),
  displayName: Nullable(Type.String()),
  deleted: Type.Boolean(),
  deletedAt: NullableDateTime,
  createdAt: DateTime,
  updatedAt: DateTime,
  deletion: Nullable(DeletionView),
});
type UserView = Static<typeof UserView>;

const ListQuery = Type.Object({
  ...pagingQuery(USER_PAGE),
  role: Type.Optional(Role),
  siteId: Type.Optional(SiteId),
  includeDeleted: Type.Optional(Type.Union([Type.Literal('true'), Type.Literal('false')], { description: 'default false' })),
});

const RoleChange = Type.Object({
  uid: Type.String(),
  previousRole: Role,
  role: Role,
  changed: Type.Boolean({ description: 'false on a no-op' }),
});

// ---------------------------------------------------------------------------------------------------
// Views

const iso = (d: Date | null) => (d === null ? null : d.toISOString());

function deletionView(d: DeletionRow): DeletionView {
  return {
    status: d.status,
    successorUid: d.successor_uid,
    requestedAt: d.requested_at.toISOString(),
    completedAt: iso(d.completed_at),
    keysRevoked: d.keys_revoked,
    sessionsRevoked: d.sessions_revoked,
    commandsCancelled: d.commands_cancelled,
    sitesTransferred: d.sites_transferred,
    workflowId: d.workflow_id,
  };
}

function userView(u: UserRow, deletion: DeletionRow | null = null): UserView {
  return {
    uid: u.uid,
    email: u.email,
    role: u.role,
    siteIds: u.site_ids,
    ownedSiteIds: u.owned_site_ids,
    firstName: u.first_name,
    lastName: u.last_name,
    displayName: u.display_name,
    deleted: u.deleted,
    deletedAt: iso(u.deleted_at),
    createdAt: u.created_at.toISOString(),
    updatedAt: u.updated_at.toISOString(),
    deletion: deletion ? deletionView(deletion) : null,
  };
}

// ---------------------------------------------------------------------------------------------------
// Authorisation

/**
 * The superadmin making a platform request whose key (if any) grants `<resource>=*:<permission>` (platform
 * scopes take only the id `*`, services/keys.ts, so a 403's `required` names a scope a key can hold). A
 * change (any permission but read) with a `svk_test_` key is 403 forbidden (docs/decisions/test-keys.md).
 */
export function authorizePlatform(request: FastifyRequest, resource: 'user' | 'installer', id: '*', permission: Permission): UserPrincipal {
  const user = requireSuperadmin(requireUser(request));
  if (permission !== 'read') checkPlatformChange(user);
  requireScopes(user, [{ resource, id, permission }]);
  return user;
}

const actorOf = (u: UserPrincipal) => (u.key ? apiKeyActor(u.key.keyId) : userActor(u.userId));
const bucket = (request: FastifyRequest, c: Capability) => () => enforceCapability(request, c, PLATFORM);

// ---------------------------------------------------------------------------------------------------
// Routes

const userRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/api/users',
    {
      schema: {
        tags: ['users'],
        summary: 'Users, oldest first; filter by role, siteId (member or owner) and includeDeleted',
        querystring: ListQuery,
        response: { 200: Type.Object({ users: Type.Array(UserView), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      authorizePlatform(request, 'user', '*', 'read');
      const paging = parsePaging(request, { ...USER_PAGE, accept: isUserPosition });
      const { role, siteId, includeDeleted } = request.query;
      const { rows, next } = await listUsers(app.deps, {
        role,
        siteId,
        includeDeleted: includeDeleted === 'true',
        after: paging.after,
        pageSize: paging.pageSize,
      });
      return { users: rows.map((u) => userView(u)), ...paging.tokens(next) };
    },
  );

  app.get(
    '/api/users/:uid',
    {
      schema: {
        tags: ['users'],
        summary: "One user (deleted ones too), with the delete cascade's progress",
        params: UidParams,
        response: { 200: UserView, ...problems() },
      },
    },
    async (request) => {
      authorizePlatform(request, 'user', '*', 'read');
      const { user, deletion } = await getUser(app.deps, request.params.uid);
      return userView(user, deletion);
    },
  );

  app.post(
    '/api/users/:uid/promote',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['users'],
        summary: 'Raise the role to admin or superadmin (never lowers; changed false on a no-op)',
        params: UidParams,
        body: Type.Object({ role: Type.Union([Type.Literal('admin'), Type.Literal('superadmin')]) }, { additionalProperties: false }),
        response: { 200: RoleChange, ...problems(409, 422, 429) },
      },
    },
    async (request) => {
      authorizePlatform(request, 'user', '*', 'admin');
      return promoteUser(app.deps, { uid: request.params.uid, role: request.body.role, beforeChange: bucket(request, 'USER_ROLE_MANAGE') });
    },
  );

  app.post(
    '/api/users/:uid/demote',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['users'],
        summary:
          'Lower the role to member; 409 conflict (ownedSiteIds) for a site owner, last_superadmin below the active-superadmin floor',
        params: UidParams,
        response: { 200: RoleChange, ...problems(409, 422, 429) },
      },
    },
    async (request) => {
      authorizePlatform(request, 'user', '*', 'admin');
      return demoteUser(app.deps, { uid: request.params.uid, beforeChange: bucket(request, 'USER_ROLE_MANAGE') });
    },
  );

  app.post(
    '/api/users/:uid/assign-sites',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['users'],
        summary: 'Add site memberships (atomic union); 400 unknown_site lists unknown ids and changes nothing',
        params: UidParams,
        body: SitesBody,
        response: {
          200: Type.Object({ uid: Type.String(), siteIds: Type.Array(Type.String()), addedSiteIds: Type.Array(Type.String()) }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request) => {
      const user = authorizePlatform(request, 'user', '*', 'admin');
      return assignSites(app.deps, {
        uid: request.params.uid,
        siteIds: request.body.siteIds,
        actor: actorOf(user),
        beforeChange: bucket(request, 'SITE_MEMBER_MANAGE'),
      });
    },
  );

  app.post(
    '/api/users/:uid/remove-sites',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['users'],
        summary: "End site memberships and cancel the user's pending commands on those sites",
        params: UidParams,
        body: SitesBody,
        response: {
          200: Type.Object({ uid: Type.String(), removedSiteIds: Type.Array(Type.String()), cancelledCommandCount: Type.Integer() }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request) => {
      const user = authorizePlatform(request, 'user', '*', 'admin');
      return removeSites(app.deps, {
        uid: request.params.uid,
        siteIds: request.body.siteIds,
        actor: actorOf(user),
        beforeChange: bucket(request, 'SITE_MEMBER_MANAGE'),
      });
    },
  );

  app.delete(
    '/api/users/:uid',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['users'],
        summary: 'Soft-delete the user and start the cascade (keys, sessions, pending commands, owned sites to successorUid)',
        params: UidParams,
        querystring: Type.Object({ successorUid: Type.Optional(UserId) }),
        response: {
          202: Type.Object({
            uid: Type.String(),
            deleted: Type.Literal(true),
            alreadyDeleted: Type.Boolean(),
            deletion: Nullable(DeletionView),
            workflowUrl: Nullable(Type.String({ description: 'Temporal Web UI page of the cascade' })),
          }),
          ...problems(409, 422, 429),
        },
      },
    },
    async (request, reply) => {
      const user = authorizePlatform(request, 'user', '*', 'admin');
      const r = await deleteUser(app.deps, {
        uid: request.params.uid,
        successorUid: request.query.successorUid,
        actor: actorOf(user),
        beforeChange: bucket(request, 'USER_DELETE'),
      });
      reply.code(202);
      return {
        uid: r.uid,
        deleted: true as const,
        alreadyDeleted: r.alreadyDeleted,
        deletion: r.deletion ? deletionView(r.deletion) : null,
        workflowUrl: r.workflowUrl,
      };
    },
  );
};

export default userRoutes;
