/**
 * Secrets as they appear in log text, shared by every logger of Roost (telemetry/logging.ts for the API and
 * the worker, agent/service.ts, the CLI's `--verbose` log in cli/log.ts): the patterns, the redaction of a
 * line, and the structured field names whose values are credentials whatever their format
 * (docs/observability.md "Logs").
 */

/**
 * Secrets as they appear in text, each with the part kept for diagnosis (`$1`): the credential families of
 * domain/keys.ts (`svk_live_`, `svk_test_`), services/agent.ts (`ses_` enrolment secrets, `sat_` agent
 * tokens), db/sessions.ts (`sst_`), services/webhooks.ts (`whsec_`), the `sig` of an Azure SAS URL and any
 * `Bearer` credential.
 */
export const SECRET_PATTERNS: readonly RegExp[] = [
  /\b(svk_(?:live|test)_|ses_|sat_|sst_|whsec_)[A-Za-z0-9_-]{16,}/g,
  /([?&]sig=)[^&"'\s\\]+/gi,
  /(\bBearer\s+)[^"'\s\\]+/gi,
];

/** Query parameters that carry a credential whatever their value (`?api_key=`: api/plugins/auth.ts). */
const CREDENTIAL_PARAMS = new Set(['api_key']);

/**
 * A query parameter (`?name=value` or `&name=value`) whose name or value holds a percent-escape: a server
 * decodes it, so `svk%5Flive%5F…` is a working key that the patterns above, which see the text as written,
 * would miss.
 */
const ENCODED_QUERY_PARAM = /([?&])([^=&\s"'\\]*)=([^&\s"'\\]*)/g;

/** `text` decoded as a URL component, or `text` itself when it is not valid percent-encoding. */
function decoded(text: string): string {
  try {
    return decodeURIComponent(text.replace(/\+/g, ' '));
  } catch {
    return text;
  }
}

/** True when `text` holds a secret of SECRET_PATTERNS. */
function holdsSecret(text: string): boolean {
  return SECRET_PATTERNS.some((re) => new RegExp(re.source, re.flags.replace('g', '')).test(text));
}

/**
 * `text` with every secret of SECRET_PATTERNS replaced by its prefix and `[redacted]`, and, in a query string,
 * the whole value of `api_key` and of any parameter whose percent-decoded value is a secret.
 */
export function redactSecrets(text: string): string {
  let out = text.replace(ENCODED_QUERY_PARAM, (all, sep: string, name: string, value: string) => {
    if (!all.includes('%') && !CREDENTIAL_PARAMS.has(name)) return all;
    const credential = CREDENTIAL_PARAMS.has(decoded(name).toLowerCase());
    return credential || holdsSecret(decoded(value)) ? `${sep}${name}=[redacted]` : all;
  });
  for (const re of SECRET_PATTERNS) out = out.replace(re, '$1[redacted]');
  return out;
}

/** pino `redact` paths: structured fields that hold credentials by name, whatever their value. */
export const REDACTED_FIELDS: readonly string[] = [
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["x-api-key"]',
  'headers.authorization',
  'headers["x-api-key"]',
  'authorization',
  'token',
  'apiKey',
  'agentToken',
  'enrolmentSecret',
  'secret',
  'signingSecret',
  'password',
];
