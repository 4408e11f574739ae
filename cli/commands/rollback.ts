/**
 * `roost rollback <roostId> [--to <versionRef>]`: move the current pointer back (docs/contract.md POST
 * /api/roosts/{roostId}/rollback; default target `previous`; no bytes move, no new version).
 * One Idempotency-Key per invocation, reused across retries.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, withJson } from '../context';

interface RollbackResponse {
  ok: boolean;
  roostId: string;
  siteId: string;
  currentVersionId: string;
  currentVersionNumber: number;
  previousVersionId: string | null;
}

export function registerRollback(program: Command): void {
  withJson(
    program
      .command('rollback')
      .description('point a roost back at an earlier version (default: previous)')
      .argument('<roostId>', 'roost id')
      .option('--to <versionRef>', 'target version: id, number (3, #3, v3) or alias (previous, first)'),
  ).action(async (roostId: string, opts: { to?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body: Record<string, unknown> = { siteId: ctx.siteId() };
    if (opts.to !== undefined) body.targetVersion = opts.to;
    const res = await ctx.client().post<RollbackResponse>(`/api/roosts/${seg(roostId)}/rollback`, body, { idempotencyKey: true });
    ctx.emit(res, () => {
      process.stdout.write(
        `${roostId} now at version ${res.currentVersionNumber} (${res.currentVersionId}); was ${res.previousVersionId ?? '-'}\n`,
      );
    });
  });
}
