/**
 * PostgreSQL/CockroachDB access through `pg`. `withTx` runs a callback in one SERIALIZABLE transaction
 * and retries SQLSTATE 40001 (serialization failure) with jittered backoff at the outermost level only,
 * CockroachDB's client-side retry protocol (docs/architecture.md "Transactions").
 */
import { Pool, type PoolClient, type QueryResultRow } from 'pg';

/** Anything that can run a parameterised query: the pool or a transaction's client. */
export interface Queryable {
  query<R extends QueryResultRow = QueryResultRow>(text: string, values?: unknown[]): Promise<{ rows: R[]; rowCount: number | null }>;
}

export type Db = Pool;

/** Creates the pool. BIGINT columns (epoch ms, byte counts) are parsed as JS numbers (safe below 2^53). */
export function createPool(connectionString: string, max = 10): Pool {
  const pool = new Pool({ connectionString, max, idleTimeoutMillis: 10_000 });
  pool.on('error', () => {
    /* idle client errors are reported on next use; keep the process alive */
  });
  return pool;
}

// INT8 → number (our BIGINTs are bytes and epoch milliseconds, far below 2^53).

require('pg').types.setTypeParser(20, (v: string) => Number(v));

const RETRYABLE = new Set(['40001', '40P01']);

/** Options for `withTx`. */
export interface TxOptions {
  /** Maximum attempts including the first (default 8). */
  attempts?: number;
  readOnly?: boolean;
}

/**
 * Runs `fn` inside BEGIN ISOLATION LEVEL SERIALIZABLE … COMMIT. Retries the whole callback on 40001/40P01
 * (the callback must be safe to re-run: no side effects outside the transaction), emitting
 * `txRetry` `{ code, attempt }` on the pool before each retry. Rethrows anything else after ROLLBACK.
 */
export async function withTx<T>(pool: Pool, fn: (tx: PoolClient) => Promise<T>, opts: TxOptions = {}): Promise<T> {
  const attempts = opts.attempts ?? 8;
  for (let attempt = 1; ; attempt++) {
    const client = await pool.connect();
    let broken = false;
    try {
      await client.query(`BEGIN ISOLATION LEVEL SERIALIZABLE${opts.readOnly ? ' READ ONLY' : ''}`);
      const result = await fn(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      try {
        await client.query('ROLLBACK');
      } catch {
        broken = true;
      }
      const code = (err as { code?: string }).code;
      if (code && RETRYABLE.has(code) && attempt < attempts) {
        // Observers (telemetry/metrics.ts observePool) count retries through this event.
        pool.emit('txRetry', { code, attempt });
        const base = Math.min(1000, 10 * 2 ** attempt);
        await new Promise((r) => setTimeout(r, base / 2 + Math.random() * base));
        continue;
      }
      throw err;
    } finally {
      client.release(broken);
    }
  }
}
