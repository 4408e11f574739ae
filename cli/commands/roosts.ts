/**
 * `roost roosts create|list|show|update|delete` (docs/contract.md "Roosts": POST /api/roosts, GET /api/roosts,
 * GET, PATCH and DELETE /api/roosts/{roostId}). The create and patch bodies are not shown by the spec; the API
 * (api/routes/roosts.ts, docs/decisions/roost-create-update-delete.md) takes siteId, name, targets and
 * extractPath and assigns the roost id itself. Update and delete send one Idempotency-Key per invocation
 * (optional on those routes, honoured when sent); delete asks nothing (like every other delete command) and
 * only tombstones the roost: a repeat answers `alreadyDeleted: true`.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, formatBytes, idList, positiveInt, table, UsageError, withJson } from '../context';
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

/** The answer of DELETE /api/roosts/{roostId} (docs/decisions/roost-create-update-delete.md). */
interface RoostDeleted {
  roostId: string;
  siteId: string;
  deleted: true;
  deletedAt: string;
  alreadyDeleted: boolean;
}

/** Registers `roost roosts create|list|show|update|delete`. */
export function registerRoosts(program: Command): void {
  const roosts = program.command('roosts').description('create, list, update and delete roosts');

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

  withJson(
    roosts
      .command('update')
      .description('change the name, targets or extract path of a roost (version pointers move only by publish and rollback)')
      .argument('<roostId>', 'roost id')
      .option('--name <name>', 'new display name')
      .option('--targets <ids>', 'new comma-separated target machine ids (replaces the list; "" empties it)', idList)
      .option('--extract-path <path>', 'new destination root on the target machines'),
  ).action(async (roostId: string, opts: { name?: string; targets?: string[]; extractPath?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body: Record<string, unknown> = {};
    if (opts.name !== undefined) body.name = opts.name;
    if (opts.targets !== undefined) body.targets = opts.targets;
    if (opts.extractPath !== undefined) body.extractPath = opts.extractPath;
    if (Object.keys(body).length === 0) throw new UsageError('nothing to change: give --name, --targets or --extract-path');
    const r = await ctx
      .client()
      .patch<RoostRecord>(`/api/roosts/${seg(roostId)}`, { siteId: ctx.siteId(), ...body }, { idempotencyKey: true });
    ctx.emit(r, () =>
      process.stdout.write(
        `updated roost ${r.roostId} (${r.name}): ${(r.targets ?? []).length} target(s), extract ${r.extractPath || '-'}\n`,
      ),
    );
  });

  withJson(
    roosts
      .command('delete')
      .description('soft-delete (tombstone) a roost; its versions and chunks stay until the purge')
      .argument('<roostId>', 'roost id'),
  ).action(async (roostId: string, _opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const r = await ctx
      .client()
      .delete<RoostDeleted>(`/api/roosts/${seg(roostId)}`, { query: { siteId: ctx.siteId() }, idempotencyKey: true });
    ctx.emit(r, () =>
      process.stdout.write(
        r.alreadyDeleted ? `${r.roostId} was deleted already (at ${r.deletedAt})\n` : `deleted roost ${r.roostId} at ${r.deletedAt}\n`,
      ),
    );
  });
}
