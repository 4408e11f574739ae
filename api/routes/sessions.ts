/**
 * First-party sessions and the local OIDC issuer's public documents (SPEC.md Authentication 1;
 * docs/decisions/sessions.md, docs/decisions/oidc.md):
 *
 * - `POST /api/auth/session` (no credential; body `idToken`): exchanges a valid ID token for an opaque
 *   session token `sst_…` (201; shown once, stored as a SHA-256 digest), used as `Authorization: Bearer`.
 * - `GET /api/auth/session`: the session the request was made with.
 * - `DELETE /api/auth/session`: signs that session out, at once.
 * - `GET /.well-known/jwks.json`, `GET /.well-known/openid-configuration`: the embedded issuer's public
 *   key and discovery document (404 when an external issuer is configured).
 */
import type { FastifyInstance } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { createSession, findSession, revokeSession, type SessionRow } from '../../db/sessions';
import { discoveryDocument, localJwks, oidcSettings } from '../../config/oidc';
import { requireUser, userForIdToken, verifyIdToken } from '../plugins/auth';
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

/** Registers the session routes and the issuer documents. */
export default async function sessionRoutes(root: FastifyInstance): Promise<void> {
  const app = root.withTypeProvider<TypeBoxTypeProvider>();
  const settings = oidcSettings(app.deps.cfg);

  /** The session principal of a request; other credentials get 403 forbidden (they have no session). */
  const currentSession = (request: Parameters<typeof requireUser>[0]) => {
    const user = requireUser(request);
    if (user.credential !== 'session' || !user.sessionId) {
      throw new ApiError('forbidden', 'this request was not made with a session token (sst_…)');
    }
    return { user, sessionId: user.sessionId };
  };

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
      const claims = await verifyIdToken(app, request.body.idToken);
      const user = await userForIdToken(app, claims);
      const { token, row } = await createSession(app.deps.db, {
        uid: user.uid,
        issuer: String(claims.iss ?? settings.issuer),
        subject: String(claims.sub ?? ''),
        ttlMs: app.deps.cfg.ROOST_SESSION_TTL_MINUTES * 60_000,
        ip: request.ip,
        userAgent: typeof request.headers['user-agent'] === 'string' ? request.headers['user-agent'] : null,
      });
      reply.code(201).header('Cache-Control', 'no-store');
      return { ...view(row), sessionToken: token, tokenType: 'Bearer' as const, email: user.email, role: user.role };
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
      const { user, sessionId } = currentSession(request);
      const row = await findSession(app.deps.db, sessionId, user.userId);
      if (!row) throw new ApiError('unauthorized', 'unknown session');
      return view(row);
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
      const { user, sessionId } = currentSession(request);
      const row = await revokeSession(app.deps.db, sessionId, user.userId);
      // Authentication just saw it live; a concurrent sign-out won the race.
      if (!row) throw new ApiError('unauthorized', 'this session was signed out');
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
}
