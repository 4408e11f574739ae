/**
 * `roost versions list <roostId>`, `roost versions show <roostId> <versionRef>` and `roost versions update
 * <roostId> <versionRef> --description …` (docs/contract.md "Roost versions": GET /api/roosts/{roostId}/versions,
 * …/versions/{versionRef}, …/files, PATCH …/versions/{versionRef}).
 * Refs take every form of docs/contract.md "Version id and version refs" (id, 3, #3, v3, current, previous, first).
 * A version's content is immutable: PATCH takes only `siteId` and `description` (null clears it), so update has
 * no other flag; it sends one Idempotency-Key per invocation (optional on that route, honoured when sent).
 */
import { type Command } from 'commander';
import type { RoostClient } from '../client';
import { seg } from '../client';
import { commandContext, formatBytes, positiveInt, table, UsageError, withJson } from '../context';
import { DESCRIPTION_MAX } from '../../domain/version';

/** A version record as listed (docs/contract.md "Version record"). */
export interface VersionRecord {
  versionId: string;
  versionNumber: number;
  description: string | null;
  versionUrl?: string;
  createdAt: string;
  createdBy?: string;
  totalSize: number;
  totalFiles: number;
  parentVersionId: string | null;
}

interface Page<T> {
  items: T[];
  next: string;
}

/** Follows next_page_token from `first` until it is empty (or `max` items are gathered). */
export async function collectPages<T>(fetchPage: (token: string | undefined) => Promise<Page<T>>, max = Infinity): Promise<Page<T>> {
  const items: T[] = [];
  let token: string | undefined;
  for (;;) {
    const page = await fetchPage(token);
    items.push(...page.items);
    if (!page.next || items.length >= max) return { items, next: page.next };
    token = page.next;
  }
}

/** One page of a roost's versions, newest first as the server orders them. */
export async function listVersions(
  client: RoostClient,
  siteId: string,
  roostId: string,
  pageSize?: number,
  pageToken?: string,
): Promise<Page<VersionRecord>> {
  const res = await client.get<{ versions: VersionRecord[]; next_page_token?: string }>(`/api/roosts/${seg(roostId)}/versions`, {
    siteId,
    page_size: pageSize,
    page_token: pageToken,
  });
  return { items: res.versions ?? [], next: res.next_page_token ?? '' };
}

/** Every file entry of a version (paged at 500, the spec's maximum). */
export async function listAllFiles(
  client: RoostClient,
  siteId: string,
  roostId: string,
  ref: string,
  prefix?: string,
): Promise<Array<{ path: string; size: number; chunks: unknown[] }>> {
  const all = await collectPages(async (token) => {
    const res = await client.get<{ files: Array<{ path: string; size: number; chunks: unknown[] }>; next_page_token?: string }>(
      `/api/roosts/${seg(roostId)}/versions/${seg(ref)}/files`,
      { siteId, prefix, page_size: 500, page_token: token },
    );
    return { items: res.files ?? [], next: res.next_page_token ?? '' };
  });
  return all.items;
}

const shortId = (id: string | null | undefined) => (id ? id.slice(0, 12) : null);

/** Registers `roost versions list|show|update`. */
export function registerVersions(program: Command): void {
  const versions = program.command('versions').description('list and inspect the versions of a roost');

  withJson(
    versions
      .command('list')
      .description('list versions (one page unless --all)')
      .argument('<roostId>', 'roost id')
      .option('--page-size <n>', 'versions per page (1..100)', positiveInt('--page-size'))
      .option('--page-token <token>', 'continue from a next_page_token')
      .option('--all', 'follow every page'),
  ).action(async (roostId: string, opts: { pageSize?: number; pageToken?: string; all?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = ctx.client();
    const siteId = ctx.siteId();
    const page = opts.all
      ? await collectPages((token) => listVersions(client, siteId, roostId, opts.pageSize ?? 100, token ?? opts.pageToken))
      : await listVersions(client, siteId, roostId, opts.pageSize, opts.pageToken);
    ctx.emit({ roostId, siteId, versions: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no versions\n');
      process.stdout.write(
        table(
          ['#', 'VERSION', 'CREATED', 'FILES', 'SIZE', 'DESCRIPTION'],
          page.items.map((v) => [
            v.versionNumber,
            shortId(v.versionId),
            v.createdAt,
            v.totalFiles,
            formatBytes(v.totalSize),
            v.description,
          ]),
        ) + '\n',
      );
      if (page.next) process.stdout.write(`more: --page-token ${page.next}\n`);
    });
  });

  withJson(
    versions
      .command('show')
      .description('show one version (id, number, alias)')
      .argument('<roostId>', 'roost id')
      .argument('[versionRef]', 'version ref', 'current')
      .option('--files', 'also list its files')
      .option('--prefix <path>', 'with --files: only paths starting with this prefix'),
  ).action(async (roostId: string, ref: string, opts: { files?: boolean; prefix?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = ctx.client();
    const siteId = ctx.siteId();
    const v = await client.get<Record<string, unknown> & VersionRecord>(`/api/roosts/${seg(roostId)}/versions/${seg(ref)}`, { siteId });
    const files = opts.files ? await listAllFiles(client, siteId, roostId, v.versionId, opts.prefix) : undefined;
    ctx.emit(files ? { ...v, files } : v, () => {
      const lines = [
        `version ${v.versionNumber} of ${roostId}`,
        `  id           ${v.versionId}`,
        `  description  ${v.description ?? '-'}`,
        `  created      ${v.createdAt ?? '-'} by ${v.createdBy ?? '-'}`,
        `  files        ${v.totalFiles}, ${formatBytes(Number(v.totalSize ?? 0))}`,
        `  parent       ${v.parentVersionId ?? '-'}`,
      ];
      if (files) {
        lines.push('');
        lines.push(
          table(
            ['SIZE', 'CHUNKS', 'PATH'],
            files.map((f) => [formatBytes(f.size), f.chunks.length, f.path]),
          ),
        );
      }
      process.stdout.write(lines.join('\n') + '\n');
    });
  });

  withJson(
    versions
      .command('update')
      .description("change a version's description (the only mutable field: files and chunks never change)")
      .argument('<roostId>', 'roost id')
      .argument('<versionRef>', 'version ref: id, number (3, #3, v3) or alias (current, previous, first)')
      .option('--description <text>', `new description (at most ${DESCRIPTION_MAX} characters; "" clears it)`)
      .option('--clear-description', 'remove the description'),
  ).action(async (roostId: string, ref: string, opts: { description?: string; clearDescription?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    if (opts.description !== undefined && opts.clearDescription)
      throw new UsageError('--description and --clear-description exclude each other');
    if (opts.description === undefined && !opts.clearDescription)
      throw new UsageError('nothing to change: give --description <text> or --clear-description');
    if (opts.description !== undefined && [...opts.description].length > DESCRIPTION_MAX)
      throw new UsageError(`--description has at most ${DESCRIPTION_MAX} characters, got ${[...opts.description].length}`);
    const description = opts.clearDescription || opts.description === '' ? null : (opts.description ?? null);
    const v = await ctx
      .client()
      .patch<VersionRecord & { roostId: string; siteId: string; updatedAt: string }>(
        `/api/roosts/${seg(roostId)}/versions/${seg(ref)}`,
        { siteId: ctx.siteId(), description },
        { idempotencyKey: true },
      );
    ctx.emit(v, () =>
      process.stdout.write(
        `updated version ${v.versionNumber} of ${roostId} (${shortId(v.versionId)}): ${v.description === null ? 'no description' : `"${v.description}"`}\n`,
      ),
    );
  });
}
