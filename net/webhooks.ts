/**
 * Outbound HTTP to webhook receivers, the I/O adapter beside storage/ (docs/decisions/webhook-urls.md,
 * docs/decisions/webhook-delivery.md): one signed POST with a timeout, no redirects, the address rules
 * applied again at send time (a guarded DNS lookup refuses names that now resolve to
 * loopback/private/link-local addresses unless ROOST_WEBHOOK_ALLOW_PRIVATE), any 2xx is success.
 * Used by the delivery activity (activities/webhooks.ts) and the probe (services/webhooks.ts,
 * `POST /api/webhooks/probe`). Signing is domain/webhook-signature.ts.
 */
import http from 'node:http';
import https from 'node:https';
import dns from 'node:dns';
import type { LookupAddress } from 'node:dns';
import { performance } from 'node:perf_hooks';
import { checkWebhookUrl, isNonPublicAddress } from '../domain/webhook-signature';

/** Result of one POST. `refused`: the address rules stopped it before any byte was sent. */
export interface PostResult {
  ok: boolean;
  statusCode: number | null;
  latencyMs: number;
  error: string | null;
  refused: boolean;
}

class AddressRefusedError extends Error {
  constructor(host: string, address: string) {
    super(`refused: ${host} resolves to a loopback, private or link-local address (${address})`);
    this.name = 'AddressRefusedError';
  }
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/** dns.lookup that fails with AddressRefusedError when any resolved address is not public. */
function guardedLookup(hostname: string, options: dns.LookupOptions, callback: LookupCallback): void {
  dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err, []);
    const list = addresses as LookupAddress[];
    const bad = list.find((a) => isNonPublicAddress(a.address));
    if (bad) return callback(new AddressRefusedError(hostname, bad.address), []);
    if (list.length === 0) return callback(Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' }), []);
    if (options.all) return callback(null, list);
    return callback(null, list[0].address, list[0].family);
  });
}

/**
 * The addresses `host` resolves to that are not public (empty when all are public, when `host` is an IP
 * literal (checked by `checkWebhookUrl`) or when it does not resolve: the send-time check decides then).
 */
export async function nonPublicAddressesOf(host: string): Promise<string[]> {
  try {
    const list = await dns.promises.lookup(host, { all: true, verbatim: true });
    return list.map((a) => a.address).filter((a) => isNonPublicAddress(a));
  } catch {
    return [];
  }
}

/**
 * POSTs `body` to `url` with `headers` (Content-Type and Content-Length are set here). Never throws:
 * network errors, timeouts and refusals come back in `error`. Redirects are not followed (a 3xx is a
 * failure). `latencyMs`: from the start to the response headers (or the failure).
 */
export async function postWebhook(req: {
  url: string;
  body: string;
  headers: Record<string, string>;
  timeoutMs: number;
  allowPrivate: boolean;
}): Promise<PostResult> {
  const started = performance.now();
  const elapsed = () => Math.max(0, Math.round(performance.now() - started));
  // The URL was checked as given (and normalised) at create or probe; its length is not a send-time rule.
  const checked = checkWebhookUrl(req.url, req.allowPrivate, { input: false });
  if (!checked.ok) return { ok: false, statusCode: null, latencyMs: 0, error: `refused: url ${checked.problem.message}`, refused: true };
  const u = new URL(checked.url);
  const mod = u.protocol === 'https:' ? https : http;
  return new Promise<PostResult>((resolve) => {
    let done = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = (r: Omit<PostResult, 'latencyMs'>) => {
      if (done) return;
      done = true;
      if (timer) clearTimeout(timer);
      resolve({ ...r, latencyMs: elapsed() });
    };
    const request = mod.request(
      u,
      {
        method: 'POST',
        agent: false,
        headers: {
          'Content-Type': 'application/json',
          'User-Agent': 'Roost-Webhooks/1',
          ...req.headers,
          'Content-Length': String(Buffer.byteLength(req.body)),
        },
        lookup: req.allowPrivate ? undefined : (guardedLookup as unknown as http.RequestOptions['lookup']),
      },
      (res) => {
        const code = res.statusCode ?? null;
        const ok = code !== null && code >= 200 && code < 300;
        finish({ ok, statusCode: code, error: ok ? null : `HTTP ${code}`, refused: false });
        // Drain what the receiver sends back, but never for long.
        res.resume();
        setTimeout(() => res.destroy(), 5_000).unref();
      },
    );
    timer = setTimeout(() => request.destroy(new Error(`timed out after ${req.timeoutMs} ms`)), req.timeoutMs);
    request.on('error', (err) => finish({ ok: false, statusCode: null, error: err.message, refused: err instanceof AddressRefusedError }));
    request.end(req.body);
  });
}

/** The delivery headers `Roost-Event`, `Roost-Delivery`, `Roost-Signature` (Content-Type is added by `postWebhook`). */
export function deliveryHeaders(event: string, deliveryId: string, signature: string): Record<string, string> {
  return { 'Roost-Event': event, 'Roost-Delivery': deliveryId, 'Roost-Signature': signature };
}
