/**
 * `POST /api/chunks/check` can read its chunk rows from an index alone (db/migrations/
 * 020_chunk_check_index.sql; docs/benchmarks.md "chunks/check"): `chunks_check` is keyed like the query
 * (site, hash) and carries every other column db/chunks.ts `chunkRows` returns. Whether PostgreSQL then
 * picks the index-only scan depends on the table's size and its visibility map, so the plan itself is
 * shown by the benchmark at 1,000,000 chunks, not here.
 */
import { createHash } from 'node:crypto';
import type { Pool } from 'pg';
import { bootstrap } from '../../db/bootstrap';
import { checkRows, chunkRows } from '../../db/chunks';
import { createPool } from '../../db/pool';
import { testConfig } from '../support/env';

let pool: Pool;
const hex = (s: string) => createHash('sha256').update(s).digest('hex');

beforeAll(() => {
  pool = createPool(testConfig().databaseUrl, 2);
});

afterAll(async () => {
  await pool?.end();
});

it('keys chunks_check by (site_id, hash) and includes every column chunkRows returns', async () => {
  const { rows } = await pool.query<{ indexdef: string }>(
    `SELECT indexdef FROM pg_indexes WHERE tablename = 'chunks' AND indexname = 'chunks_check'`,
  );
  expect(rows).toHaveLength(1);
  const def = rows[0].indexdef;
  expect(def).toMatch(/\(site_id, hash\) INCLUDE \((.+)\)$/);
  const included = /INCLUDE \((.+)\)$/.exec(def)![1].split(', ');

  const tag = hex(String(Math.random())).slice(0, 8);
  const { siteId } = await bootstrap(pool, { siteName: `plan-${tag}`, email: `plan-${tag}@example.test`, secret: 'plan' });
  const stored = [hex(`plan-a-${tag}`), hex(`plan-b-${tag}`)];
  await pool.query(`INSERT INTO chunks (site_id, hash, size) SELECT $1, h, 4096 FROM UNNEST($2::text[]) AS t (h)`, [siteId, stored]);
  const found = await chunkRows(pool, siteId, [...stored, hex(`absent-${tag}`)]);
  expect(found.map((r) => r.hash).sort()).toEqual([...stored].sort());
  const returned = Object.keys(found[0]).filter((c) => c !== 'hash');
  expect(returned.filter((c) => !included.includes(c))).toEqual([]);
});

it('checkRows answers the chunk rows and the reserved hashes of a list in one statement', async () => {
  const tag = hex(String(Math.random())).slice(0, 8);
  const { siteId } = await bootstrap(pool, { siteName: `check-${tag}`, email: `check-${tag}@example.test`, secret: 'check' });
  const [held, reservedOnly, both, neither] = ['held', 'reserved', 'both', 'neither'].map((s) => hex(`${s}-${tag}`));
  await pool.query(`INSERT INTO chunks (site_id, hash, size) SELECT $1, h, 4096 FROM UNNEST($2::text[]) AS t (h)`, [siteId, [held, both]]);
  await pool.query(
    `INSERT INTO upload_reservations (site_id, hash, bytes, expires_at) SELECT $1, h, 4096, now() + INTERVAL '1 hour' FROM UNNEST($2::text[]) AS t (h)`,
    [siteId, [reservedOnly, both]],
  );
  const r = await checkRows(pool, siteId, [held, reservedOnly, both, neither]);
  expect(r.rows.map((c) => c.hash).sort()).toEqual([held, both].sort());
  expect(r.rows.every((c) => c.size === 4096 && c.verified_at === null && c.verify_failed_digest === null)).toBe(true);
  expect(r.reserved.sort()).toEqual([reservedOnly, both].sort());
  // Another site's rows are not this site's.
  const other = await bootstrap(pool, { siteName: `check-o-${tag}`, email: `check-o-${tag}@example.test`, secret: 'check' });
  expect(await checkRows(pool, other.siteId, [held, reservedOnly, both, neither])).toEqual({ rows: [], reserved: [] });
});
