/**
 * `roost events tail [--events a,b] [--last-event-id N] [--count N]`: follows the site's event stream
 * (docs/contract.md "Event stream": GET /api/events/stream, server-sent events) with the `eventsource`
 * client, which reconnects after a disconnect and resumes with `Last-Event-ID`, so no event is lost or
 * repeated across a dropped connection or an API restart. `--last-event-id` resumes a previous tail.
 *
 * Output: one line per catalog event (`<id> <event> <occurredAt> <data>`); with `--json` one JSON
 * document per line (`{"id","event","siteId","occurredAt","data"}`, NDJSON, the stream's form of the
 * output contract). `connected` and `keepalive` frames and reconnects are noted on stderr. It runs until
 * interrupted (exit 0) or `--count` events have been printed; a refusal (bad filter, credential or scope:
 * the problem+json the stream answers before it starts) ends it with that problem's exit code.
 */
import { type Command } from 'commander';
import { EventSource } from 'eventsource';
import { ClientError, DEFAULT_OUTAGE_WINDOW_MS } from '../client';
import { commandContext, listOf, positiveInt, UsageError } from '../context';
import { CLI_VERSION } from '../version';
import { EVENT_TYPES } from '../../domain/events';

/** One catalog event as tail prints it. */
export interface TailedEvent {
  id: string;
  event: string;
  siteId?: string;
  occurredAt?: string;
  data?: unknown;
}

export function registerEvents(program: Command): void {
  const events = program.command('events').description("the site's event stream");
  events
    .command('tail')
    .description('follow the event stream (reconnects and resumes with Last-Event-ID)')
    .option('--events <names>', `only these events (comma-separated): ${EVENT_TYPES.join(', ')}`, listOf('--events', EVENT_TYPES))
    .option('--last-event-id <id>', 'resume after this event id')
    .option('--count <n>', 'stop after this many events', positiveInt('--count'))
    .option('--json', 'one JSON document per event and line (NDJSON)')
    .action(async (opts: { events?: string[]; lastEventId?: string; count?: number; json?: boolean }, cmd: Command) => {
      const ctx = commandContext(cmd);
      const siteId = ctx.siteId();
      const key = ctx.globals.key;
      if (!key) ctx.client(); // throws the missing-key error
      if (opts.lastEventId !== undefined && !/^[0-9]+$/.test(opts.lastEventId))
        throw new UsageError(`--last-event-id must be an event id (a decimal number), got "${opts.lastEventId}"`);
      const url = new URL(`${ctx.globals.api}/api/events/stream`);
      url.searchParams.set('siteId', siteId);
      if (opts.events) url.searchParams.set('events', opts.events.join(','));
      if (opts.lastEventId !== undefined) url.searchParams.set('lastEventId', opts.lastEventId);
      await tail(url, key as string, opts, ctx);
    });
}

/** Follows the stream until `--count` events, SIGINT/SIGTERM, or a refusal. */
async function tail(
  url: URL,
  key: string,
  opts: { events?: string[]; count?: number; json?: boolean },
  ctx: ReturnType<typeof commandContext>,
): Promise<void> {
  let refusal: ClientError | undefined;
  let printed = 0;
  let wasOpen = false;
  // When the first outage answer of the current run of them came (epoch ms), undefined while the API answers.
  let outageSince: number | undefined;
  const es = new EventSource(url, {
    // Headers the browser form cannot send: the key, and the problem body of a refusal is kept for the error.
    fetch: async (input, init) => {
      const res = await fetch(input, {
        ...init,
        headers: { ...(init?.headers ?? {}), authorization: `Bearer ${key}`, 'user-agent': `roost-cli/${CLI_VERSION}` },
      });
      if (res.ok) outageSince = undefined;
      else {
        const body = (await res
          .clone()
          .json()
          .catch(() => ({}))) as Record<string, unknown>;
        // An outage answer (503 service_unavailable, 502, 504: docs/decisions/outages.md) is ridden out like
        // a lost connection for the CLI's outage window: thrown, the client reconnects after its delay and
        // resumes with Last-Event-ID. Any other refusal (or the window spent) ends the tail below.
        const outage =
          res.status === 502 ||
          res.status === 504 ||
          (res.status === 503 && (body.code ?? 'service_unavailable') === 'service_unavailable');
        if (outage) {
          outageSince ??= Date.now();
          if (Date.now() - outageSince < DEFAULT_OUTAGE_WINDOW_MS) {
            await res.body?.cancel().catch(() => undefined);
            throw new Error(`HTTP ${res.status}${typeof body.code === 'string' ? ` ${body.code}` : ''}`);
          }
        }
        refusal = new ClientError({
          code: typeof body.code === 'string' ? body.code : `http_${res.status}`,
          status: res.status,
          detail: typeof body.detail === 'string' ? body.detail : res.statusText,
          body,
          requestId: res.headers.get('x-request-id') ?? undefined,
          method: 'GET',
          url: url.toString().split('?')[0],
          attempts: 1,
        });
      }
      return res;
    },
  });
  await new Promise<void>((resolve, reject) => {
    // The client's reconnect timer does not hold the process open (it is unref'ed); the tail must.
    const keepAlive = setInterval(() => undefined, 60_000);
    const finish = (err?: unknown) => {
      clearInterval(keepAlive);
      es.close();
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      if (err) reject(err instanceof Error ? err : new Error(String(err)));
      else resolve();
    };
    const onSignal = () => finish();
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    es.addEventListener('connected', (e) => {
      const d = JSON.parse(e.data) as { lastEventId?: string };
      ctx.info(`${wasOpen ? 're' : ''}connected to ${url.origin} (events after ${d.lastEventId ?? e.lastEventId})`);
      wasOpen = true;
    });
    es.addEventListener('keepalive', () => undefined);
    const onEvent = (e: { data: string; type: string; lastEventId: string }) => {
      let env: Record<string, unknown> = {};
      try {
        env = JSON.parse(e.data) as Record<string, unknown>;
      } catch {
        env = { data: e.data };
      }
      const ev: TailedEvent = {
        id: e.lastEventId,
        event: e.type,
        siteId: env.siteId as string | undefined,
        occurredAt: env.occurredAt as string | undefined,
        data: env.data,
      };
      process.stdout.write(
        opts.json ? `${JSON.stringify(ev)}\n` : `${ev.id} ${ev.event} ${ev.occurredAt ?? ''} ${JSON.stringify(ev.data ?? null)}\n`,
      );
      printed++;
      if (opts.count !== undefined && printed >= opts.count) finish();
    };
    for (const name of opts.events ?? EVENT_TYPES) es.addEventListener(name, onEvent);
    es.onerror = (e) => {
      if (es.readyState === EventSource.CLOSED) {
        // A refusal (non-200, or not an event stream) ends the tail; the client does not retry those.
        finish(
          refusal ??
            new ClientError({
              code: 'stream_failed',
              status: 0,
              detail: e.message ?? 'the stream closed',
              method: 'GET',
              url: url.origin,
              attempts: 1,
            }),
        );
      } else ctx.info(`stream interrupted (${e.message ?? 'disconnected'}); reconnecting`);
    };
  });
}
