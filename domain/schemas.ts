/**
 * The shared TypeBox schemas: every id format, the problem+json envelope, paging parameters and timestamps,
 * each defined once here and used by routes, repositories, the agent and the CLI (docs/architecture.md).
 * Pure: no I/O. Route-specific shapes stay beside their routes.
 */
import { type TSchema, Type } from '@sinclair/typebox';
import { ABSOLUTE_PATH_RE, EXTRACT_ROOT_RE, FILE_NAME_RE, MAX_PATH_LENGTH, MAX_SEGMENT_LENGTH } from './paths';
import { CONCRETE_VERSION_ID_RE, VERSION_REF_RE } from './versionRef';
import { INSTALLER_VERSION_RE } from './installers';

// ---------------------------------------------------------------------------------------------------
// Ids

/** Site ids: `site_<hex>` as the service makes them, or any 1..64 of [A-Za-z0-9_-]. */
export const SITE_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
/** Roost ids are server-made (`rst_<24 hex>`); anything outside 1..64 of [A-Za-z0-9_-] is malformed. */
export const ROOST_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
/**
 * Machine ids: 1..64 of [A-Za-z0-9._-], not made only of dots (`.` and `..` are path segments every URL
 * client normalises away, so `/machines/..` could never name a machine). One rule for enrolment, roost
 * targets, deploy machine lists, every machine route and the agent, so a roost can only target ids that
 * can enrol (docs/decisions/machine-ids.md).
 */
export const MACHINE_ID_RE = /^(?!\.+$)[A-Za-z0-9._-]{1,64}$/;
/** MACHINE_ID_RE in words, for the document and for messages that refuse an id. */
export const MACHINE_ID_RULE = '1..64 characters of [A-Za-z0-9._-], not only dots';
/** Command ids (`cmd_<hex>`): 1..64 of [A-Za-z0-9_-]. */
export const COMMAND_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;

/** User ids (`usr_<hex>` as the service makes them): 1..64 of [A-Za-z0-9_-]. */
export const USER_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;

export const SiteId = Type.String({ pattern: SITE_ID_RE.source, description: 'site id' });
export const UserId = Type.String({ pattern: USER_ID_RE.source, description: 'user id (usr_…)' });
export const RoostId = Type.String({ pattern: ROOST_ID_RE.source, description: 'roost id (rst_…)' });
export const MachineId = Type.String({ pattern: MACHINE_ID_RE.source, description: MACHINE_ID_RULE });
export const CommandId = Type.String({ pattern: COMMAND_ID_RE.source, description: 'command id (cmd_…)' });
/**
 * An absolute https:// URL with a host name (document form, `x-roost-pattern`: host labels start with a letter,
 * optional port 0..65535, printable ASCII after it, `fragment: false` without `#`); the handlers (checkInstallerUrl,
 * domain/webhook-signature.ts checkWebhookUrl) refuse
 * anything the URL parser rejects, another scheme or credentials with 400 validation_failed naming the field.
 */
export function HttpsUrl(description: string, opts: { fragment?: boolean } = {}) {
  const port = '(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])';
  const host = '[A-Za-z][A-Za-z0-9-]*(?:\\.[A-Za-z][A-Za-z0-9-]*)*';
  const rest = opts.fragment === false ? '(?:[/?][!-"$-~]*)?' : '(?:[/?#][!-~]*)?';
  return Type.String({ minLength: 1, maxLength: 2048, 'x-roost-pattern': `^https://${host}(?::${port})?${rest}$`, description });
}
/**
 * A machine-side absolute path (exe_path, cwd, verify_path): the service refuses anything domain/paths.ts
 * absolutePathProblem refuses with 400 validation_failed naming the field and the rule; the document states the
 * same rule as `pattern` (`x-roost-pattern`, ABSOLUTE_PATH_RE).
 */
export function MachinePath(description: string) {
  return Type.String({ minLength: 1, maxLength: MAX_PATH_LENGTH, 'x-roost-pattern': ABSOLUTE_PATH_RE.source, description });
}
/**
 * A bare file name safe on Windows (an installer's file name, an executable to close): the service refuses
 * anything domain/paths.ts fileNameProblem refuses with 400 validation_failed naming the entry; the document
 * states the same rule (`x-roost-pattern`, FILE_NAME_RE: no separators, `:`, `< > " | ? *` or control
 * characters, no trailing dot or space, no device name).
 */
export function FileName(description: string) {
  return Type.String({ minLength: 1, maxLength: MAX_SEGMENT_LENGTH, 'x-roost-pattern': FILE_NAME_RE.source, description });
}
/**
 * A roost's extract root ('' = the default): the service refuses anything domain/paths.ts extractRootProblem
 * refuses with 400 validation_failed; the document states the same rule (`x-roost-pattern`, EXTRACT_ROOT_RE:
 * every segment at most 255 characters and safe on Windows, not the agent's own folders).
 */
export const ExtractPath = Type.String({
  maxLength: MAX_PATH_LENGTH,
  pattern: '^[^\\u0000-\\u001f]*$',
  'x-roost-pattern': EXTRACT_ROOT_RE.source,
  description: "destination root on the target machines ('' = the agent's default)",
});
/**
 * A version ref (domain/versionRef.ts): the handler parses it and answers 400 version_ref_malformed, so the
 * format is stated to the document only (`x-roost-pattern`, api/openapi.ts) and not checked by the validator.
 */
export function VersionRefString(description = 'version id, vrs_<hex>, 3, #3, v3, current, previous or first') {
  return Type.String({ 'x-roost-pattern': VERSION_REF_RE.source, description });
}
/** A concrete version id (64 lowercase hex or legacy vrs_<hex>), checked by the service for its own message. */
export const ConcreteVersionId = Type.String({
  'x-roost-pattern': CONCRETE_VERSION_ID_RE.source,
  description: 'concrete version id (64 lowercase hex, or legacy vrs_<hex>)',
});
/** An agent-installer catalog version, semver `X.Y.Z` (domain/installers.ts INSTALLER_VERSION_RE). */
export const InstallerVersion = Type.String({
  pattern: INSTALLER_VERSION_RE.source,
  description: 'semver X.Y.Z (no pre-release or build parts)',
});
/**
 * A name or text that is not blank (at least one non-space character) and carries no U+0000 (the input rule
 * of domain/input.ts), as one anchored pattern, so the document states both rules the server enforces.
 */
export const NON_BLANK_TEXT = '^\\s*[^\\s\\u0000][^\\u0000]*$';
/** Lowercase SHA-256 hex, 64 characters. */
export const Sha256Hex = Type.String({ pattern: '^[0-9a-f]{64}$', description: 'lowercase SHA-256 hex' });

/** True when `id` is a well-formed machine id (MACHINE_ID_RE). */
export function isMachineId(id: unknown): id is string {
  return typeof id === 'string' && MACHINE_ID_RE.test(id);
}

// ---------------------------------------------------------------------------------------------------
// Values

/** `T` or null. */
export const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
/** An RFC 3339 / ISO 8601 timestamp string (UTC, e.g. `2026-01-02T03:04:05.678Z`). */
export const DateTime = Type.String({ format: 'date-time' });
export const NullableDateTime = Nullable(DateTime);

// ---------------------------------------------------------------------------------------------------
// Errors

/** Media type of every error response. */
export const PROBLEM_MEDIA_TYPE = 'application/problem+json';

/**
 * The problem+json envelope every error response carries (docs/errors.md). Unknown fields must be ignored by
 * clients; route extras (`required`, `sent`/`supported`, `missingChunks`, `retryAfter`, `quota`, …) ride along.
 */
export const Problem = Type.Object(
  {
    type: Type.String({ description: 'stable URI of the form {base_url}/problems/<slug>' }),
    title: Type.String(),
    status: Type.Integer({ description: 'equals the HTTP status' }),
    detail: Type.String({ description: 'display text, not for parsing' }),
    code: Type.String({ description: 'stable error code: branch on this (see the error table in the API description)' }),
    docsUrl: Type.String(),
    requestId: Type.String({ description: 'also sent as header X-Request-Id' }),
    param: Type.Optional(Type.String({ description: 'the parameter at fault, when there is one' })),
    errors: Type.Optional(
      Type.Record(Type.String(), Type.Array(Type.String()), { description: 'dotted path → messages (validation_failed)' }),
    ),
    required: Type.Optional(
      Type.Object(
        { resource: Type.String(), id: Type.String(), permission: Type.String() },
        { description: 'scope_insufficient: the scope that would allow the request' },
      ),
    ),
    sent: Type.Optional(Type.String({ description: 'unsupported_version: the Roost-Version sent' })),
    supported: Type.Optional(Type.Array(Type.String(), { description: 'unsupported_version: the supported API dates, oldest first' })),
  },
  { additionalProperties: true, title: 'Problem', description: 'application/problem+json error document' },
);

/** Response schemas for the problem statuses every authenticated route can return (400, 401, 403, 404), plus `extra`. */
export function problems(...extra: number[]): Record<number, TSchema> {
  const out: Record<number, TSchema> = {};
  for (const s of [400, 401, 403, 404, ...extra]) out[s] = Problem;
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Paging

/**
 * Querystring properties of a paged route with its limits (checked by api/pagination.ts `parsePaging`,
 * which gives the documented error shape naming `page_size` or `limit`, so they validate as text here).
 * The OpenAPI document shows the sizes as what the server enforces: integers from 1 to `maxSize`
 * (`x-roost-integer`, rewritten by api/openapi.ts). Spread them into the route's querystring schema: the
 * route table marks a route as paged by the presence of `page_size`.
 */
export function pagingQuery(limits: { defaultSize: number; maxSize: number }) {
  const size = (description: string) =>
    Type.Optional(
      Type.String({
        description: `${description}: an integer from 1 to ${limits.maxSize}; default ${limits.defaultSize}; anything else is 400 validation_failed`,
        'x-roost-integer': { minimum: 1, maximum: limits.maxSize, default: limits.defaultSize },
      }),
    );
  const token = (description: string) => Type.Optional(Type.String({ maxLength: 4096, description }));
  return {
    page_size: size('page size'),
    page_token: token("opaque: the next_page_token of the previous page of this same list, sent back exactly ('' = first page)"),
    limit: size('legacy alias of page_size (page_size wins when both are sent; both must be valid)'),
    cursor: token('legacy alias of page_token (page_token wins when both are sent)'),
  };
}

/** The page-token fields of every paged response: `next_page_token` ('' at the end) and its alias `nextPageToken`. */
export const PageTokens = {
  next_page_token: Type.String({ description: "opaque token of the next page; '' at the end" }),
  nextPageToken: Type.String({ description: 'alias of next_page_token' }),
};

/** Timestamp text as PostgreSQL/CockroachDB print timestamptz (what created-at list positions carry). */
const POSITION_AT = /^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}(:?\d{2})?)$/;

/**
 * True for a `[created_at text, id]` list position this server could have issued (the roost and API key
 * lists page by it): a timestamptz as the database prints it and an id of 1..64 of [A-Za-z0-9_-].
 */
export function isCreatedAtPosition(p: unknown): p is [string, string] {
  return (
    Array.isArray(p) &&
    p.length === 2 &&
    typeof p[0] === 'string' &&
    typeof p[1] === 'string' &&
    POSITION_AT.test(p[0]) &&
    /^[A-Za-z0-9_-]{1,64}$/.test(p[1])
  );
}
