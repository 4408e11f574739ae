/**
 * `roost push <roostId> <dir>`: chunk, upload what the site lacks and publish a new version
 * (cli/push.ts; docs/contract.md Chunks upload flow and POST /api/roosts/{roostId}/versions).
 * --json prints the PushResult without the body (versionId, versionNumber, chunk and byte counts,
 * timings per stage (stages overlap), wall time, the upload window, skipped entries).
 */
import { type Command } from 'commander';
import { commandContext, formatBytes, positiveInt, withJson } from '../context';
import { createProgress } from '../progress';
import { push, pushTick } from '../push';

export function registerPush(program: Command): void {
  withJson(
    program
      .command('push')
      .description('publish a folder as a new version of a roost (uploads only the chunks the site lacks)')
      .argument('<roostId>', 'roost id')
      .argument('<dir>', 'folder to publish')
      .option('-d, --description <text>', 'version description (max 500 chars)')
      .option('--expect-current <versionId>', 'publish only if the current version is still this id (else version_stale)')
      .option(
        '-c, --concurrency <n>',
        'chunk uploads in flight (default: chosen from chunk sizes, up to 32 small chunks or 64 MiB)',
        positiveInt('--concurrency'),
      ),
  ).action(
    async (roostId: string, dir: string, opts: { description?: string; expectCurrent?: string; concurrency?: number }, cmd: Command) => {
      const ctx = commandContext(cmd);
      const progress = createProgress(ctx);
      let result;
      try {
        result = await push({
          client: ctx.client(),
          siteId: ctx.siteId(),
          roostId,
          dir,
          concurrency: opts.concurrency,
          description: opts.description,
          expectedCurrentVersionId: opts.expectCurrent,
          onProgress: (p) => progress.update(pushTick(p)),
        });
      } finally {
        progress.stop();
      }
      for (const s of result.skipped) ctx.info(`skipped ${s.path} (${s.reason})`);
      const { body: _body, ...summary } = result;
      ctx.emit(summary, () => {
        const t = result.timings;
        process.stdout.write(
          [
            `published ${roostId} version ${result.versionNumber} (${result.versionId})`,
            `  files ${result.filesTotal}, ${formatBytes(result.bytesTotal)}`,
            `  chunks ${result.chunksTotal}: ${result.chunksUploaded} uploaded (${formatBytes(result.bytesUploaded)}), ${result.chunksSkipped} already stored`,
            `  took ${result.wallMs} ms (stages overlap: hash ${t.hash} ms, check ${t.check} ms, upload ${t.upload} ms, publish ${t.publish} ms; up to ${result.upload.peakInFlight} uploads in flight)`,
            result.replayed ? '  (the server replayed an earlier identical publish)' : '',
          ]
            .filter(Boolean)
            .join('\n') + '\n',
        );
      });
    },
  );
}
