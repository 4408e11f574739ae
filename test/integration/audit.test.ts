/**
 * The hash-chained audit log against the real services (docs/contract.md "Audit record", "Audit log", Event
 * catalog `api_key.used`): records of mutations, signed URLs and sampled key use with the right
 * actor, the api_key.used event once per new address, filters and paging, site isolation, the tamper
 * test and a chain that stays one chain under 50 concurrent appenders.
 */
import http from 'node:http';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { randomBytes } from 'node:crypto';
import { buildApp } from '../../api/app';
import { appendAudit, type StoredAuditRecord } from '../../db/audit';
import { hashSetDigest } from '../../domain/audit';
import { sha256Hex } from '../../domain/hex';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { insertKey, makeUser, addMember, sessionFor } from '../support/identity';
import { testLogger } from '../support/test-log';

let h: Harness;

beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => h.close());

type Site = { siteId: string; userId: string; apiKey: string; keyId: string; email: string };

/** A fresh site (its owner a plain member) with its full-access key; every test gets its own chain. */
async function freshSite(): Promise<Site> {
  const o = await h.other();
  const keyId = (await h.deps.db.query<{ key_id: string }>('SELECT key_id FROM api_keys WHERE uid = $1', [o.userId])).rows[0].key_id;
  const email = (await h.deps.db.query<{ email: string }>('SELECT email FROM users WHERE uid = $1', [o.userId])).rows[0].email;
  return { ...o, keyId, email };
}

/** app.inject with a bearer credential from a chosen client address. */
async function call(
  opts: { method: string; url: string; key: string | null; body?: unknown; ip?: string; headers?: Record<string, string> },
  app: FastifyInstance = h.app,
): Promise<LightMyRequestResponse> {
  const headers: Record<string, string> = { ...(opts.headers ?? {}) };
  if (opts.key) headers.authorization = `Bearer ${opts.key}`;
  return app.inject({
    method: opts.method as any,
    url: opts.url,
    headers,
    payload: opts.body as any,
    remoteAddress: opts.ip ?? '127.0.0.1',
  });
}

/** The site's chain straight from the database, oldest first. */
async function chainOf(siteId: string): Promise<(StoredAuditRecord & { seq: number })[]> {
  const { rows } = await h.deps.db.query(
    'SELECT hash, previous_hash, seq, kind, actor, attributes, occurred_at FROM audit_records WHERE site_id = $1 ORDER BY seq',
    [siteId],
  );
  return rows.map((r: any) => ({
    siteId,
    hash: r.hash,
    previousHash: r.previous_hash,
    seq: Number(r.seq),
    kind: r.kind,
    actor: r.actor,
    attributes: r.attributes,
    occurredAt: r.occurred_at.toISOString(),
  }));
}

const kinds = async (siteId: string) => (await chainOf(siteId)).map((r) => r.kind);

async function createRoost(s: Site, key: string = s.apiKey, ip?: string): Promise<string> {
  const res = await call({
    method: 'POST',
    url: '/api/roosts',
    key,
    body: { siteId: s.siteId, name: `r-${randomBytes(3).toString('hex')}` },
    ip,
  });
  expect(res.statusCode).toBe(201);
  return res.json().roostId;
}

async function hold(siteId: string, hash: string): Promise<void> {
  await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, 1024) ON CONFLICT DO NOTHING', [siteId, hash]);
}

const fakeHash = () => sha256Hex(randomBytes(16));

// ---------------------------------------------------------------------------------------------------

describe('recording', () => {
  it('records a mutation by API key with actor apiKey:<keyId>, after one api_key_used sample', async () => {
    const s = await freshSite();
    const roostId = await createRoost(s);
    const chain = await chainOf(s.siteId);
    expect(chain.map((r) => [r.kind, r.actor])).toEqual([
      ['api_key_used', `apiKey:${s.keyId}`],
      ['roost_created', `apiKey:${s.keyId}`],
    ]);
    expect(chain[1].attributes).toEqual({
      method: 'POST',
      route: '/api/roosts',
      params: {},
      status: 201,
      requestId: expect.stringMatching(/^req_/),
      idempotentReplay: false,
      result: { roostId },
    });
    expect(chain[0].previousHash).toBeNull();
    expect(chain[1].previousHash).toBe(chain[0].hash);
  });

  it('records a mutation by session with actor user:<uid> and no key sample', async () => {
    const s = await freshSite();
    const { token } = await sessionFor(h, { uid: s.userId, email: s.email });
    const roostId = await createRoost(s, token);
    const patched = await call({ method: 'PATCH', url: `/api/roosts/${roostId}`, key: token, body: { siteId: s.siteId, name: 'renamed' } });
    expect(patched.statusCode).toBe(200);
    const chain = await chainOf(s.siteId);
    expect(chain.map((r) => [r.kind, r.actor])).toEqual([
      ['roost_created', `user:${s.userId}`],
      ['roost_updated', `user:${s.userId}`],
    ]);
    expect(chain[1].attributes).toMatchObject({ route: '/api/roosts/:roostId', params: { roostId }, status: 200 });
  });

  it('writes nothing for refused requests (validation, missing scope, another site)', async () => {
    const s = await freshSite();
    await createRoost(s);
    const before = await chainOf(s.siteId);
    const other = await freshSite();
    const member = await makeUser(h.deps.db);
    await addMember(h.deps.db, s.siteId, member.uid);
    const readOnly = await insertKey(h.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: s.siteId, permissions: ['read'] }] });
    const refused = [
      await call({ method: 'POST', url: '/api/roosts', key: s.apiKey, body: { siteId: s.siteId } }),
      await call({ method: 'POST', url: '/api/roosts', key: readOnly.raw, body: { siteId: s.siteId, name: 'x' }, ip: '10.9.9.9' }),
      await call({ method: 'POST', url: '/api/roosts', key: other.apiKey, body: { siteId: s.siteId, name: 'x' }, ip: '10.9.9.8' }),
      await call({
        method: 'POST',
        url: '/api/chunks/upload-urls',
        key: readOnly.raw,
        body: { siteId: s.siteId, hashes: [fakeHash()] },
        ip: '10.9.9.9',
      }),
    ];
    expect(refused.map((r) => r.statusCode)).toEqual([400, 403, 404, 403]);
    expect(await chainOf(s.siteId)).toEqual(before);
    const addresses = await h.deps.db.query('SELECT 1 FROM audit_key_addresses WHERE site_id = $1 AND ip LIKE $2', [s.siteId, '10.9.9.%']);
    expect(addresses.rows).toEqual([]);
  });

  it('records an idempotent replay with the replay flag, and never the secret of the response', async () => {
    const s = await freshSite();
    const key = idemKey();
    const first = await call({
      method: 'POST',
      url: `/api/sites/${s.siteId}/enrolment-secret`,
      key: s.apiKey,
      headers: { 'idempotency-key': key },
    });
    const again = await call({
      method: 'POST',
      url: `/api/sites/${s.siteId}/enrolment-secret`,
      key: s.apiKey,
      headers: { 'idempotency-key': key },
    });
    expect([first.statusCode, again.statusCode, again.headers['idempotent-replayed']]).toEqual([201, 201, 'true']);
    const chain = (await chainOf(s.siteId)).filter((r) => r.kind === 'enrolment_secret_rotated');
    expect(chain.map((r) => r.attributes.idempotentReplay)).toEqual([false, true]);
    expect(chain[0].attributes.params).toEqual({ siteId: s.siteId });
    const secret = first.json().enrolmentSecret as string;
    expect(JSON.stringify(await chainOf(s.siteId))).not.toContain(secret);
    expect(JSON.stringify(await chainOf(s.siteId))).not.toContain(s.apiKey);
  });

  it('records one signed_url_issued per upload-urls and download-urls call, with the count and a digest of the hashes', async () => {
    const s = await freshSite();
    const up = [fakeHash(), fakeHash()];
    const upRes = await call({ method: 'POST', url: '/api/chunks/upload-urls', key: s.apiKey, body: { siteId: s.siteId, hashes: up } });
    expect(upRes.statusCode).toBe(200);
    const held = fakeHash();
    await hold(s.siteId, held);
    const down = await call({
      method: 'POST',
      url: '/api/chunks/download-urls',
      key: s.apiKey,
      body: { siteId: s.siteId, hashes: [held, fakeHash()] },
    });
    expect(down.statusCode).toBe(200);
    const downGet = await call({ method: 'GET', url: `/api/chunks/download-urls?siteId=${s.siteId}&hash=${held}`, key: s.apiKey });
    expect(downGet.statusCode).toBe(200);
    // Agent-token calls are not audited.
    const agentToken = `sat_${randomBytes(32).toString('base64url')}`;
    await h.deps.db.query('INSERT INTO machines (site_id, machine_id, agent_token_hash) VALUES ($1, $2, $3)', [
      s.siteId,
      `mach-${randomBytes(3).toString('hex')}`,
      sha256Hex(agentToken),
    ]);
    expect(
      (await call({ method: 'POST', url: '/api/chunks/download-urls', key: agentToken, body: { siteId: s.siteId, hashes: [held] } }))
        .statusCode,
    ).toBe(200);
    // Nothing issued, nothing recorded; a chunk check is a read.
    expect(
      (await call({ method: 'POST', url: '/api/chunks/download-urls', key: s.apiKey, body: { siteId: s.siteId, hashes: [fakeHash()] } }))
        .statusCode,
    ).toBe(200);
    expect(
      (await call({ method: 'POST', url: '/api/chunks/check', key: s.apiKey, body: { siteId: s.siteId, hashes: [fakeHash()] } }))
        .statusCode,
    ).toBe(200);

    const signed = (await chainOf(s.siteId)).filter((r) => r.kind === 'signed_url_issued');
    expect(signed.map((r) => [r.attributes.purpose, r.attributes.count, r.attributes.hashesDigest, r.attributes.method])).toEqual([
      ['chunk_upload', 2, hashSetDigest(up), 'POST'],
      ['chunk_download', 1, hashSetDigest([held]), 'POST'],
      ['chunk_download', 1, hashSetDigest([held]), 'GET'],
    ]);
    expect(signed[0].attributes.expiresAt).toBe(upRes.json().expiresAt);
    expect(JSON.stringify(signed)).not.toMatch(/sig=/);
    expect(await kinds(s.siteId)).toEqual(['api_key_used', 'signed_url_issued', 'signed_url_issued', 'signed_url_issued']);
  });
});

describe('api_key_used sampling and the api_key.used event', () => {
  const events = async (siteId: string, keyId: string) =>
    (
      await h.deps.db.query(
        `SELECT data FROM events WHERE site_id = $1 AND type = 'api_key.used' AND data->>'keyId' = $2 ORDER BY occurred_at`,
        [siteId, keyId],
      )
    ).rows.map((r: any) => r.data);

  it('samples once per key and address, emits the event once per new address, and agrees across API processes', async () => {
    const s = await freshSite();
    const member = await makeUser(h.deps.db);
    await addMember(h.deps.db, s.siteId, member.uid);
    const k = await insertKey(h.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: s.siteId, permissions: ['read'] }] });
    const quota = (ip: string, app?: FastifyInstance) =>
      call({ method: 'GET', url: `/api/sites/${s.siteId}/quota`, key: k.raw, ip, headers: { 'user-agent': 'audit-test/1.0' } }, app);

    for (let i = 0; i < 3; i++) expect((await quota('10.1.0.1')).statusCode).toBe(200);
    expect((await quota('10.1.0.2')).statusCode).toBe(200);
    expect((await quota('10.1.0.2')).statusCode).toBe(200);

    const used = (await chainOf(s.siteId)).filter((r) => r.kind === 'api_key_used');
    expect(used.map((r) => [r.actor, r.attributes.ip, r.attributes.firstUseFromIp])).toEqual([
      [`apiKey:${k.keyId}`, '10.1.0.1', true],
      [`apiKey:${k.keyId}`, '10.1.0.2', true],
    ]);
    expect(used[0].attributes).toMatchObject({
      keyId: k.keyId,
      userAgent: 'audit-test/1.0',
      route: '/api/sites/:siteId/quota',
      method: 'GET',
    });
    const ev = await events(s.siteId, k.keyId);
    expect(ev).toHaveLength(2);
    expect(Object.keys(ev[0]).sort()).toEqual(['firstUseFromIp', 'ip', 'keyId', 'keyPrefix', 'userAgent']);
    expect(ev[0]).toEqual({
      keyId: k.keyId,
      keyPrefix: k.raw.slice(0, ev[0].keyPrefix.length),
      ip: '10.1.0.1',
      userAgent: 'audit-test/1.0',
      firstUseFromIp: true,
    });
    expect(ev[1].ip).toBe('10.1.0.2');

    // A second API process over the same database: the table, not the cache, decides.
    const app2 = await buildApp(h.deps, { loggerInstance: testLogger('roost-api') });
    try {
      await app2.ready();
      expect((await quota('10.1.0.1', app2)).statusCode).toBe(200);
      expect((await chainOf(s.siteId)).filter((r) => r.kind === 'api_key_used')).toHaveLength(2);

      // Once the last sample is older than the window, the next use is sampled again (no new event).
      await h.deps.db.query('UPDATE audit_key_addresses SET last_sampled_at = last_sampled_at - $2::int8 WHERE site_id = $1 AND ip = $3', [
        s.siteId,
        h.deps.cfg.ROOST_AUDIT_KEY_USE_SAMPLE_SECONDS * 1000 + 1000,
        '10.1.0.2',
      ]);
      const app3 = await buildApp(h.deps, { loggerInstance: testLogger('roost-api') });
      try {
        await app3.ready();
        expect((await quota('10.1.0.2', app3)).statusCode).toBe(200);
        expect((await quota('10.1.0.2', app3)).statusCode).toBe(200);
      } finally {
        await app3.close();
      }
    } finally {
      await app2.close();
    }
    const after = (await chainOf(s.siteId)).filter((r) => r.kind === 'api_key_used');
    expect(after.map((r) => [r.attributes.ip, r.attributes.firstUseFromIp])).toEqual([
      ['10.1.0.1', true],
      ['10.1.0.2', true],
      ['10.1.0.2', false],
    ]);
    expect(await events(s.siteId, k.keyId)).toHaveLength(2);
  });

  it('records a User-Agent sent as UTF-8 bytes over a real socket as the text the client wrote', async () => {
    const s = await freshSite();
    const member = await makeUser(h.deps.db);
    await addMember(h.deps.db, s.siteId, member.uid);
    const k = await insertKey(h.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: s.siteId, permissions: ['read'] }] });
    const base = await h.listen();
    const status = await new Promise<number>((resolve, reject) => {
      const req = http.request(`${base}/api/sites/${s.siteId}/quota`, {
        headers: {
          authorization: `Bearer ${k.raw}`,
          // Node sends a header string one byte per character: these are the UTF-8 bytes of the text.
          'user-agent': Buffer.from('Café-Agent/1.0 (日本語)', 'utf8').toString('latin1'),
        },
      });
      req.on('response', (res) => (res.resume(), resolve(res.statusCode ?? 0))).on('error', reject);
      req.end();
    });
    expect(status).toBe(200);
    const used = (await chainOf(s.siteId)).filter((r) => r.kind === 'api_key_used');
    expect(used.map((r) => r.attributes.userAgent)).toEqual(['Café-Agent/1.0 (日本語)']);
    expect((await events(s.siteId, k.keyId)).map((e: { userAgent: string }) => e.userAgent)).toEqual(['Café-Agent/1.0 (日本語)']);
  });

  it('does not sample sessions or refused key uses', async () => {
    const s = await freshSite();
    const { token } = await sessionFor(h, { uid: s.userId, email: s.email });
    expect((await call({ method: 'GET', url: `/api/sites/${s.siteId}/quota`, key: token })).statusCode).toBe(200);
    const member = await makeUser(h.deps.db);
    await addMember(h.deps.db, s.siteId, member.uid);
    const noRead = await insertKey(h.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: s.siteId, permissions: ['write'] }] });
    expect((await call({ method: 'GET', url: `/api/sites/${s.siteId}/quota`, key: noRead.raw, ip: '10.2.0.1' })).statusCode).toBe(403);
    expect(await chainOf(s.siteId)).toEqual([]);
    expect(await events(s.siteId, noRead.keyId)).toEqual([]);
  });
});

describe('GET /api/sites/{siteId}/audit-log', () => {
  let s: Site;
  let roosts: string[];
  let sessionUser: { token: string };

  beforeAll(async () => {
    s = await freshSite();
    roosts = [];
    for (let i = 0; i < 3; i++) roosts.push(await createRoost(s));
    sessionUser = await sessionFor(h, { uid: s.userId, email: s.email });
    await createRoost(s, sessionUser.token);
    // Chain: api_key_used, roost_created ×3 (key), roost_created (session).
  });

  const list = (query = '', key: string | null = s.apiKey) => call({ method: 'GET', url: `/api/sites/${s.siteId}/audit-log${query}`, key });

  it('lists newest first with the record fields and both token names', async () => {
    const res = await list('', sessionUser.token);
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.next_page_token).toBe('');
    expect(body.nextPageToken).toBe('');
    expect(body.records.map((r: any) => r.kind)).toEqual([
      'roost_created',
      'roost_created',
      'roost_created',
      'roost_created',
      'api_key_used',
    ]);
    expect(body.records.map((r: any) => r.sequence)).toEqual([5, 4, 3, 2, 1]);
    const [newest, next] = body.records;
    expect(Object.keys(newest).sort()).toEqual(['actor', 'attributes', 'hash', 'kind', 'occurredAt', 'previousHash', 'sequence', 'siteId']);
    expect(newest).toMatchObject({ actor: `user:${s.userId}`, previousHash: next.hash, siteId: s.siteId });
    expect(newest.occurredAt).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
  });

  it('filters by kind and actor (exact) and since', async () => {
    const byKind = (await list('?kind=roost_created', sessionUser.token)).json().records;
    expect(byKind).toHaveLength(4);
    const byActor = (await list(`?actor=${encodeURIComponent(`user:${s.userId}`)}`, sessionUser.token)).json().records;
    expect(byActor.map((r: any) => r.attributes.result.roostId)).toHaveLength(1);
    expect((await list('?kind=roost', sessionUser.token)).json().records).toEqual([]);
    const all = (await list('', sessionUser.token)).json().records;
    const cut = all[1].occurredAt;
    const since = (await list(`?since=${encodeURIComponent(cut)}`, sessionUser.token)).json().records;
    expect(since.every((r: any) => r.occurredAt >= cut)).toBe(true);
    expect(since.map((r: any) => r.hash)).toEqual(all.filter((r: any) => r.occurredAt >= cut).map((r: any) => r.hash));
    expect((await list('?since=2000-01-01', sessionUser.token)).json().records.length).toBeGreaterThanOrEqual(5);
    expect((await list('?since=2999-01-01T00:00:00%2B02:00', sessionUser.token)).json().records).toEqual([]);
  });

  it('pages with page_size and page_token without gaps or repeats', async () => {
    const all = (await list('', sessionUser.token)).json().records.map((r: any) => r.hash);
    const seen: string[] = [];
    let token = '';
    let pages = 0;
    do {
      const res = await list(`?page_size=2${token ? `&page_token=${token}` : ''}`, sessionUser.token);
      expect(res.statusCode).toBe(200);
      const body = res.json();
      seen.push(...body.records.map((r: any) => r.hash));
      expect(body.nextPageToken).toBe(body.next_page_token);
      token = body.next_page_token;
      pages++;
    } while (token && pages < 10);
    expect(seen).toEqual(all);
    expect(pages).toBe(3);
    // The legacy aliases work too.
    expect((await list('?limit=1', sessionUser.token)).json().records).toHaveLength(1);
  });

  it('rejects bad since, page_size and page_token with validation_failed', async () => {
    for (const q of [
      '?since=yesterday',
      '?since=2026-02-30',
      '?since=2026-01-01T25:00:00Z',
      '?page_size=0',
      '?page_size=201',
      '?page_token=garbage',
    ]) {
      const res = await list(q, sessionUser.token);
      expect({ q, status: res.statusCode, code: res.json().code }).toEqual({ q, status: 400, code: 'validation_failed' });
    }
    expect((await list('?page_size=200', sessionUser.token)).statusCode).toBe(200);
    expect((await list('?since=2026-02-30', sessionUser.token)).json().param).toBe('since');
  });

  it('hides the log from another site (404) and needs site read (403 scope_insufficient)', async () => {
    const other = await freshSite();
    const res = await list('', other.apiKey);
    expect([res.statusCode, res.json().code]).toEqual([404, 'not_found']);
    const member = await makeUser(h.deps.db);
    await addMember(h.deps.db, s.siteId, member.uid);
    const writeOnly = await insertKey(h.deps.db, {
      uid: member.uid,
      scopes: [{ resource: 'site', id: s.siteId, permissions: ['write', 'admin'] }],
    });
    const lacking = await list('', writeOnly.raw);
    expect(lacking.statusCode).toBe(403);
    expect(lacking.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: s.siteId, permission: 'read' } });
    expect((await list('', null)).statusCode).toBe(401);
  });
});

describe('GET /api/sites/{siteId}/audit-log/{recordHash}', () => {
  it('returns the record with its verification report; 400 for a malformed hash, 404 for an unknown one or another site', async () => {
    const s = await freshSite();
    await createRoost(s);
    const [genesis, second] = await chainOf(s.siteId);
    const get = (hash: string, key: string | null = s.apiKey) =>
      call({ method: 'GET', url: `/api/sites/${s.siteId}/audit-log/${hash}`, key });

    const g = await get(genesis.hash);
    expect(g.statusCode).toBe(200);
    expect(g.json()).toMatchObject({
      hash: genesis.hash,
      previousHash: null,
      kind: 'api_key_used',
      sequence: 1,
      verification: { hashValid: true, linkageValid: true, isGenesis: true, predecessorPresent: false, reason: null, ok: true },
    });
    expect((await get(second.hash)).json()).toMatchObject({
      hash: second.hash,
      previousHash: genesis.hash,
      verification: { hashValid: true, linkageValid: true, isGenesis: false, predecessorPresent: true, reason: null, ok: true },
    });

    for (const bad of ['xyz', genesis.hash.toUpperCase(), genesis.hash.slice(1)]) {
      const res = await get(bad);
      expect({ bad, status: res.statusCode, code: res.json().code }).toEqual({ bad, status: 400, code: 'validation_failed' });
    }
    const unknown = await get('0'.repeat(64));
    expect([unknown.statusCode, unknown.json().code]).toEqual([404, 'not_found']);
    const other = await freshSite();
    const hidden = await get(genesis.hash, other.apiKey);
    expect([hidden.statusCode, hidden.json().code]).toEqual([404, 'not_found']);
    // Another site's record is not found through this site, even by someone who can read both.
    const otherRoost = await createRoost(other);
    expect(otherRoost).toBeTruthy();
    const [otherGenesis] = await chainOf(other.siteId);
    expect((await call({ method: 'GET', url: `/api/sites/${s.siteId}/audit-log/${otherGenesis.hash}`, key: h.apiKey })).statusCode).toBe(
      404,
    );
  });

  it('detects a record tampered with in the database; its successor still names the original hash', async () => {
    const s = await freshSite();
    for (let i = 0; i < 3; i++) await createRoost(s);
    const chain = await chainOf(s.siteId);
    expect(chain).toHaveLength(4);
    const [, before, target, after] = chain;
    await h.deps.db.query(
      `UPDATE audit_records SET attributes = jsonb_set(attributes, '{status}', '200') WHERE site_id = $1 AND hash = $2`,
      [s.siteId, target.hash],
    );

    const get = async (hash: string) =>
      (await call({ method: 'GET', url: `/api/sites/${s.siteId}/audit-log/${hash}`, key: s.apiKey })).json();
    const t = await get(target.hash);
    expect(t.attributes.status).toBe(200);
    expect(t.verification).toEqual({
      hashValid: false,
      linkageValid: true,
      isGenesis: false,
      predecessorPresent: true,
      reason: 'hash_mismatch',
      ok: false,
    });
    const a = await get(after.hash);
    expect(a.previousHash).toBe(target.hash);
    expect(a.verification).toEqual({
      hashValid: true,
      linkageValid: false,
      isGenesis: false,
      predecessorPresent: true,
      reason: 'predecessor_tampered',
      ok: false,
    });
    expect((await get(before.hash)).verification.ok).toBe(true);

    // Rewriting the claimed hash too breaks the successor's link instead.
    await h.deps.db.query('UPDATE audit_records SET hash = $3 WHERE site_id = $1 AND hash = $2', [s.siteId, target.hash, 'f'.repeat(64)]);
    expect((await get(after.hash)).verification).toMatchObject({
      predecessorPresent: false,
      linkageValid: false,
      reason: 'predecessor_missing',
      ok: false,
    });
  });
});

describe('concurrent appends', () => {
  it('keeps 50 concurrent appends to one site one unbroken chain', async () => {
    const s = await freshSite();
    const appended = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        appendAudit(h.deps.db, s.siteId, { kind: 'concurrency_test', actor: `user:${s.userId}`, attributes: { i } }),
      ),
    );
    expect(new Set(appended.map((r) => r.hash)).size).toBe(50);
    const chain = await chainOf(s.siteId);
    expect(chain).toHaveLength(50);
    expect(chain.map((r) => Number(r.attributes.i)).sort((x, y) => x - y)).toEqual(Array.from({ length: 50 }, (_, i) => i));
    // One genesis; every other record names exactly one other record, and no record is named twice.
    const hashes = new Set(chain.map((r) => r.hash));
    expect(chain.filter((r) => r.previousHash === null)).toHaveLength(1);
    const named = chain.filter((r) => r.previousHash !== null).map((r) => r.previousHash!);
    expect(named.every((p) => hashes.has(p))).toBe(true);
    expect(new Set(named).size).toBe(49);
    chain.forEach((r, i) => expect(r.previousHash).toBe(i === 0 ? null : chain[i - 1].hash));
    const head = (await h.deps.db.query('SELECT head_hash, head_seq FROM audit_heads WHERE site_id = $1', [s.siteId])).rows[0];
    expect([head.head_hash, Number(head.head_seq)]).toEqual([chain[49].hash, 50]);
    // Every record verifies.
    for (const r of [chain[0], chain[25], chain[49]]) {
      const v = (await call({ method: 'GET', url: `/api/sites/${s.siteId}/audit-log/${r.hash}`, key: h.apiKey })).json().verification;
      expect(v.ok).toBe(true);
    }
  });
});
