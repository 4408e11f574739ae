/**
 * `roost audit list|show|verify` (docs/contract.md "Audit log": GET /api/sites/{siteId}/audit-log and
 * GET …/audit-log/{recordHash}).
 *
 *   audit list [--kind k] [--actor a] [--since iso] [--all]   newest first
 *   audit show <hash>                                         the record and the server's verification report
 *   audit verify [hash]                                       without a hash: reads the whole chain and checks
 *                                                             it here (domain/audit.ts verifyRecord: every
 *                                                             record's hash, every link to its predecessor,
 *                                                             the genesis record, no gap in the sequence);
 *                                                             with a hash: that record, here and on the server
 *
 * A broken chain or record exits 1 and names the first failure (its sequence, hash and reason).
 */
import { type Command } from 'commander';
import { seg } from '../client';
import { commandContext, isoTime, table, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';
import { type AuditRecord, type VerificationReport, verifyRecord } from '../../domain/audit';

/** A record as the audit routes return it. */
interface WireRecord extends AuditRecord {
  sequence: number;
}

/** The outcome of `audit verify` over a chain. */
export interface ChainReport {
  siteId: string;
  checked: number;
  ok: boolean;
  /** The newest record's hash (the chain head), or null for an empty log. */
  head: string | null;
  failure: { sequence: number; hash: string; reason: string } | null;
}

/**
 * Checks a chain given newest first: each record against the next older one (which must be its
 * predecessor by sequence), the oldest as the genesis record (sequence 1).
 */
export function verifyChain(siteId: string, records: WireRecord[]): ChainReport {
  const report = (failure: ChainReport['failure']): ChainReport => ({
    siteId,
    checked: records.length,
    ok: failure === null,
    head: records[0]?.hash ?? null,
    failure,
  });
  for (let i = 0; i < records.length; i++) {
    const r = records[i];
    const older = records[i + 1] ?? null;
    if (older && older.sequence !== r.sequence - 1) return report({ sequence: r.sequence, hash: r.hash, reason: 'sequence_gap' });
    if (!older && r.sequence !== 1) return report({ sequence: r.sequence, hash: r.hash, reason: 'predecessor_missing' });
    const v = verifyRecord(r, older);
    if (!v.ok) return report({ sequence: r.sequence, hash: r.hash, reason: v.reason ?? 'invalid' });
  }
  return report(null);
}

export function registerAudit(program: Command): void {
  const audit = program.command('audit').description("the site's tamper-evident audit log");
  const base = (siteId: string) => `/api/sites/${seg(siteId)}/audit-log`;

  withJson(
    addPagingOptions(
      audit
        .command('list')
        .description('audit records, newest first')
        .option('--kind <kind>', 'only this kind (exact), e.g. roost_created')
        .option('--actor <actor>', 'only this actor (exact): apiKey:<keyId> or user:<uid>')
        .option('--since <iso>', 'only records at or after this ISO 8601 date or time', isoTime('--since')),
      'records',
    ),
  ).action(async (opts: PagingOptions & { kind?: string; actor?: string; since?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const siteId = ctx.siteId();
    const page = await fetchList<WireRecord>(
      ctx.client(),
      base(siteId),
      'records',
      { kind: opts.kind, actor: opts.actor, since: opts.since },
      opts,
    );
    ctx.emit({ siteId, records: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no records\n');
      process.stdout.write(
        table(
          ['SEQ', 'OCCURRED', 'KIND', 'ACTOR', 'HASH'],
          page.items.map((r) => [r.sequence, r.occurredAt, r.kind, r.actor, r.hash.slice(0, 16)]),
        ) + '\n',
      );
      process.stdout.write(morePagesHint(page.next));
    });
  });

  withJson(audit.command('show').description('one record with its verification report').argument('<hash>', 'record hash')).action(
    async (hash: string, _opts: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const r = await ctx.client().get<WireRecord & { verification: VerificationReport }>(`${base(ctx.siteId())}/${seg(hash)}`);
      ctx.emit(r, () =>
        process.stdout.write(
          `#${r.sequence} ${r.kind} by ${r.actor} at ${r.occurredAt}\n  hash      ${r.hash}\n  previous  ${r.previousHash ?? '- (genesis)'}\n` +
            `  verified  ${r.verification.ok ? 'ok' : `FAILED: ${r.verification.reason}`}\n  attributes ${JSON.stringify(r.attributes)}\n`,
        ),
      );
      if (!r.verification.ok) process.exitCode = 1;
    },
  );

  withJson(
    audit
      .command('verify')
      .description('check the whole chain here (or one record, here and on the server)')
      .argument('[hash]', 'verify only this record'),
  ).action(async (hash: string | undefined, _opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const siteId = ctx.siteId();
    const client = ctx.client();
    if (hash !== undefined) {
      const r = await client.get<WireRecord & { verification: VerificationReport }>(`${base(siteId)}/${seg(hash)}`);
      const predecessor = r.previousHash ? await client.get<WireRecord>(`${base(siteId)}/${seg(r.previousHash)}`).catch(() => null) : null;
      const local = verifyRecord(r, predecessor);
      const ok = local.ok && r.verification.ok;
      ctx.emit({ siteId, hash, ok, local, server: r.verification }, () =>
        process.stdout.write(
          `${hash}: ${ok ? 'ok' : 'FAILED'} (here: ${local.ok ? 'ok' : local.reason}; server: ${r.verification.ok ? 'ok' : r.verification.reason})\n`,
        ),
      );
      if (!ok) process.exitCode = 1;
      return;
    }
    ctx.info('reading the whole audit chain…');
    const all = await fetchList<WireRecord>(client, base(siteId), 'records', {}, { all: true, pageSize: 200 });
    const report = verifyChain(siteId, all.items);
    ctx.emit(report, () =>
      process.stdout.write(
        report.ok
          ? `audit chain of ${siteId} ok: ${report.checked} records, head ${report.head ?? '-'}\n`
          : `audit chain of ${siteId} BROKEN at #${report.failure?.sequence} ${report.failure?.hash}: ${report.failure?.reason}\n`,
      ),
    );
    if (!report.ok) process.exitCode = 1;
  });
}
