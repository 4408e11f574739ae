/**
 * The API key lifecycle (services/keys.ts; docs/decisions/api-key-lifecycle.md, docs/decisions/scopes.md):
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
 * Idempotency-Key is ignored on all of them: responses carry raw keys, which are never stored, and a
 * replay would have to store them.
 */
import type { FastifyRequest } from 'fastify';
import { type Static, type TLiteral, type TSchema, type TUnion, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import {
  DEFAULT_LIFETIME_DAYS,
  deriveKeyStatus,
  KEY_ENVIRONMENTS,
  KEY_PRESETS,
  KEY_STATUSES,
  MAX_LIFETIME_DAYS,
  MIN_LIFETIME_DAYS,
} from '../../domain/keys';
import { PERMISSIONS, RESOURCES } from '../../domain/scopes';
import { pagingQuery, Problem, problems, SITE_ID_RE, NON_BLANK_TEXT } from '../../domain/schemas';
import { isKeyPosition, issueKeyForUser, issueOwnKey, type KeyRow, listKeyPage, revokeKey, rotateKey } from '../../services/keys';
import { parsePaging } from '../pagination';
import { requireInteractive, requireSuperadmin } from '../plugins/auth';

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
  name: Type.String({ minLength: 1, maxLength: 100, pattern: NON_BLANK_TEXT, description: 'label' }),
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
/** Key list paging (Limits table is silent): default 50, max 100. */
export const KEY_PAGE = { defaultSize: 50, maxSize: 100 };
const ListQuery = Type.Object(pagingQuery(KEY_PAGE));
const AccountListQuery = Type.Object({ ...pagingQuery(KEY_PAGE), userId: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })) });

/** The problems of the routes that cannot answer 404. */
const NO_404 = { 400: Problem, 401: Problem, 403: Problem };

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
    status: deriveKeyStatus({ status: r.status, expiresAt: r.expires_at, graceUntil: r.grace_until }, now),
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
// Routes

// Route-level hooks run after the global authentication hook and before body validation, so a caller
// without the capability learns nothing about the body rules.
const interactive = async (request: FastifyRequest) => {
  requireInteractive(request);
};
const superadmin = async (request: FastifyRequest) => {
  requireSuperadmin(requireInteractive(request));
};

/** Registers the key lifecycle routes. */
const keyRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.post(
    '/api/keys',
    {
      config: { idempotency: 'ignored' },
      preValidation: interactive,
      schema: {
        tags: ['keys'],
        summary: 'Create a scoped API key (session or ID token only); the raw key is returned once in `key`',
        body: CreateBody,
        response: { 201: Created, ...NO_404 },
      },
    },
    async (request, reply) => {
      const { row, raw } = await issueOwnKey(app.deps, requireInteractive(request), request.body);
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
          ...NO_404,
        },
      },
    },
    async (request) => {
      const user = requireInteractive(request);
      const paging = parsePaging(request, { ...KEY_PAGE, accept: isKeyPosition });
      const { rows, next } = await listKeyPage(app.deps, { uid: user.userId, after: paging.after, pageSize: paging.pageSize });
      const now = Date.now();
      return { keys: rows.map((r) => keyView(r, now)), ...paging.tokens(next) };
    },
  );

  app.post(
    '/api/keys/:keyId/rotate',
    {
      config: { idempotency: 'ignored', bodyOptional: true },
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
        response: { 201: Rotated, ...problems(409) },
      },
    },
    async (request, reply) => {
      const user = requireInteractive(request);
      const { raw, created, previous } = await rotateKey(app.deps, {
        keyId: request.params.keyId,
        uid: user.userId,
        lifetimeDays: request.body?.lifetimeDays,
      });
      reply.code(201).header('Cache-Control', 'no-store');
      return {
        ...keyView(created),
        key: raw,
        previous: { keyId: previous.key_id, status: keyView(previous).status, graceUntil: previous.grace_until as number },
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
        response: { 200: Revoked, ...problems() },
      },
    },
    async (request) => {
      const user = requireInteractive(request);
      const { row, alreadyRevoked } = await revokeKey(app.deps, request.params.keyId, user.userId);
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
          ...NO_404,
        },
      },
    },
    async (request) => {
      const paging = parsePaging(request, { ...KEY_PAGE, accept: isKeyPosition });
      const { rows, next } = await listKeyPage(app.deps, { uid: request.query.userId, after: paging.after, pageSize: paging.pageSize });
      return { keys: rows.map(accountKeyView), ...paging.tokens(next) };
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
        response: { 201: AccountCreated, ...problems() },
      },
    },
    async (request, reply) => {
      const admin = requireInteractive(request);
      const { userId, email, ...fields } = request.body;
      const { row, raw } = await issueKeyForUser(app.deps, { userId, email, fields, createdBy: admin.userId });
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
        response: { 200: AccountRevoked, ...problems() },
      },
    },
    async (request) => {
      const { row, alreadyRevoked } = await revokeKey(app.deps, request.params.keyId);
      return { ...accountKeyView(row), alreadyRevoked };
    },
  );
};

export default keyRoutes;
