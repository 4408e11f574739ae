/**
 * `roost stack`: starts the whole stack in the foreground (services, migrations, API, worker), prints one
 * line containing `ready` with the API, API reference and Temporal Web UI URLs, and stops everything
 * cleanly on SIGINT/SIGTERM. Ports come from the environment (README table).
 */
import type { Command } from 'commander';
import { loadConfig } from '../../config/env';
import { startStack } from '../../stack/run';

export function registerStack(program: Command): void {
  program
    .command('stack')
    .description('start PostgreSQL, Azurite, the Temporal dev server, the API and a worker in the foreground')
    .option('--json', 'print the ready line as JSON')
    .option('--no-worker', 'run without the in-process worker (run worker/main.ts separately)')
    .action(async (opts: { json?: boolean; worker: boolean }) => {
      const cfg = loadConfig();
      const stack = await startStack(cfg, { worker: opts.worker, log: (l) => process.stderr.write(`[stack] ${l}\n`) });
      const urls = stack.urls;
      if (opts.json) process.stdout.write(JSON.stringify({ ready: true, ...urls }) + '\n');
      else process.stdout.write(`roost stack ready: api ${urls.api}  reference ${urls.reference}  temporal-ui ${urls.temporalUi}\n`);
      await new Promise<void>((resolve) => {
        let stopping = false;
        const stop = (sig: string) => {
          if (stopping) return;
          stopping = true;
          process.stderr.write(`[stack] ${sig}: stopping\n`);
          stack.stop().then(resolve, resolve);
        };
        process.once('SIGINT', () => stop('SIGINT'));
        process.once('SIGTERM', () => stop('SIGTERM'));
      });
      process.stderr.write('[stack] stopped\n');
    });
}
