/**
 * Paged list commands share one shape: `--page-size <n>`, `--page-token <t>` (resume where a previous
 * page ended) and `--all` (follow every `next_page_token`); the result names its items and carries
 * `next_page_token` (empty at the end), as the API's paged answers do (docs/contract.md Conventions).
 */
import type { Command } from 'commander';
import type { QueryValue, RoostClient } from './client';
import { positiveInt } from './context';
import { collectPages } from './commands/versions';

/** Options a paged list command accepts (addPagingOptions). */
export interface PagingOptions {
  pageSize?: number;
  pageToken?: string;
  all?: boolean;
}

/** Adds `--page-size`, `--page-token` and `--all` to a list command. */
export function addPagingOptions(cmd: Command, what: string): Command {
  return cmd
    .option('--page-size <n>', `${what} per page`, positiveInt('--page-size'))
    .option('--page-token <token>', 'continue after a previous page (its next_page_token)')
    .option('--all', 'follow every page');
}

/**
 * GETs one page (or every page with `--all`) of `path`, whose answer lists its items under `itemsKey`.
 * @throws ClientError as the API answers
 */
export async function fetchList<T>(
  client: RoostClient,
  path: string,
  itemsKey: string,
  query: Record<string, QueryValue>,
  opts: PagingOptions,
): Promise<{ items: T[]; next: string }> {
  const fetchPage = async (token: string | undefined) => {
    const res = await client.get<Record<string, unknown>>(path, { ...query, page_size: opts.pageSize, page_token: token });
    return { items: (res[itemsKey] as T[] | undefined) ?? [], next: typeof res.next_page_token === 'string' ? res.next_page_token : '' };
  };
  return opts.all ? collectPages(fetchPage) : fetchPage(opts.pageToken);
}

/** The hint printed under a human table when more pages exist. */
export function morePagesHint(next: string): string {
  return next ? `more: --page-token ${next} (or --all)\n` : '';
}
