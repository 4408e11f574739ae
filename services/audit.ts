/**
 * The per-site audit log (`GET /api/sites/{siteId}/audit-log[/{recordHash}]`; docs/decisions/audit-chain.md,
 * docs/decisions/audit-recording.md, docs/decisions/audit-key-use.md): appending what a request did, with
 * the sampled key use and its `api_key.used` event, in one transaction; listing; and one record with its
 * verification against its predecessor. Chain SQL: db/audit.ts; hashing: domain/audit.ts.
 */
import {
  appendAuditRecords,
  type AuditInput,
  AUDIT_TX_ATTEMPTS,
  type KeyUse,
  listAuditRecords,
  noteKeyUse,
  verifyStoredRecord,
} from '../db/audit';
import { recordEvent } from '../db/events';
import { withTx } from '../db/pool';
import { ApiError } from '../domain/errors';
import { AUDIT_KIND_API_KEY_USED } from '../domain/audit';
import type { VerificationReport } from '../domain/audit';
import type { ServiceDeps } from './deps';

export type { AuditInput, AuditListOptions, KeyUse, StoredAuditRecord } from '../db/audit';
import type { AuditListOptions, StoredAuditRecord } from '../db/audit';

/** A use of an API key to note (`api_key_used` sampling). */
export interface KeyUseInput {
  keyId: string;
  keyPrefix: string;
  /** Client address ('unknown' when none). */
  ip: string;
  userAgent: string | null;
  method: string;
  route: string | null;
  requestId: string;
}

/**
 * Appends to the site's chain, in one SERIALIZABLE transaction: when `keyUse` is given, notes it (an
 * `api_key_used` record when this key has no sample from this address within `windowMs`, and the
 * `api_key.used` event on its first use from the address), then `action` when given.
 * @param now epoch ms of the request
 * @returns the key-use outcome (null without `keyUse`), for the caller's cache of recent samples
 * @throws the database error when the transaction fails after its retries
 */
export async function recordSiteActivity(
  deps: Pick<ServiceDeps, 'db'>,
  input: { siteId: string; actor: string; action: AuditInput | null; keyUse: KeyUseInput | null; now: number; windowMs: number },
): Promise<KeyUse | null> {
  const { siteId, actor, action, keyUse: key } = input;
  return withTx(
    deps.db,
    async (tx) => {
      let u: KeyUse | null = null;
      const inputs: AuditInput[] = [];
      if (key) {
        u = await noteKeyUse(tx, siteId, key.keyId, key.ip, input.now, input.windowMs);
        if (u.sample) {
          inputs.push({
            kind: AUDIT_KIND_API_KEY_USED,
            actor,
            attributes: {
              keyId: key.keyId,
              keyPrefix: key.keyPrefix,
              ip: key.ip,
              userAgent: key.userAgent,
              firstUseFromIp: u.firstUse,
              method: key.method,
              route: key.route,
              requestId: key.requestId,
            },
          });
        }
      }
      if (action) inputs.push(action);
      await appendAuditRecords(tx, siteId, inputs);
      if (key && u?.firstUse) {
        await recordEvent(tx, siteId, 'api_key.used', {
          keyId: key.keyId,
          keyPrefix: key.keyPrefix,
          ip: key.ip,
          userAgent: key.userAgent,
          firstUseFromIp: true,
        });
      }
      return u;
    },
    { attempts: AUDIT_TX_ATTEMPTS },
  );
}

/** A page of the site's log, newest first; `more` when older records follow. Does not check access. */
export function listSiteAudit(
  deps: Pick<ServiceDeps, 'db'>,
  siteId: string,
  opts: AuditListOptions,
): Promise<{ records: StoredAuditRecord[]; more: boolean }> {
  return listAuditRecords(deps.db, siteId, opts);
}

/**
 * One record of the site by hash with its verification report (hash, link to its stored predecessor).
 * @throws ApiError not_found
 */
export async function verifiedAuditRecord(
  deps: Pick<ServiceDeps, 'db'>,
  siteId: string,
  recordHash: string,
): Promise<{ record: StoredAuditRecord; verification: VerificationReport }> {
  const found = await verifyStoredRecord(deps.db, siteId, recordHash);
  if (!found) throw new ApiError('not_found', 'no audit record of this site has this hash');
  return found;
}
