/**
 * The rate-limit buckets of docs/contract.md "Limits", as data, and the resolved settings one API process runs
 * with (profile, scale factor and per-bucket overrides from configuration).
 *
 * Wrapper buckets limit whole requests (a route names one; key-authenticated routes default to `api`).
 * Capability buckets limit one kind of operation per actor, subject, site and capability in 60-second
 * windows; routes call `enforceCapability` (api/ratelimit/limits.ts) for them. When the configured
 * store is unreachable, the per-process `fallback` (15 per minute per identifier) applies instead.
 * Pure: no I/O. Decisions: docs/decisions/rate-limit-buckets.md.
 */
import { type Static, Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import type { Config } from '../../config/env';

/** A limit: `points` requests per `durationSeconds` window. */
export interface BucketLimit {
  points: number;
  durationSeconds: number;
}

/** Value of `Roost-Rate-Limited-Reason` on a 429 (docs/contract.md "Limits"). */
export type RateLimitedReason = 'global-rate' | 'endpoint-rate' | 'key-rate' | 'site-concurrency';

/**
 * Whom a wrapper bucket counts: the client IP, the user (else IP), or the API key (else IP).
 * (docs/contract.md: auth, tokenExchange, tokenRefresh, agentAlert and upload by IP; user by user id or IP; api by
 * API key id, else IP.)
 */
export type BucketSubject = 'ip' | 'userOrIp' | 'keyOrIp';

interface WrapperDefinition {
  subject: BucketSubject;
  production: BucketLimit;
  development: BucketLimit;
}

const perMinute = (points: number): BucketLimit => ({ points, durationSeconds: 60 });
const perHour = (points: number): BucketLimit => ({ points, durationSeconds: 3600 });
const same = (subject: BucketSubject, limit: BucketLimit): WrapperDefinition => ({ subject, production: limit, development: limit });

/** The wrapper buckets of docs/contract.md "Limits" with their production and development numbers. */
export const WRAPPER_BUCKETS = {
  auth: same('ip', perMinute(10)),
  tokenExchange: { subject: 'ip', production: perHour(60), development: perHour(200) },
  tokenRefresh: same('ip', perHour(120)),
  user: same('userOrIp', perHour(60)),
  agentAlert: same('ip', perHour(5)),
  upload: { subject: 'ip', production: perHour(5), development: perHour(30) },
  api: same('keyOrIp', perHour(300)),
} satisfies Record<string, WrapperDefinition>;

/** Name of a wrapper bucket; routes pick one with `config: { rateLimit: '<name>' }`. */
export type WrapperBucket = keyof typeof WRAPPER_BUCKETS;
export const WRAPPER_BUCKET_NAMES = Object.keys(WRAPPER_BUCKETS) as WrapperBucket[];

/** Per-minute limits of one capability: the user/key bucket and the system bucket. */
export interface CapabilityLimit {
  user: number;
  system: number;
}

const cap = (user: number, system: number): CapabilityLimit => ({ user, system });

/** The capability buckets of docs/contract.md "Limits" (60-second windows). */
export const CAPABILITY_BUCKETS = {
  MACHINE_EXEC_COMMAND: cap(60, 300),
  MACHINE_CONFIG_WRITE: cap(30, 150),
  MACHINE_REMOVE: cap(5, 25),
  DEPLOYMENT_MANAGE: cap(30, 150),
  DISTRIBUTION_MANAGE: cap(30, 150),
  UNINSTALL_TRIGGER: cap(30, 150),
  SITE_MEMBER_MANAGE: cap(30, 150),
  WEBHOOK_MANAGE: cap(30, 150),
  SITE_LOGS_MANAGE: cap(30, 150),
  TALON_MANAGE: cap(30, 150),
  SYSTEM_PRESET_MANAGE: cap(30, 150),
  PRESET_MANAGE: cap(60, 300),
  AGENT_TOKEN_REVOKE: cap(5, 25),
  USER_DELETE: cap(5, 25),
  USER_ROLE_MANAGE: cap(10, 50),
  INSTALLER_MANAGE: cap(10, 50),
  GLOBAL_SETTINGS_WRITE: cap(10, 50),
  USER_SELF_PREFS: cap(120, 600),
  USER_SELF_DELETE: cap(1, 5),
} satisfies Record<string, CapabilityLimit>;

/** A capability name of docs/contract.md "Limits". */
export type Capability = keyof typeof CAPABILITY_BUCKETS;
export const CAPABILITY_NAMES = Object.keys(CAPABILITY_BUCKETS) as Capability[];

/** Window of every capability bucket, seconds. */
export const CAPABILITY_WINDOW_SECONDS = 60;

/** The per-process fallback when the shared store is unreachable: 15 requests per minute per identifier. */
export const FALLBACK_LIMIT: BucketLimit = perMinute(15);

/** Which actor bucket a capability check counts against: a user or key, or a system actor (agents). */
export type CapabilityActor = 'user' | 'system';

// ------------------------------------------------------------------------------------------ overrides

const Positive = Type.Integer({ minimum: 1 });
const LimitOverride = Type.Object(
  { points: Type.Optional(Positive), durationSeconds: Type.Optional(Positive) },
  { additionalProperties: false },
);
const CapabilityOverride = Type.Object({ user: Type.Optional(Positive), system: Type.Optional(Positive) }, { additionalProperties: false });

/**
 * ROOST_RATE_LIMIT_OVERRIDES: a flat JSON object. Keys are wrapper bucket names (`api`, `auth`, …) and
 * `fallback` with `{points?, durationSeconds?}`, or capability names with `{user?, system?}` (per minute).
 */
export const OverridesSchema = Type.Object(
  {
    ...Object.fromEntries(WRAPPER_BUCKET_NAMES.map((n) => [n, Type.Optional(LimitOverride)])),
    fallback: Type.Optional(LimitOverride),
    ...Object.fromEntries(CAPABILITY_NAMES.map((n) => [n, Type.Optional(CapabilityOverride)])),
  },
  { additionalProperties: false },
);
export type Overrides = Static<typeof OverridesSchema>;

/** The limits one API process enforces. */
export interface RateLimitSettings {
  buckets: Record<WrapperBucket, BucketLimit & { subject: BucketSubject }>;
  capabilities: Record<Capability, CapabilityLimit>;
  fallback: BucketLimit;
}

/** Configuration the settings derive from. */
export type RateLimitConfig = Pick<Config, 'ROOST_RATE_LIMIT_PROFILE' | 'ROOST_RATE_LIMIT_SCALE' | 'ROOST_RATE_LIMIT_OVERRIDES'>;

/**
 * Parses ROOST_RATE_LIMIT_OVERRIDES. @throws Error naming the variable and the offending path when it
 * is not JSON or not the documented shape (unknown bucket names included).
 */
export function parseOverrides(raw: string | undefined): Overrides {
  if (raw === undefined || raw.trim() === '') return {};
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (err) {
    throw new Error(`invalid configuration: ROOST_RATE_LIMIT_OVERRIDES is not JSON (${(err as Error).message})`);
  }
  const errors = [...Value.Errors(OverridesSchema, value)];
  if (errors.length > 0) {
    throw new Error(`invalid configuration: ROOST_RATE_LIMIT_OVERRIDES ${errors.map((e) => `${e.path || '/'} ${e.message}`).join('; ')}`);
  }
  return value as Overrides;
}

/** `points × scale`, rounded, at least 1. */
function scaled(points: number, scale: number): number {
  return Math.max(1, Math.round(points * scale));
}

/**
 * The effective limits: the spec's numbers for the profile, each override applied, then every count
 * multiplied by ROOST_RATE_LIMIT_SCALE (windows are not scaled). @throws Error on bad overrides.
 */
export function rateLimitSettings(cfg: RateLimitConfig): RateLimitSettings {
  const overrides = parseOverrides(cfg.ROOST_RATE_LIMIT_OVERRIDES);
  const scale = cfg.ROOST_RATE_LIMIT_SCALE;
  const o = overrides as Record<string, { points?: number; durationSeconds?: number; user?: number; system?: number } | undefined>;
  const buckets = {} as RateLimitSettings['buckets'];
  for (const name of WRAPPER_BUCKET_NAMES) {
    const def: WrapperDefinition = WRAPPER_BUCKETS[name];
    const base = def[cfg.ROOST_RATE_LIMIT_PROFILE];
    buckets[name] = {
      subject: def.subject,
      points: scaled(o[name]?.points ?? base.points, scale),
      durationSeconds: o[name]?.durationSeconds ?? base.durationSeconds,
    };
  }
  const capabilities = {} as RateLimitSettings['capabilities'];
  for (const name of CAPABILITY_NAMES) {
    const base: CapabilityLimit = CAPABILITY_BUCKETS[name];
    capabilities[name] = { user: scaled(o[name]?.user ?? base.user, scale), system: scaled(o[name]?.system ?? base.system, scale) };
  }
  const fallback = {
    points: scaled(o.fallback?.points ?? FALLBACK_LIMIT.points, scale),
    durationSeconds: o.fallback?.durationSeconds ?? FALLBACK_LIMIT.durationSeconds,
  };
  return { buckets, capabilities, fallback };
}

/**
 * The `Roost-Rate-Limited-Reason` of an exhausted wrapper bucket: `key-rate` when it counted an API key
 * or user, `global-rate` when it counted a bare IP on the default `api` bucket, `endpoint-rate` for the
 * route-specific buckets (auth, token, upload, agent alert).
 */
export function wrapperReason(bucket: WrapperBucket, identifier: string): RateLimitedReason {
  if (bucket === 'api' || bucket === 'user') return identifier.startsWith('ip:') ? 'global-rate' : 'key-rate';
  return 'endpoint-rate';
}
