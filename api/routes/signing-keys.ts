/**
 * Site signing keys (services/signing.ts; docs/decisions/signed-manifests.md):
 *
 *   GET /api/sites/{siteId}/signing-keys   the site's public Ed25519 keys as a JWK set (site read)
 *   GET /api/agent/signing-keys            the same set for the calling agent's own site (agent token)
 *
 * Every version the service publishes is signed with the site's active key over
 * `roost-version-v1:<siteId>:<roostId>:<versionId>`; agents pin the keys they get at enrolment and
 * refresh them only over their authenticated agent channel (the second route). The first call for a
 * site without a key creates it (db/signing-keys.ts).
 */
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { listSigningKeys, sealKeyOf } from '../../services/signing';
import { authorizeSite, requireAgent } from '../plugins/auth';
import { Problem, SiteId } from '../../domain/schemas';

/** A public key in JWK form (RFC 8037) plus whether new signatures use it. */
export const SigningKeyJwk = Type.Object({
  kty: Type.Literal('OKP'),
  crv: Type.Literal('Ed25519'),
  x: Type.String({ description: 'base64url raw 32-byte public key' }),
  kid: Type.String({ description: 'key id: sk_ + 24 hex of SHA-256(raw public key)' }),
  alg: Type.Literal('EdDSA'),
  use: Type.Literal('sig'),
  active: Type.Boolean({ description: 'true for the key that signs new versions' }),
  createdAt: Type.String({ format: 'date-time' }),
});

const KeySet = Type.Object({
  siteId: Type.String(),
  signatureMessage: Type.String({ description: 'what each version signature covers' }),
  keys: Type.Array(SigningKeyJwk),
});

const MESSAGE_FORMAT = 'roost-version-v1:<siteId>:<roostId>:<versionId>';

/** Registers the signing-key routes. */
const signingKeyRoutes: FastifyPluginAsyncTypebox = async (app) => {
  /** The site's key set (creating its first key when it has none). */
  async function keySet(siteId: string): Promise<Static<typeof KeySet>> {
    const keys = await listSigningKeys(app.deps.db, sealKeyOf(app.deps.cfg), siteId);
    return {
      siteId,
      signatureMessage: MESSAGE_FORMAT,
      keys: keys.map((k) => ({ ...k.jwk, active: k.active, createdAt: k.createdAt.toISOString() })),
    };
  }

  app.get(
    '/api/sites/:siteId/signing-keys',
    {
      schema: {
        tags: ['versions'],
        summary: "The site's public Ed25519 signing keys (JWK set); version signatures verify against them",
        params: Type.Object({ siteId: SiteId }),
        response: { 200: KeySet, 400: Problem, 401: Problem, 403: Problem, 404: Problem },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      // authorizeSite answers 404 for a site that does not exist.
      await authorizeSite(request, siteId, [{ resource: 'site', id: siteId, permission: 'read' }]);
      return keySet(siteId);
    },
  );

  app.get(
    '/api/agent/signing-keys',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: "The public signing keys of this agent's site (refresh of the set pinned at enrolment)",
        response: { 200: KeySet, 401: Problem },
      },
    },
    async (request) => keySet(requireAgent(request).siteId),
  );
};

export default signingKeyRoutes;
