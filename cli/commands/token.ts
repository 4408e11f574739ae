/**
 * `roost admin token --email <email> [--ttl <minutes>] [--json]`: prints an ID token for any email, signed by
 * the embedded default's local OIDC issuer (config/oidc.ts; docs/contract.md Authentication 1 and 4). It is a
 * development issuer: for an existing user the token's `sub` is the user's uid; for a new email it is
 * `local:<first 32 hex of SHA-256 of the lower-cased email>`, and the token's first use (`POST
 * /api/auth/session` or any route) creates the user as a `member` with no sites
 * (docs/decisions/user-sign-in.md). No user is written here.
 * The token is what the key lifecycle routes need (`POST /api/keys`, …) and what `POST /api/auth/session`
 * exchanges for a session. Reads the database directly (like every `admin` command); refuses when the
 * configuration names an external issuer (ROOST_OIDC_ISSUER), whose tokens come from that issuer.
 *
 * Plain output is the token alone on one line (so `$(roost admin token --email …)` works); `--json`
 * prints {"idToken","expiresAt","userId","email","issuer","subject"} (expiresAt in epoch ms; userId null for a new email).
 */
import type { Command } from 'commander';
import { UsageError } from '../context';
import { readConfig } from '../config';
import { loadConfig } from '../../config/env';
import { createPool } from '../../db/pool';
import { migrate } from '../../db/migrate';
import { findUser } from '../../db/keys';
import { sha256Hex } from '../../domain/hex';
import { EMAIL_RE } from '../../domain/users';
import { ensurePostgres } from '../../stack/services';
import { oidcSettings, signLocalIdToken } from '../../config/oidc';

/** Longest lifetime `--ttl` accepts, minutes (one day). */
export const MAX_TOKEN_TTL_MINUTES = 24 * 60;

/** Registers `token` under the `admin` command. */
export function registerToken(admin: Command): void {
  admin
    .command('token')
    .description('print an ID token for an email (a new email becomes a member on first sign-in), signed by the local OIDC issuer')
    .requiredOption('--email <email>', "the user's email")
    .option('--ttl <minutes>', `lifetime in minutes (1..${MAX_TOKEN_TTL_MINUTES})`, '60')
    .option('--json', 'print {"idToken","expiresAt","userId","email","issuer","subject"}')
    .action(async (opts: { email: string; ttl: string; json?: boolean }, cmd: Command) => {
      const ttl = Number(opts.ttl);
      if (!Number.isInteger(ttl) || ttl < 1 || ttl > MAX_TOKEN_TTL_MINUTES)
        throw new UsageError(`--ttl must be a whole number of minutes from 1 to ${MAX_TOKEN_TTL_MINUTES}`);
      const email = opts.email.trim();
      if (!EMAIL_RE.test(email)) throw new UsageError(`--email ${JSON.stringify(opts.email)} is not an email address`);
      const cfg = loadConfig(issuerEnv(cmd.optsWithGlobals<{ api?: string }>().api ?? readConfig().api));
      const settings = oidcSettings(cfg);
      if (settings.jwks.kind !== 'local') {
        throw new UsageError(
          `this configuration trusts the external issuer ${settings.issuer}; get ID tokens from it (unset ROOST_OIDC_ISSUER for the local issuer)`,
        );
      }
      if (cfg.embedded.postgres) await ensurePostgres(cfg);
      const pool = createPool(cfg.databaseUrl, 2);
      try {
        await migrate(pool);
        const user = await findUser(pool, { email });
        if (user?.deleted) throw new UsageError(`the user with email ${email} was deleted; their sign-in is refused`);
        const subject = user ? user.uid : localSubject(email);
        const tokenEmail = user ? user.email : email;
        const { idToken, expiresAt } = await signLocalIdToken(cfg, { sub: subject, email: tokenEmail, ttlSeconds: ttl * 60 });
        if (opts.json)
          process.stdout.write(
            JSON.stringify({ idToken, expiresAt, userId: user?.uid ?? null, email: tokenEmail, issuer: settings.issuer, subject }) + '\n',
          );
        else process.stdout.write(`${idToken}\n`);
      } finally {
        await pool.end();
      }
    });
}

/**
 * The environment the token is signed under. The local issuer's `iss` is the API's public URL
 * (config/oidc.ts `localIssuer`): ROOST_PUBLIC_URL when set, else the API this CLI is pointed at (`api`:
 * --api, ROOST_API_URL or the config file's), else http://ROOST_API_HOST:ROOST_API_PORT. So a token made
 * for an API on a port other than the default is one that API accepts without also setting its port here.
 */
export function issuerEnv(api: string | undefined, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  if (env.ROOST_PUBLIC_URL || !api) return env;
  return { ...env, ROOST_PUBLIC_URL: api.replace(/\/+$/, '') };
}

/** The local issuer's subject for an email that has no user yet (stable, so every token of the email names one identity). */
export function localSubject(email: string): string {
  return `local:${sha256Hex(email.toLowerCase()).slice(0, 32)}`;
}
