/**
 * Sites (services/sites.ts; docs/decisions/sites.md):
 *
 *   POST  /api/sites                      create (superadmins; Idempotency-Key)
 *   GET   /api/sites                      the sites the caller may act on, by id (paged: default 20, max 100)
 *   GET   /api/sites/{siteId}             one site (its owner, admins, superadmins)
 *   PATCH /api/sites/{siteId}             name, timezone (IANA), tier, roostEnabled, deployQuota, ownerUid (superadmins; Idempotency-Key)
 *   GET   /api/sites/{siteId}/members     its members, owner included (its owner, admins, superadmins)
 *
 * Keys need `site=*:admin` to create, `site=<id>` read to list and read, admin for PATCH and members; a
 * `svk_test_` key may not PATCH `ownerUid` (memberships are platform-wide; docs/decisions/test-keys.md).
 * Membership itself changes through `POST /api/users/{uid}/assign-sites|remove-sites`.
 */
import type { FastifyRequest } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { DateTime, pagingQuery, PageTokens, problems, SITE_ID_RE, SiteId, UserId, NON_BLANK_TEXT } from '../../domain/schemas';
import { SITE_TIERS } from '../../domain/users';
import { siteEnvironmentFor } from '../../domain/keys';
import { apiKeyActor, userActor } from '../../domain/audit';
import { DEFAULT_DEPLOY_QUOTA, MAX_DEPLOY_QUOTA } from '../../domain/classic';
import { createSite, getSite, listSites, patchSite, requireSiteAdmin, siteMembers, type SiteRow } from '../../services/sites';
import type { UserPrincipal } from '../context';
import { checkPlatformChange } from '../../services/identity';
import { parsePaging } from '../pagination';
import { authorizeSite, requireScopes, requireSuperadmin, requireUser } from '../plugins/auth';
import { enforceCapability } from '../ratelimit/limits';

export const SITE_PAGE = { defaultSize: 20, maxSize: 100 };
export const MEMBER_PAGE = { defaultSize: 20, maxSize: 100 };

const Tier = Type.Union(
  SITE_TIERS.map((t) => Type.Literal(t)),
  { description: SITE_TIERS.join(', ') },
);
const Name = Type.String({ minLength: 1, maxLength: 100, pattern: NON_BLANK_TEXT, description: 'unique site name' });
// services/sites.ts checks the name (domain/users.ts isIanaTimeZone); the document lists the runtime's canonical zones
// (`x-roost-enum`), and the aliases the runtime knows are accepted too.
const TimeZone = Type.String({
  minLength: 1,
  maxLength: 64,
  'x-roost-enum': ['UTC', ...Intl.supportedValuesOf('timeZone')],
  description:
    'IANA time zone (e.g. Europe/Berlin), stored as given; besides the listed names, every alias the runtime knows (Asia/Kolkata, Europe/Kyiv, Etc/UTC, US/Eastern, Etc/GMT+5) is accepted',
});
const DeployQuota = Type.Integer({
  minimum: 1,
  maximum: MAX_DEPLOY_QUOTA,
  description: `classic deployment target ceiling (default ${DEFAULT_DEPLOY_QUOTA}, at most ${MAX_DEPLOY_QUOTA})`,
});

const SiteView = Type.Object({
  siteId: Type.String(),
  name: Type.String(),
  owner: Type.String({ description: 'uid of the owner' }),
  createdAt: DateTime,
  timezone: Type.String(),
  tier: Type.String(),
  roostEnabled: Type.Boolean({ description: 'false: the roost routes answer 403 roost_disabled' }),
  deployQuota: Type.Integer(),
  environment: Type.Union([Type.Literal('live'), Type.Literal('test')], { description: 'test: a sandbox site (svk_test_ keys)' }),
});
type SiteView = Static<typeof SiteView>;

const CreateBody = Type.Object(
  {
    name: Name,
    ownerUid: Type.Optional(UserId),
    timezone: Type.Optional(TimeZone),
    tier: Type.Optional(Tier),
    roostEnabled: Type.Optional(Type.Boolean()),
    deployQuota: Type.Optional(DeployQuota),
    environment: Type.Optional(
      Type.Union([Type.Literal('live'), Type.Literal('test')], {
        description:
          "test: a sandbox site. Default: the API key's environment (live for sessions); a svk_test_ key creates test sites only",
      }),
    ),
  },
  { additionalProperties: false },
);
const PatchBody = Type.Object(
  {
    name: Type.Optional(Name),
    ownerUid: Type.Optional(UserId),
    timezone: Type.Optional(TimeZone),
    tier: Type.Optional(Tier),
    roostEnabled: Type.Optional(Type.Boolean()),
    deployQuota: Type.Optional(DeployQuota),
  },
  { additionalProperties: false, minProperties: 1 },
);
const MemberView = Type.Object({
  uid: Type.String(),
  email: Type.String(),
  role: Type.String(),
  isOwner: Type.Boolean(),
  joinedAt: DateTime,
});

function siteView(s: SiteRow): SiteView {
  return {
    siteId: s.site_id,
    name: s.name,
    owner: s.owner_uid,
    createdAt: s.created_at.toISOString(),
    timezone: s.timezone,
    tier: s.tier,
    roostEnabled: s.roost_enabled,
    deployQuota: s.deploy_quota,
    environment: s.environment,
  };
}

const site = (siteId: string, permission: 'read' | 'admin') => [{ resource: 'site' as const, id: siteId, permission }];
const manage = (request: FastifyRequest, siteId: string) => () => enforceCapability(request, 'GLOBAL_SETTINGS_WRITE', siteId);
const isSitePosition = (p: unknown): p is string => typeof p === 'string' && SITE_ID_RE.test(p);
const isUidPosition = isSitePosition;
const actorOf = (u: UserPrincipal) => (u.key ? apiKeyActor(u.key.keyId) : userActor(u.userId));

const siteRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.post(
    '/api/sites',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['sites'],
        summary: 'Create a site (superadmins); the owner (default: the caller) must be an admin or superadmin',
        body: CreateBody,
        response: { 201: SiteView, ...problems(409, 422, 429) },
      },
    },
    async (request, reply) => {
      const user = requireSuperadmin(requireUser(request));
      requireScopes(user, site('*', 'admin'));
      // A svk_test_ key creates sandbox sites only (its default); docs/decisions/test-keys.md.
      const environment = siteEnvironmentFor(user.key?.environment, request.body.environment);
      if (environment === null) {
        throw new ApiError('forbidden', 'svk_test_ keys create sandbox sites only (environment test); use a svk_live_ key for a live site');
      }
      const row = await createSite(app.deps, {
        ...request.body,
        environment,
        ownerUid: request.body.ownerUid ?? user.userId,
        actor: actorOf(user),
        beforeChange: manage(request, 'platform'),
      });
      request.authorizedSiteId = row.site_id; // the new site's audit log records its creation
      reply.code(201);
      return siteView(row);
    },
  );

  app.get(
    '/api/sites',
    {
      schema: {
        tags: ['sites'],
        summary: 'The sites the caller may act on (every site for a superadmin), by id',
        querystring: Type.Object(pagingQuery(SITE_PAGE)),
        response: { 200: Type.Object({ sites: Type.Array(SiteView), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      const user = requireUser(request);
      const paging = parsePaging(request, { ...SITE_PAGE, accept: isSitePosition });
      const { rows, next } = await listSites(app.deps, user, { after: paging.after, pageSize: paging.pageSize });
      return { sites: rows.map(siteView), ...paging.tokens(next) };
    },
  );

  app.get(
    '/api/sites/:siteId',
    {
      schema: {
        tags: ['sites'],
        summary: "One site's settings (its owner, admins and superadmins)",
        params: Type.Object({ siteId: SiteId }),
        response: { 200: SiteView, ...problems() },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      const user = await authorizeSite(request, siteId, site(siteId, 'read'));
      await requireSiteAdmin(app.deps, user, siteId);
      return siteView(await getSite(app.deps, siteId));
    },
  );

  app.patch(
    '/api/sites/:siteId',
    {
      config: { idempotency: 'required', audit: 'site_updated' },
      schema: {
        tags: ['sites'],
        summary: 'Change name, timezone, tier, roostEnabled, deployQuota or the owner (superadmins)',
        params: Type.Object({ siteId: SiteId }),
        body: PatchBody,
        response: { 200: SiteView, ...problems(409, 422, 429) },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      const user = await authorizeSite(request, siteId, site(siteId, 'admin'));
      requireSuperadmin(user);
      // A new owner becomes a member: site memberships are platform-wide state, which svk_test_ keys never
      // change (docs/decisions/test-keys.md), even on a sandbox site.
      if (request.body.ownerUid !== undefined) checkPlatformChange(user);
      if (Object.keys(request.body).length === 0) throw new ApiError('validation_failed', 'send at least one field to change');
      const row = await patchSite(app.deps, siteId, {
        ...request.body,
        actor: actorOf(user),
        beforeChange: manage(request, siteId),
        // The request's site_updated record shows what changed (old and new values; no secrets among them).
        onChanges: (changes) => (request.auditDetails = { changes }),
      });
      return siteView(row);
    },
  );

  app.get(
    '/api/sites/:siteId/members',
    {
      schema: {
        tags: ['sites'],
        summary: "The site's active members, owner included, by uid (its owner, admins and superadmins)",
        params: Type.Object({ siteId: SiteId }),
        querystring: Type.Object(pagingQuery(MEMBER_PAGE)),
        response: { 200: Type.Object({ members: Type.Array(MemberView), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      const user = await authorizeSite(request, siteId, site(siteId, 'admin'));
      await requireSiteAdmin(app.deps, user, siteId);
      const paging = parsePaging(request, { ...MEMBER_PAGE, accept: isUidPosition });
      const { rows, next } = await siteMembers(app.deps, siteId, { after: paging.after, pageSize: paging.pageSize });
      return {
        members: rows.map((m) => ({ uid: m.uid, email: m.email, role: m.role, isOwner: m.is_owner, joinedAt: m.joined_at.toISOString() })),
        ...paging.tokens(next),
      };
    },
  );
};

export default siteRoutes;
