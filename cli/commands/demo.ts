/** `roost demo` (what `npm run demo` runs): the walk-through of cli/demo.ts with a human summary or --json. */
import type { Command } from 'commander';
import { runDemo, type DemoReport } from '../demo';
import { formatBytes } from '../context';

function summary(r: DemoReport): string {
  const lines: string[] = [];
  lines.push(`Roost demo: OK in ${r.seconds.toFixed(1)} s`);
  lines.push(
    `  tree      ${r.source.dir}: ${r.source.files} files, ${formatBytes(r.source.bytes)} (largest ${formatBytes(r.source.largestFile)}, ${r.source.zeroByteFiles} zero-byte)`,
  );
  for (const p of r.pushes) {
    lines.push(
      `  push v${p.versionNumber}   ${p.versionId.slice(0, 16)}…  ${p.chunksTotal} chunks: ${p.chunksUploaded} uploaded (${formatBytes(p.bytesUploaded)}), ${p.chunksSkipped} skipped`,
    );
  }
  for (const o of r.rollouts) {
    lines.push(
      `  ${o.label.padEnd(28)} ${o.machinesCommitted} machines committed in ${o.seconds.toFixed(1)} s (canary ${o.canary.length}, fleet ${o.fleet}); files skipped ${o.filesSkipped}, chunks reused ${o.chunksDedup}; history ${o.historyLength} events`,
    );
    lines.push(`  ${''.padEnd(28)} ${o.workflowUrl}`);
  }
  lines.push(`  verified  every tree byte for byte and reported = intended on every machine, after every rollout`);
  lines.push(`  rollback  current = v${r.rollback.currentVersionNumber} (${r.rollback.currentVersionId.slice(0, 16)}…)`);
  const s = r.diff.summary;
  lines.push(
    `  diff v2 against v1: ${s.added} added, ${s.removed} removed, ${s.changed} changed, ${s.unchanged} unchanged, ${s.netBytesDelta} bytes net`,
  );
  for (const p of r.diff.added) lines.push(`    + ${p}`);
  for (const p of r.diff.removed) lines.push(`    - ${p}`);
  for (const p of r.diff.modified) lines.push(`    ~ ${p}`);
  lines.push(
    `  api ${r.urls.api}  reference ${r.urls.reference}  temporal-ui ${r.urls.temporalUi} (stopped now; run \`npx roost stack\` to keep them up)`,
  );
  return lines.join('\n');
}

export function registerDemo(program: Command): void {
  program
    .command('demo')
    .description('the main job on the embedded default: push a real tree, roll it out to a simulated fleet, verify, change, roll back')
    .option('--dir <path>', 'tree to push (default: the typescript, @fastify and @sinclair packages from node_modules)')
    .option('--machines <n>', 'simulated machines', '20')
    .option('--timeout <seconds>', 'limit for each rollout', '600')
    .option('--keep', "keep the working copy and the machines' trees under .data/demo")
    .option('--json', 'print one JSON report on stdout')
    .action(async (opts: { dir?: string; machines: string; timeout: string; keep?: boolean; json?: boolean }) => {
      const quiet = opts.json === true && !process.stderr.isTTY;
      const report = await runDemo({
        dir: opts.dir,
        machines: Math.max(1, Number(opts.machines) || 20),
        timeoutMs: Math.max(10, Number(opts.timeout) || 600) * 1000,
        keep: opts.keep === true,
        tty: process.stderr.isTTY === true,
        quiet,
        log: (l) => process.stderr.write(`[demo] ${l}\n`),
      });
      if (opts.json) process.stdout.write(JSON.stringify(report, null, 2) + '\n');
      else process.stdout.write(summary(report) + '\n');
    });
}
