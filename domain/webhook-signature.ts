/**
 * Webhook signatures (docs/contract.md "Events" › Delivery): `Roost-Signature: t=<unix seconds>,v1=<hex>` where the
 * hex is HMAC-SHA256 of `<t>.<raw body>` keyed with the subscription's signing secret, over the exact raw
 * bytes. During a secret rotation's grace window the header carries one `v1` per secret.
 *
 * `verifySignature` is the receiver-side helper: it applies the spec's receiver rules (constant-time
 * compare, 300-second tolerance, any matching v1 accepted, unknown schemes ignored) and answers with one
 * of the spec's failure reasons. Pure: no I/O (the clock is a parameter with a default).
 *
 * Also the delivery URL rules shared by the subscription routes, the probe and the sender
 * (`checkWebhookUrl`, `isNonPublicAddress`).
 */
import ipaddr from 'ipaddr.js';
import { createHmac, timingSafeEqual } from 'node:crypto';
import { BlockList, isIP } from 'node:net';

/** Name of the signature header. */
export const SIGNATURE_HEADER = 'Roost-Signature';
/** docs/contract.md "Limits": webhook signature tolerance, seconds. */
export const SIGNATURE_TOLERANCE_SECONDS = 300;

/** Why a signature was refused (docs/contract.md "Events" › Delivery). */
export type SignatureFailureReason =
  'missing_header' | 'malformed_header' | 'missing_timestamp' | 'missing_v1' | 'timestamp_out_of_tolerance' | 'bad_signature';

/** Result of `verifySignature`. */
export type SignatureCheck = { ok: true } | { ok: false; reason: SignatureFailureReason };

/** Hex HMAC-SHA256 of `<t>.<raw body>` keyed with `secret` (UTF-8). */
export function computeSignature(secret: string, rawBody: string | Buffer, t: number): string {
  const mac = createHmac('sha256', Buffer.from(secret, 'utf8'));
  mac.update(`${t}.`, 'utf8');
  mac.update(typeof rawBody === 'string' ? Buffer.from(rawBody, 'utf8') : rawBody);
  return mac.digest('hex');
}

/**
 * The `Roost-Signature` header value for `rawBody` signed at `t` (unix seconds, an integer): one `v1`
 * entry per secret, in the order given (current secret first, then the previous one during a rotation).
 * @throws Error when no secret is given or `t` is not a non-negative integer.
 */
export function signPayload(secret: string | readonly string[], rawBody: string | Buffer, t: number): string {
  const secrets = typeof secret === 'string' ? [secret] : [...secret];
  if (secrets.length === 0) throw new Error('signPayload: at least one secret is needed');
  if (!Number.isInteger(t) || t < 0) throw new Error('signPayload: t must be unix seconds (a non-negative integer)');
  return [`t=${t}`, ...secrets.map((s) => `v1=${computeSignature(s, rawBody, t)}`)].join(',');
}

/** A parsed header: the timestamp (when present and numeric) and every v1 value, in order. */
export interface ParsedSignatureHeader {
  t: number | undefined;
  v1: string[];
}

/**
 * Parses `t=…,v1=…[,v1=…][,<scheme>=…]`. Every comma-separated element must be `key=value` with a
 * non-empty key and value, and `t` (when present) must be decimal digits appearing once; otherwise the
 * header is malformed (null). Unknown keys (other signature schemes such as `v0`) are ignored.
 */
export function parseSignatureHeader(header: string): ParsedSignatureHeader | null {
  let t: number | undefined;
  let seenT = false;
  const v1: string[] = [];
  for (const raw of header.split(',')) {
    const part = raw.trim();
    const eq = part.indexOf('=');
    if (eq <= 0 || eq === part.length - 1) return null;
    const key = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (!key || !value) return null;
    if (key === 't') {
      if (seenT || !/^[0-9]{1,12}$/.test(value)) return null;
      seenT = true;
      t = Number(value);
    } else if (key === 'v1') {
      v1.push(value);
    }
  }
  return { t, v1 };
}

/** Options of `verifySignature`. */
export interface VerifySignatureInput {
  /** The `Roost-Signature` header as received (Node gives string | string[] | undefined). */
  header: string | readonly string[] | null | undefined;
  /** The exact raw request body bytes (do not re-serialize parsed JSON). */
  rawBody: string | Buffer;
  /** Secrets to accept (the current one, and the previous one while rotating). */
  secrets: readonly string[];
  /** Now, in unix seconds; default the system clock. */
  nowSeconds?: number;
  /** Allowed |now − t| in seconds; default 300 (docs/contract.md "Limits"). */
  toleranceSeconds?: number;
}

function constantTimeHexEqual(expectedHex: string, candidate: string): boolean {
  if (!/^[0-9a-fA-F]+$/.test(candidate) || candidate.length !== expectedHex.length) return false;
  return timingSafeEqual(Buffer.from(expectedHex, 'hex'), Buffer.from(candidate.toLowerCase(), 'hex'));
}

/**
 * Applies the receiver rules of docs/contract.md "Events" › Delivery. Order of checks: header present
 * (missing_header), parseable (malformed_header), has t (missing_timestamp), has at least one v1
 * (missing_v1), some v1 equals the HMAC under some secret, compared in constant time (bad_signature),
 * and |now − t| ≤ tolerance (timestamp_out_of_tolerance). The signature is checked before the clock so a
 * forged header never learns anything about the tolerance window.
 */
export function verifySignature(input: VerifySignatureInput): SignatureCheck {
  const { header } = input;
  let value: string | undefined;
  if (Array.isArray(header)) {
    if (header.length > 1) return { ok: false, reason: 'malformed_header' };
    value = header[0];
  } else {
    value = (header as string | null | undefined) ?? undefined;
  }
  if (value === undefined || value.trim() === '') return { ok: false, reason: 'missing_header' };
  const parsed = parseSignatureHeader(value);
  if (!parsed) return { ok: false, reason: 'malformed_header' };
  if (parsed.t === undefined) return { ok: false, reason: 'missing_timestamp' };
  if (parsed.v1.length === 0) return { ok: false, reason: 'missing_v1' };
  let matched = false;
  for (const secret of input.secrets) {
    const expected = computeSignature(secret, input.rawBody, parsed.t);
    // Compare against every candidate (no early exit on the first mismatch).
    for (const candidate of parsed.v1) if (constantTimeHexEqual(expected, candidate)) matched = true;
  }
  if (!matched) return { ok: false, reason: 'bad_signature' };
  const now = input.nowSeconds ?? Math.floor(Date.now() / 1000);
  const tolerance = input.toleranceSeconds ?? SIGNATURE_TOLERANCE_SECONDS;
  if (Math.abs(now - parsed.t) > tolerance) return { ok: false, reason: 'timestamp_out_of_tolerance' };
  return { ok: true };
}

// ---------------------------------------------------------------------------------------------------
// Delivery URL rules (docs/decisions/webhook-urls.md). Pure: the caller resolves names and passes the
// addresses in.

/** Longest accepted delivery URL, characters. */
export const WEBHOOK_URL_MAX_LENGTH = 2048;

/** Address ranges a delivery may not reach unless the operator allows private addresses. */
const NON_PUBLIC = (() => {
  const b = new BlockList();
  const v4: [string, number][] = [
    ['0.0.0.0', 8], // "this" network
    ['10.0.0.0', 8], // private
    ['100.64.0.0', 10], // carrier-grade NAT
    ['127.0.0.0', 8], // loopback
    ['169.254.0.0', 16], // link-local (cloud metadata endpoints live here)
    ['172.16.0.0', 12], // private
    ['192.0.0.0', 24], // IETF protocol assignments
    ['192.0.2.0', 24], // documentation
    ['192.168.0.0', 16], // private
    ['198.18.0.0', 15], // benchmarking
    ['198.51.100.0', 24], // documentation
    ['203.0.113.0', 24], // documentation
    ['224.0.0.0', 4], // multicast
    ['240.0.0.0', 4], // reserved, broadcast
  ];
  for (const [a, p] of v4) b.addSubnet(a, p, 'ipv4');
  const v6: [string, number][] = [
    ['::', 96], // unspecified, loopback and the deprecated IPv4-compatible block (::a.b.c.d)
    ['64:ff9b::', 96], // NAT64 (reaches IPv4 space, including private ranges)
    ['100::', 64], // discard
    ['2001:db8::', 32], // documentation
    ['fc00::', 7], // unique local
    ['fe80::', 10], // link-local
    ['fec0::', 10], // site-local (deprecated)
    ['ff00::', 8], // multicast
  ];
  for (const [a, p] of v6) b.addSubnet(a, p, 'ipv6');
  return b;
})();

/** The deprecated IPv4-compatible IPv6 block `::/96` (`::127.0.0.1`), which ipaddr.js files under unicast. */
const IPV4_COMPATIBLE = ipaddr.parseCIDR('::/96');

/**
 * True when `address` (an IPv4 or IPv6 literal, brackets allowed) is anything but a public unicast address:
 * loopback, private, link-local, carrier-grade NAT, unspecified, multicast, broadcast, documentation,
 * benchmarking or reserved space, and every IPv6 transition form that reaches IPv4 space (IPv4-compatible
 * `::a.b.c.d`, 6to4 `2002::/16`, Teredo `2001::/32`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`, SIIT). Ranges
 * come from ipaddr.js (a maintained special-purpose registry) plus the explicit list above; an IPv4-mapped
 * address (`::ffff:10.0.0.1`) is judged by its IPv4 address. Not an IP literal → false.
 */
export function isNonPublicAddress(address: string): boolean {
  const a = address.replace(/^\[|\]$/g, '');
  const family = isIP(a);
  if (family === 0) return false;
  if (NON_PUBLIC.check(a, family === 6 ? 'ipv6' : 'ipv4')) return true;
  const parsed = ipaddr.process(a);
  if (parsed.kind() === 'ipv4') return NON_PUBLIC.check(parsed.toString(), 'ipv4') || parsed.range() !== 'unicast';
  if ((parsed as ipaddr.IPv6).match(IPV4_COMPATIBLE)) return true;
  return parsed.range() !== 'unicast';
}

/** Why a delivery URL is refused: its shape (validation) or where it points (address). */
export type WebhookUrlProblem = { kind: 'invalid'; message: string } | { kind: 'address'; message: string };

/**
 * Checks a delivery URL's shape (absolute, at most 2048 chars as given, https — or http when `allowPrivate` —,
 * a host, no user name or password, no fragment) and, unless `allowPrivate`, that an IP-literal host or a
 * `localhost` name is not a non-public address. Returns the normalised URL (WHATWG serialisation) or the
 * problem. Names are not resolved here: callers check resolved addresses with `isNonPublicAddress`.
 * The length limit is an input rule: the send-time check of an already normalised URL (which may be a few
 * characters longer: `https://example.com` becomes `https://example.com/`, `"` becomes `%22`) passes
 * `{ input: false }` and skips it.
 */
export function checkWebhookUrl(
  raw: string,
  allowPrivate: boolean,
  opts: { input?: boolean } = {},
): { ok: true; url: string; host: string } | { ok: false; problem: WebhookUrlProblem } {
  const invalid = (message: string) => ({ ok: false as const, problem: { kind: 'invalid' as const, message } });
  if (opts.input !== false && raw.length > WEBHOOK_URL_MAX_LENGTH) return invalid(`must be at most ${WEBHOOK_URL_MAX_LENGTH} characters`);
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return invalid('must be an absolute URL such as https://example.com/hooks/roost');
  }
  if (u.protocol !== 'https:' && u.protocol !== 'http:') return invalid('must use https');
  if (u.protocol === 'http:' && !allowPrivate)
    return invalid('must use https (plain http is allowed only when the operator sets ROOST_WEBHOOK_ALLOW_PRIVATE)');
  if (u.username !== '' || u.password !== '')
    return invalid('must not carry a user name or password; authenticate deliveries with the signature');
  if (u.hash !== '') return invalid('must not carry a fragment (#…)');
  const host = u.hostname.replace(/^\[|\]$/g, '');
  if (!host) return invalid('must name a host');
  if (!allowPrivate) {
    const lower = host.toLowerCase().replace(/\.$/, '');
    if (lower === 'localhost' || lower.endsWith('.localhost') || isNonPublicAddress(host)) {
      return {
        ok: false,
        problem: {
          kind: 'address',
          message: `points to a loopback, private or link-local address (${host}); deliveries go to public addresses only`,
        },
      };
    }
  }
  return { ok: true, url: u.toString(), host };
}
