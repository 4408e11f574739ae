/**
 * `roost admin token --email <email> [--ttl <minutes>] [--json]`: prints an ID token for an existing user,
 * signed by the embedded default's local OIDC issuer (config/oidc.ts; docs/contract.md Authentication 1 and 4).
 * The token is what the key lifecycle routes need (`POST /api/keys`, …) and what `POST /api/auth/session`
 * exchanges for a session. Reads the database directly (like every `admin` command); refuses when the
 * configuration names an external issuer (ROOST_OIDC_ISSUER), whose tokens come from that issuer.
 *
 * Plain output is the token alone on one line (so `$(roost admin token --email …)` works); `--json`
 * prints {"idToken","expiresAt","userId","email","issuer"} (expiresAt in epoch ms).
 */
import type { Command } from 'commander';
import { UsageError } from '../context';
import { loadConfig } from '../../config/env';
import { createPool } from '../../db/pool';
import { migrate } from '../../db/migrate';
import { findUser } from '../../db/keys';
import { ensurePostgres } from '../../stack/services';
import { oidcSettings, signLocalIdToken } from '../../config/oidc';

/** Longest lifetime `--ttl` accepts, minutes (one day). */
export const MAX_TOKEN_TTL_MINUTES = 24 * 60;

/** Registers `token` under the `admin` command. */
export function registerToken(admin: Command): void {
  admin
    .command('token')
    .description('print an ID token for an existing user, signed by the local OIDC issuer')
    .requiredOption('--email <email>', "the user's email")
    .option('--ttl <minutes>', `lifetime in minutes (1..${MAX_TOKEN_TTL_MINUTES})`, '60')
    .option('--json', 'print {"idToken","expiresAt","userId","email","issuer"}')
    .action(async (opts: { email: string; ttl: string; json?: boolean }) => {
      const ttl = Number(opts.ttl);
      if (!Number.isInteger(ttl) || ttl < 1 || ttl > MAX_TOKEN_TTL_MINUTES)
        throw new UsageError(`--ttl must be a whole number of minutes from 1 to ${MAX_TOKEN_TTL_MINUTES}`);
      const cfg = loadConfig();
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
        const user = await findUser(pool, { email: opts.email });
        if (!user || user.deleted)
          throw new UsageError(`no user with email ${opts.email} (create one with: roost admin bootstrap --site <name> --email <email>)`);
        const { idToken, expiresAt } = await signLocalIdToken(cfg, { sub: user.uid, email: user.email, ttlSeconds: ttl * 60 });
        if (opts.json)
          process.stdout.write(JSON.stringify({ idToken, expiresAt, userId: user.uid, email: user.email, issuer: settings.issuer }) + '\n');
        else process.stdout.write(`${idToken}\n`);
      } finally {
        await pool.end();
      }
    });
}
