/**
 * Applies db/migrations/NNN_name.sql (or NNNx_name.sql: a lower-case letter after the number sorts the file
 * after NNN_ and before the next number) in order, once each, recording them in schema_migrations.
 * Each file runs in its own transaction; a failing migration aborts with its error (never swallowed).
 */
import fs from 'node:fs';
import path from 'node:path';
import { type Pool } from 'pg';

export const MIGRATIONS_DIR = path.join(__dirname, 'migrations');

/** File names of this build's migrations (db/migrations), in the order they apply. */
export function migrationFiles(): string[] {
  return fs
    .readdirSync(MIGRATIONS_DIR)
    .filter((f) => /^\d+[a-z]?_.*\.sql$/.test(f))
    .sort();
}

/**
 * This build's migrations the database has not recorded in schema_migrations, in order (every file when the
 * table does not exist yet): the readiness probe `GET /readyz` is not ready while any is pending.
 * @throws the driver's error when the database does not answer.
 */
export async function pendingMigrations(q: Pick<Pool, 'query'>): Promise<string[]> {
  const { rows } = await q.query<{ t: string | null }>(`SELECT to_regclass('schema_migrations')::text AS t`);
  if (!rows[0]?.t) return migrationFiles();
  const done = new Set((await q.query<{ name: string }>('SELECT name FROM schema_migrations')).rows.map((r) => r.name));
  return migrationFiles().filter((f) => !done.has(f));
}

/** Applies pending migrations; returns the names applied in this call. */
export async function migrate(pool: Pool): Promise<string[]> {
  await pool.query(`CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`);
  const done = new Set((await pool.query<{ name: string }>('SELECT name FROM schema_migrations')).rows.map((r) => r.name));
  const files = migrationFiles();
  const applied: string[] = [];
  for (const file of files) {
    if (done.has(file)) continue;
    const sql = fs.readFileSync(path.join(MIGRATIONS_DIR, file), 'utf8');
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query(sql);
      await client.query('INSERT INTO schema_migrations (name) VALUES ($1) ON CONFLICT (name) DO NOTHING', [file]);
      await client.query('COMMIT');
      applied.push(file);
    } catch (err) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw new Error(`migration ${file} failed: ${(err as Error).message}`);
    } finally {
      client.release();
    }
  }
  return applied;
}
