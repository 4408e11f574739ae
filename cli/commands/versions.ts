/**
 * `roost versions list <roostId>` and `roost versions show <roostId> <versionRef>` (docs/contract.md "Roost
 * versions": GET /api/roosts/{roostId}/versions, …/versions/{versionRef}, …/files).
 * Refs take every form of docs/contract.md "Version id and version refs" (id, 3, #3, v3, current, previous, first).
 */
import { type Command } from 'commander';
import type { RoostClient } from '../client';
import { seg } from '../client';
import { commandContext, formatBytes, positiveInt, table, withJson } from '../context';

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
}
