/**
 * `roost roosts create|list|show` (docs/contract.md "Roosts": POST /api/roosts, GET /api/roosts,
 * GET /api/roosts/{roostId}). The create body is not shown by the spec; the API (api/routes/roosts.ts)
 * takes siteId, name, targets and extractPath and assigns the roost id itself.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, formatBytes, idList, positiveInt, table, withJson } from '../context';
import { collectPages } from './versions';

/** Roost record fields the CLI shows (docs/contract.md "Roost record"). */
interface RoostRecord {
  roostId: string;
  name: string;
  targets: string[];
  extractPath: string;
  currentVersionId: string | null;
  currentVersionNumber: number | null;
  totalFiles?: number;
  totalSize?: number;
  deletedAt?: string | null;
  [extra: string]: unknown;
}

export function registerRoosts(program: Command): void {
  const roosts = program.command('roosts').description('create and list roosts');

  withJson(
    roosts
      .command('create')
      .description('create a roost (the server assigns its id, rst_…)')
      .argument('<name>', 'display name')
      .option('--targets <ids>', 'comma-separated target machine ids', idList)
      .option('--extract-path <path>', 'destination root on the target machines'),
  ).action(async (name: string, opts: { targets?: string[]; extractPath?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body: Record<string, unknown> = { siteId: ctx.siteId(), name };
    if (opts.targets !== undefined) body.targets = opts.targets;
    if (opts.extractPath !== undefined) body.extractPath = opts.extractPath;
    // The spec ignores Idempotency-Key on POST /api/roosts, so none is sent (and a 5xx is not retried).
    const res = await ctx.client().post<RoostRecord>('/api/roosts', body);
    ctx.emit(res, () => process.stdout.write(`created roost ${res.roostId} (${res.name})\n`));
  });

  withJson(
    roosts
      .command('list')
      .description('list the roosts of the site')
      .option('--include-deleted', 'include tombstoned roosts')
      .option('--page-size <n>', 'roosts per page (1..100)', positiveInt('--page-size'))
      .option('--all', 'follow every page'),
  ).action(async (opts: { includeDeleted?: boolean; pageSize?: number; all?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = ctx.client();
    const siteId = ctx.siteId();
    const fetchPage = async (token: string | undefined) => {
      const res = await client.get<{ roosts: RoostRecord[]; next_page_token?: string }>('/api/roosts', {
        siteId,
        page_size: opts.pageSize,
        page_token: token,
        includeDeleted: opts.includeDeleted ? 'true' : undefined,
      });
      return { items: res.roosts ?? [], next: res.next_page_token ?? '' };
    };
    const page = opts.all ? await collectPages(fetchPage) : await fetchPage(undefined);
    ctx.emit({ siteId, roosts: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no roosts\n');
      process.stdout.write(
        table(
          ['ROOST', 'NAME', 'CURRENT', 'FILES', 'SIZE', 'TARGETS'],
          page.items.map((r) => [
            r.roostId + (r.deletedAt ? ' (deleted)' : ''),
            r.name,
            r.currentVersionNumber ?? null,
            r.totalFiles ?? null,
            r.totalSize === undefined ? null : formatBytes(r.totalSize),
            (r.targets ?? []).length,
          ]),
        ) + '\n',
      );
      if (page.next) process.stdout.write('more roosts: use --all\n');
    });
  });

  withJson(roosts.command('show').description('show one roost').argument('<roostId>', 'roost id')).action(
    async (roostId: string, _opts: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const r = await ctx.client().get<RoostRecord>(`/api/roosts/${seg(roostId)}`, { siteId: ctx.siteId() });
      ctx.emit(r, () => {
        process.stdout.write(
          [
            `${r.roostId} (${r.name})`,
            `  current   ${r.currentVersionNumber ?? '-'} ${r.currentVersionId ?? ''}`,
            `  files     ${r.totalFiles ?? 0}, ${formatBytes(r.totalSize ?? 0)}`,
            `  targets   ${(r.targets ?? []).join(', ') || '-'}`,
            `  extract   ${r.extractPath || '-'}`,
          ].join('\n') + '\n',
        );
      });
    },
  );
}
