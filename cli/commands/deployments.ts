/**
 * `roost deployments create|list|show|retry|cancel|uninstall|delete`: classic
 * installer deployments (`/api/sites/{siteId}/deployments`, docs/decisions/classic-deployments.md). NOT
 * `roost deploy`, which rolls a roost version out (`POST /api/roosts/{roostId}/deploy`).
 *
 * `create --wait` (and `show --wait`) follow the deployment until it ends, showing per-target progress on
 * stderr; every command has `--json`. Mutations send an Idempotency-Key (retried safely).
 */
import { type Command, Option } from 'commander';
import { seg } from '../client';
import { type CommandContext, UsageError, commandContext, idList, positiveInt, table, withJson } from '../context';
import { DEPLOYMENT_STATUSES } from '../../domain/classic';
import { createProgress } from '../progress';
import { fetchList, type PagingOptions } from '../listing';

/** A classic deployment as the API answers it (fields the CLI reads). */
interface Deployment {
  deploymentId: string;
  name: string;
  status: string;
  installer_name: string;
  parallel_install: boolean;
  counts: Record<string, number>;
  createdAt: string;
  targets?: { machineId: string; status: string; result: string; progress: number | null; error?: string | null; attempts: number }[];
  [extra: string]: unknown;
}

const TERMINAL = ['completed', 'failed', 'partial', 'cancelled', 'uninstalled'];
/** Ends of a followed deployment that are a failure of the command (exit 1, README "exit code"): some target failed. */
const FAILED = ['failed', 'partial'];

/** Sets exit code 1 when a followed deployment ended failed or partial. */
function exitOnFailure(d: Deployment): void {
  if (FAILED.includes(d.status)) process.exitCode = 1;
}

function base(ctx: CommandContext): string {
  return `/api/sites/${seg(ctx.siteId())}/deployments`;
}

/** Polls a deployment until it ends, drawing targets done/total on stderr. */
async function follow(ctx: CommandContext, id: string, intervalMs: number): Promise<Deployment> {
  const progress = createProgress({ tty: ctx.tty, quiet: ctx.quiet || ctx.json });
  try {
    for (;;) {
      const d = await ctx.client().get<Deployment>(`${base(ctx)}/${seg(id)}`);
      const total = Object.values(d.counts).reduce((a, b) => a + b, 0);
      const done = (d.counts.completed ?? 0) + (d.counts.failed ?? 0) + (d.counts.cancelled ?? 0) + (d.counts.uninstalled ?? 0);
      progress.update({ stage: `deployment ${d.name} (${d.status})`, done, total });
      if (TERMINAL.includes(d.status)) return d;
      await new Promise((r) => setTimeout(r, intervalMs));
    }
  } finally {
    progress.stop();
  }
}

function printDetail(d: Deployment): void {
  process.stdout.write(`${d.deploymentId}  ${d.name}  ${d.status}  (${d.parallel_install ? 'parallel' : 'serial'}, ${d.installer_name})\n`);
  if (d.targets?.length) {
    process.stdout.write(
      table(
        ['MACHINE', 'STATUS', 'RESULT', 'PROGRESS', 'ATTEMPTS', 'ERROR'],
        d.targets.map((t) => [
          t.machineId,
          t.status,
          t.result,
          t.progress === null ? null : `${Math.round(t.progress)}%`,
          t.attempts,
          t.error ?? null,
        ]),
      ) + '\n',
    );
  }
}

/** Registers `roost deployments` (installer templates: cli/commands/templates.ts). */
export function registerDeployments(program: Command): void {
  const deployments = program
    .command('deployments')
    .description(
      'classic installer deployments: an installer fanned out to machines (not `roost deploy`, which rolls out a roost version)',
    );

  withJson(
    deployments
      .command('create')
      .description('create a classic deployment (POST /api/sites/{siteId}/deployments)')
      .argument('<name>', 'display name')
      .requiredOption('--machines <ids>', 'comma-separated machine ids', idList)
      .option('--url <https-url>', 'installer URL (https)')
      .option('--installer <file-name>', 'installer file name, e.g. setup.msi')
      .option('--flags <text>', 'silent flags passed to the installer')
      .option('--template <templateId>', 'installer template whose fields are defaults')
      .option('--verify-path <path>', 'absolute path that must exist after the install')
      .option('--sha256 <hex>', 'expected SHA-256 of the installer')
      .option('--close <names>', 'comma-separated executables closed first', idList)
      .option('--suppress <names>', 'comma-separated projects to suppress', idList)
      .option('--parallel', 'install on targets concurrently (default serial)')
      .option('--timeout <seconds>', 'installer run time limit', positiveInt('--timeout'))
      .option('--wait', 'follow the deployment until it ends'),
  ).action(async (name: string, o: Record<string, unknown>, cmd: Command) => {
    const ctx = commandContext(cmd);
    if (!o.template && (!o.url || !o.installer || o.flags === undefined)) {
      throw new UsageError('--url, --installer and --flags are required unless --template gives them');
    }
    const body: Record<string, unknown> = { name, machines: o.machines };
    const map: Record<string, string> = {
      url: 'installer_url',
      installer: 'installer_name',
      flags: 'silent_flags',
      template: 'template_id',
      verifyPath: 'verify_path',
      sha256: 'sha256',
      close: 'close_processes',
      suppress: 'suppress_projects',
      timeout: 'timeout_seconds',
    };
    for (const [k, field] of Object.entries(map)) if (o[k] !== undefined) body[field] = o[k];
    if (o.parallel) body.parallel_install = true;
    let d = await ctx.client().post<Deployment>(base(ctx), body, { idempotencyKey: true });
    ctx.info(`created classic deployment ${d.deploymentId} (${d.targets?.length ?? 0} targets)`);
    if (o.wait) d = await follow(ctx, d.deploymentId, 1000);
    ctx.emit(d, () => printDetail(d));
    if (o.wait) exitOnFailure(d);
  });

  withJson(
    deployments
      .command('list')
      .description('list classic deployments, newest first')
      .addOption(new Option('--status <status>', 'only this status').choices(DEPLOYMENT_STATUSES))
      .option('--page-size <n>', 'deployments per page (1..100)', positiveInt('--page-size'))
      .option('--page-token <token>', 'next_page_token of the previous page')
      .option('--all', 'follow every page'),
  ).action(async (o: PagingOptions & { status?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const page = await fetchList<Deployment>(ctx.client(), base(ctx), 'deployments', { status: o.status }, o);
    const res = { deployments: page.items, next_page_token: page.next };
    ctx.emit(res, () => {
      if (res.deployments.length === 0) return void process.stdout.write('no deployments\n');
      process.stdout.write(
        table(
          ['DEPLOYMENT', 'NAME', 'STATUS', 'TARGETS', 'DONE', 'FAILED', 'CREATED'],
          res.deployments.map((d) => [
            d.deploymentId,
            d.name,
            d.status,
            Object.values(d.counts).reduce((a, b) => a + b, 0),
            (d.counts.completed ?? 0) + (d.counts.uninstalled ?? 0),
            d.counts.failed ?? 0,
            d.createdAt,
          ]),
        ) + '\n',
      );
      if (res.next_page_token) process.stdout.write(`more: --page-token ${res.next_page_token}\n`);
    });
  });

  withJson(
    deployments
      .command('show')
      .description('a classic deployment with per-target status')
      .argument('<deploymentId>')
      .option('--wait', 'follow it until it ends'),
  ).action(async (id: string, o: { wait?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const d = o.wait ? await follow(ctx, id, 1000) : await ctx.client().get<Deployment>(`${base(ctx)}/${seg(id)}`);
    ctx.emit(d, () => printDetail(d));
    if (o.wait) exitOnFailure(d);
  });

  for (const [action, description] of [
    ['retry', 'requeue the failed targets'],
    ['cancel', 'pull the pending targets (in-flight installs finish)'],
    ['uninstall', 'queue an uninstall on every target (site admin)'],
  ] as const) {
    withJson(
      deployments
        .command(action)
        .description(description)
        .argument('<deploymentId>')
        .option('--wait', 'follow the deployment until it ends'),
    ).action(async (id: string, o: { wait?: boolean }, cmd: Command) => {
      const ctx = commandContext(cmd);
      const r = await ctx
        .client()
        .post<{ affected: number; status: string }>(`${base(ctx)}/${seg(id)}/${action}`, undefined, { idempotencyKey: true });
      const out = o.wait ? { ...r, deployment: await follow(ctx, id, 1000) } : r;
      ctx.emit(out, () =>
        process.stdout.write(
          `${action}: ${r.affected} target(s); deployment ${o.wait ? (out as { deployment: Deployment }).deployment.status : r.status}\n`,
        ),
      );
      if (o.wait) exitOnFailure((out as { deployment: Deployment }).deployment);
    });
  }

  withJson(
    deployments.command('delete').description('delete a finished deployment record (uninstalls nothing)').argument('<deploymentId>'),
  ).action(async (id: string, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const r = await ctx.client().delete<{ deploymentId: string }>(`${base(ctx)}/${seg(id)}`, { idempotencyKey: true });
    ctx.emit(r, () => process.stdout.write(`deleted ${r.deploymentId}\n`));
  });
}
