/**
 * Audit record hashing and verification (domain/audit.ts; docs/contract.md "Audit record").
 */
import { createHash } from 'node:crypto';
import {
  apiKeyActor,
  auditHash,
  type AuditRecord,
  canonicalTime,
  hashSetDigest,
  sealAuditRecord,
  userActor,
  verifyRecord,
} from '../../domain/audit';

const SITE = 'site_unit';

function chain(n: number): AuditRecord[] {
  const out: AuditRecord[] = [];
  for (let i = 0; i < n; i++) {
    out.push(
      sealAuditRecord({
        kind: i % 2 ? 'signed_url_issued' : 'roost_created',
        actor: apiKeyActor('key_1'),
        occurredAt: new Date(Date.UTC(2026, 0, 1, 0, 0, i, 5)).toISOString(),
        attributes: { i, nested: { b: [1, 'two', null], a: true } },
        previousHash: i === 0 ? null : out[i - 1].hash,
        siteId: SITE,
      }),
    );
  }
  return out;
}

describe('audit hash', () => {
  it('is SHA-256 hex of the RFC 8785 canonical JSON of the six content fields', () => {
    const r = sealAuditRecord({
      kind: 'api_key_used',
      actor: userActor('usr_1'),
      occurredAt: '2026-01-01T00:00:00.000Z',
      attributes: { b: 2, a: 1 },
      previousHash: null,
      siteId: SITE,
    });
    const expected = createHash('sha256')
      .update(
        '{"actor":"user:usr_1","attributes":{"a":1,"b":2},"kind":"api_key_used","occurredAt":"2026-01-01T00:00:00.000Z","previousHash":null,"siteId":"site_unit"}',
      )
      .digest('hex');
    expect(r.hash).toBe(expected);
  });

  it('does not depend on key order or on how the time was given', () => {
    const a = auditHash({
      kind: 'k',
      actor: 'user:u',
      occurredAt: '2026-01-01T00:00:00Z',
      attributes: { x: 1, y: [2] },
      previousHash: null,
      siteId: SITE,
    });
    const b = auditHash({
      siteId: SITE,
      previousHash: null,
      attributes: { y: [2], x: 1 },
      occurredAt: canonicalTime(Date.UTC(2026, 0, 1)),
      actor: 'user:u',
      kind: 'k',
    });
    expect(a).toBe(b);
  });

  it('changes with every content field', () => {
    const base = {
      kind: 'k',
      actor: 'user:u',
      occurredAt: '2026-01-01T00:00:00.000Z',
      attributes: { x: 1 },
      previousHash: null as string | null,
      siteId: SITE,
    };
    const h = auditHash(base);
    const variants = [
      { ...base, kind: 'k2' },
      { ...base, actor: 'apiKey:u' },
      { ...base, occurredAt: '2026-01-01T00:00:00.001Z' },
      { ...base, attributes: { x: 2 } },
      { ...base, previousHash: 'a'.repeat(64) },
      { ...base, siteId: 'site_other' },
    ];
    for (const v of variants) expect(auditHash(v)).not.toBe(h);
  });

  it('names actors as the spec does', () => {
    expect(apiKeyActor('key_9')).toBe('apiKey:key_9');
    expect(userActor('usr_9')).toBe('user:usr_9');
  });

  it('digests a set of hashes independently of order and repeats', () => {
    const a = 'a'.repeat(64);
    const b = 'b'.repeat(64);
    expect(hashSetDigest([b, a, b])).toBe(hashSetDigest([a, b]));
    expect(hashSetDigest([a])).not.toBe(hashSetDigest([a, b]));
  });
});

describe('verifyRecord', () => {
  it('accepts the genesis record and every linked successor', () => {
    const c = chain(4);
    expect(verifyRecord(c[0], null)).toEqual({
      hashValid: true,
      linkageValid: true,
      isGenesis: true,
      predecessorPresent: false,
      reason: null,
      ok: true,
    });
    for (let i = 1; i < c.length; i++) {
      expect(verifyRecord(c[i], c[i - 1])).toEqual({
        hashValid: true,
        linkageValid: true,
        isGenesis: false,
        predecessorPresent: true,
        reason: null,
        ok: true,
      });
    }
  });

  it('reports altered content as hash_mismatch', () => {
    const c = chain(2);
    const tampered = { ...c[1], attributes: { ...c[1].attributes, i: 99 } };
    expect(verifyRecord(tampered, c[0])).toEqual({
      hashValid: false,
      linkageValid: true,
      isGenesis: false,
      predecessorPresent: true,
      reason: 'hash_mismatch',
      ok: false,
    });
  });

  it('reports a successor of a tampered record as predecessor_tampered', () => {
    const c = chain(3);
    const tamperedPredecessor = { ...c[1], actor: 'user:mallory' };
    const r = verifyRecord(c[2], tamperedPredecessor);
    expect(r).toEqual({
      hashValid: true,
      linkageValid: false,
      isGenesis: false,
      predecessorPresent: true,
      reason: 'predecessor_tampered',
      ok: false,
    });
  });

  it('reports a missing or wrong predecessor', () => {
    const c = chain(3);
    expect(verifyRecord(c[2], null)).toMatchObject({
      hashValid: true,
      linkageValid: false,
      predecessorPresent: false,
      reason: 'predecessor_missing',
      ok: false,
    });
    expect(verifyRecord(c[2], c[0])).toMatchObject({
      linkageValid: false,
      predecessorPresent: true,
      reason: 'predecessor_mismatch',
      ok: false,
    });
    expect(verifyRecord({ ...c[1] }, { ...c[0], siteId: 'site_other' })).toMatchObject({
      linkageValid: false,
      reason: 'predecessor_mismatch',
    });
    expect(verifyRecord(c[0], c[1])).toMatchObject({ isGenesis: true, linkageValid: false, reason: 'genesis_has_predecessor', ok: false });
  });

  it('refuses a record whose claimed hash is not a SHA-256 hex digest', () => {
    const [g] = chain(1);
    expect(verifyRecord({ ...g, hash: g.hash.toUpperCase() }, null)).toMatchObject({
      hashValid: false,
      reason: 'hash_mismatch',
      ok: false,
    });
  });

  it('names hash_mismatch first when both the content and the link are wrong', () => {
    const c = chain(2);
    expect(verifyRecord({ ...c[1], kind: 'other' }, null)).toMatchObject({
      hashValid: false,
      linkageValid: false,
      reason: 'hash_mismatch',
      ok: false,
    });
  });
});
