/**
 * The API key lifecycle (SPEC.md "API keys, identity, version, quota", "API key and scope",
 * Authentication 3–5 and 8; docs/decisions/api-key-lifecycle.md):
 *
 * Self-service, for the signed-in user (session or ID token; an API key gets 403 forbidden):
 * - `POST /api/keys`: create (name, environment live|test, scopes or one preset, lifetimeDays 1..365,
 *   default 90); the raw key comes back once in `key`.
 * - `GET /api/keys`: the caller's keys with status, keyPrefix, scopes, environment, expiresAt,
 *   lastUsedAt, isLegacy; never the raw key. Paged (page_size default 50, max 100).
 * - `POST /api/keys/{keyId}/rotate`: successor with the same scopes and environment, raw key once; the
 *   old key keeps working for 24 h, then answers 401 unauthorized.
 * - `DELETE /api/keys/{keyId}`: revoke, immediate and permanent.
 *
 * Platform surface, for superadmins (session or ID token): `GET /api/account/api-keys` (every user's
 * keys, filter userId), `POST /api/account/api-keys` (create for a user: userId or email),
 * `DELETE /api/account/api-keys/{keyId}` (revoke any key).
 *
 * Idempotency-Key is ignored on all of them (SPEC.md Conventions): responses carry raw keys, which are
 * never stored, and a replay would have to store them.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { type Static, type TLiteral, type TSchema, type TUnion, Type } from '@sinclair/typebox';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import {
  DEFAULT_LIFETIME_DAYS,
  generateApiKey,
  KEY_ENVIRONMENTS,
  KEY_PRESETS,
  KEY_STATUSES,
  MAX_LIFETIME_DAYS,
  MIN_LIFETIME_DAYS,
} from '../../domain/keys';
import { PERMISSIONS, presetScopes, RESOURCES, type Scope } from '../../domain/scopes';
import {
  accessibleResources,
  accessibleSites,
  createKey,
  findUser,
  isKeyPosition,
  type KeyOwner,
  type KeyRow,
  listKeys,
  revokeKey,
  rotateKey,
  statusOf,
} from '../../db/keys';
import { PagingQuery, pageTokens, parsePaging } from '../pagination';
import { requireInteractive, requireSuperadmin } from '../plugins/auth';
import { SITE_ID_RE } from '../../domain/schemas';
import type { UserPrincipal } from '../context';
import { Problem } from '../../domain/schemas';

// ---------------------------------------------------------------------------------------------------
// Schemas

type Literals<T extends readonly string[]> = { -readonly [K in keyof T]: TLiteral<T[K]> };
type LiteralUnion<T extends readonly string[]> = TUnion<Literals<T> extends TSchema[] ? Literals<T> : never>;

/** A union of the string literals `values`, typed as their union. */
function oneOf<T extends readonly string[]>(values: T, opts: { description?: string } = {}): LiteralUnion<T> {
  return Type.Union(
    values.map((v) => Type.Literal(v)),
    opts,
  ) as unknown as LiteralUnion<T>;
}

const ScopeSchema = Type.Object(
  {
    resource: oneOf(RESOURCES, { description: 'roost, site, machine, chat, deploy, process, user, installer' }),
    id: Type.String({ minLength: 1, maxLength: 128, pattern: '^(\\*|[A-Za-z0-9._:-]+)$', description: 'a resource id, or *' }),
    permissions: Type.Array(oneOf(PERMISSIONS), {
      minItems: 1,
      maxItems: 2 * PERMISSIONS.length,
      description: 'exact permissions: read, write, deploy, rollback, admin (repeats are merged)',
    }),
  },
  { additionalProperties: false },
);

/** Most scopes one key may carry. */
export const MAX_SCOPES_PER_KEY = 50;

const CreateFields = {
  name: Type.String({ minLength: 1, maxLength: 100, pattern: '\\S', description: 'label' }),
  environment: Type.Optional(oneOf(KEY_ENVIRONMENTS, { description: 'live (default) or test' })),
  scopes: Type.Optional(
    Type.Array(ScopeSchema, { minItems: 1, maxItems: MAX_SCOPES_PER_KEY, description: 'mutually exclusive with preset' }),
  ),
  preset: Type.Optional(
    oneOf(KEY_PRESETS, {
      description: 'readonly, publisher, operator or admin (wildcards roost, site, machine, chat); mutually exclusive with scopes',
    }),
  ),
  lifetimeDays: Type.Optional(
    Type.Integer({ minimum: MIN_LIFETIME_DAYS, maximum: MAX_LIFETIME_DAYS, description: `whole days, default ${DEFAULT_LIFETIME_DAYS}` }),
  ),
  primarySiteId: Type.Optional(
    Type.String({
      pattern: SITE_ID_RE.source,
      description: 'site reported by whoami as primarySiteId; default: the first site scope with a concrete id',
    }),
  ),
};
const CreateBody = Type.Object(CreateFields, { additionalProperties: false });
type CreateBody = Static<typeof CreateBody>;

const AccountCreateBody = Type.Object(
  {
    ...CreateFields,
    userId: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'owner of the new key (or email)' })),
    email: Type.Optional(Type.String({ minLength: 3, maxLength: 320, description: 'owner of the new key (or userId)' })),
  },
  { additionalProperties: false },
);

const Millis = Type.Number({ description: 'epoch milliseconds' });
const NullableMillis = Type.Union([Millis, Type.Null()]);
const NullableString = Type.Union([Type.String(), Type.Null()]);

const KeyViewProps = {
  keyId: Type.String(),
  name: Type.String(),
  keyPrefix: Type.String({ description: 'the first 12 characters of the key' }),
  scopes: Type.Array(ScopeSchema),
  environment: Type.String({ description: 'live or test' }),
  status: oneOf(KEY_STATUSES, { description: 'active, rotated, expired, retired, revoked' }),
  expiresAt: NullableMillis,
  lastUsedAt: NullableMillis,
  isLegacy: Type.Boolean(),
  primarySiteId: NullableString,
  createdAt: Millis,
  rotatedAt: NullableMillis,
  graceUntil: Type.Union([Millis, Type.Null()], { description: 'a rotated key works until then' }),
  replacedBy: Type.Union([Type.String(), Type.Null()], { description: 'keyId of the successor of a rotated key' }),
  rotatedFrom: Type.Union([Type.String(), Type.Null()], { description: 'keyId this key was rotated from' }),
  revokedAt: NullableMillis,
};
const KeyView = Type.Object(KeyViewProps);
type KeyView = Static<typeof KeyView>;

const AccountKeyViewProps = { ...KeyViewProps, userId: Type.String(), email: Type.String(), createdBy: NullableString };
const AccountKeyView = Type.Object(AccountKeyViewProps);
type AccountKeyView = Static<typeof AccountKeyView>;

const RawKey = Type.String({ description: 'the raw key, returned once; store it now' });
const Created = Type.Object({ ...KeyViewProps, key: RawKey });
const AccountCreated = Type.Object({ ...AccountKeyViewProps, key: RawKey });
const Rotated = Type.Object({
  ...KeyViewProps,
  key: RawKey,
  previous: Type.Object(
    { keyId: Type.String(), status: Type.String(), graceUntil: Millis },
    { description: 'the rotated key, valid until graceUntil' },
  ),
});
const Revoked = Type.Object({ ...KeyViewProps, alreadyRevoked: Type.Boolean() });
const AccountRevoked = Type.Object({ ...AccountKeyViewProps, alreadyRevoked: Type.Boolean() });

const KeyParams = Type.Object({ keyId: Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$', description: 'key id (key_…)' }) });
const RotateBody = Type.Object(
  {
    lifetimeDays: Type.Optional(
      Type.Integer({ minimum: MIN_LIFETIME_DAYS, maximum: MAX_LIFETIME_DAYS, description: "default: the old key's lifetime" }),
    ),
  },
  { additionalProperties: false },
);
const ListQuery = Type.Object(PagingQuery);
const AccountListQuery = Type.Object({ ...PagingQuery, userId: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })) });

const problems = (...statuses: number[]) => Object.fromEntries(statuses.map((s) => [s, Problem]));

/** Key list paging (Limits table is silent): default 50, max 100. */
export const KEY_PAGE = { defaultSize: 50, maxSize: 100 };

// ---------------------------------------------------------------------------------------------------
// Views

function ms(d: Date | null): number | null {
  return d === null ? null : d.getTime();
}

function keyView(r: KeyRow, now = Date.now()): KeyView {
  return {
    keyId: r.key_id,
    name: r.name,
    keyPrefix: r.key_prefix,
    scopes: r.scopes,
    environment: r.environment,
    status: statusOf(r, now),
    expiresAt: r.expires_at,
    lastUsedAt: r.last_used_at,
    isLegacy: r.is_legacy,
    primarySiteId: r.primary_site_id,
    createdAt: r.created_at.getTime(),
    rotatedAt: r.rotated_at,
    graceUntil: r.grace_until,
    replacedBy: r.replaced_by,
    rotatedFrom: r.rotated_from,
    revokedAt: ms(r.revoked_at),
  };
}

function accountKeyView(r: KeyRow): AccountKeyView {
  return { ...keyView(r), userId: r.uid, email: r.email, createdBy: r.created_by };
}

// ---------------------------------------------------------------------------------------------------
// Creation rules

const PLATFORM = new Set(['user', 'installer']);

function invalid(errs: Record<string, string[]>): ApiError {
  const first = Object.keys(errs)[0];
  return new ApiError('validation_failed', `${first} ${errs[first][0]}`, { extras: { errors: errs, param: first } });
}

/**
 * Resolves the scopes and primary site of a new key for `owner` (SPEC.md key creation parameters):
 * exactly one of scopes and preset; platform scopes (user, installer) only for a superadmin owner and
 * only with id `*`; every concrete id names a site, roost or machine the owner can access (chat, deploy
 * and process ids may name any of the three).
 * @throws ApiError validation_failed (dotted paths such as `scopes.0.id`), forbidden (platform scopes)
 */
async function resolveNewKey(
  app: FastifyInstance,
  owner: KeyOwner,
  body: CreateBody,
  who: 'you' | 'the key owner',
): Promise<{ scopes: Scope[]; primarySiteId: string | null }> {
  if (body.scopes !== undefined && body.preset !== undefined) {
    throw invalid({ preset: ['is mutually exclusive with scopes: send one of them'], scopes: ['is mutually exclusive with preset'] });
  }
  if (body.scopes === undefined && body.preset === undefined)
    throw invalid({ scopes: ['send scopes or a preset (readonly, publisher, operator, admin)'] });
  const scopes: Scope[] = body.preset
    ? presetScopes(body.preset)
    : (body.scopes as Scope[]).map((s) => ({ resource: s.resource, id: s.id, permissions: [...new Set(s.permissions)] }));

  const errs: Record<string, string[]> = {};
  const platform = scopes.map((s, i) => [s, i] as const).filter(([s]) => PLATFORM.has(s.resource));
  if (platform.length > 0 && owner.role !== 'superadmin') {
    throw new ApiError(
      'forbidden',
      `platform scopes (user, installer) are for superadmins only; ${who === 'you' ? 'you are' : 'the key owner is'} not one`,
      {
        extras: { param: `scopes.${platform[0][1]}.resource` },
      },
    );
  }
  for (const [s, i] of platform) if (s.id !== '*') errs[`scopes.${i}.id`] = [`${s.resource} scopes are platform scopes and take id *`];

  const concrete = scopes.map((s, i) => [s, i] as const).filter(([s]) => s.id !== '*' && !PLATFORM.has(s.resource));
  const anyKind = (r: string) => r === 'chat' || r === 'deploy' || r === 'process';
  const siteIds = concrete.filter(([s]) => s.resource === 'site' || anyKind(s.resource)).map(([s]) => s.id);
  if (body.primarySiteId) siteIds.push(body.primarySiteId);
  const roostIds = concrete.filter(([s]) => s.resource === 'roost' || anyKind(s.resource)).map(([s]) => s.id);
  const machineIds = concrete.filter(([s]) => s.resource === 'machine' || anyKind(s.resource)).map(([s]) => s.id);
  const [sites, res] = await Promise.all([
    accessibleSites(app.deps.db, owner, [...new Set(siteIds)]),
    accessibleResources(app.deps.db, owner, { roosts: [...new Set(roostIds)], machines: [...new Set(machineIds)] }),
  ]);
  for (const [s, i] of concrete) {
    const ok =
      s.resource === 'site'
        ? sites.has(s.id)
        : s.resource === 'roost'
          ? res.roosts.has(s.id)
          : s.resource === 'machine'
            ? res.machines.has(s.id)
            : sites.has(s.id) || res.roosts.has(s.id) || res.machines.has(s.id);
    if (!ok) {
      const what = anyKind(s.resource) ? 'site, roost or machine' : s.resource;
      (errs[`scopes.${i}.id`] ??= []).push(`no ${what} ${who === 'you' ? 'you can' : 'the key owner can'} access has id ${s.id}`);
    }
  }
  if (body.primarySiteId && !sites.has(body.primarySiteId))
    errs.primarySiteId = [`no site ${who === 'you' ? 'you can' : 'the key owner can'} access has this id`];
  if (Object.keys(errs).length) throw invalid(errs);
  const primarySiteId = body.primarySiteId ?? scopes.find((s) => s.resource === 'site' && s.id !== '*')?.id ?? null;
  return { scopes, primarySiteId };
}

// ---------------------------------------------------------------------------------------------------
// Routes

/** Registers the key lifecycle routes. */
export default async function keyRoutes(root: FastifyInstance): Promise<void> {
  const app = root.withTypeProvider<TypeBoxTypeProvider>();
  const db = app.deps.db;

  // Route-level hooks run after the global authentication hook and before body validation, so a caller
  // without the capability learns nothing about the body rules.
  const interactive = async (request: FastifyRequest) => {
    requireInteractive(request);
  };
  const superadmin = async (request: FastifyRequest) => {
    requireSuperadmin(requireInteractive(request));
  };
  const me = (request: FastifyRequest): UserPrincipal => requireInteractive(request);
  const ownerOf = (u: UserPrincipal): KeyOwner => ({ uid: u.userId, email: u.email, role: u.role, deleted: false });

  /**
   * Validates the requested scopes for `owner` (resolveNewKey; 400 validation_failed), stores a new key
   * with its digest and returns the row and the raw key, which the caller shows once.
   */
  const issueKey = async (
    owner: KeyOwner,
    fields: CreateBody,
    who: 'you' | 'the key owner',
    createdBy: string,
  ): Promise<{ row: KeyRow; raw: string }> => {
    const { scopes, primarySiteId } = await resolveNewKey(app, owner, fields, who);
    const environment = fields.environment ?? 'live';
    const raw = generateApiKey(environment);
    const row = await createKey(db, {
      raw,
      uid: owner.uid,
      name: fields.name,
      scopes,
      environment,
      primarySiteId,
      lifetimeDays: fields.lifetimeDays ?? DEFAULT_LIFETIME_DAYS,
      createdBy,
    });
    return { row, raw };
  };
  const pageAfter = (q: Record<string, unknown>) => {
    const paging = parsePaging<unknown>(q, KEY_PAGE);
    if (paging.after !== undefined && !isKeyPosition(paging.after)) {
      const param = q.page_token !== undefined ? 'page_token' : 'cursor';
      throw new ApiError('validation_failed', `${param} is not a token this server issued`, {
        extras: { param, errors: { [param]: ['unrecognised page token'] } },
      });
    }
    return { pageSize: paging.pageSize, after: paging.after as [string, string] | undefined };
  };
  const page = <T>(rows: KeyRow[], pageSize: number, map: (r: KeyRow) => T) => {
    const items = rows.slice(0, pageSize);
    const last = items[items.length - 1];
    return { items: items.map(map), tokens: pageTokens(rows.length > pageSize && last ? [last.created_at_text, last.key_id] : undefined) };
  };

  app.post(
    '/api/keys',
    {
      config: { idempotency: 'ignored' },
      preValidation: interactive,
      schema: {
        tags: ['keys'],
        summary: 'Create a scoped API key (session or ID token only); the raw key is returned once in `key`',
        body: CreateBody,
        response: { 201: Created, ...problems(400, 401, 403) },
      },
    },
    async (request, reply) => {
      const user = me(request);
      const { row, raw } = await issueKey(ownerOf(user), request.body, 'you', user.userId);
      reply.code(201).header('Cache-Control', 'no-store');
      return { ...keyView(row), key: raw };
    },
  );

  app.get(
    '/api/keys',
    {
      preValidation: interactive,
      schema: {
        tags: ['keys'],
        summary: "The caller's API keys, newest first (never the raw key)",
        querystring: ListQuery,
        response: {
          200: Type.Object({ keys: Type.Array(KeyView), next_page_token: Type.String(), nextPageToken: Type.String() }),
          ...problems(400, 401, 403),
        },
      },
    },
    async (request) => {
      const user = me(request);
      const { pageSize, after } = pageAfter(request.query);
      const rows = await listKeys(db, { uid: user.userId, after, limit: pageSize });
      const now = Date.now();
      const { items, tokens } = page(rows, pageSize, (r) => keyView(r, now));
      return { keys: items, ...tokens };
    },
  );

  app.post(
    '/api/keys/:keyId/rotate',
    {
      config: { idempotency: 'ignored' },
      preValidation: [
        interactive,
        async (request) => {
          request.body ??= {};
        },
      ],
      schema: {
        tags: ['keys'],
        summary: 'Rotate: a new key with the same scopes and environment (raw key once); the old key works 24 h more',
        params: KeyParams,
        body: RotateBody,
        response: { 201: Rotated, ...problems(400, 401, 403, 404, 409) },
      },
    },
    async (request, reply) => {
      const user = me(request);
      const { raw, created, previous } = await rotateKey(db, {
        keyId: request.params.keyId,
        uid: user.userId,
        lifetimeDays: request.body?.lifetimeDays,
        createdBy: user.userId,
      });
      reply.code(201).header('Cache-Control', 'no-store');
      return {
        ...keyView(created),
        key: raw,
        previous: { keyId: previous.key_id, status: statusOf(previous), graceUntil: previous.grace_until as number },
      };
    },
  );

  app.delete(
    '/api/keys/:keyId',
    {
      config: { idempotency: 'ignored' },
      preValidation: interactive,
      schema: {
        tags: ['keys'],
        summary: 'Revoke a key, immediately and permanently',
        params: KeyParams,
        response: { 200: Revoked, ...problems(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const user = me(request);
      const { row, alreadyRevoked } = await revokeKey(db, request.params.keyId, user.userId);
      return { ...keyView(row), alreadyRevoked };
    },
  );

  // ------------------------------------------------------------------------------ superadmin surface

  app.get(
    '/api/account/api-keys',
    {
      preValidation: superadmin,
      schema: {
        tags: ['keys'],
        summary: "Every user's API keys, newest first (superadmin; optional userId filter)",
        querystring: AccountListQuery,
        response: {
          200: Type.Object({ keys: Type.Array(AccountKeyView), next_page_token: Type.String(), nextPageToken: Type.String() }),
          ...problems(400, 401, 403),
        },
      },
    },
    async (request) => {
      const { pageSize, after } = pageAfter(request.query);
      const rows = await listKeys(db, { uid: request.query.userId, after, limit: pageSize });
      const { items, tokens } = page(rows, pageSize, accountKeyView);
      return { keys: items, ...tokens };
    },
  );

  app.post(
    '/api/account/api-keys',
    {
      config: { idempotency: 'ignored' },
      preValidation: superadmin,
      schema: {
        tags: ['keys'],
        summary: 'Create a key for a user (superadmin); the raw key is returned once in `key`',
        body: AccountCreateBody,
        response: { 201: AccountCreated, ...problems(400, 401, 403, 404) },
      },
    },
    async (request, reply) => {
      const admin = me(request);
      const { userId, email, ...fields } = request.body;
      if ((userId === undefined) === (email === undefined)) {
        throw invalid({ userId: ['send exactly one of userId and email to name the key owner'] });
      }
      const owner = await findUser(db, { uid: userId, email });
      if (!owner || owner.deleted)
        throw new ApiError('not_found', 'user not found', { extras: { param: userId !== undefined ? 'userId' : 'email' } });
      const { row, raw } = await issueKey(owner, fields, 'the key owner', admin.userId);
      reply.code(201).header('Cache-Control', 'no-store');
      return { ...accountKeyView(row), key: raw };
    },
  );

  app.delete(
    '/api/account/api-keys/:keyId',
    {
      config: { idempotency: 'ignored' },
      preValidation: superadmin,
      schema: {
        tags: ['keys'],
        summary: "Revoke any user's key (superadmin), immediately and permanently",
        params: KeyParams,
        response: { 200: AccountRevoked, ...problems(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const { row, alreadyRevoked } = await revokeKey(db, request.params.keyId);
      return { ...accountKeyView(row), alreadyRevoked };
    },
  );
}
