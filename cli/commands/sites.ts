/**
 * `roost sites …`: sites and their members (routes in api/routes/sites.ts, docs/decisions/sites.md):
 *
 *   sites list [--all]                                  GET /api/sites (the sites the caller may act on)
 *   sites show [siteId]                                 GET /api/sites/{siteId} (default: --site)
 *   sites members [siteId] [--all]                      GET /api/sites/{siteId}/members
 *   sites create <name> [--owner uid] [--timezone tz] [--tier t] [--roost-enabled true|false]
 *                [--deploy-quota n] [--sandbox]         POST /api/sites (superadmins)
 *   sites update [siteId] [--name] [--owner] [--timezone] [--tier] [--roost-enabled] [--deploy-quota]
 *                                                       PATCH /api/sites/{siteId} (superadmins)
 *
 * Membership changes through `roost users assign-sites|remove-sites`. Every mutation sends one
 * Idempotency-Key per invocation.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { type CommandContext, commandContext, positiveInt, table, UsageError, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';
import { isIanaTimeZone } from '../../domain/users';

/** A site record (api/routes/sites.ts SiteView). */
interface SiteView {
  siteId: string;
  name: string;
  owner: string;
  createdAt: string;
  timezone: string;
  tier: string;
  roostEnabled: boolean;
  deployQuota: number;
  environment: string;
}

interface MemberView {
  uid: string;
  email: string;
  role: string;
  isOwner: boolean;
  joinedAt: string;
}

interface SettingOptions {
  name?: string;
  owner?: string;
  timezone?: string;
  tier?: string;
  roostEnabled?: boolean;
  deployQuota?: number;
}

function bool(flag: string): (raw: string) => boolean {
  return (raw) => {
    if (raw === 'true') return true;
    if (raw === 'false') return false;
    throw new UsageError(`${flag} must be true or false, got "${raw}"`);
  };
}

/** The options create and update share, named after the API's fields. */
function settingOptions(cmd: Command): Command {
  return cmd
    .option('--owner <uid>', 'owner (an admin or superadmin)')
    .option('--timezone <tz>', 'IANA time zone, e.g. Europe/Berlin', (tz: string) => {
      if (!isIanaTimeZone(tz)) throw new UsageError(`--timezone ${tz} is not an IANA time zone (e.g. Europe/Berlin, UTC)`);
      return tz;
    })
    .option('--tier <tier>', 'tier')
    .option('--roost-enabled <bool>', 'false: the roost routes answer 403 roost_disabled', bool('--roost-enabled'))
    .option('--deploy-quota <n>', 'classic deployment target ceiling', positiveInt('--deploy-quota'));
}

function settingsBody(o: SettingOptions): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (o.name !== undefined) body.name = o.name;
  if (o.owner !== undefined) body.ownerUid = o.owner;
  if (o.timezone !== undefined) body.timezone = o.timezone;
  if (o.tier !== undefined) body.tier = o.tier;
  if (o.roostEnabled !== undefined) body.roostEnabled = o.roostEnabled;
  if (o.deployQuota !== undefined) body.deployQuota = o.deployQuota;
  return body;
}

function describe(s: SiteView): string {
  return [
    `${s.siteId} ${s.name}${s.environment === 'test' ? ' (sandbox)' : ''}`,
    `  owner         ${s.owner}`,
    `  timezone      ${s.timezone}`,
    `  tier          ${s.tier}`,
    `  roostEnabled  ${s.roostEnabled}`,
    `  deployQuota   ${s.deployQuota}`,
    `  created       ${s.createdAt}`,
  ].join('\n');
}

const siteArg = (ctx: CommandContext, siteId: string | undefined) => siteId ?? ctx.siteId();

/** Registers `roost sites`. */
export function registerSites(program: Command): void {
  const sites = program.command('sites').description('sites, their settings and members');

  withJson(addPagingOptions(sites.command('list').description('the sites you may act on, by id'), 'sites')).action(
    async (o: PagingOptions, cmd: Command) => {
      const ctx = commandContext(cmd);
      const page = await fetchList<SiteView>(ctx.client(), '/api/sites', 'sites', {}, o);
      ctx.emit({ sites: page.items, next_page_token: page.next }, () => {
        if (page.items.length === 0) return void process.stdout.write('no sites\n');
        process.stdout.write(
          table(
            ['SITE', 'NAME', 'OWNER', 'TIMEZONE', 'TIER', 'ROOST', 'QUOTA'],
            page.items.map((s) => [s.siteId, s.name, s.owner, s.timezone, s.tier, s.roostEnabled ? 'on' : 'off', s.deployQuota]),
          ) + '\n',
        );
        process.stdout.write(morePagesHint(page.next));
      });
    },
  );

  withJson(sites.command('show').description("a site's settings (default: --site)").argument('[siteId]')).action(
    async (siteId: string | undefined, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const s = await ctx.client().get<SiteView>(`/api/sites/${seg(siteArg(ctx, siteId))}`);
      ctx.emit(s, () => process.stdout.write(`${describe(s)}\n`));
    },
  );

  withJson(
    addPagingOptions(
      sites.command('members').description("a site's members, owner included (default: --site)").argument('[siteId]'),
      'members',
    ),
  ).action(async (siteId: string | undefined, o: PagingOptions, cmd: Command) => {
    const ctx = commandContext(cmd);
    const id = siteArg(ctx, siteId);
    const page = await fetchList<MemberView>(ctx.client(), `/api/sites/${seg(id)}/members`, 'members', {}, o);
    ctx.emit({ siteId: id, members: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no members\n');
      process.stdout.write(
        table(
          ['UID', 'EMAIL', 'ROLE', 'OWNER', 'JOINED'],
          page.items.map((m) => [m.uid, m.email, m.role, m.isOwner ? 'yes' : '', m.joinedAt]),
        ) + '\n',
      );
      process.stdout.write(morePagesHint(page.next));
    });
  });

  withJson(
    settingOptions(
      sites
        .command('create')
        .description('create a site (superadmins; the owner defaults to you)')
        .argument('<name>')
        .option('--sandbox', 'a test site (svk_test_ keys)'),
    ),
  ).action(async (name: string, o: SettingOptions & { sandbox?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body = { ...settingsBody(o), name, ...(o.sandbox ? { environment: 'test' } : {}) };
    const s = await ctx.client().post<SiteView>('/api/sites', body, { idempotencyKey: true });
    ctx.emit(s, () => process.stdout.write(`created ${s.siteId}\n${describe(s)}\n`));
  });

  withJson(
    settingOptions(
      sites
        .command('update')
        .description("change a site's settings (superadmins; default: --site)")
        .argument('[siteId]')
        .option('--name <name>', 'new unique name'),
    ),
  ).action(async (siteId: string | undefined, o: SettingOptions, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body = settingsBody(o);
    if (Object.keys(body).length === 0)
      throw new UsageError('nothing to change: give --name, --owner, --timezone, --tier, --roost-enabled or --deploy-quota');
    const s = await ctx.client().patch<SiteView>(`/api/sites/${seg(siteArg(ctx, siteId))}`, body, { idempotencyKey: true });
    ctx.emit(s, () => process.stdout.write(`updated ${s.siteId}\n${describe(s)}\n`));
  });
}
