/**
 * Builds the Fastify app (docs/architecture.md "Layers"): problem+json errors, request ids, API versioning,
 * authentication, idempotency, the OpenAPI document, and every route family. Stateless: N copies may run.
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, LogController } from 'fastify';
import type { Logger } from 'pino';
import { type TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { randomFillSync } from 'node:crypto';
import { type IncomingMessage, type ServerResponse, STATUS_CODES } from 'node:http';
import AjvCompiler, { type BuildCompilerFromPool } from '@fastify/ajv-compiler';
import type { AppDeps } from './context';
import problem, { problemBody, sendProblem, toApiError } from './plugins/problem';
import { ApiError } from '../domain/errors';
import input from './plugins/input';
import apiVersion from './plugins/api-version';
import auth from './plugins/auth';
import idempotency from './plugins/idempotency';
import audit from './plugins/audit';
import rateLimit from './plugins/rate-limit';
import metrics from './plugins/metrics';
import tracing from './plugins/tracing';
import { registerRoutes } from './routes';
import { createLogger, logContext, withBoundRequestId } from '../telemetry/logging';
import openapi from './openapi';

/** One pool of ajv validators per option set (the framework's own compiler), shared by every app of the process. */
const ajvCompilers = AjvCompiler() as BuildCompilerFromPool;

/** A whole HTTP/1.1 response carrying the problem document of `err`, for answers written straight to a socket. */
function rawProblem(err: ApiError, requestId: string, base: string): string {
  const body = JSON.stringify(problemBody(err, requestId, base));
  return (
    `HTTP/1.1 ${err.status} ${STATUS_CODES[err.status]}\r\nContent-Type: application/problem+json; charset=utf-8\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nX-Request-Id: ${requestId}\r\nConnection: close\r\n\r\n${body}`
  );
}

/** Random bytes for request ids, drawn in blocks: one `randomFillSync` per 409 requests instead of one per request. */
const idBytes = Buffer.alloc(4096);
let idOffset = idBytes.length;

/** A new request id: `req_` + 20 hex characters (80 random bits). */
export function newRequestId(): string {
  if (idOffset + 10 > idBytes.length) {
    randomFillSync(idBytes);
    idOffset = 0;
  }
  idOffset += 10;
  return `req_${idBytes.toString('hex', idOffset - 10, idOffset)}`;
}

/** Largest request head (request line and headers) the API reads, bytes. */
export const MAX_HEADER_BYTES = 128 * 1024;

export interface BuildOptions {
  /** false: no logging; else the level (default ROOST_LOG_LEVEL) of the JSON logger (telemetry/logging.ts). */
  logger?: boolean | { level: string };
  /** A logger of telemetry/logging.ts createLogger to use instead (tests capture its lines). */
  loggerInstance?: Logger;
  /**
   * Plugins left out, for the API-overhead benchmark only (bench/api.ts measures what each one costs a read);
   * production and tests never pass it. Leaving out `rateLimit` also leaves `app.rateLimits` undefined, so only
   * routes without capability limits answer (the benchmark's `GET /api/roosts/{roostId}/versions/{versionRef}`).
   */
  without?: readonly OptionalPlugin[];
}

/** The plugins `BuildOptions.without` may leave out. */
export const OPTIONAL_PLUGINS = ['metrics', 'tracing', 'input', 'apiVersion', 'rateLimit', 'idempotency', 'audit'] as const;
export type OptionalPlugin = (typeof OPTIONAL_PLUGINS)[number];

/** Creates the app with its dependencies. Call `app.ready()` (or `listen`) before use. */
export async function buildApp(deps: AppDeps, opts: BuildOptions = {}): Promise<FastifyInstance> {
  // JSON lines with requestId (every line of a request) and traceId, secrets redacted (docs/observability.md "Logs").
  const logger =
    opts.logger === false
      ? undefined
      : (opts.loggerInstance ??
        createLogger({
          service: 'roost-api',
          level: typeof opts.logger === 'object' ? opts.logger.level : deps.cfg.ROOST_LOG_LEVEL,
        }));
  const app = Fastify({
    ...(logger ? { loggerInstance: logger as FastifyBaseLogger } : { logger: false }),
    logController: new LogController({ requestIdLogLabel: 'requestId' }),
    childLoggerFactory: (parent, bindings, options) => withBoundRequestId(parent.child(bindings, options)),
    bodyLimit: 1024 * 1024,
    // GET /api/chunks/download-urls takes up to 1,000 repeated `hash` parameters (about 70 KB of URL), which
    // Node's default 16 KB header limit would refuse with 431.
    // Node answers an HTTP/1.1 request without Host with a bare 400 of its own; the onRequest hook below
    // answers it with a problem document instead.
    http: { maxHeaderSize: MAX_HEADER_BYTES, requireHostHeader: false },
    // Agents hold keep-alive connections and long-polls; closing the app must not wait for them.
    forceCloseConnections: true,
    // Building the OpenAPI document and the docs UI at start takes seconds on a busy 2-core machine; Fastify's
    // 10 s default failed the start ("Plugin did not start in time") when the machine was saturated.
    pluginTimeout: 60_000,
    genReqId: newRequestId,
    // `x-roost-*` keywords are document-only annotations (domain/schemas.ts pagingQuery, api/openapi.ts).
    ajv: {
      customOptions: {
        coerceTypes: 'array',
        removeAdditional: false,
        useDefaults: true,
        allErrors: true,
        keywords: [
          'x-roost-integer',
          'x-roost-closed',
          'x-roost-required',
          'x-roost-pattern',
          'x-roost-alias',
          'x-roost-forbidden',
          'x-roost-document',
          'x-roost-enum',
        ],
      },
    },
    // Query strings, path parameters and headers are text, so their values are coerced to the schema's type
    // (`?limit=5`, repeated `hash`); a JSON body is not: `null` or `false` where a string is required is 400,
    // not the text "" or "false" (the OpenAPI document's types are what the server enforces).
    schemaController: {
      compilersFactory: {
        buildValidator: ((externalSchemas, options) => {
          const coercing = ajvCompilers(externalSchemas, options);
          const opts = (options ?? {}) as { customOptions?: Record<string, unknown> };
          const exact = ajvCompilers(externalSchemas, {
            ...opts,
            customOptions: { ...opts.customOptions, coerceTypes: false },
          } as typeof options);
          // The framework calls the compiler with its route definition ({ schema, httpPart, … }), which the
          // package's typings spell as a bare schema.
          return ((route: { httpPart?: string }) =>
            (route.httpPart === 'body' ? exact : coercing)(route as never)) as unknown as ReturnType<typeof ajvCompilers>;
        }) satisfies typeof ajvCompilers,
      },
    },
    // Path parameters of any length reach their schema, which answers 400 validation_failed naming the
    // parameter (the request head itself is bounded by MAX_HEADER_BYTES).
    routerOptions: { maxParamLength: MAX_HEADER_BYTES },
    // A request Node's HTTP parser refuses before Fastify sees it (a head over MAX_HEADER_BYTES, a control
    // character in a header, a malformed request line) still gets a problem document.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket) => {
      if (!socket.writable) return socket.destroy();
      const code = err.code === 'HPE_HEADER_OVERFLOW' ? 'request_header_too_large' : 'validation_failed';
      const detail =
        code === 'request_header_too_large'
          ? `the request line and headers are over ${MAX_HEADER_BYTES} bytes`
          : 'the request is not valid HTTP (a malformed request line or a header with a forbidden character)';
      socket.end(rawProblem(new ApiError(code, detail), newRequestId(), deps.cfg.publicUrl));
    },
    // A path that is not valid percent-encoded UTF-8 is a client error like any other (problem+json).
    frameworkErrors: (error, request, reply) => {
      const err =
        error.code === 'FST_ERR_BAD_URL'
          ? new ApiError('validation_failed', 'the request path is not valid percent-encoded UTF-8', { extras: { param: 'path' } })
          : toApiError(error);
      void sendProblem(request, reply, err);
    },
  }).withTypeProvider<TypeBoxTypeProvider>();

  app.decorate('deps', deps);
  // The rest of the request runs with its id in the log context: lines logged outside request.log, and the
  // workflows it starts (services/deps.ts), carry it.
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('X-Request-Id', request.id);
    // HTTP/1.1 requires Host (RFC 9112 3.2).
    if (request.raw.httpVersion === '1.1' && request.headers.host === undefined) {
      return done(new ApiError('validation_failed', 'an HTTP/1.1 request must send a Host header', { extras: { param: 'Host' } }));
    }
    logContext.run({ requestId: request.id }, done);
  });
  // An Expect other than 100-continue (RFC 9110 10.1.1): Node would answer a bare 417 without calling the app.
  app.server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const requestId = newRequestId();
    const err = new ApiError('expectation_failed', 'this Expect cannot be met; the only expectation the API meets is 100-continue', {
      extras: { param: 'Expect' },
    });
    const body = JSON.stringify(problemBody(err, requestId, deps.cfg.publicUrl));
    res.writeHead(err.status, {
      'content-type': 'application/problem+json; charset=utf-8',
      'content-length': Buffer.byteLength(body),
      'x-request-id': requestId,
      connection: 'close',
    });
    res.end(body);
  });
  const wanted = (name: OptionalPlugin) => !opts.without?.includes(name);
  await app.register(problem);
  // Request, rate-limit, idempotency, pool and stream metrics (api/plugins/metrics.ts; docs/observability.md).
  if (wanted('metrics')) await app.register(metrics);
  // Request spans when tracing is on (api/plugins/tracing.ts); before the routes it wraps.
  if (wanted('tracing')) await app.register(tracing);
  // One rule for client text and JSON: no U+0000, no lone surrogates, bounded depth (api/plugins/input.ts).
  if (wanted('input')) await app.register(input);
  // The route table, the OpenAPI document (/api/openapi.json) and the public reference page (/docs).
  await app.register(openapi);
  if (wanted('apiVersion')) await app.register(apiVersion);
  await app.register(auth);
  if (wanted('rateLimit')) await app.register(rateLimit);
  if (wanted('idempotency')) await app.register(idempotency);
  if (wanted('audit')) await app.register(audit);
  await registerRoutes(app);
  return app;
}
