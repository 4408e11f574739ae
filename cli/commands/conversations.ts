/**
 * `roost conversations …`: conversations with the fleet assistant (routes in api/routes/conversations.ts,
 * docs/decisions/cortex.md), all under `/api/cortex/conversations`:
 *
 *   conversations list [--machine id] [--include-deleted] [--all]   GET ?siteId= (yours, newest first)
 *   conversations show <conversationId>                 GET …/{conversationId} (with its messages)
 *   conversations create [--machine id] [--title t]     POST (site-wide, or about one machine)
 *   conversations send <conversationId> <message|->     POST …/{conversationId}: the reply printed as it streams
 *   conversations rename <conversationId> <title>       PATCH …/{conversationId} ("" clears it)
 *   conversations delete <conversationId>               DELETE …/{conversationId} (restorable for 30 days)
 *   conversations restore <conversationId>              POST …/{conversationId}/restore
 *
 * `send` reads the message from stdin when it is `-`. Without `--json` each text delta is written to stdout
 * the moment it arrives; with `--json` the whole reply is one document at the end
 * (`{conversationId, messageId, content}`), as docs/decisions/cli-output.md asks. An error frame (`3:`)
 * ends the command with exit 1, code `reply_failed`, and the text received so far kept on stdout. A send is
 * never retried: the API never replays a reply (a reused Idempotency-Key is 422).
 */
import { type Command } from 'commander';
import { parseFrames } from '../../domain/cortex';
import { ClientError, seg } from '../client';
import { commandContext, positiveInt, table, UsageError, withJson } from '../context';
import { collectPages } from './versions';
import type { PagingOptions } from '../listing';

const BASE = '/api/cortex/conversations';

/** A conversation record (api/routes/conversations.ts ConversationView). */
interface ConversationView {
  conversationId: string;
  siteId: string;
  machineId: string | null;
  title: string | null;
  messageCount: number;
  createdAt: string;
  updatedAt: string;
  deletedAt: string | null;
  recoverableUntil: string | null;
  usage: { inputTokens: number; outputTokens: number };
}

interface MessageView {
  messageId: string;
  role: 'user' | 'assistant';
  content: string;
  status: string;
  createdAt: string;
  toolCalls: Array<{ toolName: string; ok: boolean; error: string | null }>;
  error: string | null;
}

/**
 * The message piped to `send -`: stdin as UTF-8 without the one line ending that ends it (`echo`, a file's
 * last line), as a shell's `$(…)` would drop it; other whitespace is the message's own.
 */
async function readStdin(): Promise<string> {
  const parts: Buffer[] = [];
  for await (const chunk of process.stdin) parts.push(chunk as Buffer);
  return Buffer.concat(parts)
    .toString('utf8')
    .replace(/\r?\n$/, '');
}

/** Registers `roost conversations`. */
export function registerConversations(program: Command): void {
  const conversations = program.command('conversations').description('conversations with the fleet assistant');

  withJson(
    conversations
      .command('list')
      .description('your conversations in the site, newest first')
      .option('--machine <machineId>', 'only those about this machine')
      .option('--include-deleted', 'also deleted ones that can still be restored')
      .option('--page-size <n>', 'conversations per page (1..100, default 25)', positiveInt('--page-size'))
      .option('--page-token <token>', 'continue after a previous page (its next_page_token)')
      .option('--all', 'follow every page'),
  ).action(async (o: PagingOptions & { machine?: string; includeDeleted?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = ctx.client();
    const siteId = ctx.siteId();
    const fetchPage = async (token: string | undefined) => {
      const res = await client.get<{ data: { conversations: ConversationView[]; next_page_token?: string } }>(BASE, {
        siteId,
        machineId: o.machine,
        includeDeleted: o.includeDeleted ? 'true' : undefined,
        page_size: o.pageSize,
        page_token: token,
      });
      return { items: res.data.conversations, next: res.data.next_page_token ?? '' };
    };
    const page = o.all ? await collectPages(fetchPage) : await fetchPage(o.pageToken);
    ctx.emit({ siteId, conversations: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no conversations\n');
      process.stdout.write(
        table(
          ['CONVERSATION', 'TITLE', 'MACHINE', 'MESSAGES', 'UPDATED', 'STATE'],
          page.items.map((c) => [
            c.conversationId,
            c.title,
            c.machineId,
            c.messageCount,
            c.updatedAt,
            c.deletedAt ? `deleted (restorable until ${c.recoverableUntil})` : 'active',
          ]),
        ) + '\n',
      );
      if (page.next) process.stdout.write(`more: --page-token ${page.next} (or --all)\n`);
    });
  });

  withJson(conversations.command('show').description('a conversation with its messages').argument('<conversationId>')).action(
    async (id: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const c = await ctx.client().get<ConversationView & { messages: MessageView[] }>(`${BASE}/${seg(id)}`);
      ctx.emit(c, () => {
        process.stdout.write(
          `${c.conversationId} ${c.title ?? '(untitled)'} on ${c.machineId ?? c.siteId}: ${c.messageCount} messages, ${c.usage.inputTokens}+${c.usage.outputTokens} tokens${c.deletedAt ? `, deleted (restorable until ${c.recoverableUntil})` : ''}\n`,
        );
        for (const m of c.messages) {
          const tools = m.toolCalls.length ? ` [tools: ${m.toolCalls.map((t) => `${t.toolName}${t.ok ? '' : ' failed'}`).join(', ')}]` : '';
          const state = m.status === 'complete' ? '' : ` (${m.status}${m.error ? `: ${m.error}` : ''})`;
          process.stdout.write(`\n${m.role} ${m.createdAt}${state}${tools}\n${m.content}\n`);
        }
      });
    },
  );

  withJson(
    conversations
      .command('create')
      .description('start a conversation about the site, or one machine of it')
      .option('--machine <machineId>', 'narrow it to this machine')
      .option('--title <title>', 'display title'),
  ).action(async (o: { machine?: string; title?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const body = {
      siteId: ctx.siteId(),
      ...(o.machine ? { machineId: o.machine } : {}),
      ...(o.title !== undefined ? { title: o.title } : {}),
    };
    const c = await ctx.client().post<ConversationView>(BASE, body, { idempotencyKey: true });
    ctx.emit(c, () => process.stdout.write(`created ${c.conversationId}\n`));
  });

  withJson(
    conversations
      .command('send')
      .description("send a message; the assistant's reply is printed as it streams")
      .argument('<conversationId>')
      .argument('<message>', 'the message, or - to read it from stdin'),
  ).action(async (id: string, message: string, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const text = message === '-' ? await readStdin() : message;
    if (!text.trim()) throw new UsageError('the message is empty');
    const { response, requestId } = await ctx
      .client()
      .openStream('POST', `${BASE}/${seg(id)}`, { body: { message: text }, idempotencyKey: true });
    const messageId = response.headers.get('x-message-id');
    const conversationId = response.headers.get('x-conversation-id') ?? id;
    const decoder = new TextDecoder();
    let buffer = '';
    let content = '';
    let failure: string | undefined;
    const take = (chunk: string) => {
      const { frames, rest } = parseFrames(buffer + chunk);
      buffer = rest;
      for (const f of frames) {
        if (f.kind === 'error') failure = f.message;
        else {
          content += f.text;
          if (!ctx.json) process.stdout.write(f.text);
        }
      }
    };
    if (response.body) for await (const chunk of response.body) take(decoder.decode(chunk as Uint8Array, { stream: true }));
    take(`${decoder.decode()}${buffer ? '\n' : ''}`);
    if (!ctx.json && content && !content.endsWith('\n')) process.stdout.write('\n');
    if (failure !== undefined)
      throw new ClientError({
        code: 'reply_failed',
        status: 0,
        detail: failure,
        body: { conversationId, messageId, content },
        requestId,
        method: 'POST',
        url: `${BASE}/${id}`,
        attempts: 1,
      });
    if (ctx.json) ctx.emit({ conversationId, messageId, content }, () => undefined);
  });

  withJson(
    conversations
      .command('rename')
      .description('rename a conversation ("" clears the title)')
      .argument('<conversationId>')
      .argument('<title>'),
  ).action(async (id: string, title: string, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const c = await ctx
      .client()
      .patch<ConversationView>(`${BASE}/${seg(id)}`, { title: title === '' ? null : title }, { idempotencyKey: true });
    ctx.emit(c, () => process.stdout.write(`${c.conversationId}: ${c.title ?? '(untitled)'}\n`));
  });

  withJson(
    conversations.command('delete').description('delete a conversation (restorable for 30 days)').argument('<conversationId>'),
  ).action(async (id: string, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const r = await ctx
      .client()
      .delete<{ alreadyDeleted: boolean; recoverableUntil: string }>(`${BASE}/${seg(id)}`, { idempotencyKey: true });
    ctx.emit(r, () =>
      process.stdout.write(`${r.alreadyDeleted ? `${id} was already deleted` : `deleted ${id}`}; restorable until ${r.recoverableUntil}\n`),
    );
  });

  withJson(conversations.command('restore').description('undo a delete within 30 days').argument('<conversationId>')).action(
    async (id: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const r = await ctx
        .client()
        .post<ConversationView & { restored: boolean }>(`${BASE}/${seg(id)}/restore`, undefined, { idempotencyKey: true });
      ctx.emit(r, () => process.stdout.write(r.restored ? `restored ${id}\n` : `${id} was not deleted\n`));
    },
  );
}
