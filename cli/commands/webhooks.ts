/**
 * `roost webhooks …`: subscriptions, their deliveries, manual retry and the probe (docs/contract.md
 * "Webhook subscription", "Events"; routes under /api/sites/{siteId}/webhooks and POST /api/webhooks/probe):
 *
 *   webhooks create <url> --name <n> --events a,b [--disabled]   signing secret shown once
 *   webhooks list | show <id> | delete <id>
 *   webhooks update <id> [--url] [--name] [--events] [--enable|--disable] [--pause|--resume]
 *   webhooks rotate-secret <id> [--grace-hours h]                 new secret shown once
 *   webhooks deliveries <id> [--all]                              history with attempts, newest first
 *   webhooks retry <id> <deliveryId>                              a new delivery run
 *   webhooks probe <url> --event <name> [--payload json]          one signed delivery, no retry
 *
 * Every mutation sends one Idempotency-Key per invocation.
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, idList, table, UsageError, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';

interface WebhookView {
  webhookId: string;
  url: string;
  name: string;
  events: string[];
  enabled: boolean;
  paused: boolean;
  lastStatus: string | null;
  failCount: number;
  signingSecret?: string;
  [extra: string]: unknown;
}

interface DeliveryView {
  deliveryId: string;
  event: string;
  status: string;
  attemptCount: number;
  lastError: string | null;
  createdAt: string;
  [extra: string]: unknown;
}

function state(w: WebhookView): string {
  return !w.enabled ? 'disabled' : w.paused ? 'paused' : 'enabled';
}

function parseJsonObject(flag: string, raw: string): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    throw new UsageError(`${flag} must be JSON`);
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new UsageError(`${flag} must be a JSON object`);
  return v as Record<string, unknown>;
}

export function registerWebhooks(program: Command): void {
  const webhooks = program.command('webhooks').description('webhook subscriptions, deliveries and the probe');
  const base = (siteId: string) => `/api/sites/${seg(siteId)}/webhooks`;

  withJson(
    webhooks
      .command('create')
      .description('subscribe a receiver URL to events; the signing secret is shown once')
      .argument('<url>', 'https receiver URL')
      .requiredOption('--name <name>', 'label')
      .requiredOption('--events <names>', 'comma-separated event names of the catalog', idList)
      .option('--disabled', 'create it disabled'),
  ).action(async (url: string, opts: { name: string; events: string[]; disabled?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body = { url, name: opts.name, events: opts.events, ...(opts.disabled ? { enabled: false } : {}) };
    const w = await ctx.client().post<WebhookView>(base(ctx.siteId()), body, { idempotencyKey: true });
    ctx.emit(w, () =>
      process.stdout.write(
        `${w.signingSecret}\ncreated ${w.webhookId} → ${w.url} (${w.events.join(', ')}); the secret is not shown again\n`,
      ),
    );
  });

  withJson(addPagingOptions(webhooks.command('list').description("list the site's subscriptions"), 'subscriptions')).action(
    async (opts: PagingOptions, cmd: Command) => {
      const ctx = commandContext(cmd);
      const siteId = ctx.siteId();
      const page = await fetchList<WebhookView>(ctx.client(), base(siteId), 'webhooks', {}, opts);
      ctx.emit({ siteId, webhooks: page.items, next_page_token: page.next }, () => {
        if (page.items.length === 0) return void process.stdout.write('no webhooks\n');
        process.stdout.write(
          table(
            ['WEBHOOK', 'NAME', 'STATE', 'LAST', 'FAILS', 'EVENTS', 'URL'],
            page.items.map((w) => [w.webhookId, w.name, state(w), w.lastStatus, w.failCount, w.events.join(','), w.url]),
          ) + '\n',
        );
        process.stdout.write(morePagesHint(page.next));
      });
    },
  );

  withJson(webhooks.command('show').description('show one subscription').argument('<webhookId>', 'webhook id')).action(
    async (webhookId: string, _opts: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const w = await ctx.client().get<WebhookView>(`${base(ctx.siteId())}/${seg(webhookId)}`);
      ctx.emit(w, () =>
        process.stdout.write(
          `${w.webhookId} (${w.name}) ${state(w)}\n  url     ${w.url}\n  events  ${w.events.join(', ')}\n  last    ${w.lastStatus ?? '-'}, ${w.failCount} consecutive failures\n`,
        ),
      );
    },
  );

  withJson(
    webhooks
      .command('update')
      .description('change a subscription')
      .argument('<webhookId>', 'webhook id')
      .option('--url <url>', 'new receiver URL')
      .option('--name <name>', 'new label')
      .option('--events <names>', 'new comma-separated event list', idList)
      .option('--enable', 'enable it')
      .option('--disable', 'disable it')
      .option('--pause', 'pause deliveries')
      .option('--resume', 'resume a paused subscription (resets its failure count)'),
  ).action(
    async (
      webhookId: string,
      opts: { url?: string; name?: string; events?: string[]; enable?: boolean; disable?: boolean; pause?: boolean; resume?: boolean },
      cmd: Command,
    ) => {
      const ctx = commandContext(cmd);
      if (opts.enable && opts.disable) throw new UsageError('--enable and --disable exclude each other');
      if (opts.pause && opts.resume) throw new UsageError('--pause and --resume exclude each other');
      const body: Record<string, unknown> = {};
      if (opts.url !== undefined) body.url = opts.url;
      if (opts.name !== undefined) body.name = opts.name;
      if (opts.events !== undefined) body.events = opts.events;
      if (opts.enable || opts.disable) body.enabled = opts.enable === true;
      if (opts.pause || opts.resume) body.paused = opts.pause === true;
      if (Object.keys(body).length === 0)
        throw new UsageError('nothing to change: give --url, --name, --events, --enable/--disable or --pause/--resume');
      const w = await ctx.client().patch<WebhookView>(`${base(ctx.siteId())}/${seg(webhookId)}`, body, { idempotencyKey: true });
      ctx.emit(w, () => process.stdout.write(`updated ${w.webhookId}: ${state(w)}, ${w.events.join(', ')} → ${w.url}\n`));
    },
  );

  withJson(webhooks.command('delete').description('delete a subscription with its history').argument('<webhookId>', 'webhook id')).action(
    async (webhookId: string, _opts: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const res = await ctx.client().delete<{ webhookId: string }>(`${base(ctx.siteId())}/${seg(webhookId)}`, { idempotencyKey: true });
      ctx.emit(res, () => process.stdout.write(`deleted ${res.webhookId}\n`));
    },
  );

  withJson(
    webhooks
      .command('rotate-secret')
      .description('issue a new signing secret (shown once); the old one keeps signing for the grace period')
      .argument('<webhookId>', 'webhook id')
      .option('--grace-hours <hours>', 'hours the previous secret keeps signing (0 ends it now)', (v) => {
        if (!/^[0-9]+$/.test(v)) throw new UsageError(`--grace-hours must be a whole number, got "${v}"`);
        return Number(v);
      }),
  ).action(async (webhookId: string, opts: { graceHours?: number }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const res = await ctx
      .client()
      .post<WebhookView>(
        `${base(ctx.siteId())}/${seg(webhookId)}/rotate-secret`,
        opts.graceHours === undefined ? {} : { graceHours: opts.graceHours },
        { idempotencyKey: true },
      );
    ctx.emit(res, () =>
      process.stdout.write(
        `${res.signingSecret}\nrotated the secret of ${res.webhookId}; the previous one signs until ${String(res.previousSecretExpiresAt ?? 'now')}\n`,
      ),
    );
  });

  withJson(
    addPagingOptions(
      webhooks.command('deliveries').description("a subscription's deliveries, newest first").argument('<webhookId>', 'webhook id'),
      'deliveries',
    ),
  ).action(async (webhookId: string, opts: PagingOptions, cmd: Command) => {
    const ctx = commandContext(cmd);
    const page = await fetchList<DeliveryView>(ctx.client(), `${base(ctx.siteId())}/${seg(webhookId)}/deliveries`, 'deliveries', {}, opts);
    ctx.emit({ webhookId, deliveries: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no deliveries\n');
      process.stdout.write(
        table(
          ['DELIVERY', 'EVENT', 'STATUS', 'ATTEMPTS', 'CREATED', 'LAST ERROR'],
          page.items.map((d) => [d.deliveryId, d.event, d.status, d.attemptCount, d.createdAt, d.lastError]),
        ) + '\n',
      );
      process.stdout.write(morePagesHint(page.next));
    });
  });

  withJson(
    webhooks
      .command('retry')
      .description('deliver a finished delivery again')
      .argument('<webhookId>', 'webhook id')
      .argument('<deliveryId>', 'delivery id'),
  ).action(async (webhookId: string, deliveryId: string, _opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const res = await ctx
      .client()
      .post<{ deliveryId: string; status: string }>(
        `${base(ctx.siteId())}/${seg(webhookId)}/deliveries/${seg(deliveryId)}/retry`,
        undefined,
        { idempotencyKey: true },
      );
    ctx.emit(res, () => process.stdout.write(`delivery ${res.deliveryId} queued again (${res.status})\n`));
  });

  withJson(
    webhooks
      .command('probe')
      .description('send one signed test delivery to a URL (no retry) and show the answer')
      .argument('<url>', 'receiver URL')
      .requiredOption('--event <name>', 'an event name of the catalog')
      .option('--payload <json>', 'the envelope data (a JSON object)', '{}')
      .option('--signing-secret <secret>', 'sign with this secret (default: a fresh one, printed)'),
  ).action(async (url: string, opts: { event: string; payload: string; signingSecret?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body = {
      url,
      event: opts.event,
      payload: parseJsonObject('--payload', opts.payload),
      ...(opts.signingSecret ? { signingSecret: opts.signingSecret } : {}),
    };
    const res = await ctx
      .client()
      .post<{ ok: boolean; statusCode: number | null; latencyMs: number; error: string | null }>('/api/webhooks/probe', body, {
        query: { siteId: ctx.siteId() },
      });
    ctx.emit(res, () =>
      process.stdout.write(
        `${res.ok ? 'delivered' : 'not delivered'}: ${res.statusCode === null ? (res.error ?? 'no response') : `HTTP ${res.statusCode}`} in ${res.latencyMs} ms\n`,
      ),
    );
    if (!res.ok) process.exitCode = 1;
  });
}
