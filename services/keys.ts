/**
 * The API key lifecycle (`POST|GET /api/keys`, `POST /api/keys/{keyId}/rotate`, `DELETE /api/keys/{keyId}`
 * and the superadmin surface `/api/account/api-keys`; docs/decisions/api-key-lifecycle.md,
 * docs/decisions/scopes.md). Keys are stored as SHA-256 digests (db/keys.ts); the raw key is returned
 * once by `issue…` and `rotate…` and never stored. Times are epoch ms.
 */
import {
  type KeyOwner,
  type KeyPosition,
  type KeyRow,
  accessibleResources,
  accessibleSites,
  createKey,
  findUser,
  listKeys,
} from '../db/keys';
import { revokeKey as revokeKeyRow, rotateKey as rotateKeyRow } from '../db/keys';
import { ApiError } from '../domain/errors';
import { DEFAULT_LIFETIME_DAYS, generateApiKey, type KeyEnvironment, type KeyPreset } from '../domain/keys';
import type { UserPrincipal } from '../domain/principal';
import { type Permission, presetScopes, type Resource, type Scope } from '../domain/scopes';
import type { ServiceDeps } from './deps';

export { isKeyPosition, statusOf, type KeyPosition, type KeyRow } from '../db/keys';

/** What a new key asks for (the body of `POST /api/keys`). Exactly one of `scopes` and `preset`. */
export interface NewKeyFields {
  name: string;
  environment?: KeyEnvironment;
  scopes?: { resource: Resource; id: string; permissions: Permission[] }[];
  preset?: KeyPreset;
  /** Whole days, default 90. */
  lifetimeDays?: number;
  primarySiteId?: string;
}

/** A key just issued: its row and the raw key (show it once). */
export interface IssuedKey {
  row: KeyRow;
  raw: string;
}

/** Resources whose scopes are platform scopes (superadmin owners only, id `*`). */
const PLATFORM = new Set(['user', 'installer']);

/** 400 validation_failed carrying `errs` (dotted path → messages), the first path as `param`. */
function invalid(errs: Record<string, string[]>): ApiError {
  const first = Object.keys(errs)[0];
  return new ApiError('validation_failed', `${first} ${errs[first][0]}`, { extras: { errors: errs, param: first } });
}

/**
 * Resolves the scopes and primary site of a new key for `owner`: exactly one of scopes and preset;
 * platform scopes (user, installer) only for a superadmin owner and only with id `*`; every concrete id
 * names a site, roost or machine the owner can access (chat, deploy and process ids may name any of the
 * three); `primarySiteId` defaults to the first site scope with a concrete id.
 * @throws ApiError validation_failed (dotted paths such as `scopes.0.id`), forbidden (platform scopes)
 */
async function resolveNewKey(
  deps: Pick<ServiceDeps, 'db'>,
  owner: KeyOwner,
  body: NewKeyFields,
  who: 'you' | 'the key owner',
): Promise<{ scopes: Scope[]; primarySiteId: string | null }> {
  if (body.scopes !== undefined && body.preset !== undefined) {
    throw invalid({ preset: ['is mutually exclusive with scopes: send one of them'], scopes: ['is mutually exclusive with preset'] });
  }
  if (body.scopes === undefined && body.preset === undefined)
    throw invalid({ scopes: ['send scopes or a preset (readonly, publisher, operator, admin)'] });
  const scopes: Scope[] = body.preset
    ? presetScopes(body.preset)
    : (body.scopes ?? []).map((s) => ({ resource: s.resource, id: s.id, permissions: [...new Set(s.permissions)] }));

  const errs: Record<string, string[]> = {};
  const platform = scopes.map((s, i) => [s, i] as const).filter(([s]) => PLATFORM.has(s.resource));
  if (platform.length > 0 && owner.role !== 'superadmin') {
    throw new ApiError(
      'forbidden',
      `platform scopes (user, installer) are for superadmins only; ${who === 'you' ? 'you are' : 'the key owner is'} not one`,
      { extras: { param: `scopes.${platform[0][1]}.resource` } },
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
    accessibleSites(deps.db, owner, [...new Set(siteIds)]),
    accessibleResources(deps.db, owner, { roosts: [...new Set(roostIds)], machines: [...new Set(machineIds)] }),
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

/** Validates the requested scopes for `owner`, stores a new key's digest, and returns the row with the raw key. */
async function issueKey(
  deps: Pick<ServiceDeps, 'db'>,
  owner: KeyOwner,
  fields: NewKeyFields,
  who: 'you' | 'the key owner',
  createdBy: string,
): Promise<IssuedKey> {
  const { scopes, primarySiteId } = await resolveNewKey(deps, owner, fields, who);
  const environment = fields.environment ?? 'live';
  const raw = generateApiKey(environment);
  const row = await createKey(deps.db, {
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
}

/**
 * Issues a key owned by the signed-in `user` (`POST /api/keys`).
 * @throws ApiError validation_failed (scopes, preset, primarySiteId), forbidden (platform scopes of a non-superadmin)
 */
export function issueOwnKey(deps: Pick<ServiceDeps, 'db'>, user: UserPrincipal, fields: NewKeyFields): Promise<IssuedKey> {
  return issueKey(deps, { uid: user.userId, email: user.email, role: user.role, deleted: false }, fields, 'you', user.userId);
}

/**
 * Issues a key for the user named by exactly one of `userId` and `email` (`POST /api/account/api-keys`,
 * superadmin; `createdBy` is the superadmin's uid).
 * @throws ApiError validation_failed (neither or both owner fields; scope rules), not_found (no such live user), forbidden
 */
export async function issueKeyForUser(
  deps: Pick<ServiceDeps, 'db'>,
  input: { userId?: string; email?: string; fields: NewKeyFields; createdBy: string },
): Promise<IssuedKey> {
  const { userId, email } = input;
  if ((userId === undefined) === (email === undefined)) {
    throw invalid({ userId: ['send exactly one of userId and email to name the key owner'] });
  }
  const owner = await findUser(deps.db, { uid: userId, email });
  if (!owner || owner.deleted)
    throw new ApiError('not_found', 'user not found', { extras: { param: userId !== undefined ? 'userId' : 'email' } });
  return issueKey(deps, owner, input.fields, 'the key owner', input.createdBy);
}

/**
 * A page of keys, newest first: of `uid` when given (every user's otherwise, superadmin surface), after
 * `after`. `next` is the position of the page's last row when more follow.
 */
export async function listKeyPage(
  deps: Pick<ServiceDeps, 'db'>,
  input: { uid?: string; after?: KeyPosition; pageSize: number },
): Promise<{ rows: KeyRow[]; next: KeyPosition | undefined }> {
  const rows = await listKeys(deps.db, { uid: input.uid, after: input.after, limit: input.pageSize });
  const page = rows.slice(0, input.pageSize);
  const last = page[page.length - 1];
  return { rows: page, next: rows.length > input.pageSize && last ? [last.created_at_text, last.key_id] : undefined };
}

/**
 * Rotates a key of `uid` (`POST /api/keys/{keyId}/rotate`): a successor with the same scopes and
 * environment (raw key once), the old key valid 24 h more. `lifetimeDays` defaults to the old key's.
 * @throws ApiError not_found (absent or not the caller's), conflict (not active or expired)
 */
export function rotateKey(
  deps: Pick<ServiceDeps, 'db'>,
  input: { keyId: string; uid: string; lifetimeDays?: number },
): Promise<{ raw: string; created: KeyRow; previous: KeyRow }> {
  return rotateKeyRow(deps.db, { keyId: input.keyId, uid: input.uid, lifetimeDays: input.lifetimeDays, createdBy: input.uid });
}

/**
 * Revokes a key at once and for good: of `uid` when given (`DELETE /api/keys/{keyId}`), any key otherwise
 * (`DELETE /api/account/api-keys/{keyId}`, superadmin). Revoking a revoked key reports `alreadyRevoked`.
 * @throws ApiError not_found
 */
export function revokeKey(deps: Pick<ServiceDeps, 'db'>, keyId: string, uid?: string): Promise<{ row: KeyRow; alreadyRevoked: boolean }> {
  return revokeKeyRow(deps.db, keyId, uid);
}
