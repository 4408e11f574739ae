/**
 * Rollout policy (docs/decisions/rollout-control.md): the optional `policy` object of
 * `POST /api/roosts/{roostId}/deploy`, validated into a `PolicySpec`; the `RolloutPolicy` a rollout
 * stores and runs by (the spec plus the watcher's poll interval); and the pure rules built on them: wave
 * planning (the one canary-sizing rule), thresholds and maintenance windows. No I/O and no clock of its
 * own (callers pass `now`).
 *
 * Wire shape (every field optional; the defaults are the fixed canary-then-fleet rollout of
 * docs/decisions/canary-selection.md: canary = ceil(10 %) of the targets (1..100), then one fleet wave,
 * any failure past the retry budget fails the rollout):
 *
 *   canary:            { count: 1..10000 } | { percent: (0, 100] }
 *   waves:             cumulative percentages of all targets after the canary, strictly increasing,
 *                      each in (0, 100], the last exactly 100; 1..10 entries (default [100])
 *   bakeSeconds:       0..86400, wait after a wave before the next starts (default 0)
 *   successThreshold:  { fraction: (0, 1] } | { count: ≥ 1 } of a wave's machines that, once succeeded,
 *                      let the next wave start without waiting for the wave's stragglers (default: all)
 *   failureThreshold:  { fraction: [0, 1] } | { count: ≥ 0 } failed machines tolerated among the waves
 *                      dispatched so far; one more trips the rollout (default { count: 0 })
 *   requirePromotion:  'none' | 'canary' | 'everyWave' (true = 'canary'; default 'none')
 *   retries:           0..10 per machine after the first attempt (default 2)
 *   retryBackoffSeconds: 0..3600 before the first retry, doubling (default 10)
 *   waveTimeoutSeconds:  1..86400 from a machine's first dispatch (default 1800)
 *   maintenanceWindow: { days?: ('mon'…'sun')[], start: 'HH:MM[:SS]', end: 'HH:MM[:SS]' } in the site's
 *                      timezone; no wave starts outside it (end ≤ start wraps past midnight; `days` are
 *                      the days a window opens; default every day)
 *   autoRollback:      boolean (default false): a tripped failure threshold rolls back switched machines
 *   activation:        'immediate' | 'wave' | 'fleet' (default 'immediate'): stage, then activate per
 *                      wave or once for the whole fleet
 */
import { createHash } from 'node:crypto';
import { Type } from '@sinclair/typebox';

/** A count, or a share of a population. */
export type Threshold = { count: number } | { fraction: number };
/** Where a rollout waits for `promote`: never, after the canary, or before every wave after the first. */
export type PromotionGate = 'none' | 'canary' | 'everyWave';
/** Stage-then-activate: activate on sync (immediate), per wave once staged, or once for the whole fleet. */
export type Activation = 'immediate' | 'wave' | 'fleet';
/** Weekday names of maintenance windows, in `Date.getUTCDay()` order. */
export const WEEKDAYS = ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'] as const;
export type Weekday = (typeof WEEKDAYS)[number];

/** A maintenance window in the site's timezone: local seconds of day [start, end) on `days`. */
export interface MaintenanceWindow {
  days: Weekday[];
  /** Seconds after local midnight. */
  startSec: number;
  endSec: number;
}

/** A validated policy (all defaults filled in). Stored with the rollout in `rollouts.policy`. */
export interface PolicySpec {
  canary: { count: number } | { percent: number } | null;
  waves: number[];
  bakeMs: number;
  successThreshold: Threshold | null;
  failureThreshold: Threshold;
  requirePromotion: PromotionGate;
  retries: number;
  retryBackoffMs: number;
  waveTimeoutMs: number;
  maintenanceWindow: MaintenanceWindow | null;
  autoRollback: boolean;
  activation: Activation;
}

/** The default canary rule (docs/decisions/canary-selection.md): ceil(10 %) of the targets, 1..100. */
export const DEFAULT_CANARY_PERCENT = 10;
export const DEFAULT_CANARY_MAX = 100;
/** Most entries of `waves`. */
export const MAX_WAVES = 10;

/** The spec of a deploy without `policy` (the fixed canary-then-fleet rollout). */
export const DEFAULT_SPEC: PolicySpec = {
  canary: null,
  waves: [100],
  bakeMs: 0,
  successThreshold: null,
  failureThreshold: { count: 0 },
  requirePromotion: 'none',
  retries: 2,
  retryBackoffMs: 10_000,
  waveTimeoutMs: 30 * 60 * 1000,
  maintenanceWindow: null,
  autoRollback: false,
  activation: 'immediate',
};

const closed = { additionalProperties: false } as const;
const count = (minimum: number) => Type.Object({ count: Type.Integer({ minimum, maximum: 10_000 }) }, closed);
const localTime = Type.String({
  pattern: '^(?:(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9])?|24:00(?::00)?)$',
  description: "local time 'HH:MM' or 'HH:MM:SS' (00:00..24:00)",
});
/** A weekday as validatePolicy reads it: 3..9 letters whose first three name the day, any case. */
const weekday = Type.String({
  pattern: `^(?:${WEEKDAYS.map((d) => [...d].map((c) => `[${c.toUpperCase()}${c}]`).join('')).join('|')})[A-Za-z]{0,6}$`,
  description: "'mon' … 'sun' (or the full name, any case)",
});

/**
 * The exact wire shape of `policy` that validatePolicy accepts, as JSON Schema (the OpenAPI document states it
 * for `POST /api/roosts/{roostId}/deploy`; validatePolicy stays the check, with errors keyed by dotted path).
 * What JSON Schema cannot say is in the descriptions: `waves` strictly increasing, a window's end ≠ start.
 */
export const POLICY_SCHEMA = Type.Object(
  {
    canary: Type.Optional(
      Type.Union([count(1), Type.Object({ percent: Type.Number({ exclusiveMinimum: 0, maximum: 100 }) }, closed)], {
        description: 'canary size: { count } machines or { percent } of the targets (default ceil(10 %), 1..100)',
      }),
    ),
    waves: Type.Optional(
      Type.Array(Type.Number({ exclusiveMinimum: 0, maximum: 100 }), {
        minItems: 1,
        maxItems: 10,
        // Strictly increasing up to 100, so 100 is the last entry exactly when the list contains it.
        contains: Type.Literal(100),
        description: 'cumulative percentages of all targets after the canary, strictly increasing, the last 100 (default [100])',
      }),
    ),
    bakeSeconds: Type.Optional(Type.Number({ minimum: 0, maximum: 86_400, description: 'wait after a wave (default 0)' })),
    successThreshold: Type.Optional(
      Type.Union([count(1), Type.Object({ fraction: Type.Number({ exclusiveMinimum: 0, maximum: 1 }) }, closed)], {
        description: "successes that let the next wave start early (default: all of the wave's machines)",
      }),
    ),
    failureThreshold: Type.Optional(
      Type.Union([count(0), Type.Object({ fraction: Type.Number({ minimum: 0, maximum: 1 }) }, closed)], {
        description: 'failures tolerated among the waves dispatched so far (default { count: 0 })',
      }),
    ),
    requirePromotion: Type.Optional(
      Type.Union([Type.Union([Type.Literal('none'), Type.Literal('canary'), Type.Literal('everyWave')]), Type.Boolean()], {
        description: "where the rollout waits for promote (true = 'canary'; default 'none')",
      }),
    ),
    retries: Type.Optional(Type.Integer({ minimum: 0, maximum: 10, description: 'retries per machine (default 2)' })),
    retryBackoffSeconds: Type.Optional(
      Type.Number({ minimum: 0, maximum: 3_600, description: 'before the first retry, doubling (default 10)' }),
    ),
    waveTimeoutSeconds: Type.Optional(
      Type.Number({ minimum: 1, maximum: 86_400, description: "from a machine's first dispatch (default 1800)" }),
    ),
    maintenanceWindow: Type.Optional(
      Type.Object(
        { days: Type.Optional(Type.Array(weekday, { minItems: 1, maxItems: 7 })), start: localTime, end: localTime },
        { ...closed, description: "no wave starts outside it, in the site's timezone; end ≠ start (an earlier end wraps past midnight)" },
      ),
    ),
    autoRollback: Type.Optional(Type.Boolean({ description: 'a tripped failure threshold rolls back switched machines (default false)' })),
    activation: Type.Optional(
      Type.Union([Type.Literal('immediate'), Type.Literal('wave'), Type.Literal('fleet')], {
        description: "stage, then activate per wave or once for the fleet (default 'immediate')",
      }),
    ),
  },
  {
    ...closed,
    // Staged activation (wave, fleet) cannot be combined with an early-advance successThreshold.
    not: { required: ['activation', 'successThreshold'], properties: { activation: { enum: ['wave', 'fleet'] } } },
    description: 'rollout policy, every field optional (docs/decisions/rollout-control.md)',
  },
);

const KNOWN = new Set(Object.keys(POLICY_SCHEMA.properties));

/** Dotted path → messages (the `errors` map of a validation_failed problem). */
export type PolicyErrors = Record<string, string[]>;

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const isInt = (v: unknown): v is number => Number.isSafeInteger(v);

/** Parses 'HH:MM' or 'HH:MM:SS' (00:00:00..24:00:00) to seconds of day, or undefined. */
export function parseLocalTime(s: unknown): number | undefined {
  if (typeof s !== 'string') return undefined;
  const m = /^([01][0-9]|2[0-4]):([0-5][0-9])(?::([0-5][0-9]))?$/.exec(s);
  if (!m) return undefined;
  const sec = Number(m[1]) * 3600 + Number(m[2]) * 60 + Number(m[3] ?? 0);
  return sec <= 86400 ? sec : undefined;
}

/**
 * Validates the deploy body's `policy` (undefined → defaults). Returns the spec, or the errors keyed by
 * dotted path under `prefix` (default 'policy'), e.g. `policy.waves.1`, `policy.canary.percent`.
 */
export function validatePolicy(
  input: unknown,
  prefix = 'policy',
): { spec: PolicySpec; errors?: undefined } | { spec?: undefined; errors: PolicyErrors } {
  const errors: PolicyErrors = {};
  const err = (p: string, msg: string) => (errors[p ? `${prefix}.${p}` : prefix] ??= []).push(msg);
  const spec: PolicySpec = { ...DEFAULT_SPEC, waves: [...DEFAULT_SPEC.waves] };
  if (input === undefined || input === null) return { spec };
  if (!isObj(input)) return { errors: { [prefix]: ['must be an object'] } };
  for (const k of Object.keys(input)) if (!KNOWN.has(k)) err(k, 'is not a policy field');

  const v = input;
  if (v.canary !== undefined) {
    const c = v.canary;
    if (!isObj(c) || Object.keys(c).length !== 1 || !('count' in c || 'percent' in c)) err('canary', 'must be { count } or { percent }');
    else if ('count' in c) {
      if (!isInt(c.count) || c.count < 1 || c.count > 10_000) err('canary.count', 'must be an integer from 1 to 10000');
      else spec.canary = { count: c.count };
    } else if (!isNum(c.percent) || c.percent <= 0 || c.percent > 100) err('canary.percent', 'must be a number above 0 and at most 100');
    else spec.canary = { percent: c.percent };
  }
  if (v.waves !== undefined) {
    if (!Array.isArray(v.waves) || v.waves.length < 1 || v.waves.length > MAX_WAVES)
      err('waves', `must be a list of 1 to ${MAX_WAVES} cumulative percentages`);
    else {
      let ok = true;
      v.waves.forEach((p, i) => {
        if (!isNum(p) || p <= 0 || p > 100) {
          err(`waves.${i}`, 'must be a number above 0 and at most 100');
          ok = false;
        } else if (i > 0 && isNum(v.waves && (v.waves as unknown[])[i - 1]) && p <= (v.waves as number[])[i - 1]) {
          err(`waves.${i}`, 'must be greater than the previous wave (percentages are cumulative)');
          ok = false;
        }
      });
      if (ok && v.waves[v.waves.length - 1] !== 100) err(`waves.${v.waves.length - 1}`, 'the last wave must be 100 (every target)');
      else if (ok) spec.waves = [...(v.waves as number[])];
    }
  }
  const seconds = (key: string, min: number, max: number, set: (ms: number) => void) => {
    const x = v[key];
    if (x === undefined) return;
    if (!isNum(x) || x < min || x > max) err(key, `must be a number of seconds from ${min} to ${max}`);
    else set(Math.round(x * 1000));
  };
  seconds('bakeSeconds', 0, 86_400, (ms) => (spec.bakeMs = ms));
  seconds('retryBackoffSeconds', 0, 3_600, (ms) => (spec.retryBackoffMs = ms));
  seconds('waveTimeoutSeconds', 1, 86_400, (ms) => (spec.waveTimeoutMs = ms));
  if (v.retries !== undefined) {
    if (!isInt(v.retries) || v.retries < 0 || v.retries > 10) err('retries', 'must be an integer from 0 to 10');
    else spec.retries = v.retries;
  }
  const threshold = (key: string, minCount: number, minFraction: number, fractionOpenBelow: boolean): Threshold | undefined => {
    const t = v[key];
    if (!isObj(t) || Object.keys(t).length !== 1 || !('count' in t || 'fraction' in t)) {
      err(key, 'must be { count } or { fraction }');
      return undefined;
    }
    if ('count' in t) {
      if (!isInt(t.count) || t.count < minCount || t.count > 10_000) {
        err(`${key}.count`, `must be an integer from ${minCount} to 10000`);
        return undefined;
      }
      return { count: t.count };
    }
    const f = t.fraction;
    if (!isNum(f) || f > 1 || (fractionOpenBelow ? f <= minFraction : f < minFraction)) {
      err(`${key}.fraction`, fractionOpenBelow ? `must be above ${minFraction} and at most 1` : `must be from ${minFraction} to 1`);
      return undefined;
    }
    return { fraction: f };
  };
  if (v.successThreshold !== undefined) spec.successThreshold = threshold('successThreshold', 1, 0, true) ?? null;
  if (v.failureThreshold !== undefined) spec.failureThreshold = threshold('failureThreshold', 0, 0, false) ?? spec.failureThreshold;
  if (v.requirePromotion !== undefined) {
    const g = v.requirePromotion;
    if (g === true) spec.requirePromotion = 'canary';
    else if (g === false) spec.requirePromotion = 'none';
    else if (g === 'none' || g === 'canary' || g === 'everyWave') spec.requirePromotion = g;
    else err('requirePromotion', "must be 'none', 'canary', 'everyWave' or a boolean");
  }
  if (v.autoRollback !== undefined) {
    if (typeof v.autoRollback !== 'boolean') err('autoRollback', 'must be a boolean');
    else spec.autoRollback = v.autoRollback;
  }
  if (v.activation !== undefined) {
    if (v.activation === 'immediate' || v.activation === 'wave' || v.activation === 'fleet') spec.activation = v.activation;
    else err('activation', "must be 'immediate', 'wave' or 'fleet'");
  }
  if (v.maintenanceWindow !== undefined) {
    const w = v.maintenanceWindow;
    if (!isObj(w)) err('maintenanceWindow', 'must be { days?, start, end }');
    else {
      for (const k of Object.keys(w)) if (!['days', 'start', 'end'].includes(k)) err(`maintenanceWindow.${k}`, 'is not a window field');
      const startSec = parseLocalTime(w.start);
      const endSec = parseLocalTime(w.end);
      if (startSec === undefined) err('maintenanceWindow.start', "must be a local time 'HH:MM' or 'HH:MM:SS'");
      if (endSec === undefined) err('maintenanceWindow.end', "must be a local time 'HH:MM' or 'HH:MM:SS'");
      if (startSec !== undefined && endSec !== undefined && startSec === endSec) err('maintenanceWindow.end', 'must differ from start');
      let days: Weekday[] = [...WEEKDAYS];
      if (w.days !== undefined) {
        if (!Array.isArray(w.days) || w.days.length < 1 || w.days.length > 7) err('maintenanceWindow.days', 'must list 1 to 7 weekdays');
        else {
          const seen = new Set<Weekday>();
          w.days.forEach((d, i) => {
            const n = typeof d === 'string' ? (d.toLowerCase().slice(0, 3) as Weekday) : undefined;
            if (!n || !WEEKDAYS.includes(n) || typeof d !== 'string' || !/^[a-z]{3,9}$/i.test(d))
              err(`maintenanceWindow.days.${i}`, "must be a weekday ('mon' … 'sun')");
            else seen.add(n);
          });
          days = WEEKDAYS.filter((d) => seen.has(d));
        }
      }
      if (startSec !== undefined && endSec !== undefined) spec.maintenanceWindow = { days, startSec, endSec };
    }
  }
  if (spec.activation !== 'immediate' && spec.successThreshold)
    err('successThreshold', 'cannot be combined with staged activation (a wave activates together)');
  return Object.keys(errors).length > 0 ? { errors } : { spec };
}

/** Canary size for `n` targets: the policy's count (≤ n) or percent (ceil, ≥ 1), else ceil(10 %) in 1..100. */
export function canarySize(n: number, canary: PolicySpec['canary']): number {
  if (n === 0) return 0;
  if (canary && 'count' in canary) return Math.min(n, canary.count);
  if (canary && 'percent' in canary) return Math.min(n, Math.max(1, Math.ceil((n * canary.percent) / 100)));
  return Math.min(DEFAULT_CANARY_MAX, Math.max(1, Math.ceil((n * DEFAULT_CANARY_PERCENT) / 100)));
}

/**
 * Splits `machines` (distinct) into waves: the canary (machines ordered by SHA-256(rolloutId:machineId),
 * first `canarySize`), then the rest in the caller's order cut at the cumulative percentages of all
 * targets (`ceil(n · p / 100)`, never below the canary). Empty waves are dropped, so the result has 1 to
 * 1 + waves.length non-empty waves; the default policy gives [canary, fleet] (`splitWaves`).
 */
export function planWaves(rolloutId: string, machines: readonly string[], spec: Pick<PolicySpec, 'canary' | 'waves'>): string[][] {
  const n = machines.length;
  if (n === 0) return [];
  const size = canarySize(n, spec.canary);
  const keyed = machines.map((m) => ({ m, k: createHash('sha256').update(`${rolloutId}:${m}`).digest('hex') }));
  keyed.sort((a, b) => (a.k < b.k ? -1 : a.k > b.k ? 1 : a.m < b.m ? -1 : a.m > b.m ? 1 : 0));
  const canary = keyed.slice(0, size).map((x) => x.m);
  const canarySet = new Set(canary);
  const rest = machines.filter((m) => !canarySet.has(m));
  const waves = [canary];
  let done = size;
  for (const p of spec.waves) {
    const upto = Math.min(n, Math.max(done, Math.ceil((n * p) / 100)));
    if (upto > done) waves.push(rest.slice(done - size, upto - size));
    done = upto;
  }
  if (done < n) waves.push(rest.slice(done - size));
  return waves;
}

/** Wave names stored in rollout_machines.wave: 'canary', then 'fleet' when there is one more, else 'wave-<i>'. */
export function waveNames(count: number): string[] {
  return Array.from({ length: count }, (_, i) => (i === 0 ? 'canary' : count === 2 ? 'fleet' : `wave-${i}`));
}

/** Failures tolerated among `population` machines: the count, or floor(fraction · population). */
export function maxFailures(t: Threshold, population: number): number {
  return 'count' in t ? t.count : Math.floor(t.fraction * population + 1e-9);
}

/** Successes that let a wave of `size` advance early: min(count, size) or ceil(fraction · size); `size` by default. */
export function successTarget(t: Threshold | null, size: number): number {
  if (!t) return size;
  return 'count' in t ? Math.min(size, t.count) : Math.min(size, Math.max(1, Math.ceil(t.fraction * size - 1e-9)));
}

/**
 * The default policy's two waves: the canary (first `canarySize` machines by SHA-256(rolloutId:machineId))
 * and the fleet (the others, in the caller's order). `planWaves` with `DEFAULT_SPEC`, as two lists.
 */
export function splitWaves(rolloutId: string, machines: readonly string[]): { canary: string[]; fleet: string[] } {
  const waves = planWaves(rolloutId, machines, DEFAULT_SPEC);
  return { canary: waves[0] ?? [], fleet: waves.slice(1).flat() };
}

// ---------------------------------------------------------------------------------------------------
// The stored policy

/** The spec fields every stored policy carries, rollouts started before rollout control included. */
type RetryFields = 'waveTimeoutMs' | 'retries' | 'retryBackoffMs';

/**
 * The policy a rollout stores (`rollouts.policy`) and runs by: a `PolicySpec` plus the wave watcher's
 * poll interval (ms). Rollouts started before rollout control stored only the retry fields and the poll
 * interval; their other spec fields are absent, and every reader applies `DEFAULT_SPEC`'s value (the
 * workflow, the wave watcher in activities/rollout.ts and `policyView`).
 */
export type RolloutPolicy = Pick<PolicySpec, RetryFields> & Partial<Omit<PolicySpec, RetryFields>> & { pollIntervalMs: number };

/** The retry fields and poll interval of a rollout stored without them (2 s poll; see ROOST_ROLLOUT_POLL_MS). */
export const DEFAULT_POLICY: RolloutPolicy = {
  waveTimeoutMs: DEFAULT_SPEC.waveTimeoutMs,
  retries: DEFAULT_SPEC.retries,
  retryBackoffMs: DEFAULT_SPEC.retryBackoffMs,
  pollIntervalMs: 2_000,
};

const NUMERIC_KEYS = ['waveTimeoutMs', 'retries', 'retryBackoffMs', 'pollIntervalMs'] as const;
const SPEC_KEYS = [
  'canary',
  'waves',
  'bakeMs',
  'successThreshold',
  'failureThreshold',
  'requirePromotion',
  'maintenanceWindow',
  'autoRollback',
  'activation',
] as const;

/** A stored policy with `DEFAULT_POLICY` filled in for missing or invalid numbers (unknown keys dropped; spec fields kept as stored). */
export function resolvePolicy(stored: Partial<RolloutPolicy> | null | undefined): RolloutPolicy {
  const p: RolloutPolicy = { ...DEFAULT_POLICY };
  for (const k of NUMERIC_KEYS) {
    const v = stored?.[k];
    if (typeof v === 'number' && Number.isFinite(v) && v >= 0) p[k] = v;
  }
  for (const k of SPEC_KEYS) {
    const v = stored?.[k];
    if (v !== undefined) (p as unknown as Record<string, unknown>)[k] = v;
  }
  return p;
}

/**
 * The stored policy of a validated spec. The watcher's poll interval is not a policy field: it is the
 * operator setting ROOST_ROLLOUT_POLL_MS (config/env.ts, 50..60000 ms, default 2 s), passed in here.
 */
export function policyFromSpec(spec: PolicySpec, pollIntervalMs: number = DEFAULT_POLICY.pollIntervalMs): RolloutPolicy {
  return { ...spec, pollIntervalMs };
}

/**
 * The policy of the rollback of a rollout stored with `original`: one wave of every machine (no canary),
 * the original's retries, timeout and poll interval, no failure tolerance, gates, windows or staging.
 */
export function rollbackPolicy(original: RolloutPolicy): RolloutPolicy {
  return {
    waveTimeoutMs: original.waveTimeoutMs,
    retries: original.retries,
    retryBackoffMs: original.retryBackoffMs,
    pollIntervalMs: original.pollIntervalMs,
    waves: [100],
    failureThreshold: { count: 0 },
    requirePromotion: 'none',
    maintenanceWindow: null,
    autoRollback: false,
    activation: 'immediate',
  };
}

// ---------------------------------------------------------------------------------------------------
// Maintenance windows (site timezone, Intl only)

interface LocalParts {
  y: number;
  mo: number;
  d: number;
  h: number;
  mi: number;
  s: number;
  wd: number;
}

const dtfCache = new Map<string, Intl.DateTimeFormat>();
function dtf(timeZone: string): Intl.DateTimeFormat {
  let f = dtfCache.get(timeZone);
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', {
      timeZone,
      hourCycle: 'h23',
      year: 'numeric',
      month: '2-digit',
      day: '2-digit',
      hour: '2-digit',
      minute: '2-digit',
      second: '2-digit',
      weekday: 'short',
    });
    dtfCache.set(timeZone, f);
  }
  return f;
}

function localParts(ms: number, timeZone: string): LocalParts {
  const parts: Record<string, string> = {};
  for (const p of dtf(timeZone).formatToParts(new Date(ms))) parts[p.type] = p.value;
  return {
    y: Number(parts.year),
    mo: Number(parts.month),
    d: Number(parts.day),
    h: Number(parts.hour) % 24,
    mi: Number(parts.minute),
    s: Number(parts.second),
    wd: WEEKDAYS.indexOf(parts.weekday.toLowerCase().slice(0, 3) as Weekday),
  };
}

/** Epoch ms of local wall time (y, mo, d) + `sec` seconds in `timeZone` (the earlier instant in a DST overlap). */
function zonedToEpoch(y: number, mo: number, d: number, sec: number, timeZone: string): number {
  const wall = Date.UTC(y, mo - 1, d) + sec * 1000;
  const offsetAt = (ms: number) => {
    const p = localParts(ms, timeZone);
    return Date.UTC(p.y, p.mo - 1, p.d, p.h, p.mi, p.s) - Math.floor(ms / 1000) * 1000;
  };
  let t = wall - offsetAt(wall);
  t = wall - offsetAt(t);
  return t;
}

/**
 * Milliseconds from `nowMs` until the maintenance window is open (0 when it is open now), in
 * `timeZone`. A window opens at `startSec` on each of `days` and closes at `endSec` the same day, or
 * the next day when endSec ≤ startSec. Looks at most 8 days ahead (always enough: `days` is non-empty).
 */
export function windowDelayMs(w: MaintenanceWindow, timeZone: string, nowMs: number): number {
  const now = localParts(nowMs, timeZone);
  const wraps = w.endSec <= w.startSec;
  for (let back = -1; back <= 8; back++) {
    // Local calendar day `back` days from today (-1 = yesterday, for a window wrapping past midnight).
    const day = new Date(Date.UTC(now.y, now.mo - 1, now.d + back));
    const wd = day.getUTCDay();
    if (!w.days.includes(WEEKDAYS[wd])) continue;
    const y = day.getUTCFullYear();
    const mo = day.getUTCMonth() + 1;
    const d = day.getUTCDate();
    const open = zonedToEpoch(y, mo, d, w.startSec, timeZone);
    const close = zonedToEpoch(y, mo, d, wraps ? w.endSec + 86_400 : w.endSec, timeZone);
    if (nowMs >= open && nowMs < close) return 0;
    if (open > nowMs) return open - nowMs;
  }
  return 7 * 86_400_000;
}

/** The wire form of a stored policy (`policy` of rollout records): the deploy body's fields, defaults filled in. */
export interface PolicyView {
  canary: { count: number } | { percent: number } | null;
  waves: number[];
  bakeSeconds: number;
  successThreshold: Threshold | null;
  failureThreshold: Threshold;
  requirePromotion: PromotionGate;
  retries: number;
  retryBackoffSeconds: number;
  waveTimeoutSeconds: number;
  maintenanceWindow: { days: Weekday[]; start: string; end: string } | null;
  autoRollback: boolean;
  activation: Activation;
}

function clock(sec: number): string {
  const h = Math.floor(sec / 3600);
  const m = Math.floor((sec % 3600) / 60);
  const s = sec % 60;
  const two = (n: number) => String(n).padStart(2, '0');
  return s ? `${two(h)}:${two(m)}:${two(s)}` : `${two(h)}:${two(m)}`;
}

/** Maps a stored policy (any subset of PolicySpec's fields) to its wire form. */
export function policyView(p: Partial<PolicySpec>): PolicyView {
  const d = DEFAULT_SPEC;
  const w = p.maintenanceWindow ?? null;
  return {
    canary: p.canary ?? null,
    waves: p.waves ?? d.waves,
    bakeSeconds: (p.bakeMs ?? d.bakeMs) / 1000,
    successThreshold: p.successThreshold ?? null,
    failureThreshold: p.failureThreshold ?? d.failureThreshold,
    requirePromotion: p.requirePromotion ?? d.requirePromotion,
    retries: p.retries ?? d.retries,
    retryBackoffSeconds: (p.retryBackoffMs ?? d.retryBackoffMs) / 1000,
    waveTimeoutSeconds: (p.waveTimeoutMs ?? d.waveTimeoutMs) / 1000,
    maintenanceWindow: w ? { days: w.days, start: clock(w.startSec), end: clock(w.endSec) } : null,
    autoRollback: p.autoRollback ?? d.autoRollback,
    activation: p.activation ?? d.activation,
  };
}
