/**
 * A migrated database of one test file's own on the suite's embedded PostgreSQL (test files whose data
 * must not meet the other files' in the shared database: sweeps over every site, Schemathesis with a
 * superadmin key). On an external database (ROOST_DATABASE_URL) there is none: the shared one is used.
 */
import { createDatabase, dropDatabase } from '../../stack/services';
import { createPool } from '../../db/pool';
import { migrate } from '../../db/migrate';
import { testConfig, testDatabase } from './env';

export interface OwnDatabase {
  /** Configuration overrides that point a harness at it (empty when there is none). */
  overrides: Record<string, string>;
  /** Drops it (nothing when there is none). */
  drop(): void;
}

/** Creates (afresh) and migrates `<suite database>_<suffix>`. */
export async function ownDatabase(suffix: string): Promise<OwnDatabase> {
  if (!testConfig().embedded.postgres) return { overrides: {}, drop: () => undefined };
  const name = `${testDatabase()}_${suffix}`;
  const cfg = testConfig({ ROOST_PG_DATABASE: name });
  createDatabase(cfg, name, true);
  const pool = createPool(cfg.databaseUrl, 2);
  try {
    await migrate(pool);
  } finally {
    await pool.end();
  }
  return { overrides: { ROOST_PG_DATABASE: name }, drop: () => dropDatabase(testConfig(), name) };
}
