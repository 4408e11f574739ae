/**
 * PostgreSQL/CockroachDB access through `pg`. `withTx` runs a callback in one SERIALIZABLE transaction
 * and retries SQLSTATE 40001 (serialization failure) with jittered backoff at the outermost level only,
 * CockroachDB's client-side retry protocol (docs/architecture.md "Transactions").
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { Client, type ClientConfig, Pool, type PoolClient, type QueryResultRow } from 'pg';

/**
 * A statement with a name: `pg` prepares it once per connection (Parse) and later only binds and executes it,
 * so the server parses and plans it once per connection instead of on every call (see `prepared`).
 */
export interface NamedStatement {
  name: string;
  text: string;
  values?: unknown[];
}

/** Anything that can run a parameterised query: the pool or a transaction's client. */
export interface Queryable {
  query<R extends QueryResultRow = QueryResultRow>(text: string, values?: unknown[]): Promise<{ rows: R[]; rowCount: number | null }>;
  query<R extends QueryResultRow = QueryResultRow>(statement: NamedStatement): Promise<{ rows: R[]; rowCount: number | null }>;
}

/**
 * Runs `text` as a named (prepared) statement: for the statements every request sends (authentication's
 * key and site read, db/keys.ts `keyForAuth`), where planning cost the server several times what executing
 * does (a three-table join with a membership subquery: ~0.4 ms of PostgreSQL CPU planned each time against
 * ~0.1 ms prepared, docs/benchmarks.md "API overhead"). `name` must be unique per distinct `text` in the
 * process (each connection keeps its prepared statements until it closes). Read-only statements only: a
 * write must go through `query(text, values)` so an active TxObserver sees it (`createPool`). CockroachDB
 * prepares named statements the same way over the wire protocol.
 */
export function prepared<R extends QueryResultRow = QueryResultRow>(
  db: Queryable,
  name: string,
  text: string,
  values: unknown[],
): Promise<{ rows: R[]; rowCount: number | null }> {
  return db.query<R>({ name, text, values });
}

export type Db = Pool;

/**
 * Marks `err` as a lost or refused database connection when it is one: pg reports those without a SQLSTATE
 * ("Connection terminated unexpectedly", "Client has encountered a connection error and is not queryable",
 * "timeout exceeded when trying to connect", a socket error), while every answer of the server itself is a
 * `DatabaseError` with `severity` and a SQLSTATE `code`. Programming errors (TypeError, RangeError) are not
 * marked. A marked error carries `dependency: 'database'`, which domain/outage.ts reads: the API answers 503
 * service_unavailable with Retry-After instead of 500 (docs/decisions/outages.md). Returns `err`.
 */
export function tagConnectionError(err: unknown): unknown {
  if (!(err instanceof Error) || err instanceof TypeError || err instanceof RangeError || err instanceof SyntaxError) return err;
  const o = err as Error & { severity?: unknown; dependency?: unknown };
  if (o.severity === undefined && o.dependency === undefined) o.dependency = 'database';
  return err;
}

type AnyFn = (...args: unknown[]) => unknown;

/**
 * Told of the transactions that write while it is the current one (`enterTxObserver`; services/audit.ts uses it
 * to put a request's audit record into the request's own transactions, docs/decisions/audit-recording.md).
 */
export interface TxObserver {
  /** Whether it still acts (cleared when the request's handler is done; later async work is not its). */
  active: boolean;
  /** Runs inside a transaction that wrote, just before its COMMIT (a failure rolls the transaction back). */
  beforeCommit(tx: Queryable): Promise<void>;
  /** Runs once that COMMIT succeeded. */
  afterCommit(): void;
}

const observers = new AsyncLocalStorage<TxObserver>();

/** Makes `o` the observer of the current async context and everything it starts from now on. */
export function enterTxObserver(o: TxObserver): void {
  observers.enterWith(o);
}

/** Runs `fn` with no observer (bookkeeping writes of a request that are not part of its mutation). */
export function withoutTxObserver<T>(fn: () => T): T {
  return observers.exit(fn);
}

function activeObserver(): TxObserver | undefined {
  const o = observers.getStore();
  return o?.active ? o : undefined;
}

/** True for statements that change data: INSERT, UPDATE, DELETE, UPSERT, or a WITH that does one of them. */
export function isWriteStatement(text: string): boolean {
  return (
    /^\s*(INSERT|UPDATE|DELETE|UPSERT|MERGE)\b/i.test(text) ||
    (/^\s*WITH\b/i.test(text) && /\b(INSERT\s+INTO|DELETE\s+FROM|UPDATE\s+\w+\s+(AS\s+\w+\s+)?SET)\b/i.test(text))
  );
}

/** Wraps a promise-returning method so its rejections pass through `tagConnectionError` (callback calls untouched). */
function tagRejections(target: object, method: 'query' | 'connect'): void {
  const t = target as Record<string, AnyFn>;
  const raw = t[method].bind(target);
  t[method] = (...args: unknown[]) => {
    if (typeof args[args.length - 1] === 'function') return raw(...args);
    const r = raw(...args);
    return r instanceof Promise
      ? r.catch((err: unknown) => {
          throw tagConnectionError(err);
        })
      : r;
  };
}

/** Waits the API's pool puts on the database (config ROOST_DB_QUERY_TIMEOUT_MS, ROOST_DB_CONNECT_TIMEOUT_MS). */
export interface PoolTimeouts {
  /** Longest wait for one statement's answer (ms; pg `query_timeout`); none when unset. */
  queryTimeoutMs?: number;
  /** Longest wait for a new connection to be set up (ms); none when unset. */
  connectTimeoutMs?: number;
}

/** The message of pg's `query_timeout` error: the statement may still run, the connection is unusable. */
const QUERY_TIMEOUT_MESSAGE = 'Query read timeout';

/** True for pg's `query_timeout` error (the client that raised it must be discarded, not reused). */
export function isQueryTimeout(err: unknown): boolean {
  return err instanceof Error && err.message === QUERY_TIMEOUT_MESSAGE;
}

/**
 * Creates the pool. BIGINT columns (epoch ms, byte counts) are parsed as JS numbers (safe below 2^53).
 * Connection-level failures of `pool.query`, `pool.connect` and a checked-out client's `query` are marked by
 * `tagConnectionError`, and so are the timeouts of `timeouts`, so a database that stops answering is 503 too.
 * The connect timeout is set on each client, not on the pool: pg's pool-level `connectionTimeoutMillis` also
 * bounds the wait for a free client, so under load (a fleet enrolling at once) it would turn a busy pool into
 * 503s. A client whose statement timed out is discarded (pool.query does; `withTx` does).
 */
export function createPool(connectionString: string, max = 10, timeouts: PoolTimeouts = {}): Pool {
  const connectTimeoutMs = timeouts.connectTimeoutMs;
  const pool = new Pool({
    connectionString,
    max,
    idleTimeoutMillis: 10_000,
    ...(timeouts.queryTimeoutMs ? { query_timeout: timeouts.queryTimeoutMs } : {}),
    ...(connectTimeoutMs
      ? {
          Client: class extends Client {
            constructor(config?: ClientConfig) {
              super({ ...config, connectionTimeoutMillis: connectTimeoutMs });
            }
          },
        }
      : {}),
  });
  pool.on('error', () => {
    /* idle client errors are reported on next use; keep the process alive */
  });
  pool.on('connect', (client) => tagRejections(client, 'query'));
  tagRejections(pool, 'query');
  tagRejections(pool, 'connect');
  // A single-statement write under an active observer runs in a transaction of its own, so the observer's
  // rows commit with it (withTx below).
  const query = (pool as unknown as Record<string, AnyFn>).query;
  (pool as unknown as Record<string, AnyFn>).query = (...args: unknown[]) => {
    if (typeof args[0] === 'string' && typeof args[args.length - 1] !== 'function' && activeObserver() && isWriteStatement(args[0])) {
      const [text, values] = args as [string, unknown[] | undefined];
      return withTx(pool, (tx) => tx.query(text, values));
    }
    return query(...args);
  };
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
 * @throws Error when COMMIT rolled back (a statement failed and `fn` caught it and returned).
 * Under an active `TxObserver`, a transaction that wrote runs its `beforeCommit` just before COMMIT and its
 * `afterCommit` after.
 */
export async function withTx<T>(pool: Pool, fn: (tx: PoolClient) => Promise<T>, opts: TxOptions = {}): Promise<T> {
  const attempts = opts.attempts ?? 8;
  const observer = opts.readOnly ? undefined : activeObserver();
  for (let attempt = 1; ; attempt++) {
    const client = await pool.connect();
    let broken = false;
    // A checked-out client has no error listener of the pool's: a connection cut while the callback awaits
    // something else (a database outage) would otherwise be an unhandled 'error' event. The next query fails
    // with the same error, which the code below handles; the client is discarded.
    const onError = () => {
      broken = true;
    };
    client.on('error', onError);
    // Under an observer, notice whether this transaction writes (the observer acts only then).
    let wrote = false;
    const clientQuery = client.query;
    if (observer) {
      (client as unknown as Record<string, AnyFn>).query = (...args: unknown[]) => {
        if (typeof args[0] === 'string' && isWriteStatement(args[0])) wrote = true;
        return (clientQuery as unknown as AnyFn).apply(client, args);
      };
    }
    try {
      await client.query(`BEGIN ISOLATION LEVEL SERIALIZABLE${opts.readOnly ? ' READ ONLY' : ''}`);
      const result = await fn(client);
      const observed = observer !== undefined && wrote && observer.active;
      if (observed) await observer.beforeCommit(client);
      // PostgreSQL answers COMMIT of a transaction an error aborted with ROLLBACK, not an error: a callback
      // that caught a failed statement and returned must not pass for committed.
      const commit = await client.query('COMMIT');
      if (commit.command === 'ROLLBACK') throw new Error('the transaction was rolled back at COMMIT: a statement in it failed');
      if (observed) observer.afterCommit();
      return result;
    } catch (err) {
      // A statement that timed out is still the connection's active one: a ROLLBACK would wait behind it.
      if (isQueryTimeout(err)) broken = true;
      else
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
      if (observer) client.query = clientQuery;
      client.removeListener('error', onError);
      client.release(broken);
    }
  }
}
