/**
 * `roost keys create|list|rotate|revoke` (docs/contract.md "API keys, identity, version, quota":
 * POST /api/keys, GET /api/keys, POST /api/keys/{keyId}/rotate, DELETE /api/keys/{keyId}).
 *
 * These routes take a person's credential, never a key: the session stored by `roost login`, or an
 * OIDC ID token from `--id-token` / ROOST_ID_TOKEN (cli/context.ts userClient). The raw key of create
 * and rotate is printed once (alone on the first line of plain output, so `$(roost keys create …)`
 * works with `| head -1`). Scopes use the tooling grammar `<resource>=<id>:<perm>[,<perm>…]`.
 */
import { type Command, Option } from 'commander';
import { seg } from '../client';
import { commandContext, positiveInt, table, UsageError, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';
import { parseScopeSpec, type Scope } from '../../domain/scopes';
import { KEY_ENVIRONMENTS, KEY_PRESETS } from '../../domain/keys';

/** A key as the API shows it (never the raw key, except `key` right after create or rotate). */
interface KeyView {
  keyId: string;
  name: string;
  keyPrefix: string;
  scopes: Scope[];
  environment: string;
  status: string;
  expiresAt: number | null;
  lastUsedAt: number | null;
  key?: string;
  [extra: string]: unknown;
}

const idTokenOption = () => new Option('--id-token <jwt>', 'an OIDC ID token to act with (default: the roost login session)');

/** `resource=id:perm,…` as the tooling writes it. */
export function formatScope(s: Scope): string {
  return `${s.resource}=${s.id}:${s.permissions.join(',')}`;
}

const when = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());

function collectScope(raw: string, acc: Scope[] = []): Scope[] {
  try {
    return [...acc, parseScopeSpec(raw)];
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

export function registerKeys(program: Command): void {
  const keys = program.command('keys').description('your API keys (needs roost login or --id-token)');

  withJson(
    keys
      .command('create')
      .description('create an API key; the raw key is shown once')
      .requiredOption('--name <label>', 'label of the key')
      .option('--scope <spec>', 'a scope <resource>=<id>:<perm>[,<perm>…] (repeatable)', collectScope)
      .addOption(new Option('--preset <preset>', 'a preset instead of scopes').choices([...KEY_PRESETS]))
      .addOption(new Option('--environment <env>', 'live (default) or test').choices([...KEY_ENVIRONMENTS]))
      .option('--lifetime-days <days>', 'days until the key expires (default 90, max 365)', positiveInt('--lifetime-days'))
      .option('--primary-site <siteId>', 'the site whoami reports for the key')
      .addOption(idTokenOption()),
  ).action(
    async (
      opts: {
        name: string;
        scope?: Scope[];
        preset?: string;
        environment?: string;
        lifetimeDays?: number;
        primarySite?: string;
        idToken?: string;
      },
      cmd: Command,
    ) => {
      const ctx = commandContext(cmd);
      if (!opts.scope && !opts.preset) throw new UsageError('give --scope <spec> (repeatable) or --preset <preset>');
      const body: Record<string, unknown> = { name: opts.name };
      if (opts.scope) body.scopes = opts.scope;
      if (opts.preset) body.preset = opts.preset;
      if (opts.environment) body.environment = opts.environment;
      if (opts.lifetimeDays) body.lifetimeDays = opts.lifetimeDays;
      if (opts.primarySite) body.primarySiteId = opts.primarySite;
      const res = await ctx.userClient(opts.idToken).post<KeyView>('/api/keys', body);
      ctx.emit(res, () =>
        process.stdout.write(
          `${res.key}\ncreated ${res.keyId} (${res.name}), expires ${when(res.expiresAt) ?? 'never'}; the key is not shown again\n`,
        ),
      );
    },
  );

  withJson(
    addPagingOptions(keys.command('list').description('list your keys (never the raw keys)'), 'keys').addOption(idTokenOption()),
  ).action(async (opts: PagingOptions & { idToken?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const page = await fetchList<KeyView>(ctx.userClient(opts.idToken), '/api/keys', 'keys', {}, opts);
    ctx.emit({ keys: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no keys\n');
      process.stdout.write(
        table(
          ['KEY', 'NAME', 'PREFIX', 'STATUS', 'EXPIRES', 'LAST USED', 'SCOPES'],
          page.items.map((k) => [
            k.keyId,
            k.name,
            k.keyPrefix,
            k.status,
            when(k.expiresAt),
            when(k.lastUsedAt),
            k.scopes.map(formatScope).join(' '),
          ]),
        ) + '\n',
      );
      process.stdout.write(morePagesHint(page.next));
    });
  });

  withJson(
    keys
      .command('rotate')
      .description('issue a successor with the same scopes; the old key keeps working for 24 hours')
      .argument('<keyId>', 'key id (key_…)')
      .option('--lifetime-days <days>', "days until the new key expires (default: the old key's lifetime)", positiveInt('--lifetime-days'))
      .addOption(idTokenOption()),
  ).action(async (keyId: string, opts: { lifetimeDays?: number; idToken?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const res = await ctx
      .userClient(opts.idToken)
      .post<KeyView & { previous: { keyId: string; graceUntil: number } }>(
        `/api/keys/${seg(keyId)}/rotate`,
        opts.lifetimeDays ? { lifetimeDays: opts.lifetimeDays } : {},
      );
    ctx.emit(res, () =>
      process.stdout.write(
        `${res.key}\nrotated ${keyId} → ${res.keyId}; ${res.previous.keyId} works until ${when(res.previous.graceUntil)}; the key is not shown again\n`,
      ),
    );
  });

  withJson(
    keys
      .command('revoke')
      .description('revoke a key, at once and for good')
      .argument('<keyId>', 'key id (key_…)')
      .addOption(idTokenOption()),
  ).action(async (keyId: string, opts: { idToken?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const res = await ctx.userClient(opts.idToken).delete<KeyView & { alreadyRevoked: boolean }>(`/api/keys/${seg(keyId)}`);
    ctx.emit(res, () => process.stdout.write(`${res.keyId} ${res.alreadyRevoked ? 'was already revoked' : 'revoked'}\n`));
  });
}
