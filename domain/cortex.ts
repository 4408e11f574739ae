/**
 * Pure rules of conversations with the fleet assistant (`/api/cortex/conversations`, aliases `/api/chat/*`;
 * docs/contract.md Conversations; docs/decisions/cortex.md): ids, limits, the page-size rule and the reply
 * stream's line-prefixed frames.
 */

/** Conversation ids are server-made: `cnv_<24 hex>`. */
export const CONVERSATION_ID_RE = /^cnv_[0-9a-f]{24}$/;

/** Longest conversation title, characters. */
export const MAX_TITLE_LENGTH = 200;
/** Longest user message of one send, characters. */
export const MAX_MESSAGE_LENGTH = 16000;
/** Conversation list paging (docs/contract.md Limits): default 25, max 100. */
export const CONVERSATION_PAGE = { defaultSize: 25, maxSize: 100 } as const;
/** Messages returned by `GET /api/cortex/conversations/{conversationId}` (the newest). */
export const MAX_MESSAGES_SHOWN = 500;
/** Earlier messages given to the model as context of a new reply (the newest). */
export const MAX_HISTORY_MESSAGES = 40;

/**
 * The page size of a conversation list: conversation routes clamp or default instead of refusing
 * (docs/contract.md Conventions). Absent, empty or not a whole number → the default; below 1 → 1; above
 * the maximum → the maximum.
 */
export function conversationPageSize(raw: unknown): number {
  const { defaultSize, maxSize } = CONVERSATION_PAGE;
  if (raw === undefined || raw === null) return defaultSize;
  const s = String(Array.isArray(raw) ? raw[0] : raw).trim();
  if (!/^[+-]?[0-9]{1,15}$/.test(s)) return defaultSize;
  const n = Number(s);
  return Math.min(maxSize, Math.max(1, n));
}

/** A frame of the reply stream: `0:` a text delta, `3:` an error (the stream then ends). */
export type ReplyFrame = { kind: 'text'; text: string } | { kind: 'error'; message: string };

/** One frame as its line: the prefix, then the JSON-encoded string, then a newline. */
export function encodeFrame(frame: ReplyFrame): string {
  return frame.kind === 'text' ? `0:${JSON.stringify(frame.text)}\n` : `3:${JSON.stringify(frame.message)}\n`;
}

/**
 * Parses complete lines of a reply stream into frames; lines with other prefixes are skipped (clients must
 * ignore frame kinds they do not know). Returns the frames and the unterminated rest of `buffer`.
 * @throws Error on a `0:` or `3:` line whose payload is not a JSON string.
 */
export function parseFrames(buffer: string): { frames: ReplyFrame[]; rest: string } {
  const frames: ReplyFrame[] = [];
  let start = 0;
  for (let nl = buffer.indexOf('\n'); nl >= 0; nl = buffer.indexOf('\n', start)) {
    const line = buffer.slice(start, nl);
    start = nl + 1;
    const m = /^([0-9a-z]+):([\s\S]*)$/.exec(line); // [\s\S]: U+2028/U+2029 may sit raw in a JSON string
    if (!m || (m[1] !== '0' && m[1] !== '3')) continue;
    const value: unknown = JSON.parse(m[2]);
    if (typeof value !== 'string') throw new Error(`frame ${m[1]}: payload is not a JSON string`);
    frames.push(m[1] === '0' ? { kind: 'text', text: value } : { kind: 'error', message: value });
  }
  return { frames, rest: buffer.slice(start) };
}
