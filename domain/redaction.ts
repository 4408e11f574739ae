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

/** `text` with every secret of SECRET_PATTERNS replaced by its prefix and `[redacted]`. */
export function redactSecrets(text: string): string {
  let out = text;
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
