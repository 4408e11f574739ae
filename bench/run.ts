/**
 * `npm run bench`: Roost's benchmarks, each figure next to a floor measured in the same run on the same
 * data (docs/benchmarks.md says what each one means and lists measured figures).
 *
 *   chunker    chunk-and-hash stage of a cold push (MB/s)            vs sha256sum of the same files
 *   push       cold push end to end (s, MB/s)                        vs plain parallel PUTs of the same chunks
 *   republish  no-op republish of the unchanged tree (s)             vs sha256sum of the tree
 *   check      POST /api/chunks/check, 1000 hashes, 100k stored (ms) vs the same SQL through pg
 *   rollout    deploy to N simulated machines, to the last commit (s) vs one trivial command to each
 *   classic    classic installer deployment to N simulated machines, to the last install (s) vs the same floor
 *   scaleout   2 API + 2 worker processes behind a balancer, rollout to N machines, one of each SIGKILLed midway (s) vs the floor
 *   api        GET /api/roosts/{roostId}/versions/current under autocannon (req/s, p99) vs a bare Fastify route, same SQL
 *
 * Progress goes to stderr; stdout carries one JSON document at the end. Options: bench/options.ts
 * (`--only`, `--size-mib`, `--machines`, …). The stack is the in-process one (stack/run.ts) on its own
 * database, a free API port, its own task queue and its own Azurite (bench/stack.ts), so a running
 * `roost stack` is not disturbed.
 * Exit code 1 when a benchmark failed (the JSON then carries `errors`).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { benchApi } from './api';
import { benchCheck } from './check';
import { benchChunker } from './chunker';
import { benchClassic } from './classic';
import { parseOptions, type BenchOptions } from './options';
import { benchColdPush, benchRepublish, publishTree, type PublishedTree } from './push';
import { benchRollout } from './rollout';
import { benchScaleout } from './scaleout';
import { type BenchStack, benchConfig, emergencyStopBench, startBenchStack } from './stack';
import { ensureTree, type TreeInfo } from './tree';
import { log, round } from './util';

async function main(opts: BenchOptions): Promise<{ doc: Record<string, unknown>; failed: boolean }> {
  const started = new Date();
  const results: Record<string, unknown> = {};
  /** 1/5/15-minute load averages as each benchmark started (other work on the machine skews figures). */
  const loadAtStart: Record<string, number[]> = {};
  const errors: Record<string, string> = {};
  const cfg = benchConfig(opts.database);
  const benchDir = path.join(cfg.ROOST_DATA_DIR, 'bench');
  const wants = (n: BenchOptions['only'][number]) => opts.only.includes(n);

  let tree: TreeInfo | undefined;
  const document = (): Record<string, unknown> => {
    const doc: Record<string, unknown> = {
      benchmark: 'roost',
      startedAt: started.toISOString(),
      durationSeconds: round((Date.now() - started.getTime()) / 1000, 1),
      host: {
        cpus: os.cpus().length,
        cpuModel: os.cpus()[0]?.model ?? 'unknown',
        memoryGiB: round(os.totalmem() / 2 ** 30, 1),
        node: process.version,
        platform: `${process.platform}-${process.arch}`,
      },
      loadAverage: os.loadavg().map((x) => round(x, 2)),
      loadAverageAtStart: loadAtStart,
      options: opts,
      tree: tree ? { root: tree.root, files: tree.files, bytes: tree.bytes, kinds: tree.kinds, largest: tree.largest } : null,
      results,
    };
    if (Object.keys(errors).length) doc.errors = errors;
    return doc;
  };
  if (wants('chunker') || wants('push') || wants('republish')) tree = await ensureTree(benchDir, opts.sizeMiB);

  const attempt = async (name: string, fn: () => Promise<unknown>): Promise<void> => {
    loadAtStart[name] = os.loadavg().map((x) => round(x, 2));
    log(`=== ${name} (load average ${loadAtStart[name].join(' ')})`);
    try {
      results[name] = await fn();
    } catch (err) {
      errors[name] = (err as Error).stack ?? String(err);
      log(`${name} failed: ${(err as Error).message}`);
    }
    // A long run keeps what it measured so far.
    if (opts.out) fs.writeFileSync(opts.out, JSON.stringify({ ...document(), partial: true }, null, 2) + '\n');
  };

  if (tree && wants('chunker')) await attempt('chunker', () => benchChunker(tree!, { rounds: opts.rounds }));

  const needsStack =
    wants('push') || wants('republish') || wants('check') || wants('rollout') || wants('classic') || wants('api') || wants('scaleout');
  let bench: BenchStack | undefined;
  if (needsStack) {
    try {
      bench = await startBenchStack({ database: opts.database, worker: wants('rollout') || wants('classic') });
    } catch (err) {
      errors.stack = (err as Error).stack ?? String(err);
      log(`the bench stack did not start: ${(err as Error).message}`);
    }
  }
  if (bench) {
    try {
      if (wants('check'))
        await attempt('check', () => benchCheck(bench!, { storedChunks: opts.storedChunks, requests: opts.requests, api: opts.checkApi }));
      let published: PublishedTree | undefined;
      if (tree && wants('push')) {
        await attempt('push', async () => {
          const r = await benchColdPush(bench!, tree!, { concurrency: opts.concurrency, api: opts.pushApi, rounds: opts.rounds });
          published = r.published;
          return r.figures;
        });
      }
      if (tree && wants('republish')) {
        await attempt('republish', async () => {
          published ??= await publishTree(bench!, tree!, opts.concurrency);
          return benchRepublish(tree!, published, { concurrency: opts.concurrency, rounds: opts.rounds });
        });
      }
      if (wants('rollout')) {
        // The push benchmarks left ~2 × 17,500 blobs in the bench Azurite; the rollout starts from an empty one.
        if (wants('push') || wants('republish')) await bench.resetStorage();
        await attempt('rollout', () =>
          benchRollout(bench!, {
            machines: opts.machines,
            fleet: opts.fleet,
            rootDir: path.join(benchDir, 'fleet'),
            floor: !opts.skipFloor,
          }),
        );
      }
      if (wants('classic')) {
        await attempt('classic', () =>
          benchClassic(bench!, { machines: opts.machines, fleet: opts.fleet, rootDir: path.join(benchDir, 'classic') }),
        );
      }
      if (wants('scaleout')) {
        // Only the benchmark's own worker processes serve the task queue.
        if (bench.stack.worker) await bench.stack.stopWorker();
        await attempt('scaleout', () =>
          benchScaleout(bench!, {
            machines: opts.machines,
            fleet: opts.fleet,
            rootDir: path.join(benchDir, 'scaleout'),
            floor: !opts.skipFloor,
          }),
        );
      }
      if (wants('api')) {
        await attempt('api', () =>
          benchApi(bench!, {
            connections: opts.connections,
            seconds: opts.seconds,
            rounds: opts.rounds,
            ablations: opts.apiAblations,
            rootDir: benchDir,
          }),
        );
      }
    } finally {
      await bench.close({ keepDatabase: opts.keepDatabase }).catch((err) => log(`clean-up failed: ${(err as Error).message}`));
    }
  }
  return { doc: document(), failed: Object.keys(errors).length > 0 };
}

/**
 * SIGTERM to this process's remaining child processes, by pid (Linux /proc; elsewhere nothing): a service
 * caught half-started by a signal (e.g. the bench Azurite before it answered) is not left running.
 */
function killOwnChildren(): void {
  let entries: string[];
  try {
    entries = fs.readdirSync('/proc').filter((e) => /^\d+$/.test(e));
  } catch {
    return;
  }
  for (const pid of entries) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === process.pid) process.kill(Number(pid), 'SIGTERM');
    } catch {
      /* gone meanwhile */
    }
  }
}

if (require.main === module) {
  let opts: BenchOptions;
  try {
    opts = parseOptions(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`bench: ${(err as Error).message}\n`);
    process.exit(2);
  }
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      log(`${sig}: stopping the bench stack`);
      const stop = async () => {
        await emergencyStopBench();
        killOwnChildren();
        // The fleet child exits on its own when this process goes; its machine trees and a half-started
        // bench Azurite's files are ours to remove.
        await new Promise((r) => setTimeout(r, 1000));
        for (const dir of ['fleet', 'classic', 'scaleout', 'azurite']) {
          fs.rmSync(path.join(benchConfig(opts.database).ROOST_DATA_DIR, 'bench', dir), { recursive: true, force: true, maxRetries: 3 });
        }
      };
      void Promise.race([stop(), new Promise((r) => setTimeout(r, 30_000))]).finally(() => process.exit(130));
    });
  }
  main(opts)
    .then(({ doc, failed }) => {
      const text = JSON.stringify(doc, null, 2) + '\n';
      if (opts.out) fs.writeFileSync(opts.out, text);
      process.stdout.write(text);
      process.exit(failed ? 1 : 0);
    })
    .catch((err) => {
      process.stderr.write(`bench failed: ${(err as Error).stack ?? err}\n`);
      process.exit(1);
    });
}
