/**
 * The audit log of a site (services/audit.ts):
 *
 *   GET /api/sites/{siteId}/audit-log               site read → { records[], next_page_token, nextPageToken }
 *       query kind (exact), actor (exact), since (ISO 8601; records at or after it), page_size (default 50,
 *       max 200), page_token (aliases limit, cursor). Newest first (descending chain position).
 *   GET /api/sites/{siteId}/audit-log/{recordHash}  site read → the record with previousHash, hash and
 *       its `verification` report (hashValid, linkageValid, isGenesis, predecessorPresent, reason, ok).
 *
 * Records are appended by api/plugins/audit.ts; chain and verification in db/audit.ts and domain/audit.ts.
 * Decisions: docs/decisions/audit-chain.md, docs/decisions/audit-log-routes.md.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { ApiError } from '../../domain/errors';
import { SHA256_HEX } from '../../domain/hex';
import { Nullable, pagingQuery, PageTokens, problems, SiteId } from '../../domain/schemas';
import { listSiteAudit, type StoredAuditRecord, verifiedAuditRecord } from '../../services/audit';
import { authorizeSite } from '../plugins/auth';
import { parsePaging } from '../pagination';

/** Audit log page size (default 50, max 200). */
export const AUDIT_PAGE = { defaultSize: 50, maxSize: 200 };

const LogParams = Type.Object({ siteId: SiteId });
const RecordParams = Type.Object({
  siteId: SiteId,
  recordHash: Type.String({ pattern: SHA256_HEX.source, description: 'the record hash (lowercase SHA-256 hex, 64 chars)' }),
});
/**
 * The `since` forms parseSince accepts, as one regular expression (also the document's `pattern`): a real
 * calendar date (leap years included), optionally a time `T` hh:mm[:ss[.fraction]] and an offset Z or ±hh[:]mm.
 */
const DATE_SOURCE =
  '[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|' +
  '(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29';
const ISO_8601_SOURCE = `(?:${DATE_SOURCE})(?:[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\\.[0-9]{1,9})?)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):?[0-5][0-9])?)?`;
const ISO_8601_FORM = new RegExp(`^${ISO_8601_SOURCE}$`);
const ISO_8601 = /^(\d{4})-(\d{2})-(\d{2})(?:[Tt](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?([Zz]|[+-]\d{2}:?\d{2})?)?$/;

const LogQuery = Type.Object({
  kind: Type.Optional(
    Type.String({ minLength: 1, maxLength: 200, description: 'only records of this kind (exact match), e.g. api_key_used' }),
  ),
  actor: Type.Optional(
    Type.String({ minLength: 1, maxLength: 200, description: 'only records of this actor (exact match): apiKey:<keyId> or user:<uid>' }),
  ),
  since: Type.Optional(
    Type.String({
      'x-roost-pattern': `^(?:${ISO_8601_SOURCE})?$`,
      description:
        'ISO 8601 date or date-time (UTC when no offset is given): only records that occurred at or after it; empty means no filter',
    }),
  ),
  ...pagingQuery(AUDIT_PAGE),
});

/** One audit record as the routes return it. */
export const AuditRecordSchema = Type.Object({
  hash: Type.String({
    description: 'SHA-256 hex of the RFC 8785 canonical JSON of {kind, actor, occurredAt, attributes, previousHash, siteId}; the record id',
  }),
  previousHash: Nullable(Type.String({ description: "the site's previous record's hash; null for the genesis record" })),
  kind: Type.String({ description: 'api_key_used, signed_url_issued, or a mutation kind (roost_created, version_published, …)' }),
  actor: Type.String({ description: 'apiKey:<keyId> or user:<uid>' }),
  occurredAt: Type.String({ description: 'ISO 8601 UTC with milliseconds (hashed in this exact form)' }),
  attributes: Type.Record(Type.String(), Type.Unknown()),
  siteId: Type.String(),
  sequence: Type.Integer({ minimum: 1, description: "position in the site's chain (1 = genesis)" }),
});
type AuditRecordWire = Static<typeof AuditRecordSchema>;

const Verification = Type.Object({
  hashValid: Type.Boolean(),
  linkageValid: Type.Boolean(),
  isGenesis: Type.Boolean(),
  predecessorPresent: Type.Boolean(),
  reason: Nullable(
    Type.String({
      description: 'null when ok; hash_mismatch, predecessor_missing, predecessor_mismatch, predecessor_tampered, genesis_has_predecessor',
    }),
  ),
  ok: Type.Boolean(),
});
const RecordResponse = Type.Object({ ...AuditRecordSchema.properties, verification: Verification });
type RecordResponse = Static<typeof RecordResponse>;

const ListResponse = Type.Object({
  records: Type.Array(AuditRecordSchema),
  ...PageTokens,
});
type ListResponse = Static<typeof ListResponse>;

/** Parses `since` (ISO 8601 date or date-time; no offset means UTC). Anything else → 400 validation_failed (param since). */
export function parseSince(raw: string): Date {
  const m = ISO_8601_FORM.test(raw) ? ISO_8601.exec(raw) : null;
  if (m) {
    const [, y, mo, da, h = '00', mi = '00', s = '00', frac = '', off = 'Z'] = m;
    const daysInMonth = new Date(Date.UTC(Number(y), Number(mo), 0)).getUTCDate();
    const fieldsOk =
      Number(mo) >= 1 &&
      Number(mo) <= 12 &&
      Number(da) >= 1 &&
      Number(da) <= daysInMonth &&
      Number(h) <= 23 &&
      Number(mi) <= 59 &&
      Number(s) <= 59;
    const zone = off.toUpperCase() === 'Z' ? 'Z' : off.length === 5 ? `${off.slice(0, 3)}:${off.slice(3)}` : off;
    const t = Date.parse(`${y}-${mo}-${da}T${h}:${mi}:${s}${frac ? `.${frac.slice(0, 3).padEnd(3, '0')}` : ''}${zone}`);
    if (fieldsOk && !Number.isNaN(t)) return new Date(t);
  }
  throw new ApiError('validation_failed', 'since must be an ISO 8601 date or date-time, e.g. 2026-01-31T12:00:00Z', {
    extras: { param: 'since', errors: { since: ['must be an ISO 8601 date or date-time'] } },
  });
}

function wire(r: StoredAuditRecord): AuditRecordWire {
  return {
    hash: r.hash,
    previousHash: r.previousHash,
    kind: r.kind,
    actor: r.actor,
    occurredAt: r.occurredAt,
    attributes: r.attributes,
    siteId: r.siteId,
    sequence: r.seq,
  };
}

const isPosition = (p: unknown): p is { s: number } =>
  typeof p === 'object' && p !== null && !Array.isArray(p) && Number.isInteger((p as { s?: unknown }).s) && (p as { s: number }).s > 0;

/** Registers the audit log routes. */
const auditRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/api/sites/:siteId/audit-log',
    {
      schema: {
        summary: "A site's hash-chained audit log, newest first",
        tags: ['audit'],
        params: LogParams,
        querystring: LogQuery,
        response: { 200: ListResponse, ...problems() },
      },
    },
    async (request): Promise<ListResponse> => {
      const { siteId } = request.params;
      const q = request.query;
      const paging = parsePaging(request, { ...AUDIT_PAGE, accept: isPosition });
      const since = q.since !== undefined && q.since !== '' ? parseSince(q.since) : undefined;
      await authorizeSite(request, siteId, [{ resource: 'site', id: siteId, permission: 'read' }]);
      const page = await listSiteAudit(app.deps, siteId, {
        kind: q.kind,
        actor: q.actor,
        since,
        beforeSeq: paging.after?.s,
        limit: paging.pageSize,
      });
      const last = page.records[page.records.length - 1];
      return { records: page.records.map(wire), ...paging.tokens(page.more && last ? { s: last.seq } : undefined) };
    },
  );

  app.get(
    '/api/sites/:siteId/audit-log/:recordHash',
    {
      schema: {
        summary: 'One audit record with its verification report',
        tags: ['audit'],
        params: RecordParams,
        response: { 200: RecordResponse, ...problems() },
      },
    },
    async (request): Promise<RecordResponse> => {
      const { siteId, recordHash } = request.params;
      await authorizeSite(request, siteId, [{ resource: 'site', id: siteId, permission: 'read' }]);
      const found = await verifiedAuditRecord(app.deps, siteId, recordHash);
      return { ...wire(found.record), verification: found.verification };
    },
  );
};

export default auditRoutes;
