/**
 * The `roost` program shared by its two entry points: cli/main.ts (the full CLI, `npx roost`) and
 * cli/portable.ts (the packaged single-file executable for machines without Node: every API command and
 * `roost agent`, without the commands that run local services). Each command lives in its own file under
 * cli/commands/ and exports a `register…(program)` function; add new API commands to COMMANDS below.
 */
import { Command, CommanderError } from 'commander';
import { addGlobalOptions, isJsonMode, reportError, UsageError } from './context';
import { CLI_VERSION } from './version';
import { registerPush } from './commands/push';
import { registerDeploy } from './commands/deploy';
import { registerRollback } from './commands/rollback';
import { registerDeployments } from './commands/deployments';
import { registerProcesses } from './commands/processes';
import { registerTemplates } from './commands/templates';
import { registerVersions } from './commands/versions';
import { registerDiff } from './commands/diff';
import { registerRoosts } from './commands/roosts';
import { registerMachines } from './commands/machines';
import { registerKeys } from './commands/keys';
import { registerLogin } from './commands/login';
import { registerWebhooks } from './commands/webhooks';
import { registerAudit } from './commands/audit';
import { registerEvents } from './commands/events';
import { registerAccount } from './commands/account';
import { registerAgent } from './commands/agent';
import { registerSites } from './commands/sites';
import { registerUsers } from './commands/users';
import { registerConversations } from './commands/conversations';
import { registerInstaller } from './commands/installer';
import { registerChunks } from './commands/chunks';

/** Registers one command (or command group) on the program. */
export type Registrar = (program: Command) => void;

/** Command registrars, in help order. */
export const COMMANDS: Registrar[] = [
  registerRoosts,
  registerPush,
  registerVersions,
  registerDiff,
  registerChunks,
  registerDeploy,
  registerRollback,
  registerDeployments,
  registerTemplates,
  registerProcesses,
  registerMachines,
  registerKeys,
  registerWebhooks,
  registerAudit,
  registerEvents,
  registerSites,
  registerUsers,
  registerConversations,
  registerAccount,
  registerInstaller,
  registerLogin,
  registerAgent,
];

/**
 * True during a `runProgram` whose arguments include `--json`: commander's own error text (and the help it
 * shows after an error) is then left unwritten, and the failure is reported as the `{error}` document with
 * code usage_error (docs/decisions/cli-output.md), like every other failure of a --json run.
 */
let jsonRun = false;

/** The program with the global options and every command of COMMANDS registered (does not parse). */
export function baseProgram(): Command {
  const program = addGlobalOptions(new Command('roost'))
    .description('Roost: content-addressed roosts, canary rollouts and fleet control')
    .version(CLI_VERSION)
    .showHelpAfterError()
    .configureOutput({ writeErr: (text) => void (jsonRun || process.stderr.write(text)) })
    .exitOverride();
  for (const register of COMMANDS) register(program);
  return program;
}

/** Parses `argv` and runs the command; resolves with the exit code (also set on process.exitCode). */
export async function runProgram(build: () => Command, argv: string[]): Promise<number> {
  jsonRun = argv.includes('--json');
  try {
    const program = build();
    await program.parseAsync(argv);
    return Number(process.exitCode ?? 0);
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and --version exit through here with code 0; usage errors were already printed by commander,
      // except in a --json run, which reports them as its one {error} document.
      if (err.exitCode !== 0 && jsonRun) {
        const detail = err.message === '(outputHelp)' ? 'a subcommand is needed: see --help' : err.message.replace(/^error: /, '');
        reportError(new UsageError(detail), true);
      }
      process.exitCode = err.exitCode === 0 ? 0 : 2;
      return Number(process.exitCode);
    }
    // An option parser may refuse a value before the command's action runs: --json still shapes the error.
    process.exitCode = reportError(err, isJsonMode() || argv.includes('--json'));
    return process.exitCode;
  }
}
