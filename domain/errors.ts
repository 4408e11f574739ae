/**
 * The one error type of the service (docs/contract.md "Errors"). Thrown from anywhere (routes, repositories,
 * plugins) and rendered once by api/plugins/problem.ts as `application/problem+json`.
 */

/** Every stable error code of docs/contract.md with its HTTP status. Route-specific codes are added here too. */
export const ERROR_STATUS = {
  unauthorized: 401,
  token_expired: 401,
  forbidden: 403,
  scope_insufficient: 403,
  not_found: 404,
  version_not_found: 404,
  validation_failed: 400,
  unsupported_version: 400,
  forbidden_field: 400,
  version_ref_malformed: 400,
  version_content_immutable: 400,
  rollback_no_op: 400,
  idempotency_key_required: 400,
  idempotency_key_invalid: 400,
  idempotency_key_mismatch: 422,
  idempotency_key_in_use: 409,
  precondition_failed: 412,
  version_stale: 412,
  conflict: 409,
  machine_offline: 409,
  payload_too_large: 413,
  over_quota: 413,
  quota_exceeded: 402,
  rate_limited: 429,
  cortex_unavailable: 503,
  service_unavailable: 503,
  internal_error: 500,
  deployment_in_flight: 409,
  last_superadmin: 409,
  orphan_sites: 409,
  unknown_site: 400,
  successor_invalid: 400,
  duplicate_process_name: 409,
  process_not_found: 404,
  unsupported_command_type: 400,
  /** A request body in a media type the route does not take (every JSON route takes application/json only). */
  unsupported_media_type: 415,
  /** The request head (request line and headers) is over the server's limit. */
  request_header_too_large: 431,
  /** A known path with a method it does not have; the answer carries `Allow`. */
  method_not_allowed: 405,
  /** An `Expect` header other than 100-continue (RFC 9110 10.1.1). */
  expectation_failed: 417,
  /** Webhooks: a delivery URL pointing at a loopback, private or link-local address (docs/decisions/webhook-urls.md). */
  url_not_allowed: 400,
  /** A roost route on a site whose roostEnabled is false (docs/decisions/sites.md). */
  roost_disabled: 403,
  /** Installer catalog: the uploaded bytes do not hash to the declared SHA-256 (docs/decisions/installer-catalog.md). */
  checksum_mismatch: 422,
  /** Installer catalog: delete of the version the latest pointer names. */
  latest_version_protected: 409,
  /** Installer catalog: a delete that would leave fewer active versions than the minimum (2). */
  min_versions_violated: 409,
  /** Installer catalog: upload of a version that exists (any state) or is reserved by another upload. */
  version_exists: 409,
  /** Installer catalog: finalise of a reservation whose bytes were never uploaded. */
  upload_missing: 409,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS;

const TITLES: Partial<Record<ErrorCode, string>> = {
  unauthorized: 'Unauthorized',
  token_expired: 'Token expired',
  forbidden: 'Forbidden',
  scope_insufficient: 'Scope insufficient',
  not_found: 'Not found',
  version_not_found: 'Version not found',
  validation_failed: 'Validation failed',
  internal_error: 'Internal error',
  conflict: 'Conflict',
  precondition_failed: 'Precondition failed',
  version_stale: 'Version stale',
};

/** Title for a code: a fixed title where one is set, otherwise the code in sentence case. */
export function titleFor(code: string): string {
  const t = TITLES[code as ErrorCode];
  if (t) return t;
  const words = code.replace(/_/g, ' ');
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/**
 * A client-visible failure. `extras` are merged into the problem body (for example `missingChunks`,
 * `required`, `sent`/`supported`, `quota`); `errors` is the dotted-path map of validation messages.
 */
export class ApiError extends Error {
  readonly code: string;
  readonly status: number;
  readonly detail: string;
  readonly extras: Record<string, unknown>;
  readonly headers: Record<string, string>;

  constructor(
    code: ErrorCode | string,
    detail: string,
    opts: { status?: number; extras?: Record<string, unknown>; headers?: Record<string, string> } = {},
  ) {
    super(detail);
    this.name = 'ApiError';
    this.code = code;
    this.status = opts.status ?? (ERROR_STATUS as Record<string, number>)[code] ?? 400;
    this.detail = detail;
    this.extras = opts.extras ?? {};
    this.headers = opts.headers ?? {};
  }
}

/** Shorthand constructors for the most common failures. */
export const errors = {
  validation(detail: string, fieldErrors?: Record<string, string[]>, param?: string): ApiError {
    const extras: Record<string, unknown> = {};
    if (fieldErrors) extras.errors = fieldErrors;
    if (param) extras.param = param;
    return new ApiError('validation_failed', detail, { extras });
  },
  notFound(what = 'resource'): ApiError {
    return new ApiError('not_found', `${what} not found`);
  },
  conflict(detail: string): ApiError {
    return new ApiError('conflict', detail);
  },
};

/** Seconds a client is told to wait when a dependency is down (503 service_unavailable). */
export const OUTAGE_RETRY_AFTER_SECONDS = 5;

/**
 * 503 service_unavailable with `detail`, the `Retry-After` header and the body's `retryAfter` (seconds,
 * OUTAGE_RETRY_AFTER_SECONDS): the answer to a dependency or a worker that is not there (docs/decisions/outages.md).
 */
export function serviceUnavailable(detail: string): ApiError {
  return new ApiError('service_unavailable', detail, {
    headers: { 'Retry-After': String(OUTAGE_RETRY_AFTER_SECONDS) },
    extras: { retryAfter: OUTAGE_RETRY_AFTER_SECONDS },
  });
}
