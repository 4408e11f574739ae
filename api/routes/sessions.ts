/**
 * First-party sessions and the local OIDC issuer's public documents (services/sessions.ts;
 * docs/decisions/sessions.md, docs/decisions/oidc.md):
 *
 * - `POST /api/auth/session` (no credential; body `idToken`): exchanges a valid ID token for an opaque
 *   session token `sst_…` (201; shown once, stored as a SHA-256 digest), used as `Authorization: Bearer`.
 * - `GET /api/auth/session`: the session the request was made with.
 * - `DELETE /api/auth/session`: signs that session out, at once.
 * - `GET /.well-known/jwks.json`, `GET /.well-known/openid-configuration`: the embedded issuer's public
 *   key and discovery document (404 when an external issuer is configured).
 */
import type { FastifyRequest } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { discoveryDocument, localJwks, oidcSettings } from '../../config/oidc';
import { exchangeIdToken, getSession, type SessionRow, signOut } from '../../services/sessions';
import { requireUser } from '../plugins/auth';
import { Problem } from '../../domain/schemas';

const ExchangeBody = Type.Object(
  { idToken: Type.String({ minLength: 1, maxLength: 16384, description: 'an OIDC ID token (compact JWT) from the configured issuer' }) },
  { additionalProperties: false },
);

const SessionView = Type.Object({
  sessionId: Type.String(),
  userId: Type.String(),
  createdAt: Type.Number({ description: 'epoch milliseconds' }),
  expiresAt: Type.Number({ description: 'epoch milliseconds; the session is not extended by use' }),
  lastUsedAt: Type.Union([Type.Number(), Type.Null()], { description: 'epoch milliseconds, about one-minute resolution' }),
});
type SessionView = Static<typeof SessionView>;

const SessionCreated = Type.Composite([
  SessionView,
  Type.Object({
    sessionToken: Type.String({ description: 'sst_…; returned once; send as Authorization: Bearer' }),
    tokenType: Type.Literal('Bearer'),
    email: Type.String(),
    role: Type.String(),
  }),
]);

function view(r: SessionRow): SessionView {
  return { sessionId: r.session_id, userId: r.uid, createdAt: r.created_at, expiresAt: r.expires_at, lastUsedAt: r.last_used_at };
}

/** The session principal of a request; other credentials get 403 forbidden (they have no session). */
function currentSession(request: FastifyRequest): { userId: string; sessionId: string } {
  const user = requireUser(request);
  if (user.credential !== 'session' || !user.sessionId) {
    throw new ApiError('forbidden', 'this request was not made with a session token (sst_…)');
  }
  return { userId: user.userId, sessionId: user.sessionId };
}

/** Registers the session routes and the issuer documents. */
const sessionRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const settings = oidcSettings(app.deps.cfg);

  app.post(
    '/api/auth/session',
    {
      // The spec's tokenExchange bucket (IP; 60 per hour in production) guards the exchange.
      config: { auth: 'none', idempotency: 'ignored', rateLimit: 'tokenExchange' },
      schema: {
        tags: ['identity'],
        summary: 'Exchange an ID token for a session token (sst_…, shown once)',
        security: [],
        body: ExchangeBody,
        response: { 201: SessionCreated, 400: Problem, 401: Problem, 503: Problem },
      },
    },
    async (request, reply) => {
      const { row, token, email, role } = await exchangeIdToken(app.deps, {
        idToken: request.body.idToken,
        ip: request.ip,
        userAgent: typeof request.headers['user-agent'] === 'string' ? request.headers['user-agent'] : null,
      });
      reply.code(201).header('Cache-Control', 'no-store');
      return { ...view(row), sessionToken: token, tokenType: 'Bearer' as const, email, role };
    },
  );

  app.get(
    '/api/auth/session',
    {
      schema: {
        tags: ['identity'],
        summary: 'The session this request was made with',
        response: { 200: SessionView, 401: Problem, 403: Problem },
      },
    },
    async (request) => {
      const { userId, sessionId } = currentSession(request);
      return view(await getSession(app.deps, userId, sessionId));
    },
  );

  app.delete(
    '/api/auth/session',
    {
      config: { idempotency: 'ignored' },
      schema: {
        tags: ['identity'],
        summary: 'Sign out: end the session this request was made with, at once',
        response: {
          200: Type.Composite([SessionView, Type.Object({ revoked: Type.Literal(true), revokedAt: Type.Number() })]),
          401: Problem,
          403: Problem,
        },
      },
    },
    async (request) => {
      const { userId, sessionId } = currentSession(request);
      // Authentication just saw it live; signOut answers 401 when a concurrent sign-out won the race.
      const row = await signOut(app.deps, userId, sessionId);
      return { ...view(row), revoked: true as const, revokedAt: row.revoked_at as number };
    },
  );

  const notLocal = () => new ApiError('not_found', 'ID tokens come from the configured external issuer; see its own discovery document');

  app.get(
    '/.well-known/jwks.json',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['identity'],
        summary: "The embedded OIDC issuer's public keys (JWKS)",
        security: [],
        response: { 200: Type.Object({ keys: Type.Array(Type.Object({}, { additionalProperties: true })) }), 404: Problem },
      },
    },
    async (_request, reply) => {
      if (settings.jwks.kind !== 'local') throw notLocal();
      reply.header('Cache-Control', 'public, max-age=300');
      return localJwks(app.deps.cfg);
    },
  );

  app.get(
    '/.well-known/openid-configuration',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['identity'],
        summary: "The embedded OIDC issuer's discovery document",
        security: [],
        response: { 200: Type.Object({ issuer: Type.String(), jwks_uri: Type.String() }, { additionalProperties: true }), 404: Problem },
      },
    },
    async (_request, reply) => {
      if (settings.jwks.kind !== 'local') throw notLocal();
      reply.header('Cache-Control', 'public, max-age=300');
      return discoveryDocument(settings.issuer) as { issuer: string; jwks_uri: string };
    },
  );
};

export default sessionRoutes;
