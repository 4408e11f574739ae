/**
 * The `roost` command (`npx roost …` runs bin/roost.js → this file). Each command lives in its own file
 * under cli/commands/ and exports a `register…(program)` function; API commands are listed in cli/program.ts.
 * Global options: --api (ROOST_API_URL, then the config file, default http://127.0.0.1:8080), --key
 * (ROOST_API_KEY), --site (ROOST_SITE_ID), --quiet, --verbose (JSON log lines on stderr, cli/log.ts). Every command has --json (cli/context.ts output
 * contract). On failure the problem's code, detail and request id go to stderr and process.exitCode is
 * set (cli/context.ts EXIT: 1 failure, 2 usage, 3 conflict, 4 not found, 5 auth).
 */
// Tracing of `roost stack` (when an OTLP endpoint is set) must start before http and pg load: first import.
import '../telemetry/instrument';
import type { Command } from 'commander';
import { baseProgram, type Registrar, runProgram } from './program';

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
 * plus the local-service commands when one of them is named or help may list them (not for `--version`).
 */
export function buildProgram(argv: string[] = process.argv): Command {
  const program = baseProgram();
  const args = argv.slice(2);
  const name = commandName(args);
  const versionOnly = name === undefined && (args.includes('--version') || args.includes('-V'));
  for (const [local, load] of Object.entries(LOCAL_COMMANDS))
    if ((name === undefined && !versionOnly) || name === local || name === 'help') load()(program);
  return program;
}

/** Parses `argv` and runs the command; resolves with the exit code (also set on process.exitCode). */
export function main(argv: string[] = process.argv): Promise<number> {
  return runProgram(() => buildProgram(argv), argv);
}

void main();
