/**
 * `roost admin …`: operator commands that talk to the database directly (no API key needed).
 * `roost admin bootstrap --site <name> --email <email> [--json]` creates or reuses a superadmin user,
 * the site and a full-access API key, printing {"siteId","userId","apiKey"}. Idempotent. With `--sandbox` the
 * site is a sandbox site and the key a `svk_test_` key (docs/decisions/test-keys.md).
 * With the embedded default it starts PostgreSQL if it is not running.
 * `roost admin token --email <email> [--json]` prints an ID token for that user (cli/commands/token.ts).
 */
import type { Command } from 'commander';
import { UsageError } from '../context';
import { isIanaTimeZone } from '../../domain/users';
import { loadConfig } from '../../config/env';
import { createPool } from '../../db/pool';
import { migrate } from '../../db/migrate';
import { bootstrap } from '../../db/bootstrap';
import { ensurePostgres } from '../../stack/services';
import { bootstrapSecret } from '../../config/secrets';
import { registerToken } from './token';

export function registerAdmin(program: Command): void {
  const admin = program.command('admin').description('operator commands (direct database access)');
  admin
    .command('bootstrap')
    .description('create or reuse a superadmin, a site and a full-access API key (live, or test with --sandbox)')
    .requiredOption('--email <email>', 'superadmin email')
    .option('--timezone <iana>', 'site timezone (IANA)', 'UTC')
    .option('--sandbox', 'a sandbox site with a svk_test_ key (test keys act on sandbox sites only)')
    .option('--json', 'print {"siteId","userId","apiKey"}')
    .addHelpText(
      'after',
      '\nThe site is named with the global --site <name> option: roost admin bootstrap --site acme --email ops@acme.test',
    )
    .action(async (local: { email: string; timezone: string; sandbox?: boolean; json?: boolean }, cmd: Command) => {
      // `--site` is the program's global option (site id elsewhere); here it names the site.
      const opts = { ...local, site: cmd.optsWithGlobals<{ site?: string }>().site };
      if (!opts.site) throw new UsageError('--site <name> is required');
      if (!isIanaTimeZone(opts.timezone))
        throw new UsageError(`--timezone ${opts.timezone} is not an IANA time zone (e.g. Europe/Berlin, UTC)`);
      const cfg = loadConfig();
      if (cfg.embedded.postgres) await ensurePostgres(cfg);
      const pool = createPool(cfg.databaseUrl, 2);
      try {
        await migrate(pool);
        const r = await bootstrap(pool, {
          siteName: opts.site,
          email: opts.email,
          secret: bootstrapSecret(cfg),
          timezone: opts.timezone,
          environment: opts.sandbox ? 'test' : 'live',
        });
        if (opts.json) process.stdout.write(JSON.stringify({ siteId: r.siteId, userId: r.userId, apiKey: r.apiKey }) + '\n');
        else {
          const what = (b: boolean) => (b ? 'created' : 'reused');
          process.stdout.write(
            `site ${r.siteId} (${what(r.created.site)}), user ${r.userId} (${what(r.created.user)}), key ${r.apiKey.slice(0, 12)}… (${what(r.created.key)})\n` +
              `export ROOST_SITE_ID=${r.siteId} ROOST_API_KEY=${r.apiKey}\n`,
          );
        }
      } finally {
        await pool.end();
      }
    });
  registerToken(admin);
}
