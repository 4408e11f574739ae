/**
 * The per-site audit log (`GET /api/sites/{siteId}/audit-log[/{recordHash}]`; docs/decisions/audit-chain.md,
 * docs/decisions/audit-recording.md, docs/decisions/audit-key-use.md): appending what a request did, with
 * the sampled key use and its `api_key.used` event, in one transaction; listing; and one record with its
 * verification against its predecessor. Chain SQL: db/audit.ts; hashing: domain/audit.ts.
 */
import { randomUUID } from 'node:crypto';
import {
  appendAuditRecords,
  type AuditInput,
  AUDIT_TX_ATTEMPTS,
  insertAuditOutbox,
  type KeyUse,
  listAuditRecords,
  noteKeyUse,
  staleAuditOutbox,
  takeAuditOutbox,
  verifyStoredRecord,
} from '../db/audit';
import { recordEvent } from '../db/events';
import { enterTxObserver, type TxObserver, withTx } from '../db/pool';
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
 * `api_key.used` event on its first use from the address), then `action` when given, or the request's
 * record from the outbox when `outbox` is given (taken out of it in the same transaction).
 * @param now epoch ms of the request
 * @returns the key-use outcome (null without `keyUse`), for the caller's cache of recent samples
 * @throws the database error when the transaction fails after its retries
 */
export async function recordSiteActivity(
  deps: Pick<ServiceDeps, 'db'>,
  input: {
    siteId: string;
    actor: string;
    action: AuditInput | null;
    keyUse: KeyUseInput | null;
    now: number;
    windowMs: number;
    /** The request's record waiting in the outbox (`AuditedMutation`): linked with `outboxAttributes` added. */
    outbox?: { outboxId: string; attributes: Record<string, unknown> };
  },
): Promise<KeyUse | null> {
  const { siteId, actor, keyUse: key } = input;
  return withTx(
    deps.db,
    async (tx) => {
      let action = input.action;
      if (input.outbox) {
        // Taken by the periodic pass already (the request was slow to get here): its record is in the chain.
        const row = await takeAuditOutbox(tx, input.outbox.outboxId);
        action = row ? { kind: row.kind, actor: row.actor, attributes: { ...row.attributes, ...input.outbox.attributes } } : null;
      }
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

/**
 * The audit record of one mutating request, written by the request's own transactions
 * (docs/decisions/audit-recording.md): while `active`, every transaction of the request that writes also
 * inserts the record into `audit_outbox` (once; later ones find it there) just before its COMMIT, so no
 * mutation commits without its record. After the response the caller links it into the chain
 * (`recordSiteActivity` with `outbox`); if the process dies first, `linkStaleAuditOutbox` does.
 */
export interface AuditedMutation {
  readonly outboxId: string;
  /** The site the record went to, once a transaction that wrote it committed (null before). */
  readonly committedSiteId: string | null;
  /** Stops recording (the request's handler is done). */
  end(): void;
}

/**
 * Starts recording the mutation of the current request: makes its observer the current async context's
 * (db/pool.ts enterTxObserver). Call it synchronously where the request's handler will run after.
 * @param siteId read at each commit: the site the request was authorised for (none yet: nothing recorded)
 * @param details read at each commit: what the mutation's service said about it (a PATCH's changed fields),
 *   merged into the attributes so the record carries it from its commit on; never secrets
 */
export function beginAuditedMutation(input: {
  kind: string;
  actor: string;
  attributes: Record<string, unknown>;
  siteId: () => string | undefined;
  details?: () => Record<string, unknown> | undefined;
}): AuditedMutation {
  const outboxId = randomUUID();
  let committedSiteId: string | null = null;
  let pendingSiteId: string | null = null;
  const observer: TxObserver = {
    active: true,
    async beforeCommit(tx) {
      pendingSiteId = input.siteId() ?? null;
      if (pendingSiteId)
        await insertAuditOutbox(tx, {
          outboxId,
          siteId: pendingSiteId,
          kind: input.kind,
          actor: input.actor,
          attributes: { ...input.details?.(), ...input.attributes },
        });
    },
    afterCommit() {
      committedSiteId ??= pendingSiteId;
    },
  };
  enterTxObserver(observer);
  return {
    outboxId,
    get committedSiteId() {
      return committedSiteId;
    },
    end() {
      observer.active = false;
    },
  };
}

/**
 * Links outbox records older than `olderThanMs` into their sites' chains, one transaction each (their
 * request died between its commit and its response). Their attributes say `status: null` and
 * `linkedAfterCrash: true`: the response was never made. Returns how many were linked.
 */
export async function linkStaleAuditOutbox(deps: Pick<ServiceDeps, 'db'>, olderThanMs: number): Promise<number> {
  let linked = 0;
  for (const id of await staleAuditOutbox(deps.db, olderThanMs)) {
    const done = await withTx(
      deps.db,
      async (tx) => {
        const row = await takeAuditOutbox(tx, id);
        if (!row) return false;
        await appendAuditRecords(tx, row.siteId, [
          { kind: row.kind, actor: row.actor, attributes: { ...row.attributes, status: null, result: {}, linkedAfterCrash: true } },
        ]);
        return true;
      },
      { attempts: AUDIT_TX_ATTEMPTS },
    );
    if (done) linked++;
  }
  return linked;
}
