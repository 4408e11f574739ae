/**
 * API key repository (docs/contract.md "API key and scope"; docs/decisions/api-key-lifecycle.md): insert, list, find,
 * rotate and revoke rows of `api_keys`, plus the access lookups that scope ids are checked against.
 * Raw keys never reach this module: only their SHA-256 digests and display prefixes.
 *
 * `api_keys` is user data, not site data: queries name `uid` (the owner) except the superadmin listing.
 * Rotation and revocation run in one `withTx` (SERIALIZABLE, 40001 retry) so two concurrent rotations of
 * one key cannot both succeed.
 */
import { isCreatedAtPosition } from '../domain/schemas';
import type { Pool } from 'pg';
import { ApiError } from '../domain/errors';
import { newId, sha256Hex } from '../domain/hex';
import {
  DEFAULT_LIFETIME_DAYS,
  deriveKeyStatus,
  expiresAtFor,
  generateApiKey,
  isRotatable,
  type KeyEnvironment,
  type KeyStatus,
  keyPrefix,
  ROTATION_GRACE_MS,
} from '../domain/keys';
import type { Scope } from '../domain/scopes';
import type { UserRole } from '../domain/principal';
import { prepared, type Queryable, withTx } from './pool';
import { accessibleSiteIds, mayActCondition, type SiteAccess, type SiteUser } from './sites';
import { prefixedRoostColumns, roostFromPrefixed, type RoostRow } from './roosts';

/** An `api_keys` row joined with its owner's email (times in epoch ms unless Date). */
export interface KeyRow {
  key_id: string;
  uid: string;
  email: string;
  name: string;
  key_prefix: string;
  scopes: Scope[];
  environment: KeyEnvironment;
  is_legacy: boolean;
  primary_site_id: string | null;
  status: string;
  expires_at: number | null;
  grace_until: number | null;
  last_used_at: number | null;
  lifetime_days: number | null;
  rotated_at: number | null;
  replaced_by: string | null;
  rotated_from: string | null;
  created_by: string | null;
  created_at: Date;
  created_at_text: string;
  revoked_at: Date | null;
}

const KEY_COLUMNS = `k.key_id, k.uid, u.email, k.name, k.key_prefix, k.scopes, k.environment, k.is_legacy, k.primary_site_id,
  k.status, k.expires_at, k.grace_until, k.last_used_at, k.lifetime_days, k.rotated_at, k.replaced_by, k.rotated_from,
  k.created_by, k.created_at, k.created_at::text AS created_at_text, k.revoked_at`;

/** The derived list-view status of a row at `now`. */
export function statusOf(row: KeyRow, now = Date.now()): KeyStatus {
  return deriveKeyStatus({ status: row.status, expiresAt: row.expires_at, graceUntil: row.grace_until }, now);
}

/** What a new key row holds; `raw` is hashed here and never stored. */
export interface NewKey {
  raw: string;
  uid: string;
  name: string;
  scopes: Scope[];
  environment: KeyEnvironment;
  primarySiteId: string | null;
  lifetimeDays: number;
  createdBy: string;
  rotatedFrom?: string | null;
  isLegacy?: boolean;
}

async function insertKey(db: Queryable, k: NewKey, now: number): Promise<string> {
  const keyId = newId('key');
  await db.query(
    `INSERT INTO api_keys (key_id, uid, name, key_prefix, key_hash, scopes, environment, is_legacy, primary_site_id, status,
                           expires_at, lifetime_days, created_by, rotated_from, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'active', $10, $11, $12, $13, $14)`,
    [
      keyId,
      k.uid,
      k.name,
      keyPrefix(k.raw),
      sha256Hex(k.raw),
      JSON.stringify(k.scopes),
      k.environment,
      k.isLegacy ?? false,
      k.primarySiteId,
      expiresAtFor(now, k.lifetimeDays),
      k.lifetimeDays,
      k.createdBy,
      k.rotatedFrom ?? null,
      new Date(now),
    ],
  );
  return keyId;
}

/** Inserts a new active key; returns its row. */
export async function createKey(db: Pool, k: NewKey): Promise<KeyRow> {
  const keyId = await insertKey(db, k, Date.now());
  return (await findKey(db, keyId)) as KeyRow;
}

/** One key by id, optionally only when owned by `uid`; undefined when absent. */
export async function findKey(db: Queryable, keyId: string, uid?: string): Promise<KeyRow | undefined> {
  const { rows } = await db.query<KeyRow>(
    `SELECT ${KEY_COLUMNS} FROM api_keys k JOIN users u ON u.uid = k.uid WHERE k.key_id = $1 AND ($2::text IS NULL OR k.uid = $2::text)`,
    [keyId, uid ?? null],
  );
  return rows[0];
}

/** A list position: [created_at text, key id] of the last row of the previous page. */
export type KeyPosition = [string, string];

/** True for a position this server could have issued (domain/schemas.ts `isCreatedAtPosition`). */
export const isKeyPosition: (p: unknown) => p is KeyPosition = isCreatedAtPosition;

/**
 * Keys newest first, `limit` + 1 rows (the extra one tells whether a next page exists). `uid` narrows to
 * one owner (GET /api/keys always passes it; the superadmin listing may not).
 */
export async function listKeys(db: Queryable, opts: { uid?: string; after?: KeyPosition; limit: number }): Promise<KeyRow[]> {
  const { rows } = await db.query<KeyRow>(
    `SELECT ${KEY_COLUMNS} FROM api_keys k JOIN users u ON u.uid = k.uid
      WHERE ($1::text IS NULL OR k.uid = $1::text)
        AND ($2::timestamptz IS NULL OR (k.created_at, k.key_id) < ($2::timestamptz, $3::text))
      ORDER BY k.created_at DESC, k.key_id DESC LIMIT $4`,
    [opts.uid ?? null, opts.after?.[0] ?? null, opts.after?.[1] ?? null, opts.limit + 1],
  );
  return rows;
}

/**
 * Rotates a key (docs/contract.md: new key, same scopes and environment; the old key keeps working for 24 h):
 * generates the successor's raw key (returned once), inserts it (same name, scopes, environment, primary site, legacy flag, and lifetime unless
 * `lifetimeDays` is given; a key issued without a lifetime gets the default 90 days) and marks the old
 * one rotated with `grace_until = now + 24 h`.
 * @param uid the owner the key must belong to, or undefined (superadmin surface)
 * @throws ApiError not_found (absent or not the caller's), conflict (status is not active or expired)
 */
export async function rotateKey(
  db: Pool,
  opts: { keyId: string; uid?: string; lifetimeDays?: number; createdBy: string },
): Promise<{ raw: string; created: KeyRow; previous: KeyRow }> {
  return withTx(db, async (tx) => {
    const old = await findKeyForUpdate(tx, opts.keyId, opts.uid);
    const now = Date.now();
    const status = statusOf(old, now);
    if (!isRotatable(status)) {
      throw new ApiError(
        'conflict',
        `a ${status} key cannot be rotated${status === 'rotated' ? '; rotate its successor ' + (old.replaced_by ?? '') : ''}`.trim(),
        {
          extras: { keyStatus: status, replacedBy: old.replaced_by },
        },
      );
    }
    const raw = generateApiKey(old.environment);
    const successorId = await insertKey(
      tx,
      {
        raw,
        uid: old.uid,
        name: old.name,
        scopes: old.scopes,
        environment: old.environment,
        primarySiteId: old.primary_site_id,
        lifetimeDays: opts.lifetimeDays ?? old.lifetime_days ?? DEFAULT_LIFETIME_DAYS,
        createdBy: opts.createdBy,
        rotatedFrom: old.key_id,
        isLegacy: old.is_legacy,
      },
      now,
    );
    await tx.query(`UPDATE api_keys SET status = 'rotated', grace_until = $2, rotated_at = $3, replaced_by = $4 WHERE key_id = $1`, [
      old.key_id,
      now + ROTATION_GRACE_MS,
      now,
      successorId,
    ]);
    return { raw, created: (await findKey(tx, successorId)) as KeyRow, previous: (await findKey(tx, old.key_id)) as KeyRow };
  });
}

/**
 * Revokes a key at once and for good (docs/contract.md). Revoking a revoked key changes nothing and reports
 * `alreadyRevoked: true`.
 * @throws ApiError not_found (absent or not owned by `uid` when given)
 */
export async function revokeKey(db: Pool, keyId: string, uid?: string): Promise<{ row: KeyRow; alreadyRevoked: boolean }> {
  return withTx(db, async (tx) => {
    const row = await findKeyForUpdate(tx, keyId, uid);
    if (row.status === 'revoked') return { row, alreadyRevoked: true };
    await tx.query(`UPDATE api_keys SET status = 'revoked', revoked_at = now() WHERE key_id = $1`, [keyId]);
    return { row: (await findKey(tx, keyId)) as KeyRow, alreadyRevoked: false };
  });
}

async function findKeyForUpdate(tx: Queryable, keyId: string, uid?: string): Promise<KeyRow> {
  const { rows } = await tx.query<{ key_id: string }>(
    'SELECT key_id FROM api_keys WHERE key_id = $1 AND ($2::text IS NULL OR uid = $2::text) FOR UPDATE',
    [keyId, uid ?? null],
  );
  if (!rows[0]) throw new ApiError('not_found', 'API key not found', { extras: { param: 'keyId' } });
  return (await findKey(tx, keyId)) as KeyRow;
}

// ---------------------------------------------------------------------------------------------------
// Authentication

/** The key row authentication reads: the repository's KeyRow columns it needs, plus the digest and the owner's role. */
export type AuthKeyRow = Pick<
  KeyRow,
  | 'key_id'
  | 'name'
  | 'key_prefix'
  | 'scopes'
  | 'environment'
  | 'is_legacy'
  | 'primary_site_id'
  | 'status'
  | 'expires_at'
  | 'grace_until'
  | 'last_used_at'
  | 'uid'
  | 'email'
> & { key_hash: string; role: UserRole; deleted: boolean };

const AUTH_KEY_COLS = `k.key_id, k.key_hash, k.name, k.key_prefix, k.scopes, k.environment, k.is_legacy, k.primary_site_id, k.status,
            k.expires_at, k.grace_until, k.last_used_at, u.uid, u.email, u.role, u.deleted`;
const KEY_FOR_AUTH_SQL = `SELECT ${AUTH_KEY_COLS} FROM api_keys k JOIN users u ON u.uid = k.uid WHERE k.key_hash = $1`;
const KEY_FOR_AUTH_SITE_SQL = `SELECT ${AUTH_KEY_COLS}, s.environment AS site_environment, s.roost_enabled AS site_roost_enabled
       FROM api_keys k JOIN users u ON u.uid = k.uid
       LEFT JOIN sites s ON s.site_id = $2 AND ${mayActCondition('s', 'u.uid', "u.role = 'superadmin'")}
      WHERE k.key_hash = $1`;

const KEY_FOR_AUTH_SITE_ROOST_SQL = `SELECT ${AUTH_KEY_COLS}, s.environment AS site_environment, s.roost_enabled AS site_roost_enabled,
         ${prefixedRoostColumns('r', 'roost_')}
       FROM api_keys k JOIN users u ON u.uid = k.uid
       LEFT JOIN sites s ON s.site_id = $2 AND ${mayActCondition('s', 'u.uid', "u.role = 'superadmin'")}
       LEFT JOIN roosts r ON s.site_id IS NOT NULL AND r.site_id = s.site_id AND r.roost_id = $3 AND r.deleted_at IS NULL
      WHERE k.key_hash = $1`;

type SiteReadRow = AuthKeyRow & { site_environment: SiteAccess['environment'] | null; site_roost_enabled: boolean | null };

/**
 * The key whose digest is `digest` (SHA-256 hex of the raw key) with its owner; undefined when none. With
 * `siteId`, the same statement also reads what authorisation needs of that site for the key's owner
 * (db/sites.ts `siteAccess`): `site` is undefined when the site is absent or the owner may not act on it.
 * With `siteId` and `roostId` it also reads that roost's live row (`roost`; only when the owner may act on
 * the site, undefined when the roost is absent or tombstoned), so a read route naming a roost does not
 * read it again (db/roosts.ts `resolveVersion` `readRoost`): one round trip fewer per request.
 */
export async function keyForAuth(
  db: Queryable,
  digest: string,
  siteId?: string,
  roostId?: string,
): Promise<(AuthKeyRow & { site?: SiteAccess; roost?: RoostRow }) | undefined> {
  // Named statements (db/pool.ts `prepared`): every authenticated API-key request sends one of them.
  if (siteId === undefined) {
    const { rows } = await prepared<AuthKeyRow>(db, 'auth_key', KEY_FOR_AUTH_SQL, [digest]);
    return rows[0];
  }
  if (roostId === undefined) {
    const { rows } = await prepared<SiteReadRow>(db, 'auth_key_site', KEY_FOR_AUTH_SITE_SQL, [digest, siteId]);
    return rows[0] && withSite(rows[0]);
  }
  const { rows } = await prepared<SiteReadRow & Record<string, unknown>>(db, 'auth_key_site_roost', KEY_FOR_AUTH_SITE_ROOST_SQL, [
    digest,
    siteId,
    roostId,
  ]);
  const row = rows[0];
  if (!row) return undefined;
  const roost = roostFromPrefixed(row, 'roost_');
  const key = withSite(Object.fromEntries(Object.entries(row).filter(([k]) => !k.startsWith('roost_'))) as SiteReadRow);
  return roost ? { ...key, roost } : key;
}

/** The key row without the site columns, with `site` when the site was read. */
function withSite(row: SiteReadRow): AuthKeyRow & { site?: SiteAccess } {
  const { site_environment, site_roost_enabled, ...key } = row;
  return site_environment === null ? key : { ...key, site: { environment: site_environment, roost_enabled: site_roost_enabled === true } };
}

/**
 * The state of the keys `keyIds`, whether their users are deleted, and whether each key's user may still act
 * on `siteId` (`may_act`: owner, member or superadmin, the rule of db/sites.ts `mayActCondition`; false when
 * the site is gone), one statement (the event stream checks every streaming key before it delivers:
 * api/events/hub.ts). Keys not found are absent.
 */
export async function keyStates(db: Queryable, keyIds: string[], siteId: string): Promise<KeyState[]> {
  const { rows } = await db.query<KeyState>(
    `SELECT k.key_id, k.status, k.expires_at, k.grace_until, u.deleted,
            EXISTS (SELECT 1 FROM sites s WHERE s.site_id = $2 AND ${mayActCondition('s', 'u.uid', "u.role = 'superadmin'")}) AS may_act
       FROM api_keys k JOIN users u ON u.uid = k.uid
      WHERE k.key_id = ANY($1::text[])`,
    [keyIds, siteId],
  );
  return rows;
}

/** One row of `keyStates`. */
export type KeyState = Pick<AuthKeyRow, 'key_id' | 'status' | 'expires_at' | 'grace_until' | 'deleted'> & { may_act: boolean };

/** Sets a key's `last_used_at` to `at` (epoch ms). */
export async function touchKey(db: Queryable, keyId: string, at: number): Promise<void> {
  await db.query('UPDATE api_keys SET last_used_at = $2 WHERE key_id = $1', [keyId, at]);
}

// ---------------------------------------------------------------------------------------------------
// Access lookups for scope ids (an id in a key's scopes must name something the owning user can access)

export { findUser, type KeyOwner } from './users';

/** Which of `siteIds` the user may act on (owner, member, or any site for a superadmin; db/sites.ts). */
export async function accessibleSites(db: Queryable, owner: SiteUser, siteIds: string[]): Promise<Set<string>> {
  return new Set(await accessibleSiteIds(db, owner, { siteIds }));
}

/**
 * Which of `ids` name a live roost or an enrolled machine in a site the user may act on. Each lookup
 * names the sites (`site_id = ANY(...)`) the user can see.
 */
export async function accessibleResources(
  db: Queryable,
  owner: SiteUser,
  ids: { roosts: string[]; machines: string[] },
): Promise<{ roosts: Set<string>; machines: Set<string> }> {
  const out = { roosts: new Set<string>(), machines: new Set<string>() };
  if (ids.roosts.length === 0 && ids.machines.length === 0) return out;
  const siteIds = await accessibleSiteIds(db, owner);
  if (siteIds.length === 0) return out;
  if (ids.roosts.length) {
    const { rows } = await db.query<{ roost_id: string }>(
      'SELECT DISTINCT roost_id FROM roosts WHERE site_id = ANY($1::text[]) AND roost_id = ANY($2::text[]) AND deleted_at IS NULL',
      [siteIds, ids.roosts],
    );
    for (const r of rows) out.roosts.add(r.roost_id);
  }
  if (ids.machines.length) {
    const { rows } = await db.query<{ machine_id: string }>(
      'SELECT DISTINCT machine_id FROM machines WHERE site_id = ANY($1::text[]) AND machine_id = ANY($2::text[])',
      [siteIds, ids.machines],
    );
    for (const r of rows) out.machines.add(r.machine_id);
  }
  return out;
}

/**
 * Revokes every key of `uid` that is not revoked yet (active and rotated alike), in the caller's
 * transaction; returns how many it revoked (0 when run again). The user-delete cascade's step.
 */
export async function revokeUserKeys(tx: Queryable, uid: string): Promise<number> {
  const { rowCount } = await tx.query(`UPDATE api_keys SET status = 'revoked', revoked_at = now() WHERE uid = $1 AND status <> 'revoked'`, [
    uid,
  ]);
  return rowCount ?? 0;
}
