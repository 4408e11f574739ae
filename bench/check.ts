/**
 * Benchmark 4, `check`: latency of `POST /api/chunks/check` with 1000 hashes against a site holding
 * `storedChunks` chunks (100,000 by default, inserted with one bulk `INSERT … SELECT FROM UNNEST`), over
 * `requests` sequential requests, each half present and half absent (shuffled), against the floor: the
 * route's own database read (db/chunks.ts `checkRows`, one statement: hash, size and verification state of
 * the listed chunks, answered by an index-only scan of `chunks_check`, and which of them have upload
 * reservations) run directly through `pg` with the same hash sets the same number of times.
 *
 * API request i and SQL query i run back to back (interleaved), so both see the same machine noise, and
 * which goes first alternates, so neither always finds the other's index pages in shared buffers (no
 * order effect was measured at 1,000,000 chunks: docs/benchmarks.md).
 * The API is the real app in a process of its own session (bench/server-child.ts, `api: 'process'`, the
 * default), as a remote API would be: with the app in the bench process (`in-process`), the client's
 * JSON work and the garbage collection of the bench's heap (a million stored hashes among it) landed on
 * the API's event loop and in its tail latency.
 * The HTTP side is the CLI's client (cli/client.ts: undici's request with keep-alive, JSON, the full-access key),
 * so the figure includes HTTP, JSON, schema validation, authentication and authorisation. Every answer
 * is checked (exactly the absent half reported missing) so a broken route cannot pass for a fast one.
 */
import { createHash } from 'node:crypto';
import { checkRows, explainCheckRows } from '../db/chunks';
import type { BenchStack } from './stack';
import { siteOn } from './push';
import { type ApiWhere, type ServerChild, withApiChild } from './server-child';
import { latencySummary, log, now, prng, round, shuffle, sleep } from './util';

export interface CheckFigures {
  /** Where the API ran: a process of its own (`process`) or the bench process (`in-process`). */
  apiRuns: ApiWhere;
  storedChunks: number;
  hashesPerRequest: number;
  requests: number;
  /** The chunks table's pages and all-visible pages when the requests began, and the VACUUM + ANALYZE passes it took. */
  visibility: { relpages: number; relallvisible: number; passes: number };
  /** One bulk INSERT of the stored chunks (ms). */
  insertMs: number;
  api: ReturnType<typeof latencySummary>;
  /** The floor; `query` names the repository function timed. */
  floor: ReturnType<typeof latencySummary> & { query: string };
  /** PostgreSQL's plan for the floor's query over the first measured hash set (an index-only scan of chunks_check is the goal). */
  plan: Awaited<ReturnType<typeof explainCheckRows>>;
  /** API p50 ÷ SQL p50, and the same at p99. */
  timesFloorP50: number;
  timesFloorP99: number;
}

const HASHES_PER_REQUEST = 1000;
const WARMUP = 20;

function digest(s: string): string {
  return createHash('sha256').update(s).digest('hex');
}

/** Runs benchmark 4 on a fresh site of `bench`. */
export async function benchCheck(
  bench: BenchStack,
  opts: { storedChunks: number; requests: number; api?: ApiWhere },
): Promise<CheckFigures> {
  if (opts.storedChunks < HASHES_PER_REQUEST / 2)
    throw new Error(`--stored-chunks must be at least ${HASHES_PER_REQUEST / 2} (half of every request is present)`);
  const where = opts.api ?? 'process';
  return withApiChild(bench.cfg, where, (server) => check(bench, { ...opts, where, server }));
}

async function check(
  bench: BenchStack,
  opts: { storedChunks: number; requests: number; where: ApiWhere; server?: ServerChild },
): Promise<CheckFigures> {
  const site = siteOn(await bench.newSite('check'), opts.server?.url);
  if (opts.server) log(`check: the API runs in process ${opts.server.pid} (${opts.server.url})`);
  const stored = Array.from({ length: opts.storedChunks }, (_, i) => digest(`bench-stored-${i}`));
  log(`check: inserting ${opts.storedChunks} chunks for ${site.siteId} (one statement)`);
  const t0 = now();
  await bench.pool.query(`INSERT INTO chunks (site_id, hash, size) SELECT $1, h, $3 FROM UNNEST($2::text[]) AS t(h)`, [
    site.siteId,
    stored,
    4 * 1024 * 1024,
  ]);
  const insertMs = now() - t0;
  // Statistics and the visibility map, as autovacuum leaves them after a bulk load (the index-only scan
  // of chunks_check needs the latter). PostgreSQL only, like the bench's embedded cluster. On PostgreSQL 15
  // here, the first VACUUM right after the load often marks no page all-visible, and pg_class.relallvisible
  // (what the planner reads) follows the visibility map only at the next ANALYZE: with it at 0 the planner
  // costs a heap fetch per row and reads the primary key instead (docs/benchmarks.md "On a quiet
  // machine"). So VACUUM and ANALYZE repeat, a second apart, until nine tenths of the pages are
  // all-visible (autovacuum would get there on its own, later).
  let vis = { relpages: 0, relallvisible: 0 };
  let passes = 0;
  while (passes < 10) {
    passes++;
    await bench.pool.query('VACUUM chunks');
    await bench.pool.query('ANALYZE chunks');
    const { rows } = await bench.pool.query<{ relpages: number; relallvisible: number }>(
      `SELECT relpages, relallvisible FROM pg_class WHERE relname = 'chunks' AND relkind = 'r'`,
    );
    vis = rows[0] ?? vis;
    if (vis.relpages > 0 && vis.relallvisible >= 0.9 * vis.relpages) break;
    await sleep(1000);
  }
  log(`check: chunks table ${vis.relpages} pages, ${vis.relallvisible} all-visible after ${passes} VACUUM + ANALYZE pass(es)`);

  const random = prng(4242);
  const half = HASHES_PER_REQUEST / 2;
  const sets: { hashes: string[]; absent: Set<string> }[] = [];
  for (let r = 0; r < opts.requests + WARMUP; r++) {
    const present = Array.from({ length: half }, () => stored[Math.floor(random() * stored.length)]);
    const absent = Array.from({ length: half }, (_, j) => digest(`bench-absent-${r}-${j}`));
    // Distinct present hashes (the route dedups; the floor gets the same list).
    const uniq = [...new Set(present)];
    while (uniq.length < half) {
      const h = stored[Math.floor(random() * stored.length)];
      if (!uniq.includes(h)) uniq.push(h);
    }
    sets.push({ hashes: shuffle([...uniq, ...absent], random), absent: new Set(absent) });
  }

  const floorClient = await bench.pool.connect();
  const apiMs: number[] = [];
  const sqlMs: number[] = [];
  try {
    for (let r = 0; r < sets.length; r++) {
      const { hashes, absent } = sets[r];
      const viaApi = async () => {
        const t0 = now();
        const answer = await site.client.request<{ missing: string[] }>('POST', '/api/chunks/check', {
          body: { siteId: site.siteId, hashes },
          retrySafe: true,
        });
        return { ms: now() - t0, missing: answer.body.missing };
      };
      const viaSql = async () => {
        const t0 = now();
        const rows = (await checkRows(floorClient, site.siteId, hashes)).rows;
        return { ms: now() - t0, rows };
      };
      // Whichever runs second may find the index pages of this hash set in shared buffers, so the order
      // alternates (the SQL first on odd requests).
      let api: Awaited<ReturnType<typeof viaApi>>;
      let sql: Awaited<ReturnType<typeof viaSql>>;
      if (r % 2 === 0) {
        api = await viaApi();
        sql = await viaSql();
      } else {
        sql = await viaSql();
        api = await viaApi();
      }
      const q = sql.rows;
      const missing = api.missing;
      if (missing.length !== absent.size || !missing.every((h) => absent.has(h))) {
        throw new Error(`chunks/check answered ${missing.length} missing, expected exactly the ${absent.size} absent hashes`);
      }
      if (q.length !== half) throw new Error(`the floor query found ${q.length} rows, expected ${half}`);
      if (r >= WARMUP) {
        apiMs.push(api.ms);
        sqlMs.push(sql.ms);
      }
      if (r >= WARMUP && (r - WARMUP + 1) % 100 === 0) log(`check: ${r - WARMUP + 1}/${opts.requests} requests`);
    }
  } finally {
    floorClient.release();
  }
  const api = latencySummary(apiMs);
  const floor = latencySummary(sqlMs);
  return {
    apiRuns: opts.where,
    storedChunks: opts.storedChunks,
    hashesPerRequest: HASHES_PER_REQUEST,
    requests: opts.requests,
    insertMs: round(insertMs),
    visibility: { ...vis, passes },
    plan: await explainCheckRows(bench.pool, site.siteId, sets[WARMUP].hashes),
    api,
    floor: { ...floor, query: 'db/chunks.ts checkRows' },
    timesFloorP50: floor.p50 > 0 ? round(api.p50 / floor.p50, 2) : 0,
    timesFloorP99: floor.p99 > 0 ? round(api.p99 / floor.p99, 2) : 0,
  };
}
