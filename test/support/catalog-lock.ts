/**
 * The agent-installer catalog is platform-wide (one latest pointer, one active-version count for every
 * test file sharing a run's database). Test files that move latest or delete versions hold this lock
 * while they do, so their assertions about latest and the two-version minimum never see another file's
 * changes: a session-level PostgreSQL advisory lock on a dedicated connection (test code only; the
 * product's SQL takes no advisory locks).
 */
import { Client } from 'pg';
import type { Harness } from './harness';

const LOCK_KEY = 731_902_417;

/** Waits for the catalog lock; resolves to its release (idempotent). */
export async function lockCatalog(h: Harness): Promise<() => Promise<void>> {
  const client = new Client({ connectionString: h.deps.cfg.databaseUrl });
  await client.connect();
  await client.query('SELECT pg_advisory_lock($1)', [LOCK_KEY]);
  let released = false;
  return async () => {
    if (released) return;
    released = true;
    await client.query('SELECT pg_advisory_unlock($1)', [LOCK_KEY]).catch(() => undefined);
    await client.end().catch(() => undefined);
  };
}
