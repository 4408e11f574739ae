/**
 * The `roost` command (`npx roost …` runs bin/roost.js → this file). Each command lives in its own file
 * under cli/commands/ and exports a `register…(program)` function; add new commands to COMMANDS below.
 * Global options: --api (ROOST_API_URL, default http://127.0.0.1:8080), --key (ROOST_API_KEY),
 * --site (ROOST_SITE_ID), --quiet. Every command has --json (cli/context.ts output contract).
 * On failure the problem's code and detail go to stderr and process.exitCode is set (1, or 2 for usage).
 */
// Tracing of `roost stack` (when an OTLP endpoint is set) must start before http and pg load: first import.
import '../telemetry/instrument';
import { Command, CommanderError } from 'commander';
import { addGlobalOptions, isJsonMode, reportError } from './context';
import { CLI_VERSION } from './version';
import { registerPush } from './commands/push';
import { registerDeploy } from './commands/deploy';
import { registerRollback } from './commands/rollback';
import { registerVersions } from './commands/versions';
import { registerDiff } from './commands/diff';
import { registerRoosts } from './commands/roosts';
import { registerStack } from './commands/stack';
import { registerAdmin } from './commands/admin';
import { registerDemo } from './commands/demo';

/** Command registrars, in help order. */
const COMMANDS: Array<(program: Command) => void> = [
  registerRoosts,
  registerPush,
  registerVersions,
  registerDiff,
  registerDeploy,
  registerRollback,
  registerStack,
  registerAdmin,
  registerDemo,
];

/** Builds the program with every command registered (does not parse). */
export function buildProgram(): Command {
  const program = addGlobalOptions(new Command('roost'))
    .description('Roost: content-addressed roosts, canary rollouts and fleet control')
    .version(CLI_VERSION)
    .showHelpAfterError()
    .exitOverride();
  for (const register of COMMANDS) register(program);
  return program;
}

/** Parses `argv` and runs the command; resolves with the exit code (also set on process.exitCode). */
export async function main(argv: string[] = process.argv): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
    return Number(process.exitCode ?? 0);
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and --version exit through here with code 0; usage errors were already printed by commander.
      process.exitCode = err.exitCode === 0 ? 0 : 2;
      return Number(process.exitCode);
    }
    process.exitCode = reportError(err, isJsonMode());
    return process.exitCode;
  }
}

void main();
