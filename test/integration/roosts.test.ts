/**
 * Roost routes over the real services: POST/GET /api/roosts, GET/PATCH/DELETE /api/roosts/{roostId}
 * (docs/contract.md "Roost record", "Roosts").
 */
import { sha256Hex } from '../../domain/hex';
import type { Scope } from '../../domain/scopes';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { scopedKey as scopedKeyOf } from '../support/identity';

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => h.close());

/** A live key of the harness user carrying only `scopes`. */
const scopedKey = (scopes: Scope[]) => scopedKeyOf(h, scopes);

async function create(body: Record<string, unknown> = {}, key?: string) {
  return h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'App', ...body }, key });
}

/** Publishes a one-file version to `roostId` (its chunk recorded as present for the site). */
async function publish(roostId: string, text: string, description?: string) {
  const content = Buffer.from(text);
  const hash = sha256Hex(content);
  await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING', [
    h.siteId,
    hash,
    content.length,
  ]);
  const version = {
    schemaVersion: 2,
    mediaType: VERSION_MEDIA_TYPE,
    config: {},
    files: [{ path: 'app.txt', size: content.length, chunks: [{ hash, size: content.length }] }],
  };
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    body: { siteId: h.siteId, version, description },
    idempotencyKey: true,
  });
  expect(res.statusCode).toBe(201);
  return res.json();
}

describe('POST /api/roosts', () => {
  it('creates a roost with a server-made id and an empty version history', async () => {
    const res = await create({ name: '  Kiosk app  ', targets: ['m-1', 'm-2'], extractPath: 'C:\\Roost\\kiosk' });
    expect(res.statusCode).toBe(201);
    const r = res.json();
    expect(r.roostId).toMatch(/^rst_[0-9a-f]{24}$/);
    expect(r).toMatchObject({
      siteId: h.siteId,
      schemaVersion: 2,
      name: 'Kiosk app',
      targets: ['m-1', 'm-2'],
      extractPath: 'C:\\Roost\\kiosk',
      versionCounter: 0,
      currentVersionId: null,
      currentVersionNumber: null,
      currentVersionDescription: null,
      previousVersionId: null,
      versionUrl: null,
      totalFiles: 0,
      totalSize: 0,
      createdBy: h.userId,
      deleted: false,
      deletedAt: null,
      current: null,
      previous: null,
    });
    expect(Date.parse(r.createdAt)).not.toBeNaN();
    expect(Date.parse(r.updatedAt)).not.toBeNaN();
  });

  it('defaults targets to [] and extractPath to ""', async () => {
    const r = (await create()).json();
    expect(r.targets).toEqual([]);
    expect(r.extractPath).toBe('');
  });

  it('ignores Idempotency-Key: the same key creates two roosts and nothing is replayed', async () => {
    const key = idemKey();
    const a = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'x' }, idempotencyKey: key });
    const b = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'x' }, idempotencyKey: key });
    expect([a.statusCode, b.statusCode]).toEqual([201, 201]);
    expect(a.json().roostId).not.toBe(b.json().roostId);
    expect(b.headers['idempotent-replayed']).toBeUndefined();
  });

  it('rejects server-managed and unknown fields with forbidden_field', async () => {
    for (const extra of [{ roostId: 'rst_mine' }, { currentVersionId: 'a'.repeat(64) }, { versionCounter: 3 }, { colour: 'red' }]) {
      const res = await create(extra);
      expect(res.statusCode).toBe(400);
      const body = res.json();
      expect(body.code).toBe('forbidden_field');
      expect(body.fields).toEqual(Object.keys(extra));
    }
  });

  it('validates siteId, name, targets and extractPath', async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ siteId: undefined }, 'siteId'],
      [{ siteId: 'not a site!' }, 'siteId'],
      [{ name: undefined }, 'name'],
      [{ name: '   ' }, 'name'],
      [{ name: 'x'.repeat(201) }, 'name'],
      [{ targets: ['m-1', 'm-1'] }, 'targets'],
      [{ targets: ['has space'] }, 'targets.0'],
      [{ extractPath: 'C:\\a\nb' }, 'extractPath'],
    ];
    for (const [patch, key] of cases) {
      const res = await create(patch);
      expect(res.statusCode).toBe(400);
      const body = res.json();
      expect(body.code).toBe('validation_failed');
      expect(Object.keys(body.errors)).toContain(key);
    }
  });

  it('hides another site (404) and needs site write or roost=* write', async () => {
    const other = await h.other();
    const hidden = await create({}, other.apiKey);
    expect(hidden.statusCode).toBe(404);
    expect(hidden.json().code).toBe('not_found');

    const readOnly = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const denied = await create({}, readOnly);
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: h.siteId, permission: 'write' } });

    const oneRoost = await scopedKey([{ resource: 'roost', id: 'rst_0123', permissions: ['write'] }]);
    expect((await create({}, oneRoost)).statusCode).toBe(403);
    const anyRoost = await scopedKey([{ resource: 'roost', id: '*', permissions: ['write'] }]);
    expect((await create({}, anyRoost)).statusCode).toBe(201);
  });

  it('needs a credential', async () => {
    const res = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'x' }, key: null });
    expect(res.statusCode).toBe(401);
  });
});

describe('GET /api/roosts', () => {
  let site: { siteId: string; apiKey: string };
  const ids: string[] = [];
  beforeAll(async () => {
    // A site of its own, so the list holds exactly the roosts made here.
    const o = await h.other();
    site = o;
    for (let i = 0; i < 5; i++) {
      const res = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: o.siteId, name: `r${i}` }, key: o.apiKey });
      ids.push(res.json().roostId);
    }
    await h.request({ method: 'DELETE', url: `/api/roosts/${ids[2]}?siteId=${o.siteId}`, key: o.apiKey });
  });

  const list = (query: string) => h.request({ method: 'GET', url: `/api/roosts?siteId=${site.siteId}${query}`, key: site.apiKey });

  it('lists live roosts newest first under `roosts` with both token names', async () => {
    const res = await list('');
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.roosts.map((r: { roostId: string }) => r.roostId)).toEqual([ids[4], ids[3], ids[1], ids[0]]);
    expect(body.next_page_token).toBe('');
    expect(body.nextPageToken).toBe('');
    expect(body.roosts[0]).toMatchObject({ siteId: site.siteId, schemaVersion: 2, name: 'r4', deleted: false });
  });

  it('includes tombstoned roosts on request', async () => {
    const body = (await list('&includeDeleted=true')).json();
    expect(body.roosts).toHaveLength(5);
    const gone = body.roosts.find((r: { roostId: string }) => r.roostId === ids[2]);
    expect(gone.deleted).toBe(true);
    expect(Date.parse(gone.deletedAt)).not.toBeNaN();
    expect((await list('&includeDeleted=perhaps')).json().code).toBe('validation_failed');
  });

  it('pages with page_size/page_token and with the legacy limit/cursor', async () => {
    const seen: string[] = [];
    let token = '';
    do {
      const body = (await list(`&page_size=3${token ? `&page_token=${token}` : ''}`)).json();
      expect(body.next_page_token).toBe(body.nextPageToken);
      seen.push(...body.roosts.map((r: { roostId: string }) => r.roostId));
      token = body.next_page_token;
    } while (token);
    expect(seen).toEqual([ids[4], ids[3], ids[1], ids[0]]);

    const first = (await list('&limit=2')).json();
    expect(first.roosts).toHaveLength(2);
    const second = (await list(`&limit=2&cursor=${first.nextPageToken}`)).json();
    expect(second.roosts.map((r: { roostId: string }) => r.roostId)).toEqual([ids[1], ids[0]]);
    expect(second.next_page_token).toBe('');
  });

  it('lets the canonical name win over the alias', async () => {
    const body = (await list('&page_size=1&limit=3')).json();
    expect(body.roosts).toHaveLength(1);
  });

  it('rejects bad page sizes and tokens with validation_failed', async () => {
    for (const q of [
      '&page_size=0',
      '&page_size=101',
      '&page_size=abc',
      '&limit=-1',
      '&page_token=garbage',
      `&page_token=${Buffer.from(JSON.stringify({ p: 5 })).toString('base64url')}`,
      `&page_token=${Buffer.from(JSON.stringify({ p: ['not a time', ids[0]] })).toString('base64url')}`,
      `&cursor=${Buffer.from(JSON.stringify({ p: ['2025-13-45 99:00:00+00', ids[0]] })).toString('base64url')}`,
    ]) {
      const res = await list(q);
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('validation_failed');
    }
  });

  it('needs siteId, hides other sites and checks read scope', async () => {
    expect((await h.request({ method: 'GET', url: '/api/roosts', key: site.apiKey })).json().code).toBe('validation_failed');
    const stranger = await h.other();
    const res = await h.request({ method: 'GET', url: `/api/roosts?siteId=${site.siteId}`, key: stranger.apiKey });
    expect(res.statusCode).toBe(404);
    const writeOnly = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['write'] }]);
    const denied = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}`, key: writeOnly });
    expect(denied.statusCode).toBe(403);
    expect(denied.json().required).toEqual({ resource: 'site', id: h.siteId, permission: 'read' });
  });
});

describe('GET /api/roosts/{roostId}', () => {
  it('returns the record with current and previous version summaries', async () => {
    const { roostId } = (await create({ name: 'Detail' })).json();
    const v1 = await publish(roostId, 'one', 'first cut');
    const v2 = await publish(roostId, 'second!', '');
    const res = await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` });
    expect(res.statusCode).toBe(200);
    const r = res.json();
    expect(r).toMatchObject({
      roostId,
      versionCounter: 2,
      currentVersionId: v2.versionId,
      currentVersionNumber: 2,
      currentVersionDescription: null,
      previousVersionId: v1.versionId,
      totalFiles: 1,
      totalSize: 7,
    });
    expect(r.versionUrl).toContain(
      `/${h.deps.blob.containerName('versions')}/sites/${h.siteId}/roosts/${roostId}/versions/${v2.versionId}.json`,
    );
    expect(r.current).toMatchObject({
      versionId: v2.versionId,
      versionNumber: 2,
      description: null,
      totalFiles: 1,
      totalSize: 7,
      createdBy: h.userId,
    });
    expect(r.previous).toMatchObject({
      versionId: v1.versionId,
      versionNumber: 1,
      description: 'first cut',
      totalFiles: 1,
      totalSize: 3,
      createdBy: h.userId,
    });
    expect(Date.parse(r.previous.createdAt)).not.toBeNaN();
  });

  it('answers 404 for unknown roosts and other sites, 400 for malformed ids and missing siteId', async () => {
    const { roostId } = (await create()).json();
    expect((await h.request({ method: 'GET', url: `/api/roosts/rst_000000000000000000000000?siteId=${h.siteId}` })).statusCode).toBe(404);
    const other = await h.other();
    const cross = await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}`, key: other.apiKey });
    expect(cross.statusCode).toBe(404);
    // The roost id is scoped to its site: asking under the other site finds nothing.
    const wrongSite = await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${other.siteId}`, key: other.apiKey });
    expect(wrongSite.statusCode).toBe(404);
    const bad = await h.request({ method: 'GET', url: `/api/roosts/${'x'.repeat(65)}?siteId=${h.siteId}` });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().code).toBe('validation_failed');
    expect((await h.request({ method: 'GET', url: `/api/roosts/${roostId}` })).json().code).toBe('validation_failed');
  });

  it('accepts a scope on this roost and refuses one on another roost', async () => {
    const { roostId } = (await create()).json();
    const mine = await scopedKey([{ resource: 'roost', id: roostId, permissions: ['read'] }]);
    expect((await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}`, key: mine })).statusCode).toBe(200);
    const theirs = await scopedKey([{ resource: 'roost', id: 'rst_other', permissions: ['read', 'write'] }]);
    const res = await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}`, key: theirs });
    expect(res.statusCode).toBe(403);
    expect(res.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'roost', id: roostId, permission: 'read' } });
  });
});

describe('PATCH /api/roosts/{roostId}', () => {
  it('updates name, targets and extractPath', async () => {
    const { roostId, updatedAt } = (await create({ targets: ['a'] })).json();
    const res = await h.request({
      method: 'PATCH',
      url: `/api/roosts/${roostId}`,
      body: { siteId: h.siteId, name: 'Renamed', targets: ['b', 'c'], extractPath: 'D:\\apps' },
    });
    expect(res.statusCode).toBe(200);
    const r = res.json();
    expect(r).toMatchObject({ roostId, name: 'Renamed', targets: ['b', 'c'], extractPath: 'D:\\apps' });
    expect(Date.parse(r.updatedAt)).toBeGreaterThanOrEqual(Date.parse(updatedAt));
    const only = await h.request({ method: 'PATCH', url: `/api/roosts/${roostId}`, body: { siteId: h.siteId, targets: [] } });
    expect(only.json()).toMatchObject({ name: 'Renamed', targets: [], extractPath: 'D:\\apps' });
  });

  it('rejects version pointer fields with forbidden_field and changes nothing', async () => {
    const { roostId } = (await create({ name: 'Keep' })).json();
    for (const field of ['currentVersionId', 'previousVersionId', 'versionCounter', 'currentVersionNumber']) {
      const res = await h.request({
        method: 'PATCH',
        url: `/api/roosts/${roostId}`,
        body: { siteId: h.siteId, name: 'Changed', [field]: 'a'.repeat(64) },
      });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ code: 'forbidden_field', param: field });
    }
    const r = (await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` })).json();
    expect(r.name).toBe('Keep');
  });

  it('needs at least one field, a live roost and write scope', async () => {
    const { roostId } = (await create()).json();
    const empty = await h.request({ method: 'PATCH', url: `/api/roosts/${roostId}`, body: { siteId: h.siteId } });
    expect(empty.json().code).toBe('validation_failed');
    const missing = await h.request({ method: 'PATCH', url: '/api/roosts/rst_nope', body: { siteId: h.siteId, name: 'x' } });
    expect(missing.statusCode).toBe(404);
    const readOnly = await scopedKey([{ resource: 'roost', id: '*', permissions: ['read'] }]);
    const denied = await h.request({
      method: 'PATCH',
      url: `/api/roosts/${roostId}`,
      body: { siteId: h.siteId, name: 'x' },
      key: readOnly,
    });
    expect(denied.statusCode).toBe(403);
    expect(denied.json().required).toEqual({ resource: 'roost', id: roostId, permission: 'write' });
    const other = await h.other();
    expect(
      (await h.request({ method: 'PATCH', url: `/api/roosts/${roostId}`, body: { siteId: h.siteId, name: 'x' }, key: other.apiKey }))
        .statusCode,
    ).toBe(404);
  });
});

describe('DELETE /api/roosts/{roostId}', () => {
  it('tombstones once; a repeat reports alreadyDeleted; the roost disappears from reads', async () => {
    const { roostId } = (await create()).json();
    const first = await h.request({ method: 'DELETE', url: `/api/roosts/${roostId}?siteId=${h.siteId}` });
    expect(first.statusCode).toBe(200);
    expect(first.json()).toMatchObject({ roostId, siteId: h.siteId, deleted: true, alreadyDeleted: false });
    const again = await h.request({ method: 'DELETE', url: `/api/roosts/${roostId}?siteId=${h.siteId}` });
    expect(again.statusCode).toBe(200);
    expect(again.json()).toMatchObject({ deleted: true, alreadyDeleted: true, deletedAt: first.json().deletedAt });

    expect((await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` })).statusCode).toBe(404);
    const tomb = await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}&includeDeleted=true` });
    expect(tomb.json()).toMatchObject({ roostId, deleted: true });
    const patch = await h.request({ method: 'PATCH', url: `/api/roosts/${roostId}`, body: { siteId: h.siteId, name: 'x' } });
    expect(patch.statusCode).toBe(404);
    const versions = await h.request({ method: 'GET', url: `/api/roosts/${roostId}/versions?siteId=${h.siteId}` });
    expect(versions.statusCode).toBe(404);
  });

  it('answers 404 for unknown roosts and other sites, and checks write scope', async () => {
    expect((await h.request({ method: 'DELETE', url: `/api/roosts/rst_missing?siteId=${h.siteId}` })).statusCode).toBe(404);
    const { roostId } = (await create()).json();
    const other = await h.other();
    expect((await h.request({ method: 'DELETE', url: `/api/roosts/${roostId}?siteId=${h.siteId}`, key: other.apiKey })).statusCode).toBe(
      404,
    );
    const readOnly = await scopedKey([{ resource: 'site', id: h.siteId, permissions: ['read'] }]);
    const denied = await h.request({ method: 'DELETE', url: `/api/roosts/${roostId}?siteId=${h.siteId}`, key: readOnly });
    expect(denied.statusCode).toBe(403);
    expect(denied.json().code).toBe('scope_insufficient');
    expect((await h.request({ method: 'GET', url: `/api/roosts/${roostId}?siteId=${h.siteId}` })).statusCode).toBe(200);
  });
});
