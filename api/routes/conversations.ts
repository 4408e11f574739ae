/**
 * Conversations with the fleet assistant (services/conversations.ts; docs/decisions/cortex.md). One set of
 * handlers registered at two bases: the canonical `/api/cortex/conversations` and the developer-preview alias
 * `/api/chat` (marked deprecated in the OpenAPI document):
 *
 *   POST   /api/cortex/conversations                            create { siteId, machineId?, title? } (Idempotency-Key required)
 *   GET    /api/cortex/conversations?siteId=                    the caller's conversations, newest first, nested under `data`
 *                                                               (page_size 1..100, default 25, clamped or defaulted, never 400)
 *   GET    /api/cortex/conversations/{conversationId}           the conversation with its messages (role, time, tool calls)
 *   POST   /api/cortex/conversations/{conversationId}           send { message }: the reply streams as `0:` text and `3:` error lines
 *                                                               (Idempotency-Key required; never replayed: a used key is 422)
 *   PATCH  /api/cortex/conversations/{conversationId}           rename { title } (other fields: 400 forbidden_field)
 *   DELETE /api/cortex/conversations/{conversationId}           soft delete (a repeat answers alreadyDeleted true)
 *   POST   /api/cortex/conversations/{conversationId}/restore   undo a delete within 30 days (ROOST_CONVERSATION_RECOVERY_SECONDS)
 *
 * Scopes: `chat` read to list and read back, `chat` write for everything else, with id the site (or, for a
 * conversation about one machine, the machine), on top of site membership.
 */
import { Readable } from 'node:stream';
import type { FastifyRequest } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import {
  CONVERSATION_ID_RE,
  CONVERSATION_PAGE,
  conversationPageSize,
  encodeFrame,
  MAX_MESSAGE_LENGTH,
  MAX_TITLE_LENGTH,
  type ReplyFrame,
} from '../../domain/cortex';
import { DateTime, MachineId, NullableDateTime, pagingQuery, PageTokens, problems, SiteId, NON_BLANK_TEXT } from '../../domain/schemas';
import type { Permission, Requirement } from '../../domain/scopes';
import {
  type Caller,
  type ConversationPosition,
  type ConversationRow,
  type ConversationTarget,
  createConversation,
  deleteConversation,
  isConversationPosition,
  type MessageRow,
  readConversation,
  listConversationPage,
  renameConversation,
  restoreConversation,
  sendKeyDigest,
  startReply,
} from '../../services/conversations';
import { authorizeSite } from '../plugins/auth';
import { parsePaging } from '../pagination';
import type { UserPrincipal } from '../context';

/** The canonical base and its compatibility alias (docs/contract.md Versioning: developer-preview compatibility). */
export const CONVERSATION_BASES = ['/api/cortex/conversations', '/api/chat'] as const;

// ---------------------------------------------------------------------------------------------------
// Schemas

const ConversationId = Type.String({ pattern: CONVERSATION_ID_RE.source, description: 'conversation id (cnv_…)' });
const Title = Type.String({
  minLength: 1,
  maxLength: MAX_TITLE_LENGTH,
  pattern: NON_BLANK_TEXT,
  description: 'display title (an empty string counts as no title)',
});
/** An empty title is no title (stored as null): bodies are not coerced, so it is its own branch. */
const NoTitle = Type.Literal('');
const Params = Type.Object({ conversationId: ConversationId });

const CreateBody = Type.Object(
  {
    siteId: SiteId,
    machineId: Type.Optional(Type.Union([MachineId, Type.Null()], { description: 'narrow the conversation to one machine of the site' })),
    title: Type.Optional(Type.Union([Title, NoTitle, Type.Null()])),
  },
  { additionalProperties: false },
);
/**
 * Send and rename bodies: other fields are 400 forbidden_field and a rename without title is 400 (checked in the
 * handler for those codes; the document states them with `x-roost-closed` / `x-roost-required`, api/openapi.ts).
 */
const SendBody = Type.Object(
  {
    message: Type.String({
      minLength: 1,
      maxLength: MAX_MESSAGE_LENGTH,
      pattern: NON_BLANK_TEXT,
      description: 'the user message (plain text)',
    }),
  },
  { 'x-roost-closed': true },
);
const RenameBody = Type.Object(
  { title: Type.Optional(Type.Union([Title, NoTitle, Type.Null()], { description: 'new title; null or "" clears it' })) },
  { 'x-roost-closed': true, 'x-roost-required': ['title'] },
);

const clampedSize = (what: string) =>
  Type.Optional(
    Type.String({
      description: `${what}: 1..${CONVERSATION_PAGE.maxSize} (default ${CONVERSATION_PAGE.defaultSize}); out-of-range values are clamped and unreadable ones defaulted`,
    }),
  );

const ListQuery = Type.Object({
  siteId: SiteId,
  machineId: Type.Optional(MachineId),
  includeDeleted: Type.Optional(Type.Boolean({ description: 'also list deleted conversations that can still be restored' })),
  ...pagingQuery(CONVERSATION_PAGE),
  // Conversation lists clamp or default a bad size instead of refusing it (docs/contract.md Conventions).
  page_size: clampedSize('page size'),
  limit: clampedSize('legacy alias of page_size (page_size wins when both are sent)'),
});

const Usage = Type.Object(
  { inputTokens: Type.Integer(), outputTokens: Type.Integer() },
  { description: "token usage over the conversation's replies, as the model reported it (the local assistant counts words)" },
);
const ConversationProps = {
  conversationId: Type.String(),
  siteId: Type.String(),
  machineId: Type.Union([Type.String(), Type.Null()], { description: 'null: the conversation is about the whole site' }),
  title: Type.Union([Type.String(), Type.Null()]),
  messageCount: Type.Integer(),
  createdAt: DateTime,
  updatedAt: DateTime,
  deletedAt: NullableDateTime,
  recoverableUntil: Type.Union([DateTime, Type.Null()], { description: 'a deleted conversation can be restored until then' }),
  usage: Usage,
};
const ConversationView = Type.Object(ConversationProps);
type ConversationView = Static<typeof ConversationView>;

const ToolCallView = Type.Object({
  toolName: Type.String(),
  input: Type.Unknown(),
  ok: Type.Boolean(),
  error: Type.Union([Type.String(), Type.Null()]),
});
const MessageView = Type.Object({
  messageId: Type.String(),
  role: Type.Union([Type.Literal('user'), Type.Literal('assistant')]),
  content: Type.String(),
  status: Type.Union([Type.Literal('complete'), Type.Literal('streaming'), Type.Literal('interrupted'), Type.Literal('failed')], {
    description: 'interrupted: the client went away and the partial reply was kept; failed: see error',
  }),
  createdAt: DateTime,
  completedAt: NullableDateTime,
  toolCalls: Type.Array(ToolCallView, { description: 'the fleet tools the assistant called for this reply' }),
  error: Type.Union([Type.String(), Type.Null()]),
  model: Type.Union([Type.String(), Type.Null()]),
});
type MessageView = Static<typeof MessageView>;

const ListResponse = Type.Object({
  data: Type.Object({ conversations: Type.Array(ConversationView), ...PageTokens }),
});
const DeleteResponse = Type.Object({
  conversationId: Type.String(),
  siteId: Type.String(),
  deleted: Type.Literal(true),
  alreadyDeleted: Type.Boolean(),
  deletedAt: DateTime,
  recoverableUntil: DateTime,
});
/** The reply stream (typed unknown: the handler sends a Readable of these lines). */
const ReplyStream = Type.Unknown({
  description:
    'text/plain stream of lines: `0:<JSON string>` a text delta, `3:<JSON string>` an error (the stream then ends). Headers X-Conversation-Id and X-Message-Id name the stored reply.',
});

// ---------------------------------------------------------------------------------------------------
// Views and rules

const iso = (d: Date | null) => (d === null ? null : d.toISOString());

function conversationView(r: ConversationRow, recoverySeconds: number): ConversationView {
  return {
    conversationId: r.conversation_id,
    siteId: r.site_id,
    machineId: r.machine_id,
    title: r.title,
    messageCount: Number(r.message_count),
    createdAt: r.created_at.toISOString(),
    updatedAt: r.updated_at.toISOString(),
    deletedAt: iso(r.deleted_at),
    recoverableUntil: r.deleted_at ? new Date(r.deleted_at.getTime() + recoverySeconds * 1000).toISOString() : null,
    usage: { inputTokens: Number(r.input_tokens), outputTokens: Number(r.output_tokens) },
  };
}

function messageView(m: MessageRow): MessageView {
  return {
    messageId: m.message_id,
    role: m.role,
    content: m.content,
    status: m.status,
    createdAt: m.created_at.toISOString(),
    completedAt: iso(m.completed_at),
    toolCalls: m.tool_calls.map((c) => ({
      toolName: c.toolName,
      input: c.input,
      ok: c.error === null && c.resultChars !== null,
      error: c.error,
    })),
    error: m.error,
    model: m.model,
  };
}

/** 400 forbidden_field for body fields other than `allowed` (send and rename; docs/contract.md errors table). */
function rejectOtherFields(body: Record<string, unknown>, allowed: string): void {
  const extra = Object.keys(body).filter((k) => k !== allowed);
  if (extra.length) {
    throw new ApiError('forbidden_field', `only ${allowed} may be sent; not allowed: ${extra.join(', ')}`, {
      extras: { param: extra[0], fields: extra },
    });
  }
}

/** The `chat` scopes a conversation needs: on its site, or on its machine for a narrowed one. */
function chat(t: ConversationTarget, permission: Permission): Requirement[] {
  return [
    { resource: 'chat', id: t.siteId, permission },
    ...(t.machineId ? [{ resource: 'chat' as const, id: t.machineId, permission }] : []),
  ];
}

function callerOf(user: UserPrincipal): Caller {
  return { userId: user.userId, scopes: user.key && !user.key.isLegacy ? user.key.scopes : null };
}

/** The authorisation callback of the services: site membership, then the `chat` scope. */
const authorizer = (request: FastifyRequest, permission: Permission) => async (t: ConversationTarget) =>
  callerOf(await authorizeSite(request, t.siteId, chat(t, permission)));

/**
 * Page size clamped or defaulted (never 400): the request's size is rewritten to the clamped value before
 * the shared token rules of api/pagination.ts read it. Tokens name one list for both bases, so a token of
 * `/api/chat` pages `/api/cortex/conversations` too.
 */
function conversationPaging(request: FastifyRequest) {
  const query = request.query as Record<string, unknown>;
  const present = (v: unknown) => v !== undefined && v !== null && v !== '';
  const size = conversationPageSize(present(query.page_size) ? query.page_size : present(query.limit) ? query.limit : undefined);
  request.query = { ...query, page_size: String(size), limit: undefined };
  return parsePaging<ConversationPosition>(request, {
    ...CONVERSATION_PAGE,
    accept: isConversationPosition,
    list: `GET ${CONVERSATION_BASES[0]}`,
  });
}

/** Line-prefixed frames of a reply, as bytes for the response. */
async function* lines(frames: AsyncIterable<ReplyFrame>): AsyncGenerator<string> {
  for await (const f of frames) yield encodeFrame(f);
}

// ---------------------------------------------------------------------------------------------------
// Routes

/** The conversation routes at `base` (registered once per base: the same handlers). */
function routesAt(base: (typeof CONVERSATION_BASES)[number]): FastifyPluginAsyncTypebox {
  const alias = base !== CONVERSATION_BASES[0];
  const tags = ['conversations'];
  const common = alias ? { tags, deprecated: true } : { tags };
  const aliasNote = alias ? ` (alias of ${CONVERSATION_BASES[0]})` : '';
  return async (app) => {
    const recovery = app.deps.cfg.ROOST_CONVERSATION_RECOVERY_SECONDS;

    app.post(
      base,
      {
        config: { idempotency: 'required', audit: 'conversation_created' },
        schema: {
          ...common,
          summary: `Create a conversation with the fleet assistant, site-wide or about one machine${aliasNote}`,
          body: CreateBody,
          response: { 201: ConversationView, ...problems(409, 422, 423, 429, 503) },
        },
      },
      async (request, reply) => {
        const b = request.body;
        const target = { siteId: b.siteId, machineId: b.machineId ?? null };
        const caller = await authorizer(request, 'write')(target);
        const row = await createConversation(app.deps, { ...target, title: b.title || null, caller });
        reply.code(201);
        return conversationView(row, recovery);
      },
    );

    app.get(
      base,
      {
        schema: {
          ...common,
          summary: `The caller's conversations in a site, newest first, nested under data${aliasNote}`,
          querystring: ListQuery,
          response: { 200: ListResponse, ...problems(429) },
        },
      },
      async (request) => {
        const q = request.query;
        // Filtered to one machine, that machine's chat scope is enough (as for reading one of its conversations).
        const caller = await authorizer(request, 'read')({ siteId: q.siteId, machineId: q.machineId ?? null });
        const paging = conversationPaging(request);
        const page = await listConversationPage(app.deps, {
          siteId: q.siteId,
          caller,
          pageSize: paging.pageSize,
          after: paging.after,
          includeDeleted: q.includeDeleted === true,
          machineId: q.machineId,
        });
        return { data: { conversations: page.conversations.map((c) => conversationView(c, recovery)), ...paging.tokens(page.next) } };
      },
    );

    app.get(
      `${base}/:conversationId`,
      {
        schema: {
          ...common,
          summary: `A conversation with its messages (role, time, tool calls)${aliasNote}`,
          params: Params,
          response: { 200: Type.Object({ ...ConversationProps, messages: Type.Array(MessageView) }), ...problems(429) },
        },
      },
      async (request) => {
        const r = await readConversation(app.deps, {
          conversationId: request.params.conversationId,
          authorize: authorizer(request, 'read'),
        });
        return { ...conversationView(r.conversation, recovery), messages: r.messages.map(messageView) };
      },
    );

    app.post(
      `${base}/:conversationId`,
      {
        config: { idempotency: 'required', audit: 'conversation_message_sent' },
        schema: {
          ...common,
          summary: `Send a message and stream the assistant's reply (0: text, 3: error lines; never replayed)${aliasNote}`,
          params: Params,
          body: SendBody,
          response: { 200: { content: { 'text/plain': { schema: ReplyStream } } }, ...problems(409, 422, 423, 429, 503) },
        },
      },
      async (request, reply) => {
        const body = request.body as Static<typeof SendBody> & Record<string, unknown>;
        rejectOtherFields(body, 'message');
        const user = request.principal as UserPrincipal;
        const ac = new AbortController();
        reply.raw.on('close', () => {
          if (!reply.raw.writableFinished) ac.abort();
        });
        const r = await startReply(app.deps, {
          conversationId: request.params.conversationId,
          message: body.message,
          idempotencyDigest: sendKeyDigest(user.userId, user.key?.keyId ?? '', String(request.headers['idempotency-key'])),
          authorize: authorizer(request, 'write'),
          signal: ac.signal,
        });
        reply
          .code(200)
          .header('Content-Type', 'text/plain; charset=utf-8')
          .header('Cache-Control', 'no-store')
          .header('X-Accel-Buffering', 'no')
          .header('X-Conversation-Id', r.conversation.conversation_id)
          .header('X-Message-Id', r.assistantMessageId);
        return reply.send(Readable.from(lines(r.frames)));
      },
    );

    app.patch(
      `${base}/:conversationId`,
      {
        config: { idempotency: 'optional', audit: 'conversation_renamed' },
        schema: {
          ...common,
          summary: `Rename a conversation (only title; other fields: 400 forbidden_field)${aliasNote}`,
          params: Params,
          body: RenameBody,
          response: { 200: ConversationView, ...problems(409, 422, 429) },
        },
      },
      async (request) => {
        const body = request.body as Static<typeof RenameBody> & Record<string, unknown>;
        rejectOtherFields(body, 'title');
        if (body.title === undefined) {
          throw new ApiError('validation_failed', 'title is required (null clears it)', {
            extras: { param: 'title', errors: { title: ['is required'] } },
          });
        }
        const row = await renameConversation(app.deps, {
          conversationId: request.params.conversationId,
          title: body.title || null,
          authorize: authorizer(request, 'write'),
        });
        return conversationView(row, recovery);
      },
    );

    app.delete(
      `${base}/:conversationId`,
      {
        config: { idempotency: 'optional', audit: 'conversation_deleted' },
        schema: {
          ...common,
          summary: `Soft-delete a conversation (restorable for 30 days; a repeat answers alreadyDeleted true)${aliasNote}`,
          params: Params,
          response: { 200: DeleteResponse, ...problems(409, 422, 429) },
        },
      },
      async (request) => {
        const r = await deleteConversation(app.deps, {
          conversationId: request.params.conversationId,
          authorize: authorizer(request, 'write'),
        });
        const view = conversationView(r.conversation, recovery);
        return {
          conversationId: view.conversationId,
          siteId: view.siteId,
          deleted: true as const,
          alreadyDeleted: r.alreadyDeleted,
          deletedAt: view.deletedAt!,
          recoverableUntil: view.recoverableUntil!,
        };
      },
    );

    app.post(
      `${base}/:conversationId/restore`,
      {
        config: { idempotency: 'optional', audit: 'conversation_restored' },
        schema: {
          ...common,
          summary: `Restore a deleted conversation within 30 days of its deletion (restored false when it was not deleted)${aliasNote}`,
          params: Params,
          response: { 200: Type.Object({ ...ConversationProps, restored: Type.Boolean() }), ...problems(409, 422, 429) },
        },
      },
      async (request) => {
        const r = await restoreConversation(app.deps, {
          conversationId: request.params.conversationId,
          authorize: authorizer(request, 'write'),
        });
        return { ...conversationView(r.conversation, recovery), restored: r.restored };
      },
    );
  };
}

/** Registers the conversation routes at the canonical base and at the `/api/chat` alias. */
const conversationRoutes: FastifyPluginAsyncTypebox = async (app) => {
  for (const base of CONVERSATION_BASES) await app.register(routesAt(base));
};

export default conversationRoutes;
