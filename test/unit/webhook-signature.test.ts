/**
 * The webhook signature helper (docs/contract.md "Events" › Delivery): signing, every verification failure
 * reason, rotation (several v1), unknown schemes, and the delivery URL rules (docs/decisions/webhook-urls.md).
 */
import { createHmac } from 'node:crypto';
import {
  checkWebhookUrl,
  computeSignature,
  isNonPublicAddress,
  parseSignatureHeader,
  signPayload,
  verifySignature,
} from '../../domain/webhook-signature';

const SECRET = 'whsec_test_secret_1';
const OTHER = 'whsec_test_secret_2';
const BODY = '{"event":"version.published","siteId":"site_1","occurredAt":"2026-01-01T00:00:00.000Z","data":{"a":1}}';
const T = 1_800_000_000;

describe('signPayload', () => {
  it('is hex HMAC-SHA256 of `<t>.<raw body>` keyed with the secret', () => {
    const expected = createHmac('sha256', SECRET).update(`${T}.${BODY}`).digest('hex');
    expect(computeSignature(SECRET, BODY, T)).toBe(expected);
    expect(signPayload(SECRET, BODY, T)).toBe(`t=${T},v1=${expected}`);
    expect(computeSignature(SECRET, Buffer.from(BODY), T)).toBe(expected);
  });

  it('carries one v1 per secret during a rotation, current first', () => {
    const header = signPayload([SECRET, OTHER], BODY, T);
    expect(parseSignatureHeader(header)).toEqual({ t: T, v1: [computeSignature(SECRET, BODY, T), computeSignature(OTHER, BODY, T)] });
  });

  it('refuses no secret and a non-integer time', () => {
    expect(() => signPayload([], BODY, T)).toThrow();
    expect(() => signPayload(SECRET, BODY, 1.5)).toThrow();
  });
});

describe('verifySignature', () => {
  const ok = (header: unknown, extra: Partial<Parameters<typeof verifySignature>[0]> = {}) =>
    verifySignature({ header: header as string, rawBody: BODY, secrets: [SECRET], nowSeconds: T, ...extra });

  it('accepts a valid header (string, one-element array, Buffer body)', () => {
    const header = signPayload(SECRET, BODY, T);
    expect(ok(header)).toEqual({ ok: true });
    expect(ok([header])).toEqual({ ok: true });
    expect(verifySignature({ header, rawBody: Buffer.from(BODY), secrets: [SECRET], nowSeconds: T })).toEqual({ ok: true });
  });

  it('accepts any matching v1, under any accepted secret (rotation grace)', () => {
    expect(ok(signPayload([OTHER, SECRET], BODY, T))).toEqual({ ok: true });
    expect(verifySignature({ header: signPayload(OTHER, BODY, T), rawBody: BODY, secrets: [SECRET, OTHER], nowSeconds: T })).toEqual({
      ok: true,
    });
    expect(ok(`t=${T},v1=${'0'.repeat(64)},v1=${computeSignature(SECRET, BODY, T)}`)).toEqual({ ok: true });
  });

  it('ignores unknown scheme prefixes', () => {
    expect(ok(`t=${T},v0=abc,v1=${computeSignature(SECRET, BODY, T)},v2=zzz`)).toEqual({ ok: true });
  });

  it('missing_header: absent, empty or blank', () => {
    for (const h of [undefined, null, '', '   ', []]) expect(ok(h)).toEqual({ ok: false, reason: 'missing_header' });
  });

  it('malformed_header: not key=value pairs, a non-numeric or repeated t, several headers', () => {
    for (const h of [
      'garbage',
      `t=${T},v1`,
      `t=${T},=abc`,
      `t=abc,v1=${'a'.repeat(64)}`,
      `t=${T},t=${T},v1=aa`,
      `t=${T},,v1=aa`,
      [`t=${T}`, `v1=aa`],
    ]) {
      expect(ok(h)).toEqual({ ok: false, reason: 'malformed_header' });
    }
  });

  it('missing_timestamp and missing_v1', () => {
    expect(ok(`v1=${computeSignature(SECRET, BODY, T)}`)).toEqual({ ok: false, reason: 'missing_timestamp' });
    expect(ok(`t=${T}`)).toEqual({ ok: false, reason: 'missing_v1' });
    expect(ok(`t=${T},v0=abc`)).toEqual({ ok: false, reason: 'missing_v1' });
  });

  it('bad_signature: other secret, changed body, changed t, not hex', () => {
    expect(ok(signPayload(OTHER, BODY, T))).toEqual({ ok: false, reason: 'bad_signature' });
    expect(verifySignature({ header: signPayload(SECRET, BODY, T), rawBody: `${BODY} `, secrets: [SECRET], nowSeconds: T })).toEqual({
      ok: false,
      reason: 'bad_signature',
    });
    expect(ok(`t=${T + 1},v1=${computeSignature(SECRET, BODY, T)}`)).toEqual({ ok: false, reason: 'bad_signature' });
    expect(ok(`t=${T},v1=not-hex`)).toEqual({ ok: false, reason: 'bad_signature' });
    expect(verifySignature({ header: signPayload(SECRET, BODY, T), rawBody: BODY, secrets: [], nowSeconds: T })).toEqual({
      ok: false,
      reason: 'bad_signature',
    });
  });

  it('timestamp_out_of_tolerance: more than 300 s either way (exactly 300 s is accepted)', () => {
    const header = signPayload(SECRET, BODY, T);
    expect(ok(header, { nowSeconds: T + 300 })).toEqual({ ok: true });
    expect(ok(header, { nowSeconds: T - 300 })).toEqual({ ok: true });
    expect(ok(header, { nowSeconds: T + 301 })).toEqual({ ok: false, reason: 'timestamp_out_of_tolerance' });
    expect(ok(header, { nowSeconds: T - 301 })).toEqual({ ok: false, reason: 'timestamp_out_of_tolerance' });
    expect(ok(header, { nowSeconds: T + 20, toleranceSeconds: 10 })).toEqual({ ok: false, reason: 'timestamp_out_of_tolerance' });
  });

  it('uses the system clock by default', () => {
    const now = Math.floor(Date.now() / 1000);
    expect(verifySignature({ header: signPayload(SECRET, BODY, now), rawBody: BODY, secrets: [SECRET] })).toEqual({ ok: true });
    expect(verifySignature({ header: signPayload(SECRET, BODY, now - 3600), rawBody: BODY, secrets: [SECRET] })).toEqual({
      ok: false,
      reason: 'timestamp_out_of_tolerance',
    });
  });
});

describe('delivery URL rules', () => {
  it('classifies loopback, private, link-local and mapped addresses as non-public', () => {
    for (const a of [
      '127.0.0.1',
      '10.1.2.3',
      '172.16.0.1',
      '192.168.1.1',
      '169.254.169.254',
      '100.64.0.1',
      '0.0.0.0',
      '::1',
      '[::1]',
      'fe80::1',
      'fd00::1',
      '::ffff:127.0.0.1',
      '::ffff:a00:1',
      '::',
      'ff02::1',
    ]) {
      expect([a, isNonPublicAddress(a)]).toEqual([a, true]);
    }
    for (const a of ['93.184.216.34', '8.8.8.8', '2606:4700:4700::1111', 'example.com'])
      expect([a, isNonPublicAddress(a)]).toEqual([a, false]);
  });

  it('classifies the IPv6 forms that reach IPv4 space, and special-purpose IPv4 blocks, as non-public', () => {
    for (const a of [
      '::127.0.0.1', // IPv4-compatible (deprecated)
      '::7f00:1',
      '[::127.0.0.1]',
      '::8.8.8.8', // IPv4-compatible, even of a public address
      '2002:7f00:1::', // 6to4 of 127.0.0.1
      '2002:0808:0808::1', // 6to4 of a public address: still a relay, refused
      '2001:0:4136:e378:8000:63bf:3fff:fdd2', // Teredo
      '64:ff9b::a00:1', // NAT64 of 10.0.0.1
      '64:ff9b:1::1', // local-use NAT64
      '2001:db8::1', // documentation
      '192.0.0.8', // IETF protocol assignments
      '198.18.0.1', // benchmarking
      '255.255.255.255', // broadcast
      '::ffff:7f00:1', // IPv4-mapped loopback, hex form
    ]) {
      expect([a, isNonPublicAddress(a)]).toEqual([a, true]);
    }
    for (const a of ['::ffff:8.8.8.8', '2a00:1450:4001:80b::200e']) expect([a, isNonPublicAddress(a)]).toEqual([a, false]);
    expect(checkWebhookUrl('https://[::127.0.0.1]/hook', false)).toMatchObject({ ok: false, problem: { kind: 'address' } });
    expect(checkWebhookUrl('https://[2002:7f00:1::]/hook', false)).toMatchObject({ ok: false, problem: { kind: 'address' } });
  });

  it('needs https, a host, no credentials, no fragment, at most 2048 chars', () => {
    expect(checkWebhookUrl('https://example.com/hooks', false)).toEqual({
      ok: true,
      url: 'https://example.com/hooks',
      host: 'example.com',
    });
    const bad = (u: string, allow = false) => {
      const r = checkWebhookUrl(u, allow);
      return r.ok ? 'ok' : r.problem.kind;
    };
    expect(bad('http://example.com/hooks')).toBe('invalid');
    expect(bad('http://example.com/hooks', true)).toBe('ok');
    expect(bad('ftp://example.com/')).toBe('invalid');
    expect(bad('not a url')).toBe('invalid');
    expect(bad('https://user:pw@example.com/')).toBe('invalid');
    expect(bad('https://example.com/#frag')).toBe('invalid');
    expect(bad(`https://example.com/${'a'.repeat(2048)}`)).toBe('invalid');
  });

  it('limits the length of the URL as given: its normalised form may be longer and still passes the send-time check', () => {
    const raw = `https://A${'0'.repeat(2048 - 'https://A'.length)}`;
    const r = checkWebhookUrl(raw, true);
    expect(r.ok && r.url.length).toBe(2049); // lower-cased host and a trailing slash
    expect(checkWebhookUrl(r.ok ? r.url : '', true, { input: false }).ok).toBe(true);
    expect(checkWebhookUrl(r.ok ? r.url : '', true).ok).toBe(false);
  });

  it('refuses private addresses and localhost unless allowed (IPv4 forms and IPv6 normalised)', () => {
    for (const u of [
      'https://127.0.0.1/',
      'https://[::1]:8443/',
      'https://[::ffff:127.0.0.1]/',
      'https://0x7f.1/',
      'https://2130706433/',
      'https://localhost/',
      'https://a.localhost/',
      'https://169.254.169.254/latest',
    ]) {
      const r = checkWebhookUrl(u, false);
      expect([u, r.ok ? 'ok' : r.problem.kind]).toEqual([u, 'address']);
      expect(checkWebhookUrl(u, true).ok).toBe(true);
    }
  });
});
