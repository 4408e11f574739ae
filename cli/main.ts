/**
 * The `roost` command (`npx roost …` runs bin/roost.js → this file). Each command lives in its own file
 * under cli/commands/ and exports a `register…(program)` function; add new commands to COMMANDS below.
 * Global options: --api (ROOST_API_URL, then the config file, default http://127.0.0.1:8080), --key
 * (ROOST_API_KEY), --site (ROOST_SITE_ID), --quiet. Every command has --json (cli/context.ts output
 * contract). On failure the problem's code, detail and request id go to stderr and process.exitCode is
 * set (cli/context.ts EXIT: 1 failure, 2 usage, 3 conflict, 4 not found, 5 auth).
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
import { registerMachines } from './commands/machines';
import { registerKeys } from './commands/keys';
import { registerLogin } from './commands/login';
import { registerWebhooks } from './commands/webhooks';
import { registerAudit } from './commands/audit';
import { registerEvents } from './commands/events';
import { registerAccount } from './commands/account';
import { registerAgent } from './commands/agent';

/** Registers one command (or command group) on the program. */
type Registrar = (program: Command) => void;

/** Command registrars, in help order. */
const COMMANDS: Registrar[] = [
  registerRoosts,
  registerPush,
  registerVersions,
  registerDiff,
  registerDeploy,
  registerRollback,
  registerMachines,
  registerKeys,
  registerWebhooks,
  registerAudit,
  registerEvents,
  registerAccount,
  registerLogin,
  registerAgent,
];

/**
 * The commands that start or reach local services (the database, Temporal, the embedded stack), in help
 * order. Their modules take seconds to load, so they are loaded only when one of them runs or help is
 * shown, and every API command starts fast.
 */
const LOCAL_COMMANDS: Record<string, () => Registrar> = {
  // require, not import(): the CLI runs as CommonJS through tsx (bin/roost.js), whose require hook
  // resolves the .ts files; a dynamic import() would go through the ESM resolver, which does not.
  stack: () => (require('./commands/stack') as { registerStack: Registrar }).registerStack,
  admin: () => (require('./commands/admin') as { registerAdmin: Registrar }).registerAdmin,
  demo: () => (require('./commands/demo') as { registerDemo: Registrar }).registerDemo,
};

/** The first argument that is not an option (the command name), if any; global options with a value are skipped. */
function commandName(args: string[]): string | undefined {
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === '--api' || a === '--key' || a === '--site') i++;
    else if (!a.startsWith('-')) return a;
  }
  return undefined;
}

/**
 * Builds the program with the commands `argv` can reach registered (does not parse): every API command,
 * plus the local-service commands when one of them is named or help may list them.
 */
export function buildProgram(argv: string[] = process.argv): Command {
  const program = addGlobalOptions(new Command('roost'))
    .description('Roost: content-addressed roosts, canary rollouts and fleet control')
    .version(CLI_VERSION)
    .showHelpAfterError()
    .exitOverride();
  for (const register of COMMANDS) register(program);
  const name = commandName(argv.slice(2));
  for (const [local, load] of Object.entries(LOCAL_COMMANDS)) if (name === undefined || name === local || name === 'help') load()(program);
  return program;
}

/** Parses `argv` and runs the command; resolves with the exit code (also set on process.exitCode). */
export async function main(argv: string[] = process.argv): Promise<number> {
  try {
    const program = buildProgram(argv);
    await program.parseAsync(argv);
    return Number(process.exitCode ?? 0);
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and --version exit through here with code 0; usage errors were already printed by commander.
      process.exitCode = err.exitCode === 0 ? 0 : 2;
      return Number(process.exitCode);
    }
    // An option parser may refuse a value before the command's action runs: --json still shapes the error.
    process.exitCode = reportError(err, isJsonMode() || argv.includes('--json'));
    return process.exitCode;
  }
}

void main();
