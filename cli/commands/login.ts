/**
 * `roost login`, `roost logout` and `roost config …`: the person's session and the CLI's stored
 * defaults (cli/config.ts).
 *
 *   login --id-token <jwt> | --with-token   POST /api/auth/session: exchanges an OIDC ID token (from the
 *                                           flag, or stdin with --with-token, as `gh auth login` does)
 *                                           for a session and stores it in the config file (0600)
 *   logout                                  DELETE /api/auth/session, then forgets the stored session
 *   config path|get [name]|set <name> <v>|unset <name>   api, site and key defaults
 */
import fs from 'node:fs';
import { type Command } from 'commander';
import { ClientError, RoostClient } from '../client';
import { commandContext, UsageError, withJson } from '../context';
import { configPath, readConfig, SETTABLE_KEYS, type SettableKey, type StoredSession, updateConfig } from '../config';

interface SessionCreated {
  sessionId: string;
  userId: string;
  expiresAt: number;
  sessionToken: string;
  email: string;
  role: string;
}

function settable(name: string): SettableKey {
  if (!(SETTABLE_KEYS as readonly string[]).includes(name))
    throw new UsageError(`unknown setting "${name}": use ${SETTABLE_KEYS.join(', ')}`);
  return name as SettableKey;
}

/** Masks a credential for display: its first 12 characters. */
function masked(v: string | undefined): string | undefined {
  return v === undefined ? undefined : `${v.slice(0, 12)}…`;
}

export function registerLogin(program: Command): void {
  withJson(
    program
      .command('login')
      .description('sign in with an OIDC ID token and keep the session in the config file')
      .option('--id-token <jwt>', 'the ID token (e.g. from your identity provider, or roost admin token)')
      .option('--with-token', 'read the ID token from standard input'),
  ).action(async (opts: { idToken?: string; withToken?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const idToken = opts.withToken ? fs.readFileSync(0, 'utf8').trim() : opts.idToken;
    if (!idToken) throw new UsageError('give --id-token <jwt>, or pipe it in with --with-token');
    const res = await ctx.anonymousClient().post<SessionCreated>('/api/auth/session', { idToken });
    const session: StoredSession = {
      token: res.sessionToken,
      api: ctx.globals.api,
      sessionId: res.sessionId,
      userId: res.userId,
      email: res.email,
      expiresAt: res.expiresAt,
    };
    updateConfig((c) => ({ ...c, session }));
    const shown = {
      api: session.api,
      sessionId: res.sessionId,
      userId: res.userId,
      email: res.email,
      role: res.role,
      expiresAt: res.expiresAt,
    };
    ctx.emit({ ...shown, configPath: configPath() }, () =>
      process.stdout.write(
        `signed in to ${session.api} as ${res.email} (${res.role}) until ${new Date(res.expiresAt).toISOString()}; session kept in ${configPath()}\n`,
      ),
    );
  });

  withJson(program.command('logout').description('end the stored session (server and config file)')).action(
    async (_opts: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const session = readConfig().session;
      if (!session) throw new UsageError('not signed in');
      let serverEnded = true;
      try {
        await new RoostClient({ baseUrl: session.api, apiKey: session.token, maxAttempts: 2 }).delete('/api/auth/session');
      } catch (err) {
        // An expired or already ended session is gone on the server too; anything else is reported.
        if (!(err instanceof ClientError && err.status === 401)) throw err;
        serverEnded = false;
      }
      updateConfig(({ session: _gone, ...rest }) => rest);
      ctx.emit({ signedOut: true, email: session.email, serverSessionEnded: serverEnded }, () =>
        process.stdout.write(`signed out ${session.email}${serverEnded ? '' : ' (the session had already ended)'}\n`),
      );
    },
  );

  const config = program.command('config').description(`stored defaults for --api, --site and --key (${SETTABLE_KEYS.join(', ')})`);
  withJson(config.command('path').description('print where the config file lives')).action((_o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    ctx.emit({ configPath: configPath() }, () => process.stdout.write(`${configPath()}\n`));
  });
  withJson(
    config.command('get').description('print the stored settings (credentials masked)').argument('[name]', SETTABLE_KEYS.join(' | ')),
  ).action((name: string | undefined, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const c = readConfig();
    const view = {
      api: c.api,
      site: c.site,
      key: masked(c.key),
      session: c.session ? { api: c.session.api, email: c.session.email, expiresAt: c.session.expiresAt } : undefined,
    };
    if (name !== undefined) {
      const k = settable(name);
      const value = k === 'key' ? masked(c.key) : c[k];
      ctx.emit({ [k]: value ?? null }, () => process.stdout.write(`${value ?? ''}\n`));
      return;
    }
    ctx.emit(view, () =>
      process.stdout.write(
        `api      ${view.api ?? '-'}\nsite     ${view.site ?? '-'}\nkey      ${view.key ?? '-'}\nsession  ${
          view.session ? `${view.session.email} until ${new Date(view.session.expiresAt).toISOString()}` : '-'
        }\n`,
      ),
    );
  });
  withJson(
    config.command('set').description('store a default').argument('<name>', SETTABLE_KEYS.join(' | ')).argument('<value>', 'the value'),
  ).action((name: string, value: string, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const k = settable(name);
    updateConfig((c) => ({ ...c, [k]: value }));
    ctx.emit({ [k]: k === 'key' ? masked(value) : value, configPath: configPath() }, () =>
      process.stdout.write(`${k} stored in ${configPath()}\n`),
    );
  });
  withJson(config.command('unset').description('forget a default').argument('<name>', SETTABLE_KEYS.join(' | '))).action(
    (name: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const k = settable(name);
      updateConfig(({ [k]: _gone, ...rest }) => rest);
      ctx.emit({ unset: k }, () => process.stdout.write(`${k} removed from ${configPath()}\n`));
    },
  );
}
