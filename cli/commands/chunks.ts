/**
 * `roost chunks mount|referrers` (docs/contract.md "Chunks"; docs/decisions/chunk-mount.md,
 * docs/decisions/chunk-referrers.md):
 *
 *   chunks mount <digest> --from <roostId> --to <roostId>   POST /api/chunks/{digest}/mount (site write)
 *   chunks referrers <digest> [--all]                      GET /api/chunks/{digest}/referrers (site read)
 *
 * Mount records a referrer entry (a cross-roost reference, no bytes move) for a chunk the site holds; it is
 * retry-safe (the entry id is derived from digest, site, from and to) and sends one Idempotency-Key per
 * invocation (optional on that route, honoured when sent). Referrers lists the mount entries and the
 * versions that reference the chunk, ordered by referring roost (pages of 50, at most 200).
 * A digest is 64 hex characters of SHA-256 (docs/contract.md "Chunk reference"); anything else, or
 * a missing or equal `--from` and `--to`, is a usage error before any request.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, table, UsageError, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';

/** A referrer entry (docs/contract.md "Chunk referrer entry"); fields that do not apply are null. */
interface ReferrerEntry {
  entryId: string;
  source: string;
  roostId: string | null;
  fromRoostId: string | null;
  toRoostId: string | null;
  versionId: string | null;
  versionNumber: number | null;
  fileCount: number | null;
  pathCount: number | null;
  totalBytes: number | null;
  referencedAt: string;
  createdAt: string;
  createdBy: string;
  mountedAt: string | null;
  mountedBy: string | null;
  [extra: string]: unknown;
}

/** The answer of POST /api/chunks/{digest}/mount. */
interface MountAnswer {
  digest: string;
  siteId: string;
  from: string;
  to: string;
  mounted: true;
  zeroByte: true;
}

/** The chunk digest argument: 64 hex characters, sent lowercase. @throws UsageError */
function digest(raw: string): string {
  if (!/^[0-9a-fA-F]{64}$/.test(raw)) throw new UsageError(`a chunk digest is 64 hex characters of SHA-256, got "${raw}"`);
  return raw.toLowerCase();
}

/** What a referrer entry points at, for the human table: `from → to` for a mount, `#n` for a version. */
function reference(e: ReferrerEntry): string {
  if (e.source === 'mount') return `mount ${e.fromRoostId ?? '-'} → ${e.toRoostId ?? '-'}`;
  if (e.versionNumber !== null) return `version #${e.versionNumber} (${(e.versionId ?? '').slice(0, 12)})`;
  return e.source;
}

/** Registers `roost chunks mount|referrers`. */
export function registerChunks(program: Command): void {
  const chunks = program.command('chunks').description('cross-roost chunk mounts and who references a chunk');

  withJson(
    chunks
      .command('mount')
      .description('record that roost --to references a chunk the site holds for roost --from (no bytes move)')
      .argument('<digest>', 'chunk SHA-256 (64 hex characters)', digest)
      .option('--from <roostId>', 'the roost the chunk is mounted from (required)')
      .option('--to <roostId>', 'the roost that now references the chunk (required)'),
  ).action(async (d: string, opts: { from?: string; to?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    // Checked here rather than by requiredOption, so that --json still prints the {error} document.
    if (!opts.from || !opts.to) throw new UsageError('give both --from <roostId> and --to <roostId>');
    if (opts.from === opts.to) throw new UsageError('--from and --to must name different roosts');
    const r = await ctx
      .client()
      .post<MountAnswer>(`/api/chunks/${seg(d)}/mount`, { siteId: ctx.siteId(), from: opts.from, to: opts.to }, { idempotencyKey: true });
    ctx.emit(r, () => process.stdout.write(`mounted ${r.digest.slice(0, 16)}… from ${r.from} into ${r.to}\n`));
  });

  withJson(
    addPagingOptions(
      chunks
        .command('referrers')
        .description('the mounts and versions that reference a chunk, by referring roost')
        .argument('<digest>', 'chunk SHA-256 (64 hex characters)', digest),
      'entries (1..200)',
    ),
  ).action(async (d: string, opts: PagingOptions, cmd: Command) => {
    const ctx = commandContext(cmd);
    const siteId = ctx.siteId();
    const page = await fetchList<ReferrerEntry>(ctx.client(), `/api/chunks/${seg(d)}/referrers`, 'referrers', { siteId }, opts);
    ctx.emit({ digest: d, siteId, referrers: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no referrers\n');
      process.stdout.write(
        table(
          ['ROOST', 'SOURCE', 'REFERENCE', 'FILES', 'BY', 'AT'],
          page.items.map((e) => [e.roostId, e.source, reference(e), e.fileCount, e.createdBy, e.referencedAt]),
        ) + '\n',
      );
      process.stdout.write(morePagesHint(page.next));
    });
  });
}
