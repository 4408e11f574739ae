/**
 * `roost quota` (GET /api/sites/{siteId}/quota: tier, used, pending and limit bytes) and `roost whoami`
 * (GET /api/whoami: who the configured key, or with --session the stored session, acts as).
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, formatBytes, withJson } from '../context';

interface QuotaSnapshot {
  siteId: string;
  tier: string;
  usedBytes: number;
  pendingBytes: number;
  limitBytes: number;
}

export function registerAccount(program: Command): void {
  withJson(program.command('quota').description("the site's storage quota")).action(async (_opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const q = await ctx.client().get<QuotaSnapshot>(`/api/sites/${seg(ctx.siteId())}/quota`);
    ctx.emit(q, () => {
      const pct = q.limitBytes > 0 ? ` (${((100 * (q.usedBytes + q.pendingBytes)) / q.limitBytes).toFixed(1)} %)` : '';
      process.stdout.write(
        `${q.siteId} tier ${q.tier}: ${formatBytes(q.usedBytes)} used + ${formatBytes(q.pendingBytes)} pending of ${formatBytes(q.limitBytes)}${pct}\n`,
      );
    });
  });

  withJson(
    program
      .command('whoami')
      .description('who the configured credential acts as')
      .option('--session', 'ask for the stored roost login session instead of the API key'),
  ).action(async (opts: { session?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = opts.session ? ctx.userClient() : ctx.client();
    const me = await client.get<Record<string, unknown>>('/api/whoami');
    ctx.emit(me, () => {
      const key = (me.key ?? null) as Record<string, unknown> | null;
      process.stdout.write(
        `${String(me.email ?? me.userId ?? '?')} (${String(me.role ?? '?')})${key ? ` with key ${String(key.keyId)} (${String(key.name ?? '')})` : ''}` +
          `${me.primarySiteId ? `, primary site ${String(me.primarySiteId)}` : ''}\n`,
      );
    });
  });
}
