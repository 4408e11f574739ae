/**
 * Renders every failure once as `application/problem+json` (docs/contract.md "Errors"): type, title, status,
 * detail, code, docsUrl, requestId (+ `X-Request-Id`), and optional param / errors / route extras.
 * Schema validation failures become `validation_failed` with an `errors` map keyed by dotted paths.
 */
import fp from 'fastify-plugin';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import Router, { type HTTPMethod } from 'find-my-way';
import { KindGuard } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { ApiError, serviceUnavailable, titleFor } from '../../domain/errors';
import { unavailableDependency } from '../../domain/outage';

/** Methods a route of this API can have. */
const ROUTER_METHODS: HTTPMethod[] = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];

/** Dotted path of an ajv error: `/files/0/path` → `files.0.path`; a missing property names itself. */
function dottedPath(prefix: string | undefined, e: { instancePath?: string; params?: Record<string, unknown>; keyword?: string }): string {
  const parts = (e.instancePath ?? '').split('/').filter(Boolean);
  if (e.keyword === 'required' && typeof e.params?.missingProperty === 'string') parts.push(e.params.missingProperty);
  if (e.keyword === 'additionalProperties' && typeof e.params?.additionalProperty === 'string') parts.push(e.params.additionalProperty);
  const where = prefix && prefix !== 'body' ? [prefix, ...parts] : parts;
  return where.join('.') || prefix || 'body';
}

/** Maps any thrown value to an ApiError. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const fe = err as FastifyError & { validationContext?: string };
  if (fe && Array.isArray(fe.validation)) {
    const map: Record<string, string[]> = {};
    for (const v of fe.validation) {
      const key = dottedPath(fe.validationContext, v);
      (map[key] ??= []).push(v.message ?? 'invalid');
    }
    const first = Object.keys(map)[0];
    return new ApiError('validation_failed', `${fe.validationContext ?? 'request'} is invalid: ${first} ${map[first]?.[0] ?? ''}`.trim(), {
      extras: { errors: map, param: first },
    });
  }
  switch (fe?.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new ApiError('payload_too_large', "request body is over this endpoint's limit");
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new ApiError('unsupported_media_type', 'unsupported Content-Type; send application/json', {
        extras: { param: 'Content-Type' },
      });
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new ApiError('validation_failed', 'body must not be empty with Content-Type application/json');
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return new ApiError('validation_failed', 'invalid Content-Length');
  }
  const down = unavailableDependency(err);
  if (down) {
    return serviceUnavailable(
      down === 'network' ? 'a dependency is unavailable; retry shortly' : `the ${down} is unavailable; retry shortly`,
    );
  }
  if (fe instanceof SyntaxError || (fe as { statusCode?: number })?.statusCode === 400) {
    return new ApiError('validation_failed', `malformed request: ${fe.message}`);
  }
  return new ApiError('internal_error', 'an unexpected error occurred', { status: 500 });
}

/**
 * The problem document of `err` (docs/contract.md "Errors"): `type` and `docsUrl` absolute under `base`
 * (the API's public URL, cfg.publicUrl), `requestId`, and the error's extras.
 */
export function problemBody(err: ApiError, requestId: string, base: string): Record<string, unknown> {
  return {
    type: `${base}/problems/${err.code.replace(/_/g, '-')}`,
    title: titleFor(err.code),
    status: err.status,
    detail: err.detail,
    code: err.code,
    docsUrl: `${base}/docs#error-${err.code}`,
    requestId,
    ...err.extras,
  };
}

/** Sends a problem document for `err` on `reply`. */
export function sendProblem(request: FastifyRequest, reply: FastifyReply, err: ApiError): FastifyReply {
  const body = problemBody(err, request.id, request.server.deps?.cfg.publicUrl ?? '');
  for (const [k, v] of Object.entries(err.headers)) reply.header(k, v);
  return reply.code(err.status).type('application/problem+json').send(body);
}

export default fp(async function problemPlugin(app: FastifyInstance) {
  app.setErrorHandler((error, request, reply) => {
    // A request no route matches gets 404 or 405 whatever its body: the framework parses the body of the
    // not-found route first (and refuses a QUERY without Content-Type), which must not turn it into a 400/415.
    const apiErr = toApiError(error);
    // Roost-Version is still checked first (api/plugins/api-version.ts), on unknown routes too.
    if (request.is404 && apiErr.status < 500 && apiErr.code !== 'unsupported_version') return notFound(request, reply);
    // Path parameters this route refuses while another method's route takes the path (`DELETE
    // /api/installer/latest`: `latest` is no version, but `GET /api/installer/latest` exists): the path is that
    // route's, so the method is not allowed there (405), as the document says.
    if ((error as FastifyError).validationContext === 'params') {
      const allow = allowed(request, request.url.split('?')[0], true);
      if (allow.length > 0) return methodNotAllowed(request, reply, allow);
    }
    // A 503 with a code of its own answers a state the client asked about (`cortex_unavailable`: the machine
    // is offline), not a failure of ours: one info line without the stack.
    if (apiErr.status === 503 && apiErr.code !== 'service_unavailable')
      request.log.info({ code: apiErr.code, detail: apiErr.detail }, 'request refused: unavailable');
    else if (apiErr.status >= 500) request.log.error({ err: error }, 'request failed');
    return sendProblem(request, reply, apiErr);
  });
  // Every registered route, by method, so a known path asked with another method is 405 with `Allow`
  // rather than 404 (the framework's own router only knows "no match"). A method counts only when the path's
  // parameters fit that route's params schema, so `Allow` lists what the OpenAPI document lists for the path:
  // `/api/installer/latest` is not a `DELETE /api/installer/{version}` (a version is X.Y.Z). When no route's
  // parameters fit (`/api/roosts/<malformed id>`), the path still has the shape of the routes it matches: 405
  // with their methods.
  const known = Router({ maxParamLength: Number.MAX_SAFE_INTEGER });
  app.addHook('onRoute', (route) => {
    const params = route.schema?.params;
    const fits = KindGuard.IsSchema(params) ? (p: Record<string, string | undefined>) => Value.Check(params, p) : () => true;
    for (const method of Array.isArray(route.method) ? route.method : [route.method]) {
      try {
        known.on(method as HTTPMethod, route.url, () => undefined, { fits });
      } catch {
        /* the same method and path registered twice (HEAD beside GET): one entry is enough */
      }
    }
  });
  /** Methods other than the request's with a route for `path`: those whose parameters fit, else (unless `fittingOnly`) all. */
  const allowed = (request: FastifyRequest, path: string, fittingOnly = false): HTTPMethod[] => {
    const matched = ROUTER_METHODS.filter((m) => m !== request.method)
      .map((m) => ({ m, found: known.find(m, path) }))
      .filter((x) => x.found !== null);
    const fitting = matched.filter(({ found }) =>
      (found!.store as { fits: (p: Record<string, string | undefined>) => boolean }).fits(found!.params),
    );
    return (fitting.length > 0 || fittingOnly ? fitting : matched).map((x) => x.m);
  };
  function methodNotAllowed(request: FastifyRequest, reply: FastifyReply, allow: HTTPMethod[]): FastifyReply {
    const path = request.url.split('?')[0];
    return sendProblem(
      request,
      reply,
      new ApiError('method_not_allowed', `${request.method} is not a method of ${path}; it takes ${allow.join(', ')}`, {
        headers: { Allow: allow.join(', ') },
      }),
    );
  }
  function notFound(request: FastifyRequest, reply: FastifyReply): FastifyReply {
    const path = request.url.split('?')[0];
    const allow = allowed(request, path);
    if (allow.length > 0) return methodNotAllowed(request, reply, allow);
    return sendProblem(request, reply, new ApiError('not_found', `no route ${request.method} ${path}`));
  }
  app.setNotFoundHandler(notFound);
});
