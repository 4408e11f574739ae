/**
 * The CLI output contract (docs/decisions/cli-output.md): every `roost` command that produces a result takes
 * `--json`. Walks the real command tree (cli/program.ts COMMANDS plus the local-service commands of
 * cli/main.ts) so a command added without `withJson()` fails here.
 */
import type { Command } from 'commander';
import { baseProgram } from '../../cli/program';
import { registerAdmin } from '../../cli/commands/admin';
import { registerDemo } from '../../cli/commands/demo';
import { registerStack } from '../../cli/commands/stack';

/** Runs in the foreground until stopped and logs JSON lines by default (`--pretty` for people): no result document. */
const NO_RESULT = new Set(['agent run']);

function leaves(c: Command, path: string[] = []): Array<[string, Command]> {
  return c.commands.length ? c.commands.flatMap((s) => leaves(s, [...path, s.name()])) : [[path.join(' '), c]];
}

it('gives every command --json, including users, sites, conversations and templates', () => {
  const program = baseProgram();
  for (const register of [registerStack, registerAdmin, registerDemo]) register(program);
  const all = leaves(program);
  const missing = all.filter(([name, c]) => !NO_RESULT.has(name) && !c.options.some((o) => o.long === '--json')).map(([name]) => name);
  expect(missing).toEqual([]);
  const names = all.map(([name]) => name);
  for (const family of ['users', 'sites', 'conversations', 'templates', 'machines', 'keys', 'webhooks', 'audit', 'events'])
    expect(names.some((n) => n.startsWith(`${family} `))).toBe(true);
  expect(names).toEqual(expect.arrayContaining(['conversations send', 'users delete', 'sites members', 'templates update']));
});
