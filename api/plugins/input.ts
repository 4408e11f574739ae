/**
 * Client input checked once for every route (domain/input.ts, docs/decisions/hostile-input.md):
 *
 * - JSON bodies are parsed here instead of by Fastify's default parser, then walked once: U+0000, lone
 *   surrogates, nesting deeper than MAX_JSON_DEPTH and prototype keys are 400 `validation_failed` naming the
 *   field (`errors` keyed by the dotted path, as schema errors are). An empty or malformed body is 400 too.
 * - Query and path parameters get the same text rule before schema validation.
 * - A body in a content coding (`Content-Encoding: gzip`, …) is 415 unsupported_media_type: nothing is decoded.
 *
 * Route body limits still apply first (Fastify reads at most the route's `bodyLimit` bytes).
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../../domain/errors';
import { jsonInputProblem, textProblem } from '../../domain/input';

function refuse(param: string, message: string): ApiError {
  return new ApiError('validation_failed', `${param} ${message}`, { extras: { param, errors: { [param]: [message] } } });
}

/** Parses a JSON body and applies the input rule; throws ApiError 400 validation_failed. */
export function parseJsonBody(text: string): unknown {
  if (text.length === 0) throw new ApiError('validation_failed', 'body must not be empty with Content-Type application/json');
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new ApiError('validation_failed', `body is not valid JSON: ${(err as Error).message}`, { extras: { param: 'body' } });
  }
  const problem = jsonInputProblem(value);
  if (problem) throw refuse(problem.path === '' ? 'body' : problem.path, problem.message);
  return value;
}

/**
 * The first query component of `rawUrl` that is not valid percent-encoded UTF-8 (the query parser would
 * otherwise pass the bytes on as replacement characters), as an ApiError, or null.
 */
export function queryEncodingProblem(rawUrl: string): ApiError | null {
  const q = rawUrl.indexOf('?');
  if (q < 0) return null;
  for (const pair of rawUrl.slice(q + 1).split('&')) {
    const eq = pair.indexOf('=');
    const [name, value] = eq < 0 ? [pair, ''] : [pair.slice(0, eq), pair.slice(eq + 1)];
    let decodedName = name;
    try {
      decodedName = decodeURIComponent(name.replace(/\+/g, ' '));
      decodeURIComponent(value.replace(/\+/g, ' '));
    } catch {
      return refuse(decodedName || 'query', 'is not valid percent-encoded UTF-8');
    }
  }
  return null;
}

/** The first query or path parameter the text rule refuses, as an ApiError, or null. */
export function parameterProblem(request: FastifyRequest): ApiError | null {
  const encoding = queryEncodingProblem(request.raw.url ?? request.url);
  if (encoding) return encoding;
  for (const source of [request.params, request.query]) {
    if (!source || typeof source !== 'object') continue;
    for (const [name, raw] of Object.entries(source as Record<string, unknown>)) {
      const nameWhy = textProblem(name);
      if (nameWhy) return refuse('query', `parameter name ${nameWhy}`);
      for (const v of Array.isArray(raw) ? raw : [raw]) {
        if (typeof v !== 'string') continue;
        const why = textProblem(v);
        if (why) return refuse(name, why);
      }
    }
  }
  return null;
}

/**
 * 415 unsupported_media_type (param Content-Encoding) when a request with a body names a content coding other
 * than `identity` (RFC 9110 8.4: the API decodes none), else null.
 */
export function contentEncodingProblem(headers: FastifyRequest['headers']): ApiError | null {
  const coding = String(headers['content-encoding'] ?? '')
    .trim()
    .toLowerCase();
  const hasBody = headers['transfer-encoding'] !== undefined || Number(headers['content-length'] ?? 0) > 0;
  if (!hasBody || coding === '' || coding === 'identity') return null;
  return new ApiError('unsupported_media_type', `Content-Encoding ${coding} is not accepted: send the body uncompressed`, {
    extras: { param: 'Content-Encoding' },
  });
}

export default fp(
  async function inputPlugin(app: FastifyInstance) {
    app.removeContentTypeParser('application/json');
    // No route takes text: a text/plain body is 415 unsupported_media_type like any other foreign type.
    app.removeContentTypeParser('text/plain');
    app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
      try {
        done(null, parseJsonBody(body as string));
      } catch (err) {
        done(err as Error, undefined);
      }
    });
    // Request bodies are read as sent: a body in a content coding (gzip, br, …) is 415, not a JSON error.
    app.addHook('preParsing', async (request, _reply, payload) => {
      const problem = contentEncodingProblem(request.headers);
      if (problem) throw problem;
      return payload;
    });
    app.addHook('preValidation', async (request) => {
      const problem = parameterProblem(request);
      if (problem) throw problem;
    });
  },
  { name: 'roost-input' },
);
