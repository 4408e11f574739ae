/**
 * Progress display for long client work (docs/architecture.md "Operator surface"): cli-progress bars on stderr
 * when it is a TTY (one per stage, several at once when stages overlap, as in a push), otherwise one
 * quiet line when a stage starts and one when it ends. Nothing is written with --quiet, and nothing ever
 * goes to stdout (that belongs to the result / --json).
 */
import cliProgress from 'cli-progress';
import { formatBytes } from './context';

/** One progress tick of any stage. `bytes` says whether done/total count bytes (else items). */
export interface Tick {
  stage: string;
  done: number;
  total: number;
  bytes?: boolean;
  /**
   * Set by callers whose stages overlap (cli/push.ts): `total` will not grow any more, so the stage
   * ends once `done` reaches it, and a tick of another stage does not end this one. Absent: stages run
   * one after another, and a tick of a new stage ends the one before.
   */
  final?: boolean;
}

export interface ProgressSink {
  update(t: Tick): void;
  /** Ends every stage's display (call in finally); later ticks start afresh. */
  stop(): void;
}

interface StageView {
  started: number;
  last: Tick;
  bar?: cliProgress.SingleBar;
  ended: boolean;
}

/** A sink for the current terminal: bars on a TTY, lines otherwise, silent when `quiet`. */
export function createProgress(opts: { tty: boolean; quiet: boolean }): ProgressSink {
  if (opts.quiet) return { update: () => undefined, stop: () => undefined };
  const fmt = (t: Tick, n: number) => (t.bytes ? formatBytes(n) : String(n));
  const shown = (t: Tick) => `${fmt(t, t.done)}/${fmt(t, t.total)}${t.final === false ? '+' : ''}`;
  const stages = new Map<string, StageView>();
  let bars: cliProgress.MultiBar | undefined;

  const end = (view: StageView) => {
    if (view.ended) return;
    view.ended = true;
    if (view.bar) view.bar.stop();
    else {
      const secs = ((Date.now() - view.started) / 1000).toFixed(1);
      process.stderr.write(`${view.last.stage}: done ${fmt(view.last, view.last.done)}/${fmt(view.last, view.last.total)} in ${secs}s\n`);
    }
  };

  return {
    update(t) {
      let view = stages.get(t.stage);
      if (!view) {
        // Stages that run one after another: a new stage ends the ones before it.
        if (t.final === undefined) for (const v of stages.values()) end(v);
        view = { started: Date.now(), last: t, ended: false };
        stages.set(t.stage, view);
        if (opts.tty) {
          bars ??= new cliProgress.MultiBar(
            { stream: process.stderr, hideCursor: true, fps: 10, format: '{stage} [{bar}] {percentage}% | {shown} | {duration_formatted}' },
            cliProgress.Presets.shades_classic,
          );
          view.bar = bars.create(Math.max(t.total, 1), t.total === 0 ? 1 : t.done, { stage: t.stage.padEnd(8), shown: shown(t) });
        } else {
          process.stderr.write(t.final === false ? `${t.stage}: started\n` : `${t.stage}: ${fmt(t, t.total)} to go\n`);
        }
      }
      if (view.ended) return;
      view.last = t;
      if (view.bar) {
        view.bar.setTotal(Math.max(t.total, 1));
        view.bar.update(t.total === 0 ? 1 : t.done, { stage: t.stage.padEnd(8), shown: shown(t) });
      }
      if (t.final === undefined ? t.total > 0 && t.done >= t.total : t.final && t.done >= t.total) end(view);
    },
    stop() {
      for (const v of stages.values()) end(v);
      stages.clear();
      bars?.stop();
      bars = undefined;
    },
  };
}
