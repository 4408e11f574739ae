/**
 * Operator bootstrap (`roost admin bootstrap`): creates or reuses a superadmin user, a site owned by it,
 * and an API key with every scope on every resource: a live site with a `svk_live_` key, or a sandbox site
 * (`environment: 'test'`, docs/decisions/test-keys.md) with a `svk_test_` key. Re-running returns the same ids and the same
 * key: the raw key is derived as HMAC-SHA256(bootstrap secret, site id + user id), so it can be shown
 * again without ever being stored (only its digest is).
 */
import { createHmac } from 'node:crypto';
import type { Pool } from 'pg';
import { withTx } from './pool';
import { addSiteMember, insertSite } from './sites';
import { DEFAULT_DEPLOY_QUOTA } from '../domain/classic';
import { newId, sha256Hex } from '../domain/hex';
import { PERMISSIONS, RESOURCES, type Scope } from '../domain/scopes';
import type { KeyEnvironment } from '../domain/keys';

export interface BootstrapResult {
  siteId: string;
  userId: string;
  apiKey: string;
  keyId: string;
  created: { user: boolean; site: boolean; key: boolean };
}

/** Every resource, id `*`, every permission. */
export function fullAccessScopes(): Scope[] {
  return RESOURCES.map((resource) => ({ resource, id: '*', permissions: [...PERMISSIONS] }));
}

/** Raw key for (site, user) under `secret`: `svk_<environment>_` + 43 base64url chars. */
export function deriveBootstrapKey(secret: string, siteId: string, userId: string, environment: KeyEnvironment = 'live'): string {
  return `svk_${environment}_${createHmac('sha256', secret).update(`bootstrap:${siteId}:${userId}`).digest('base64url')}`;
}

/** Display prefix of a raw key (first 12 characters). */
export function keyPrefixOf(raw: string): string {
  return raw.slice(0, 12);
}

/**
 * Idempotent bootstrap. `secret` signs the derived key (the embedded default keeps one under the data
 * folder; production passes ROOST_BOOTSTRAP_SECRET).
 */
export async function bootstrap(
  pool: Pool,
  opts: { siteName: string; email: string; secret: string; timezone?: string; environment?: KeyEnvironment },
): Promise<BootstrapResult> {
  return withTx(pool, async (tx) => {
    const created = { user: false, site: false, key: false };
    let user = (await tx.query<{ uid: string; role: string }>('SELECT uid, role FROM users WHERE email = $1', [opts.email])).rows[0];
    if (!user) {
      user = { uid: newId('usr'), role: 'superadmin' };
      await tx.query(`INSERT INTO users (uid, email, role) VALUES ($1, $2, 'superadmin')`, [user.uid, opts.email]);
      created.user = true;
    } else if (user.role !== 'superadmin') {
      await tx.query(`UPDATE users SET role = 'superadmin', deleted = false, updated_at = now() WHERE uid = $1`, [user.uid]);
    }
    const environment = opts.environment ?? 'live';
    let site = (
      await tx.query<{ site_id: string; environment: KeyEnvironment }>('SELECT site_id, environment FROM sites WHERE name = $1', [
        opts.siteName,
      ])
    ).rows[0];
    if (!site) {
      // The same insert as `POST /api/sites` (services/sites.ts): one way a site comes to exist.
      const made = await insertSite(tx, {
        siteId: newId('site'),
        name: opts.siteName,
        ownerUid: user.uid,
        timezone: opts.timezone ?? 'UTC',
        tier: 'standard',
        roostEnabled: true,
        deployQuota: DEFAULT_DEPLOY_QUOTA,
        environment,
      });
      if (!made) throw new Error(`site ${opts.siteName} was created concurrently; run the bootstrap again`);
      site = { site_id: made.site_id, environment };
      created.site = true;
    } else if (site.environment !== environment) {
      throw new Error(
        `site ${opts.siteName} is a ${site.environment === 'test' ? 'sandbox' : 'live'} site; it cannot be bootstrapped as ${environment === 'test' ? 'a sandbox' : 'a live'} one`,
      );
    }
    await addSiteMember(tx, site.site_id, user.uid);
    const apiKey = deriveBootstrapKey(opts.secret, site.site_id, user.uid, environment);
    const digest = sha256Hex(apiKey);
    let key = (await tx.query<{ key_id: string; status: string }>('SELECT key_id, status FROM api_keys WHERE key_hash = $1', [digest]))
      .rows[0];
    if (!key) {
      key = { key_id: newId('key'), status: 'active' };
      await tx.query(
        `INSERT INTO api_keys (key_id, uid, name, key_prefix, key_hash, scopes, environment, primary_site_id, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $8, $7, NULL)`,
        [
          key.key_id,
          user.uid,
          `bootstrap ${opts.siteName}`,
          keyPrefixOf(apiKey),
          digest,
          JSON.stringify(fullAccessScopes()),
          site.site_id,
          environment,
        ],
      );
      created.key = true;
    } else if (key.status !== 'active') {
      throw new Error(`the bootstrap key for this site was ${key.status}; create a new key through the API`);
    }
    return { siteId: site.site_id, userId: user.uid, apiKey, keyId: key.key_id, created };
  });
}

/**
 * Creates (or rotates) the site's agent enrolment secret; returns the raw secret (`ses_…`). Agents
 * present it once to enrol and receive their own `sat_` token.
 */
export async function setEnrolmentSecret(pool: Pool, siteId: string, secret: string): Promise<void> {
  await pool.query('UPDATE sites SET enrolment_secret_hash = $2 WHERE site_id = $1', [siteId, sha256Hex(secret)]);
}
