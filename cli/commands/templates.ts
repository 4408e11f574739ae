/**
 * `roost templates …`: installer templates, the defaults of classic deployments (`--template` of
 * `roost deployments create`; routes in api/routes/installer-templates.ts). Not the agent-installer catalog.
 *
 *   templates list [--all]                        GET    /api/sites/{siteId}/installer-templates (newest first)
 *   templates show <templateId>                   GET    …/installer-templates/{templateId}
 *   templates create <name> --url --installer [--flags] [--verify-path] [--close] [--timeout]
 *                                                 POST   …/installer-templates
 *   templates update <templateId> [--name] [--url] [--installer] [--flags] [--verify-path|--no-verify-path]
 *                    [--close] [--timeout|--no-timeout]   PATCH  …/installer-templates/{templateId}
 *   templates delete <templateId>                 DELETE …/installer-templates/{templateId}
 *
 * Every mutation sends one Idempotency-Key per invocation.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { type CommandContext, commandContext, idList, positiveInt, table, UsageError, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';

/** An installer template (api/routes/installer-templates.ts TemplateRecord). */
interface Template {
  templateId: string;
  name: string;
  installer_name: string;
  installer_url: string;
  silent_flags: string;
  verify_path: string | null;
  close_processes: string[];
  timeout_seconds: number | null;
  updatedAt: string;
}

interface FieldOptions {
  name?: string;
  url?: string;
  installer?: string;
  flags?: string;
  verifyPath?: string | false;
  close?: string[];
  timeout?: number | false;
}

const base = (ctx: CommandContext) => `/api/sites/${seg(ctx.siteId())}/installer-templates`;

/** The API's fields from the options given (false clears a nullable field). */
function fieldsOf(o: FieldOptions): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (o.name !== undefined) body.name = o.name;
  if (o.url !== undefined) body.installer_url = o.url;
  if (o.installer !== undefined) body.installer_name = o.installer;
  if (o.flags !== undefined) body.silent_flags = o.flags;
  if (o.verifyPath !== undefined) body.verify_path = o.verifyPath === false ? null : o.verifyPath;
  if (o.close !== undefined) body.close_processes = o.close;
  if (o.timeout !== undefined) body.timeout_seconds = o.timeout === false ? null : o.timeout;
  return body;
}

function describe(t: Template): string {
  return [
    `${t.templateId} ${t.name}`,
    `  installer     ${t.installer_name} from ${t.installer_url}`,
    `  flags         ${t.silent_flags || '-'}`,
    `  verify path   ${t.verify_path ?? '-'}`,
    `  close first   ${t.close_processes.join(', ') || '-'}`,
    `  time limit    ${t.timeout_seconds === null ? '-' : `${t.timeout_seconds} s`}`,
  ].join('\n');
}

/** Registers `roost templates`. */
export function registerTemplates(program: Command): void {
  const templates = program.command('templates').description('installer templates: defaults for classic deployments');

  withJson(addPagingOptions(templates.command('list').description('installer templates, newest first'), 'templates')).action(
    async (o: PagingOptions, cmd: Command) => {
      const ctx = commandContext(cmd);
      const page = await fetchList<Template>(ctx.client(), base(ctx), 'templates', {}, o);
      ctx.emit({ templates: page.items, next_page_token: page.next }, () => {
        if (page.items.length === 0) return void process.stdout.write('no templates\n');
        process.stdout.write(
          table(
            ['TEMPLATE', 'NAME', 'INSTALLER', 'URL'],
            page.items.map((t) => [t.templateId, t.name, t.installer_name, t.installer_url]),
          ) + '\n',
        );
        process.stdout.write(morePagesHint(page.next));
      });
    },
  );

  withJson(templates.command('show').description('one installer template').argument('<templateId>')).action(
    async (id: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const t = await ctx.client().get<Template>(`${base(ctx)}/${seg(id)}`);
      ctx.emit(t, () => process.stdout.write(`${describe(t)}\n`));
    },
  );

  withJson(
    templates
      .command('create')
      .description('create an installer template')
      .argument('<name>')
      .requiredOption('--url <https-url>', 'installer URL')
      .requiredOption('--installer <file-name>', 'installer file name')
      .option('--flags <text>', 'silent flags', '')
      .option('--verify-path <path>', 'absolute path that must exist after install')
      .option('--close <names>', 'comma-separated executables closed first', idList)
      .option('--timeout <seconds>', 'installer run time limit', positiveInt('--timeout')),
  ).action(async (name: string, o: FieldOptions, cmd: Command) => {
    const ctx = commandContext(cmd);
    const t = await ctx.client().post<Template>(base(ctx), { ...fieldsOf(o), name }, { idempotencyKey: true });
    ctx.emit(t, () => process.stdout.write(`created template ${t.templateId}\n`));
  });

  withJson(
    templates
      .command('update')
      .description('change fields of an installer template')
      .argument('<templateId>')
      .option('--name <name>', 'new name')
      .option('--url <https-url>', 'installer URL')
      .option('--installer <file-name>', 'installer file name')
      .option('--flags <text>', 'silent flags')
      .option('--verify-path <path>', 'absolute path that must exist after install')
      .option('--no-verify-path', 'no install check')
      .option('--close <names>', 'comma-separated executables closed first', idList)
      .option('--timeout <seconds>', 'installer run time limit', positiveInt('--timeout'))
      .option('--no-timeout', 'no time limit'),
  ).action(async (id: string, o: FieldOptions, cmd: Command) => {
    const ctx = commandContext(cmd);
    // commander sets a `--no-x` option's default to true; only an explicit flag counts.
    const given = (flag: string) => cmd.getOptionValueSource(flag) === 'cli';
    const body = fieldsOf({
      ...o,
      verifyPath: given('verifyPath') ? o.verifyPath : undefined,
      timeout: given('timeout') ? o.timeout : undefined,
    });
    if (Object.keys(body).length === 0)
      throw new UsageError('nothing to change: give --name, --url, --installer, --flags, --verify-path, --close or --timeout');
    const t = await ctx.client().patch<Template>(`${base(ctx)}/${seg(id)}`, body, { idempotencyKey: true });
    ctx.emit(t, () => process.stdout.write(`updated ${t.templateId}\n${describe(t)}\n`));
  });

  withJson(
    templates.command('delete').description('delete an installer template (deployments keep their fields)').argument('<templateId>'),
  ).action(async (id: string, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const r = await ctx.client().delete<{ templateId: string }>(`${base(ctx)}/${seg(id)}`, { idempotencyKey: true });
    ctx.emit(r, () => process.stdout.write(`deleted template ${r.templateId}\n`));
  });
}
