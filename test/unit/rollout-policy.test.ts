/**
 * Pure rules of rollout policies (domain/rollout-policy.ts): validation with dotted-path errors, wave
 * planning, thresholds and maintenance windows in a timezone.
 */
import {
  DEFAULT_SPEC,
  canarySize,
  maxFailures,
  planWaves,
  splitWaves,
  policyView,
  successTarget,
  validatePolicy,
  waveNames,
  windowDelayMs,
} from '../../domain/rollout-policy';

const ids = (n: number) => Array.from({ length: n }, (_, i) => `m-${String(i).padStart(5, '0')}`);

describe('validatePolicy', () => {
  it('gives the defaults for an absent policy and an empty object', () => {
    expect(validatePolicy(undefined)).toEqual({ spec: DEFAULT_SPEC });
    expect(validatePolicy({})).toEqual({ spec: DEFAULT_SPEC });
  });

  it('accepts every field', () => {
    const r = validatePolicy({
      canary: { percent: 5 },
      waves: [10, 50, 100],
      bakeSeconds: 30,
      successThreshold: { fraction: 0.9 },
      failureThreshold: { count: 3 },
      requirePromotion: 'everyWave',
      retries: 0,
      retryBackoffSeconds: 1.5,
      waveTimeoutSeconds: 60,
      maintenanceWindow: { days: ['sat', 'Sunday'], start: '22:00', end: '04:30:15' },
      autoRollback: true,
      activation: 'immediate',
    });
    expect(r.errors).toBeUndefined();
    expect(r.spec).toEqual({
      canary: { percent: 5 },
      waves: [10, 50, 100],
      bakeMs: 30_000,
      successThreshold: { fraction: 0.9 },
      failureThreshold: { count: 3 },
      requirePromotion: 'everyWave',
      retries: 0,
      retryBackoffMs: 1500,
      waveTimeoutMs: 60_000,
      maintenanceWindow: { days: ['sun', 'sat'], startSec: 22 * 3600, endSec: 4 * 3600 + 30 * 60 + 15 },
      autoRollback: true,
      activation: 'immediate',
    });
    expect(policyView(r.spec!).maintenanceWindow).toEqual({ days: ['sun', 'sat'], start: '22:00', end: '04:30:15' });
    expect(validatePolicy({ requirePromotion: true }).spec?.requirePromotion).toBe('canary');
  });

  it('keys every error by its dotted path', () => {
    const r = validatePolicy({
      canary: { count: 0 },
      waves: [50, 40, 'x'],
      bakeSeconds: -1,
      failureThreshold: { fraction: 2 },
      successThreshold: { count: 1, fraction: 1 },
      requirePromotion: 'sometimes',
      retries: 1.5,
      maintenanceWindow: { start: '25:00', end: '10:00', days: ['funday'], extra: 1 },
      activation: 'later',
      autoRollback: 'yes',
      surprise: true,
    });
    expect(Object.keys(r.errors!).sort()).toEqual(
      [
        'policy.activation',
        'policy.autoRollback',
        'policy.bakeSeconds',
        'policy.canary.count',
        'policy.failureThreshold.fraction',
        'policy.maintenanceWindow.days.0',
        'policy.maintenanceWindow.extra',
        'policy.maintenanceWindow.start',
        'policy.requirePromotion',
        'policy.retries',
        'policy.successThreshold',
        'policy.surprise',
        'policy.waves.1',
        'policy.waves.2',
      ].sort(),
    );
    expect(validatePolicy({ waves: [10, 50] }).errors).toEqual({ 'policy.waves.1': ['the last wave must be 100 (every target)'] });
    expect(validatePolicy('fast').errors).toEqual({ policy: ['must be an object'] });
    expect(validatePolicy({ waves: [] }).errors).toHaveProperty(['policy.waves']);
    expect(validatePolicy({ maintenanceWindow: { start: '10:00', end: '10:00' } }).errors).toHaveProperty(['policy.maintenanceWindow.end']);
    expect(validatePolicy({ activation: 'wave', successThreshold: { count: 1 } }).errors).toHaveProperty(['policy.successThreshold']);
  });
});

describe('planWaves', () => {
  it('reproduces the canary-then-fleet split of the fixed canary-then-fleet rollout by default', () => {
    for (const n of [1, 5, 12, 1000]) {
      const machines = ids(n);
      const waves = planWaves('rol_x', machines, DEFAULT_SPEC);
      const old = splitWaves('rol_x', machines);
      expect(waves[0]).toEqual(old.canary);
      expect(waves.slice(1).flat()).toEqual(old.fleet);
      expect(waves).toHaveLength(old.fleet.length ? 2 : 1);
    }
  });

  it('cuts cumulative percentages of all targets after the canary, dropping empty waves', () => {
    const machines = ids(20);
    const waves = planWaves('rol_y', machines, { canary: { count: 2 }, waves: [10, 50, 100] });
    expect(waves.map((w) => w.length)).toEqual([2, 8, 10]); // 10 % = 2 (all canary) → dropped
    expect(new Set(waves.flat()).size).toBe(20);
    expect(planWaves('rol_y', machines, { canary: { percent: 25 }, waves: [30, 100] }).map((w) => w.length)).toEqual([5, 1, 14]);
    expect(planWaves('rol_y', ids(3), { canary: { count: 10 }, waves: [100] }).map((w) => w.length)).toEqual([3]);
    expect(planWaves('rol_y', [], DEFAULT_SPEC)).toEqual([]);
  });

  it('names waves canary/fleet for two, wave-<i> beyond', () => {
    expect(waveNames(2)).toEqual(['canary', 'fleet']);
    expect(waveNames(3)).toEqual(['canary', 'wave-1', 'wave-2']);
    expect(waveNames(1)).toEqual(['canary']);
  });

  it('sizes the canary from count, percent or the default rule', () => {
    expect(canarySize(1000, null)).toBe(100);
    expect(canarySize(10_000, null)).toBe(100);
    expect(canarySize(7, null)).toBe(1);
    expect(canarySize(7, { count: 3 })).toBe(3);
    expect(canarySize(7, { count: 30 })).toBe(7);
    expect(canarySize(7, { percent: 1 })).toBe(1);
    expect(canarySize(200, { percent: 25 })).toBe(50);
  });
});

describe('thresholds', () => {
  it('counts tolerated failures and success targets', () => {
    expect(maxFailures({ count: 0 }, 50)).toBe(0);
    expect(maxFailures({ fraction: 0.1 }, 50)).toBe(5);
    expect(maxFailures({ fraction: 0.1 }, 9)).toBe(0);
    expect(successTarget(null, 40)).toBe(40);
    expect(successTarget({ fraction: 0.9 }, 40)).toBe(36);
    expect(successTarget({ count: 100 }, 40)).toBe(40);
  });
});

describe('windowDelayMs', () => {
  const at = (iso: string) => Date.parse(iso);
  const w = (start: string, end: string, days = ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat']) =>
    validatePolicy({ maintenanceWindow: { start, end, days } }).spec!.maintenanceWindow!;

  it('is 0 inside the window and the time to the next opening outside it', () => {
    expect(windowDelayMs(w('01:00', '05:00'), 'UTC', at('2026-03-02T02:00:00Z'))).toBe(0);
    expect(windowDelayMs(w('01:00', '05:00'), 'UTC', at('2026-03-02T00:59:00Z'))).toBe(60_000);
    expect(windowDelayMs(w('01:00', '05:00'), 'UTC', at('2026-03-02T05:00:00Z'))).toBe(20 * 3600_000);
  });

  it('uses the site timezone, across DST', () => {
    // 2026-03-08 is the US spring-forward day: 02:00 EST → 03:00 EDT.
    expect(windowDelayMs(w('01:00', '05:00'), 'America/New_York', at('2026-03-07T05:30:00Z'))).toBe(30 * 60_000); // 00:30 EST
    expect(windowDelayMs(w('04:00', '05:00'), 'America/New_York', at('2026-03-08T07:00:00Z'))).toBe(60 * 60_000); // 03:00 EDT
    expect(windowDelayMs(w('09:00', '17:00'), 'Asia/Kolkata', at('2026-03-02T03:30:00Z'))).toBe(0); // 09:00 IST
  });

  it('wraps windows past midnight and honours the days a window opens', () => {
    const night = w('22:00', '04:00', ['fri']);
    // Friday 2026-03-06 23:00 UTC: open; Saturday 03:00: still Friday's window; Saturday 05:00: next Friday 22:00.
    expect(windowDelayMs(night, 'UTC', at('2026-03-06T23:00:00Z'))).toBe(0);
    expect(windowDelayMs(night, 'UTC', at('2026-03-07T03:00:00Z'))).toBe(0);
    expect(windowDelayMs(night, 'UTC', at('2026-03-07T05:00:00Z'))).toBe(at('2026-03-13T22:00:00Z') - at('2026-03-07T05:00:00Z'));
  });
});
