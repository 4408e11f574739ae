/** API key rules (domain/keys.ts; docs/contract.md "API key and scope", Authentication 3, 8 and 10, Limits). */
import {
  API_KEY_RE,
  DAY_MS,
  deriveKeyStatus,
  expiresAtFor,
  generateApiKey,
  isApiKeyFormat,
  isRotatable,
  isValidLifetime,
  keyEnvironmentOf,
  keyPrefix,
  type KeyEnvironment,
  keyMayChangePlatform,
  keyRejection,
  ROTATION_GRACE_MS,
  siteEnvironmentFor,
} from '../../domain/keys';

describe('key format', () => {
  it('is svk_live_/svk_test_ plus 43 base64url characters of 32 random bytes', () => {
    for (const env of ['live', 'test'] as const) {
      const k = generateApiKey(env);
      expect(k).toMatch(new RegExp(`^svk_${env}_[A-Za-z0-9_-]{43}$`));
      expect(Buffer.from(k.slice(9), 'base64url')).toHaveLength(32);
      expect(keyEnvironmentOf(k)).toBe(env);
      expect(isApiKeyFormat(k)).toBe(true);
    }
    expect(generateApiKey('live')).not.toBe(generateApiKey('live'));
  });

  it('rejects other shapes', () => {
    for (const bad of [
      'svk_live_' + 'A'.repeat(42),
      'svk_live_' + 'A'.repeat(44),
      'svk_prod_' + 'A'.repeat(43),
      'svk_live_' + 'A'.repeat(42) + '=',
      'sst_' + 'A'.repeat(43),
      '',
    ]) {
      expect(API_KEY_RE.test(bad)).toBe(false);
    }
    expect(() => keyEnvironmentOf('nope')).toThrow();
  });

  it('displays the first 12 characters as keyPrefix', () => {
    const k = generateApiKey('test');
    expect(keyPrefix(k)).toBe(k.slice(0, 12));
    expect(keyPrefix(k)).toMatch(/^svk_test_.{3}$/);
  });
});

describe('lifetimes', () => {
  it('accepts whole days 1..365', () => {
    expect([1, 90, 365].map(isValidLifetime)).toEqual([true, true, true]);
    expect([0, 366, 1.5, -1, NaN].map(isValidLifetime)).toEqual([false, false, false, false, false]);
  });
  it('computes expiry in epoch ms; rotation grace is 24 h', () => {
    expect(expiresAtFor(1_000, 90)).toBe(1_000 + 90 * DAY_MS);
    expect(ROTATION_GRACE_MS).toBe(24 * 60 * 60 * 1000);
  });
});

describe('status derivation and rejection', () => {
  const now = 1_000_000_000_000;
  const cases: Array<[string, { status: string; expiresAt: number | null; graceUntil: number | null }, string, string | null]> = [
    ['active', { status: 'active', expiresAt: now + 1, graceUntil: null }, 'active', null],
    ['active, no expiry (bootstrap)', { status: 'active', expiresAt: null, graceUntil: null }, 'active', null],
    ['expired at exactly expiresAt', { status: 'active', expiresAt: now, graceUntil: null }, 'expired', 'token_expired'],
    ['rotated within grace', { status: 'rotated', expiresAt: now + DAY_MS, graceUntil: now + 1 }, 'rotated', null],
    ['rotated past grace is retired', { status: 'rotated', expiresAt: now + DAY_MS, graceUntil: now - 1 }, 'retired', 'unauthorized'],
    ['rotated without a grace end is retired', { status: 'rotated', expiresAt: null, graceUntil: null }, 'retired', 'unauthorized'],
    ['rotated within grace but expired', { status: 'rotated', expiresAt: now - 1, graceUntil: now + 1 }, 'expired', 'token_expired'],
    ['retired wins over expired', { status: 'rotated', expiresAt: now - 1, graceUntil: now - 1 }, 'retired', 'unauthorized'],
    ['revoked wins over everything', { status: 'revoked', expiresAt: now - 1, graceUntil: now + 1 }, 'revoked', 'unauthorized'],
  ];
  it.each(cases)('%s', (_name, k, status, code) => {
    expect(deriveKeyStatus(k, now)).toBe(status);
    expect(keyRejection(k, now)?.code ?? null).toBe(code);
  });

  it('only active and expired keys can be rotated', () => {
    expect((['active', 'expired', 'rotated', 'retired', 'revoked'] as const).map(isRotatable)).toEqual([true, true, false, false, false]);
  });
});

describe('what a key environment may change (docs/decisions/test-keys.md)', () => {
  it('lets only svk_live_ keys change platform-wide state', () => {
    expect(keyMayChangePlatform('live')).toBe(true);
    expect(keyMayChangePlatform('test')).toBe(false);
  });

  it("gives a new site the request's environment, else the key's, else live; a test key never gets a live site", () => {
    const cases: [KeyEnvironment | undefined, KeyEnvironment | undefined, KeyEnvironment | null][] = [
      [undefined, undefined, 'live'], // a session or ID token
      [undefined, 'test', 'test'],
      ['live', undefined, 'live'],
      ['live', 'test', 'test'], // a live key provisions sandbox sites, as bootstrap --sandbox does
      ['test', undefined, 'test'],
      ['test', 'test', 'test'],
      ['test', 'live', null],
    ];
    for (const [key, requested, want] of cases)
      expect([key, requested, siteEnvironmentFor(key, requested)]).toEqual([key, requested, want]);
  });
});
