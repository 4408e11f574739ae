/**
 * `roost diff <roostId> <against> [versionRef]`: what changes going from `against` (the base) to
 * `versionRef` (the target, default current), per docs/contract.md GET /api/roosts/{roostId}/versions/{versionRef}/diff.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, formatBytes, withJson } from '../context';

interface DiffEntry {
  path: string;
  size?: number;
  fromSize?: number;
  toSize?: number;
  reason?: string;
}
interface DiffResponse {
  fromVersion?: unknown;
  toVersion?: unknown;
  summary: { added: number; removed: number; changed: number; unchanged: number; hasChanges: boolean; netBytesDelta: number };
  added: DiffEntry[];
  removed: DiffEntry[];
  modified: DiffEntry[];
}

export function registerDiff(program: Command): void {
  withJson(
    program
      .command('diff')
      .description('compare two versions of a roost (base, then target; target defaults to current)')
      .argument('<roostId>', 'roost id')
      .argument('<against>', 'base version ref')
      .argument('[versionRef]', 'target version ref', 'current'),
  ).action(async (roostId: string, against: string, target: string, _opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const d = await ctx
      .client()
      .get<DiffResponse>(`/api/roosts/${seg(roostId)}/versions/${seg(target)}/diff`, { siteId: ctx.siteId(), against });
    ctx.emit(d, () => {
      const s = d.summary;
      const sign = s.netBytesDelta >= 0 ? '+' : '-';
      const lines = [
        `${against} → ${target}: ${s.added} added, ${s.removed} removed, ${s.changed} changed, ${s.unchanged} unchanged (${sign}${formatBytes(Math.abs(s.netBytesDelta))})`,
      ];
      for (const e of d.added ?? []) lines.push(`A  ${e.path} (${formatBytes(e.size ?? 0)})`);
      for (const e of d.removed ?? []) lines.push(`D  ${e.path} (${formatBytes(e.size ?? 0)})`);
      for (const e of d.modified ?? []) lines.push(`M  ${e.path} (${formatBytes(e.fromSize ?? 0)} → ${formatBytes(e.toSize ?? 0)})`);
      process.stdout.write(lines.join('\n') + '\n');
    });
  });
}
