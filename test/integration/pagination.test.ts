/**
 * Pagination on every paged list route (docs/contract.md Conventions "Pagination", Limits; api/pagination.ts),
 * data-driven over the server's route table: `page_size`/`page_token`, the `limit`/`cursor` aliases with
 * the canonical name winning, `next_page_token` and `nextPageToken` ('' at the end), each route's
 * default and maximum, 400 validation_failed on 0, max+1, non-numeric sizes and forged tokens, and a
 * walk over every page returning every item exactly once, in the order of one big page.
 */
import { newId, sha256Hex } from '../../domain/hex';
import { lockCatalog } from '../support/catalog-lock';
import { VERSION_MEDIA_TYPE } from '../../domain/version';
import { createHash, randomBytes } from 'node:crypto';
import { PAGE_TOKEN_KEY_PURPOSE } from '../../api/pagination';
import { type PageBinding, signPageToken } from '../../domain/paging';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { addMember, idTokenFor, insertKey, makeUser } from '../support/identity';
import { withTx } from '../../db/pool';
import { insertRollout } from '../../db/rollouts';
import { insertDeployment } from '../../db/classic-deployments';
import { DEFAULT_POLICY, splitWaves } from '../../domain/rollout-policy';
import { insertWebhook, webhookAad } from '../../db/webhooks';
import { rolloutWorkflowId } from '../../workflows/client';
import { seal } from '../../domain/seal';
import { derivedKeyOf, secretKey } from '../../config/secrets';

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(async () => h.close());

interface ListFixture {
  /** `METHOD /url` as registered. */
  route: string;
  /** The page size limits the route must apply (docs/contract.md Limits, or the route's documented choice). */
  defaultSize: number;
  maxSize: number;
  /** Seeds more items than the default page and returns the base URL (with its required query) and credential. */
  seed: () => Promise<{ url: string; key: string; expected: string[] }>;
  items: string;
  id: (item: any) => string;
  /** Undoes what seed did that other test files could see (run after the route's tests). */
  done?: () => Promise<void>;
}

/** `n` empty files named by index (no chunks: nothing to upload). */
function emptyFiles(n: number, prefix: string) {
  return Array.from({ length: n }, (_, i) => ({ path: `${prefix}/${String(i).padStart(4, '0')}.txt`, size: 0, chunks: [] }));
}

function versionBody(files: ReturnType<typeof emptyFiles>) {
  return { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'pagination-test' }, files };
}

async function createRoost(siteId: string, key: string, name: string): Promise<string> {
  const res = await h.request({ method: 'POST', url: '/api/roosts', key, body: { siteId, name } });
  expect(res.statusCode).toBe(201);
  return res.json().roostId;
}

async function publish(siteId: string, key: string, roostId: string, files: ReturnType<typeof emptyFiles>): Promise<string> {
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    key,
    idempotencyKey: true,
    body: { siteId, version: versionBody(files) },
  });
  expect(res.statusCode).toBe(201);
  return res.json().versionId;
}

/** Inserts a rollout row of `versionId` to `machines` (no workflow: listing needs rows only); ends it unless `active`. */
async function insertRolloutRow(roostId: string, versionId: string, machines: string[], active = false): Promise<string> {
  const rolloutId = newId('rol');
  await withTx(h.deps.db, async (tx) => {
    await insertRollout(tx, {
      siteId: h.siteId,
      rolloutId,
      roostId,
      versionId,
      ...splitWaves(rolloutId, machines),
      extractRoot: 'apps/pagination',
      policy: DEFAULT_POLICY,
      scheduleAt: null,
      workflowId: rolloutWorkflowId(h.siteId, roostId, versionId),
      createdBy: h.userId,
    });
    if (!active) {
      await tx.query(
        `UPDATE rollouts SET active = false, stage = 'completed', state = 'completed', completed_at = now() WHERE site_id = $1 AND rollout_id = $2`,
        [h.siteId, rolloutId],
      );
    }
  });
  return rolloutId;
}

/** A subscription of `siteId`, inserted directly (its url is never called: no delivery runs here). */
async function insertHook(siteId: string, name: string): Promise<string> {
  const webhookId = newId('wh');
  await insertWebhook(h.deps.db, {
    siteId,
    webhookId,
    url: `https://hooks.example.com/${name}`,
    name,
    events: ['version.published'],
    enabled: true,
    secretSealed: seal(secretKey(h.deps.cfg), `whsec_${newId('s')}`, webhookAad(siteId, webhookId)),
    createdBy: h.userId,
  });
  return webhookId;
}

/** Clean-ups registered by seeds (see ListFixture.done). */
const fixtureDone = new Map<string, () => Promise<void>>();

const FIXTURES: ListFixture[] = [
  {
    route: 'GET /api/sites',
    defaultSize: 20,
    maxSize: 100,
    items: 'sites',
    id: (s) => s.siteId,
    seed: async () => {
      // The sites of one member (not a superadmin, who would see every site of the run).
      const member = await makeUser(h.deps.db);
      const expected: string[] = [];
      for (let i = 0; i < 23; i++) {
        const siteId = newId('site');
        await h.deps.db.query('INSERT INTO sites (site_id, name, owner_uid) VALUES ($1, $2, $3)', [siteId, `paged-${siteId}`, h.userId]);
        await addMember(h.deps.db, siteId, member.uid);
        expected.push(siteId);
      }
      const key = (await insertKey(h.deps.db, { uid: member.uid, scopes: [{ resource: 'site', id: '*', permissions: ['read'] }] })).raw;
      return { url: '/api/sites', key, expected: expected.sort() };
    },
  },
  {
    route: 'GET /api/sites/:siteId/members',
    defaultSize: 20,
    maxSize: 100,
    items: 'members',
    id: (m) => m.uid,
    seed: async () => {
      const site = await h.other();
      for (let i = 0; i < 23; i++) await addMember(h.deps.db, site.siteId, (await makeUser(h.deps.db)).uid);
      const { rows } = await h.deps.db.query<{ uid: string }>('SELECT uid FROM site_members WHERE site_id = $1 ORDER BY uid', [
        site.siteId,
      ]);
      return { url: `/api/sites/${site.siteId}/members`, key: h.apiKey, expected: rows.map((r) => r.uid) };
    },
  },
  {
    route: 'GET /api/users',
    defaultSize: 20,
    maxSize: 100,
    items: 'users',
    id: (u) => u.uid,
    seed: async () => {
      // The members (and owner) of a fresh site: the list is filtered by siteId so other files' users stay out.
      const site = await h.other();
      for (let i = 0; i < 23; i++) await addMember(h.deps.db, site.siteId, (await makeUser(h.deps.db)).uid);
      const { rows } = await h.deps.db.query<{ uid: string }>(
        `SELECT u.uid FROM users u WHERE EXISTS (SELECT 1 FROM site_members m WHERE m.site_id = $1 AND m.uid = u.uid) ORDER BY u.created_at, u.uid`,
        [site.siteId],
      );
      return { url: `/api/users?siteId=${site.siteId}`, key: h.apiKey, expected: rows.map((r) => r.uid) };
    },
  },
  {
    route: 'GET /api/roosts',
    defaultSize: 20,
    maxSize: 100,
    items: 'roosts',
    id: (r) => r.roostId,
    seed: async () => {
      const site = await h.other();
      const expected: string[] = [];
      for (let i = 0; i < 23; i++) expected.push(await createRoost(site.siteId, site.apiKey, `roost ${i}`));
      return { url: `/api/roosts?siteId=${site.siteId}`, key: site.apiKey, expected };
    },
  },
  {
    route: 'GET /api/roosts/:roostId/versions',
    defaultSize: 20,
    maxSize: 100,
    items: 'versions',
    id: (v) => v.versionId,
    seed: async () => {
      const roostId = await createRoost(h.siteId, h.apiKey, 'versions list');
      const expected: string[] = [];
      for (let i = 0; i < 23; i++) expected.push(await publish(h.siteId, h.apiKey, roostId, emptyFiles(1, `v${i}`)));
      return { url: `/api/roosts/${roostId}/versions?siteId=${h.siteId}`, key: h.apiKey, expected };
    },
  },
  {
    route: 'GET /api/roosts/:roostId/versions/:versionRef/files',
    defaultSize: 100,
    maxSize: 500,
    items: 'files',
    id: (f) => f.path,
    seed: async () => {
      const roostId = await createRoost(h.siteId, h.apiKey, 'files list');
      const files = emptyFiles(103, 'tree');
      const versionId = await publish(h.siteId, h.apiKey, roostId, files);
      return {
        url: `/api/roosts/${roostId}/versions/${versionId}/files?siteId=${h.siteId}`,
        key: h.apiKey,
        expected: files.map((f) => f.path),
      };
    },
  },
  {
    route: 'GET /api/chunks/:digest/referrers',
    defaultSize: 50,
    maxSize: 200,
    items: 'referrers',
    id: (e) => e.entryId,
    seed: async () => {
      const digest = sha256Hex(`pagination-${newId('x')}`);
      await h.deps.db.query('INSERT INTO chunks (site_id, hash, size) VALUES ($1, $2, 10)', [h.siteId, digest]);
      const expected: string[] = [];
      for (let i = 0; i < 53; i++) {
        const entryId = newId('mnt');
        expected.push(entryId);
        await h.deps.db.query(
          `INSERT INTO chunk_referrers (site_id, hash, entry_id, source, roost_id, from_roost_id, to_roost_id, created_by)
           VALUES ($1, $2, $3, 'mount', $4, 'rst_from', $4, $5)`,
          [h.siteId, digest, entryId, `rst_to_${String(i).padStart(3, '0')}`, h.userId],
        );
      }
      return { url: `/api/chunks/${digest}/referrers?siteId=${h.siteId}`, key: h.apiKey, expected };
    },
  },
  {
    route: 'GET /api/sites/:siteId/machines',
    defaultSize: 50,
    maxSize: 200,
    items: 'machines',
    id: (m) => m.machineId,
    seed: async () => {
      const site = await h.other();
      const expected = Array.from({ length: 53 }, (_, i) => `pg-${String(i).padStart(3, '0')}`);
      await h.deps.db.query(
        'INSERT INTO machines (site_id, machine_id, hostname) SELECT $1, m, m FROM UNNEST(CAST($2 AS TEXT[])) AS t(m)',
        [site.siteId, expected],
      );
      return { url: `/api/sites/${site.siteId}/machines`, key: site.apiKey, expected };
    },
  },
  {
    route: 'GET /api/sites/:siteId/deployments',
    defaultSize: 25,
    maxSize: 100,
    items: 'deployments',
    id: (d) => d.deploymentId,
    seed: async () => {
      const site = await h.other();
      const ids: string[] = [];
      for (let i = 0; i < 27; i++) {
        const deploymentId = `dep_page${String(i).padStart(3, '0')}`;
        await insertDeployment(h.deps.db, {
          siteId: site.siteId,
          deploymentId,
          name: `page ${i}`,
          installerUrl: 'https://downloads.example.test/setup.msi',
          installerName: 'setup.msi',
          silentFlags: '/qn',
          verifyPath: null,
          sha256: null,
          closeProcesses: [],
          suppressProjects: [],
          parallelInstall: false,
          timeoutSeconds: null,
          templateId: null,
          workflowId: `classic-deployment:${site.siteId}:${deploymentId}`,
          createdBy: site.userId,
          machines: ['pg-m'],
        });
        ids.push(deploymentId);
      }
      // Newest first.
      return { url: `/api/sites/${site.siteId}/deployments`, key: site.apiKey, expected: ids.reverse() };
    },
  },
  {
    route: 'GET /api/sites/:siteId/installer-templates',
    defaultSize: 25,
    maxSize: 100,
    items: 'templates',
    id: (t) => t.templateId,
    seed: async () => {
      const site = await h.other();
      const ids: string[] = [];
      for (let i = 0; i < 27; i++) {
        const res = await h.request({
          method: 'POST',
          url: `/api/sites/${site.siteId}/installer-templates`,
          key: site.apiKey,
          idempotencyKey: true,
          body: { name: `template ${i}`, installer_name: 'setup.msi', installer_url: 'https://downloads.example.test/setup.msi' },
        });
        ids.push(res.json().templateId);
      }
      return { url: `/api/sites/${site.siteId}/installer-templates`, key: site.apiKey, expected: ids.reverse() };
    },
  },
  {
    route: 'GET /api/installer',
    defaultSize: 20,
    maxSize: 100,
    items: 'versions',
    id: (v) => v.version,
    seed: async () => {
      // The catalog is platform-wide: hold its lock (test/support/catalog-lock.ts) from seeding to the last
      // page walk, so no other file's upload or delete changes the list under these tests.
      const unlock = await lockCatalog(h);
      const major = 800 + Math.floor(Math.random() * 100);
      const versions = Array.from({ length: 23 }, (_, i) => `${major}.${i % 3}.${i}`);
      await h.deps.db.query(
        `INSERT INTO installer_versions (version, major, minor, patch, state, sha256, blob_name, size_bytes, upload_key_hash, upload_expires_at, created_by, finalized_by, finalized_at)
         SELECT v, split_part(v, '.', 1)::INT, split_part(v, '.', 2)::INT, split_part(v, '.', 3)::INT, 'active', repeat('a', 64), 'paged/' || v, 1, repeat('b', 64), now(), 'pagination-test', 'pagination-test', now()
           FROM UNNEST($1::text[]) AS t (v)`,
        [versions],
      );
      const { rows } = await h.deps.db.query<{ version: string }>(
        `SELECT version FROM installer_versions WHERE state = 'active' ORDER BY major DESC, minor DESC, patch DESC`,
      );
      fixtureDone.set('GET /api/installer', async () => {
        await h.deps.db.query('DELETE FROM installer_versions WHERE version = ANY($1::text[])', [versions]);
        await unlock();
      });
      return { url: '/api/installer', key: h.apiKey, expected: rows.map((r) => r.version) };
    },
    done: async () => fixtureDone.get('GET /api/installer')?.(),
  },
  {
    route: 'GET /api/keys',
    defaultSize: 50,
    maxSize: 100,
    items: 'keys',
    id: (k) => k.keyId,
    seed: async () => {
      const user = await makeUser(h.deps.db);
      const expected: string[] = [];
      for (let i = 0; i < 53; i++) expected.push((await insertKey(h.deps.db, { uid: user.uid, scopes: [] })).keyId);
      return { url: '/api/keys', key: await idTokenFor(h, user), expected };
    },
  },
  {
    route: 'GET /api/account/api-keys',
    defaultSize: 50,
    maxSize: 100,
    items: 'keys',
    id: (k) => k.keyId,
    seed: async () => {
      const admin = await makeUser(h.deps.db, { role: 'superadmin' });
      const owner = await makeUser(h.deps.db);
      const expected: string[] = [];
      for (let i = 0; i < 53; i++) expected.push((await insertKey(h.deps.db, { uid: owner.uid, scopes: [] })).keyId);
      return { url: `/api/account/api-keys?userId=${owner.uid}`, key: await idTokenFor(h, admin), expected };
    },
  },
  {
    route: 'GET /api/roosts/:roostId/rollouts',
    defaultSize: 20,
    maxSize: 100,
    items: 'rollouts',
    id: (r) => r.rolloutId,
    seed: async () => {
      const roostId = await createRoost(h.siteId, h.apiKey, 'rollouts list');
      const versionId = await publish(h.siteId, h.apiKey, roostId, emptyFiles(1, 'rollouts'));
      const expected: string[] = [];
      for (let i = 0; i < 23; i++) expected.push(await insertRolloutRow(roostId, versionId, [`rl-${i}`]));
      return { url: `/api/roosts/${roostId}/rollouts?siteId=${h.siteId}`, key: h.apiKey, expected };
    },
  },
  {
    // The detail route pages the rollout's machines (ordered by machine id).
    route: 'GET /api/roosts/:roostId/rollouts/:rolloutId',
    defaultSize: 100,
    maxSize: 1000,
    items: 'machines',
    id: (m) => m.machineId,
    seed: async () => {
      const roostId = await createRoost(h.siteId, h.apiKey, 'rollout machines');
      const versionId = await publish(h.siteId, h.apiKey, roostId, emptyFiles(1, 'rollout-machines'));
      const expected = Array.from({ length: 103 }, (_, i) => `rm-${String(i).padStart(4, '0')}`);
      const rolloutId = await insertRolloutRow(roostId, versionId, expected);
      return { url: `/api/roosts/${roostId}/rollouts/${rolloutId}?siteId=${h.siteId}`, key: h.apiKey, expected };
    },
  },
  {
    route: 'GET /api/sites/:siteId/audit-log',
    defaultSize: 50,
    maxSize: 200,
    items: 'records',
    id: (r) => r.hash,
    seed: async () => {
      // Its own site: 53 roost_created records plus the key's sampled api_key_used (reads by the same
      // key and address within the sample window add none, so the log holds still while it is paged).
      const site = await h.other();
      for (let i = 0; i < 53; i++) await createRoost(site.siteId, site.apiKey, `audited ${i}`);
      const { rows } = await h.deps.db.query<{ hash: string }>('SELECT hash FROM audit_records WHERE site_id = $1', [site.siteId]);
      return { url: `/api/sites/${site.siteId}/audit-log`, key: site.apiKey, expected: rows.map((r) => r.hash) };
    },
  },
  {
    route: 'GET /api/sites/:siteId/webhooks',
    defaultSize: 20,
    maxSize: 100,
    items: 'webhooks',
    id: (w) => w.webhookId,
    seed: async () => {
      const site = await h.other();
      const expected: string[] = [];
      for (let i = 0; i < 23; i++) expected.push(await insertHook(site.siteId, `list-${i}`));
      return { url: `/api/sites/${site.siteId}/webhooks`, key: site.apiKey, expected };
    },
  },
  {
    route: 'GET /api/sites/:siteId/webhooks/:webhookId/deliveries',
    defaultSize: 20,
    maxSize: 100,
    items: 'deliveries',
    id: (d) => d.deliveryId,
    seed: async () => {
      const webhookId = await insertHook(h.siteId, 'deliveries');
      const expected = Array.from({ length: 23 }, () => newId('dlv'));
      // Finished deliveries, a second apart, plus two sharing a created_at (ties go by delivery id).
      await h.deps.db.query(
        `INSERT INTO webhook_deliveries (site_id, delivery_id, webhook_id, event_id, event_type, payload, status, attempts, created_at, completed_at)
         SELECT $1, t.d, $2, 'evt_' || t.d, 'version.published', $4, 'succeeded', 1, now() - LEAST(t.i, 21) * INTERVAL '1 second', now()
           FROM UNNEST($3::text[]) WITH ORDINALITY AS t (d, i)`,
        [
          h.siteId,
          webhookId,
          expected,
          JSON.stringify({ event: 'version.published', siteId: h.siteId, occurredAt: new Date().toISOString(), data: {} }),
        ],
      );
      return { url: `/api/sites/${h.siteId}/webhooks/${webhookId}/deliveries`, key: h.apiKey, expected };
    },
  },
];

const with_ = (url: string, q: string) => `${url}${url.includes('?') ? '&' : '?'}${q}`;

/**
 * Conversation lists clamp or default page sizes instead of refusing them and nest their page under `data`
 * (docs/contract.md Conventions): test/integration/conversations.test.ts covers them with the same token rules.
 */
const CLAMPING_LISTS = ['GET /api/cortex/conversations', 'GET /api/chat'];

it('covers every paged route the server registers (and only those)', () => {
  const paged = h.app.routeTable
    .filter((r) => r.paged && !CLAMPING_LISTS.includes(`${r.method} ${r.url}`))
    .map((r) => `${r.method} ${r.url}`);
  const fixtures = FIXTURES.map((f) => f.route);
  expect(paged.filter((r) => !fixtures.includes(r))).toEqual([]);
  expect(fixtures.filter((r) => !paged.includes(r))).toEqual([]);
});

describe.each(FIXTURES.map((f) => [f.route, f] as const))('%s', (_route, f) => {
  let url: string;
  let key: string;
  let expected: string[];
  beforeAll(async () => {
    ({ url, key, expected } = await f.seed());
    expect(expected.length).toBeGreaterThan(f.defaultSize);
  });
  afterAll(async () => f.done?.());

  const get = async (q: string) => {
    const res = await h.request({ method: 'GET', url: with_(url, q), key });
    return { status: res.statusCode, body: res.json() };
  };

  /** Follows next_page_token (or `cursor` with the aliases) to the end; returns ids in order. */
  async function walk(size: number, aliases: boolean): Promise<string[]> {
    const ids: string[] = [];
    let token = '';
    for (let pages = 0; pages < 1000; pages++) {
      const q = aliases ? `limit=${size}${token ? `&cursor=${token}` : ''}` : `page_size=${size}${token ? `&page_token=${token}` : ''}`;
      const { status, body } = await get(q);
      expect(status).toBe(200);
      expect(body.nextPageToken).toBe(body.next_page_token);
      const items = body[f.items];
      expect(items.length).toBeLessThanOrEqual(size);
      ids.push(...items.map(f.id));
      token = body.next_page_token;
      if (token === '') return ids;
      expect(items.length).toBe(size);
    }
    throw new Error('no last page');
  }

  it('serves the default page size, then every item once across pages, in one order', async () => {
    const first = await get('');
    expect(first.status).toBe(200);
    expect(first.body[f.items]).toHaveLength(f.defaultSize);
    expect(first.body.next_page_token).not.toBe('');
    const all = await get(`page_size=${f.maxSize}`);
    expect(all.status).toBe(200);
    const order = all.body[f.items].map(f.id);
    expect(all.body.next_page_token).toBe('');
    expect(all.body.nextPageToken).toBe('');
    expect([...order].sort()).toEqual([...expected].sort());
    const walked = await walk(7, false);
    expect(walked).toEqual(order);
    expect(new Set(walked).size).toBe(walked.length);
    expect(await walk(expected.length - 1, true)).toEqual(order);
  });

  it('accepts 1 and the maximum; rejects 0, max+1 and non-numeric sizes with validation_failed', async () => {
    expect((await get('page_size=1')).body[f.items]).toHaveLength(1);
    expect((await get(`limit=${f.maxSize}`)).status).toBe(200);
    for (const [q, param] of [
      ['page_size=0', 'page_size'],
      [`page_size=${f.maxSize + 1}`, 'page_size'],
      ['page_size=abc', 'page_size'],
      ['page_size=-1', 'page_size'],
      ['page_size=2.5', 'page_size'],
      ['limit=0', 'limit'],
      [`limit=${f.maxSize + 1}`, 'limit'],
      [`limit=x&page_size=${f.maxSize + 1}`, 'page_size'],
    ]) {
      const { status, body } = await get(q);
      expect([q, status, body.code, body.param]).toEqual([q, 400, 'validation_failed', param]);
      expect(body.errors[param]).toBeDefined();
    }
  });

  it('lets the canonical name win when both are sent', async () => {
    const sized = await get('page_size=2&limit=5');
    expect(sized.body[f.items]).toHaveLength(2);
    const token = sized.body.next_page_token;
    const second = await get(`page_size=2&page_token=${token}&cursor=garbage`);
    expect(second.status).toBe(200);
    const third = await get(`page_size=2&cursor=${token}`);
    expect(third.body[f.items].map(f.id)).toEqual(second.body[f.items].map(f.id));
    const bad = await get(`page_size=2&page_token=garbage&cursor=${token}`);
    expect([bad.status, bad.body.code, bad.body.param]).toEqual([400, 'validation_failed', 'page_token']);
  });

  it('rejects tokens it did not issue for this list: garbage, hand-made, edited, appended to, re-spaced, old-format, foreign key, wrong shape, other caller', async () => {
    const real = (await get('page_size=2')).body.next_page_token as string;
    const { p: position, c: tag } = JSON.parse(Buffer.from(real, 'base64url').toString('utf8'));
    expect(position).toBeDefined();
    // The binding this test derives on its own reproduces the server's token exactly.
    const binding = await bindingOf(f.route, url, key);
    expect(signPageToken(serverKey(), binding, position)).toBe(real);
    const wrapped = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64url');
    const flipped = `${tag[0] === 'A' ? 'B' : 'A'}${tag.slice(1)}`;
    for (const [name, token] of [
      ['garbage', 'garbage'],
      ['not base64', '%%%'],
      ['hand-made', wrapped({ p: position })],
      ['edited tag', wrapped({ p: position, c: flipped })],
      ['edited position', wrapped({ p: typeof position === 'number' ? position + 1 : [position], c: tag })],
      ['unkeyed (the old format)', legacyToken(position)],
      ['foreign server key', signPageToken(randomBytes(32), binding, position)],
      ['wrong shape', signPageToken(serverKey(), binding, { not: 'a position' })],
      ['other route name', signPageToken(serverKey(), { ...binding, route: `${binding.route}/x` }, position)],
      // base64url decoding skips a trailing character it cannot complete a byte with, and JSON its spaces:
      // each of these decodes to the issued position and tag, and none is the issued token.
      ['a character appended', `${real}x`],
      ['a character appended to the tag', wrapped({ p: position, c: `${tag}x` })],
      ['re-spaced', Buffer.from(` {"p": ${JSON.stringify(position)}, "c": "${tag}"}`).toString('base64url')],
    ]) {
      const { status, body } = await get(`page_token=${encodeURIComponent(token)}`);
      expect([name, status, body.code, body.param, res400(body)]).toEqual([name, 400, 'validation_failed', 'page_token', true]);
      const alias = await get(`cursor=${encodeURIComponent(token)}`);
      expect([name, alias.status, alias.body.param]).toEqual([name, 400, 'cursor']);
    }
    // Another user who may read the same list cannot continue this one's pages.
    const other = await otherCaller(key);
    const crossed = await h.request({ method: 'GET', url: with_(url, `page_token=${real}`), key: other });
    expect([crossed.statusCode, crossed.json().code, crossed.json().param]).toEqual([400, 'validation_failed', 'page_token']);
    expect((await h.request({ method: 'GET', url: with_(url, 'page_size=1'), key: other })).statusCode).toBe(200);
    // Paging parameters are not part of the binding: a token continues with another page size.
    expect((await get(`page_size=3&page_token=${real}`)).status).toBe(200);
    issued.set(f.route, { url, key, token: real });
  });
});

/** One token per paged route (filled by the per-route tests), for the cross-route check below. */
const issued = new Map<string, { url: string; key: string; token: string }>();

const res400 = (body: any) => typeof body.detail === 'string' && body.detail.includes('not a token this server issued');

/** The page-token key of the harness server, derived the way api/pagination.ts does. */
const serverKey = () => derivedKeyOf(h.deps.cfg, PAGE_TOKEN_KEY_PURPOSE);

/** A token in the unkeyed format this server used to issue (SHA-256 over the position, no key, no binding). */
function legacyToken(position: unknown): string {
  const p = JSON.stringify(position);
  const c = createHash('sha256').update(`roost.page_token.v1\n${p}`).digest('base64url').slice(0, 16);
  return Buffer.from(JSON.stringify({ p: position, c })).toString('base64url');
}

/** The binding of a list URL for `key`'s user, derived from the route pattern, the URL and whoami. */
async function bindingOf(route: string, url: string, key: string): Promise<PageBinding> {
  const [method, pattern] = route.split(' ');
  const u = new URL(url, 'http://x');
  const params: Record<string, string> = {};
  const want = pattern.split('/');
  const got = u.pathname.split('/');
  want.forEach((seg, i) => {
    if (seg.startsWith(':')) params[seg.slice(1)] = decodeURIComponent(got[i]);
  });
  const filters = Object.fromEntries(u.searchParams.entries());
  const who = await h.request({ method: 'GET', url: '/api/whoami', key });
  expect(who.statusCode).toBe(200);
  return { route: `${method} ${pattern}`, params, filters, caller: `user:${who.json().userId}` };
}

/** A different user who may read every list: a superadmin (a legacy key, or an ID token where API keys are refused). */
async function otherCaller(key: string): Promise<string> {
  const admin = await makeUser(h.deps.db, { role: 'superadmin' });
  if (!key.startsWith('svk_')) return idTokenFor(h, admin);
  return (await insertKey(h.deps.db, { uid: admin.uid, scopes: [], isLegacy: true })).raw;
}

describe('a token is bound to its route, resource and filters', () => {
  it("is refused on every other paged route (each route's token tried on all the others)", async () => {
    expect([...issued.keys()].sort()).toEqual(FIXTURES.map((f) => f.route).sort());
    for (const [from, t] of issued) {
      for (const [to, target] of issued) {
        if (from === to) continue;
        const res = await h.request({ method: 'GET', url: with_(target.url, `page_token=${t.token}`), key: target.key });
        expect([from, to, res.statusCode, res.json().code]).toEqual([from, to, 400, 'validation_failed']);
      }
    }
  });

  it("one roost's version token is refused on another roost's versions and on its own /files; filters bind", async () => {
    const a = await createRoost(h.siteId, h.apiKey, 'bound a');
    const b = await createRoost(h.siteId, h.apiKey, 'bound b');
    let versionId = '';
    for (let i = 0; i < 3; i++) {
      await publish(h.siteId, h.apiKey, b, emptyFiles(3, `b${i}`));
      versionId = await publish(h.siteId, h.apiKey, a, emptyFiles(3, `a${i}`));
    }
    const list = async (u: string) => {
      const res = await h.request({ method: 'GET', url: u });
      return { status: res.statusCode, body: res.json() };
    };
    const first = await list(`/api/roosts/${a}/versions?siteId=${h.siteId}&page_size=1`);
    const token = first.body.next_page_token as string;
    expect(token).not.toBe('');
    expect((await list(`/api/roosts/${a}/versions?siteId=${h.siteId}&page_size=1&page_token=${token}`)).status).toBe(200);
    for (const u of [
      `/api/roosts/${b}/versions?siteId=${h.siteId}&page_size=1&page_token=${token}`,
      `/api/roosts/${a}/versions/${versionId}/files?siteId=${h.siteId}&page_size=1&page_token=${token}`,
      `/api/roosts/${a}/rollouts?siteId=${h.siteId}&page_token=${token}`,
    ]) {
      const r = await list(u);
      expect([u, r.status, r.body.code, r.body.param]).toEqual([u, 400, 'validation_failed', 'page_token']);
    }
    // Files: the token of one prefix or one version is refused with another prefix or version ref.
    const files = await list(`/api/roosts/${a}/versions/${versionId}/files?siteId=${h.siteId}&prefix=a2&page_size=1`);
    const ft = files.body.next_page_token as string;
    expect(ft).not.toBe('');
    expect((await list(`/api/roosts/${a}/versions/${versionId}/files?siteId=${h.siteId}&prefix=a2&page_token=${ft}`)).status).toBe(200);
    for (const u of [
      `/api/roosts/${a}/versions/${versionId}/files?siteId=${h.siteId}&page_token=${ft}`,
      `/api/roosts/${a}/versions/${versionId}/files?siteId=${h.siteId}&prefix=a&page_token=${ft}`,
      `/api/roosts/${a}/versions/1/files?siteId=${h.siteId}&prefix=a2&page_token=${ft}`,
    ]) {
      const r = await list(u);
      expect([u, r.status, r.body.param]).toEqual([u, 400, 'page_token']);
    }
    // Roosts: a token of the list without deleted roosts is refused on the list with them.
    const roosts = await list(`/api/roosts?siteId=${h.siteId}&limit=1`);
    const rt = roosts.body.next_page_token as string;
    expect((await list(`/api/roosts?siteId=${h.siteId}&limit=1&cursor=${rt}`)).status).toBe(200);
    const withDeleted = await list(`/api/roosts?siteId=${h.siteId}&limit=1&includeDeleted=true&cursor=${rt}`);
    expect([withDeleted.status, withDeleted.body.param]).toEqual([400, 'cursor']);
  });
});

it('an idempotency key does not change list results (GET routes ignore it)', async () => {
  const res = await h.request({
    method: 'GET',
    url: `/api/roosts?siteId=${h.siteId}&page_size=1`,
    headers: { 'idempotency-key': idemKey() },
  });
  expect(res.statusCode).toBe(200);
  expect(res.headers['idempotent-replayed']).toBeUndefined();
});
