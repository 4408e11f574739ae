/**
 * The embedded default's local OIDC issuer (docs/contract.md Authentication 1: ID tokens; docs/decisions/oidc.md).
 *
 * One Ed25519 key pair is created once under DATA/oidc/signing-key.json (mode 0600, written atomically so
 * two processes starting together agree on one key). The issuer is the API's public URL; the API serves
 * the public half at `/.well-known/jwks.json` (and a discovery document at
 * `/.well-known/openid-configuration`). `roost admin token` signs ID tokens with the private half.
 *
 * Production sets ROOST_OIDC_ISSUER and ROOST_OIDC_JWKS_URL (and ROOST_OIDC_AUDIENCE): `oidcSettings`
 * then names the remote JWKS and nothing here is used to sign. Verification (api/plugins/auth.ts) is the
 * same code path for both: `jwtVerify` against a JWKS key resolver.
 */
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { calculateJwkThumbprint, exportJWK, generateKeyPair, importJWK, type JWK, SignJWT } from 'jose';
import type { Config } from './env';

/** The signing algorithm of the local issuer. */
export const LOCAL_ALG = 'EdDSA';

/** Where ID tokens come from and how they are checked. */
export interface OidcSettings {
  issuer: string;
  audience: string;
  /** `local`: the key pair under DATA/oidc (embedded default); `remote`: the issuer's JWKS URL. */
  jwks: { kind: 'local' } | { kind: 'remote'; url: string };
}

/**
 * The issuer settings of this configuration.
 * @throws Error when ROOST_OIDC_ISSUER is set without ROOST_OIDC_JWKS_URL (or the URL is not http(s)).
 */
export function oidcSettings(cfg: Config): OidcSettings {
  const audience = cfg.ROOST_OIDC_AUDIENCE;
  if (cfg.ROOST_OIDC_ISSUER) {
    const url = cfg.ROOST_OIDC_JWKS_URL;
    if (!url) throw new Error('invalid configuration: ROOST_OIDC_ISSUER is set but ROOST_OIDC_JWKS_URL is not');
    if (!/^https?:\/\//.test(url)) throw new Error('invalid configuration: ROOST_OIDC_JWKS_URL must be an http(s) URL');
    return { issuer: cfg.ROOST_OIDC_ISSUER, audience, jwks: { kind: 'remote', url } };
  }
  return { issuer: localIssuer(cfg), audience, jwks: { kind: 'local' } };
}

/** The local issuer's `iss`: the API's public URL without a trailing slash. */
export function localIssuer(cfg: Config): string {
  return cfg.publicUrl.replace(/\/+$/, '');
}

interface StoredKey {
  kid: string;
  alg: string;
  privateJwk: JWK;
  publicJwk: JWK;
}

const cache = new Map<string, StoredKey>();

function keyFile(cfg: Config): string {
  return path.join(cfg.ROOST_DATA_DIR, 'oidc', 'signing-key.json');
}

/**
 * The local key pair, created on first use. Creation writes a temporary file and hard-links it into
 * place, so a concurrent creator loses the race cleanly and both read the one winner.
 */
export async function localSigningKey(cfg: Config): Promise<StoredKey> {
  const file = keyFile(cfg);
  const hit = cache.get(file);
  if (hit) return hit;
  if (!fs.existsSync(file)) {
    const { privateKey, publicKey } = await generateKeyPair(LOCAL_ALG, { crv: 'Ed25519', extractable: true });
    const publicJwk = await exportJWK(publicKey);
    const kid = await calculateJwkThumbprint(publicJwk);
    const stored: StoredKey = {
      kid,
      alg: LOCAL_ALG,
      privateJwk: { ...(await exportJWK(privateKey)), kid, alg: LOCAL_ALG },
      publicJwk: { ...publicJwk, kid, alg: LOCAL_ALG, use: 'sig' },
    };
    fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify(stored, null, 2), { mode: 0o600, flag: 'wx' });
    try {
      fs.linkSync(tmp, file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    } finally {
      fs.unlinkSync(tmp);
    }
  }
  const stored = JSON.parse(fs.readFileSync(file, 'utf8')) as StoredKey;
  cache.set(file, stored);
  return stored;
}

/** The local issuer's public JWKS document ({ keys: [Ed25519 public JWK] }). */
export async function localJwks(cfg: Config): Promise<{ keys: JWK[] }> {
  return { keys: [(await localSigningKey(cfg)).publicJwk] };
}

/** The discovery document of the local issuer (the subset relying parties read). */
export function discoveryDocument(issuer: string): Record<string, unknown> {
  return {
    issuer,
    jwks_uri: `${issuer}/.well-known/jwks.json`,
    id_token_signing_alg_values_supported: [LOCAL_ALG],
    subject_types_supported: ['public'],
    response_types_supported: ['id_token'],
    claims_supported: ['iss', 'sub', 'aud', 'exp', 'iat', 'nbf', 'email', 'email_verified'],
  };
}

/** Claims of a locally issued ID token. `sub` is the Roost user id. */
export interface LocalIdTokenClaims {
  sub: string;
  email: string;
  /** Lifetime in seconds (default 3600). */
  ttlSeconds?: number;
  /** Not-before offset in seconds from now (default 0; tests use it). */
  notBeforeSeconds?: number;
  /** Overrides for tests of the verifier: another audience or issuer. */
  audience?: string;
  issuer?: string;
}

/**
 * Signs an ID token with the local issuer's key: iss, aud, sub, email, email_verified, iat, nbf, exp.
 * @returns the compact JWT and its expiry (epoch ms).
 * @throws Error when the configuration points at an external issuer (tokens come from it, not from us).
 */
export async function signLocalIdToken(cfg: Config, claims: LocalIdTokenClaims): Promise<{ idToken: string; expiresAt: number }> {
  const settings = oidcSettings(cfg);
  if (settings.jwks.kind !== 'local') {
    throw new Error(`ID tokens come from the configured issuer ${settings.issuer}; the local issuer is only for the embedded default`);
  }
  const key = await localSigningKey(cfg);
  const now = Math.floor(Date.now() / 1000);
  const exp = now + (claims.ttlSeconds ?? 3600);
  const idToken = await new SignJWT({ email: claims.email, email_verified: true })
    .setProtectedHeader({ alg: key.alg, kid: key.kid, typ: 'JWT' })
    .setIssuer(claims.issuer ?? settings.issuer)
    .setAudience(claims.audience ?? settings.audience)
    .setSubject(claims.sub)
    .setIssuedAt(now)
    .setNotBefore(now + (claims.notBeforeSeconds ?? 0))
    .setExpirationTime(exp)
    .sign(await importJWK(key.privateJwk, key.alg));
  return { idToken, expiresAt: exp * 1000 };
}
