/**
 * Progress display for long client work (docs/architecture.md "Operator surface"): a cli-progress bar on stderr
 * when it is a TTY, otherwise one quiet line when a stage starts and one when it ends. Nothing is
 * written with --quiet, and nothing ever goes to stdout (that belongs to the result / --json).
 */
import cliProgress from 'cli-progress';
import { formatBytes } from './context';

/** One progress tick of any stage. `bytes` says whether done/total count bytes (else items). */
export interface Tick {
  stage: string;
  done: number;
  total: number;
  bytes?: boolean;
}

export interface ProgressSink {
  update(t: Tick): void;
  /** Ends the current stage's display (call in finally). */
  stop(): void;
}

/** A sink for the current terminal: bar on a TTY, lines otherwise, silent when `quiet`. */
export function createProgress(opts: { tty: boolean; quiet: boolean }): ProgressSink {
  if (opts.quiet) return { update: () => undefined, stop: () => undefined };
  const fmt = (t: Tick, n: number) => (t.bytes ? formatBytes(n) : String(n));
  let current: { stage: string; started: number; last: Tick; bar?: cliProgress.SingleBar; ended: boolean } | undefined;

  const end = () => {
    if (!current || current.ended) return;
    current.ended = true;
    const secs = ((Date.now() - current.started) / 1000).toFixed(1);
    if (current.bar) current.bar.stop();
    else
      process.stderr.write(
        `${current.stage}: done ${fmt(current.last, current.last.done)}/${fmt(current.last, current.last.total)} in ${secs}s\n`,
      );
  };

  return {
    update(t) {
      if (!current || current.stage !== t.stage) {
        end();
        current = { stage: t.stage, started: Date.now(), last: t, ended: false };
        if (opts.tty) {
          current.bar = new cliProgress.SingleBar(
            {
              stream: process.stderr,
              format: `${t.stage.padEnd(8)} [{bar}] {percentage}% | {shown} | {duration_formatted}`,
              hideCursor: true,
              fps: 10,
            },
            cliProgress.Presets.shades_classic,
          );
          current.bar.start(Math.max(t.total, 1), t.total === 0 ? 1 : t.done, { shown: `${fmt(t, t.done)}/${fmt(t, t.total)}` });
        } else {
          process.stderr.write(`${t.stage}: ${fmt(t, t.total)} to go\n`);
        }
      }
      if (current.ended) return;
      current.last = t;
      if (current.bar) {
        current.bar.setTotal(Math.max(t.total, 1));
        current.bar.update(t.total === 0 ? 1 : t.done, { shown: `${fmt(t, t.done)}/${fmt(t, t.total)}` });
      }
      if (t.total > 0 && t.done >= t.total) end();
    },
    stop: end,
  };
}
