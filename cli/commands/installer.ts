/**
 * `roost installer list|latest|upload|set-latest|delete`: the agent-installer catalog (docs/contract.md
 * "Installer catalog": GET /api/installer, GET /api/installer/latest, POST and PUT /api/installer/upload,
 * POST /api/installer/{version}/set-latest, DELETE /api/installer/{version}). Platform scope: the key
 * must belong to a superadmin and carry `installer=*` read, write or admin.
 *
 * `upload` runs the three steps with one Idempotency-Key: reserve the version (declaring the file's
 * SHA-256), PUT the bytes to the signed URL, finalise (the server re-hashes the stored bytes). A repeat
 * after a lost answer is safe: the same key replays step 1, a blob stored earlier counts as uploaded.
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import { type Command } from 'commander';
import { newIdempotencyKey, seg } from '../client';
import { commandContext, formatBytes, positiveInt, table, UsageError, withJson } from '../context';
import { collectPages } from './versions';

/** A catalog entry as the API shows it. */
interface InstallerEntry {
  version: string;
  sha256: string;
  sizeBytes: number | null;
  releaseNotes: string | null;
  latest: boolean;
  status: 'active' | 'deleted';
  createdAt: string;
  finalizedAt: string | null;
  deletedAt: string | null;
}

const SEMVER = /^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})$/;

function version(raw: string): string {
  if (!SEMVER.test(raw)) throw new UsageError(`version must be semver X.Y.Z, got "${raw}"`);
  return raw;
}

function describe(e: InstallerEntry): string {
  return [
    `${e.version}${e.latest ? ' (latest)' : ''}${e.status === 'deleted' ? ' (deleted)' : ''}`,
    `  sha256    ${e.sha256}`,
    `  size      ${e.sizeBytes === null ? '-' : formatBytes(e.sizeBytes)}`,
    `  finalised ${e.finalizedAt ?? '-'}`,
    ...(e.releaseNotes ? [`  notes     ${e.releaseNotes}`] : []),
  ].join('\n');
}

export function registerInstaller(program: Command): void {
  const installer = program.command('installer').description('the agent-installer catalog (superadmins)');

  withJson(
    installer
      .command('list')
      .description('installer versions, newest first')
      .option('--include-deleted', 'include soft-deleted versions')
      .option('--page-size <n>', 'versions per page (1..100)', positiveInt('--page-size'))
      .option('--all', 'follow every page'),
  ).action(async (opts: { includeDeleted?: boolean; pageSize?: number; all?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = ctx.client();
    const fetchPage = async (token: string | undefined) => {
      const res = await client.get<{ versions: InstallerEntry[]; next_page_token?: string }>('/api/installer', {
        page_size: opts.pageSize,
        page_token: token,
        includeDeleted: opts.includeDeleted ? 'true' : undefined,
      });
      return { items: res.versions ?? [], next: res.next_page_token ?? '' };
    };
    const page = opts.all ? await collectPages(fetchPage) : await fetchPage(undefined);
    ctx.emit({ versions: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no installer versions\n');
      process.stdout.write(
        table(
          ['VERSION', 'STATUS', 'SIZE', 'FINALISED', 'SHA256'],
          page.items.map((e) => [
            e.version + (e.latest ? ' *' : ''),
            e.status,
            e.sizeBytes === null ? null : formatBytes(e.sizeBytes),
            e.finalizedAt,
            e.sha256.slice(0, 16),
          ]),
        ) + '\n',
      );
      if (page.next) process.stdout.write('more versions: use --all\n');
    });
  });

  withJson(installer.command('latest').description('the latest installer version')).action(async (_opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const e = await ctx.client().get<InstallerEntry>('/api/installer/latest');
    ctx.emit(e, () => process.stdout.write(describe(e) + '\n'));
  });

  withJson(
    installer
      .command('upload')
      .description('upload an agent installer: reserve the version, send the bytes, finalise (verified by the server)')
      .argument('<version>', 'catalog version X.Y.Z', version)
      .argument('<file>', 'the installer file')
      .option('--release-notes <text>', 'release notes')
      .option('--no-latest', 'do not make it the latest version')
      .option('--idempotency-key <key>', 'reuse the key of an interrupted upload'),
  ).action(async (v: string, file: string, opts: { releaseNotes?: string; latest: boolean; idempotencyKey?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = ctx.client();
    const bytes = await fs.readFile(file).catch((err: NodeJS.ErrnoException) => {
      throw new UsageError(`cannot read ${file}: ${err.code ?? err.message}`);
    });
    const sha256 = createHash('sha256').update(bytes).digest('hex');
    const key = opts.idempotencyKey ?? newIdempotencyKey();
    ctx.info(`reserving ${v} (${formatBytes(bytes.length)}, sha256 ${sha256.slice(0, 16)}…)`);
    const reserved = await client.post<{ uploadUrl: string; expiresAt: string }>(
      '/api/installer/upload',
      { version: v, sha256, ...(opts.releaseNotes !== undefined ? { releaseNotes: opts.releaseNotes } : {}) },
      { idempotencyKey: key },
    );
    ctx.info(`uploading ${formatBytes(bytes.length)}`);
    const stored = await client.putBlob(reserved.uploadUrl, bytes);
    if (stored === 'exists') ctx.info('the bytes were stored by an earlier attempt');
    ctx.info('finalising: the server re-hashes the stored bytes');
    const e = (
      await client.request<InstallerEntry>('PUT', '/api/installer/upload', {
        body: { version: v, sha256, setAsLatest: opts.latest },
        idempotencyKey: key,
        timeoutMs: 5 * 60_000,
      })
    ).body;
    ctx.emit(e, () => process.stdout.write(`uploaded ${e.version}${e.latest ? ' (latest)' : ''}\n`));
  });

  withJson(installer.command('set-latest').description('make an active version the latest').argument('<version>', 'X.Y.Z', version)).action(
    async (v: string, _opts: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const r = await ctx
        .client()
        .post<{ version: string; previousVersion: string | null; changed: boolean }>(`/api/installer/${seg(v)}/set-latest`, undefined, {
          idempotencyKey: true,
        });
      ctx.emit(r, () =>
        process.stdout.write(
          r.changed ? `latest is ${r.version} (was ${r.previousVersion ?? 'none'})\n` : `${r.version} is latest already\n`,
        ),
      );
    },
  );

  withJson(
    installer
      .command('delete')
      .description('soft-delete a version (not the latest; 2 active versions stay)')
      .argument('<version>', 'X.Y.Z', version),
  ).action(async (v: string, _opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const r = await ctx.client().delete<{ version: string; alreadyDeleted: boolean }>(`/api/installer/${seg(v)}`, { idempotencyKey: true });
    ctx.emit(r, () => process.stdout.write(r.alreadyDeleted ? `${r.version} was deleted already\n` : `deleted ${r.version}\n`));
  });
}
