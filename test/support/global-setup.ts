/**
 * Jest global setup: starts (or reuses this clone's) PostgreSQL, Azurite and the Temporal dev server, creates a fresh
 * database for this run (its name goes to the workers through ROOST_TEST_DATABASE) and applies
 * migrations. Handles are kept on globalThis for global-teardown.ts.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { createDatabase, ensureServicesAwayFromOthers } from '../../stack/services';
import { createPool } from '../../db/pool';
import { migrate } from '../../db/migrate';
import { testConfig } from './env';
import { BlobStore } from '../../storage/blob';
import { DefaultLogger } from '@temporalio/worker';
import { buildWorkflowBundle, PREBUILT_BUNDLE_ENV } from '../../worker/worker';

export default async function globalSetup(): Promise<void> {
  if (!process.env.ROOST_TEST_DATABASE) process.env.ROOST_TEST_DATABASE = `roost_test_${randomBytes(4).toString('hex')}`;
  // Blob containers of this run's own (t<hex>-chunks, …), deleted by global-teardown: test runs leave no
  // blobs in the shared Azurite (each GET there costs more the more blobs it holds).
  if (!process.env.ROOST_BLOB_CONTAINER_PREFIX)
    process.env.ROOST_BLOB_CONTAINER_PREFIX = `t${process.env.ROOST_TEST_DATABASE.replace(/^roost_test_/, '').replace(/[^a-z0-9]/g, '')}-`;
  // The suite sends hundreds of requests per key within minutes: every rate limit is multiplied (the
  // rate-limit tests set their own numbers; docs/decisions/rate-limit-buckets.md).
  if (!process.env.ROOST_RATE_LIMIT_SCALE) process.env.ROOST_RATE_LIMIT_SCALE = '1000';
  // Tests insert rollout rows without workflows into the shared database; an API process's lost-start pass
  // would fail them after two minutes. test/integration/lost-starts.test.ts runs the pass itself.
  if (!process.env.ROOST_LOST_START_PASS_SECONDS) process.env.ROOST_LOST_START_PASS_SECONDS = '0';
  // Every app, worker and agent of the run logs into this folder (test/support/test-log.ts); the logs are
  // grepped for secrets after the run (scripts/run-tests.ts, global-teardown.ts).
  if (!process.env.ROOST_TEST_LOG_DIR)
    process.env.ROOST_TEST_LOG_DIR = path.join(__dirname, '..', '..', '.data', 'test-logs', process.env.ROOST_TEST_DATABASE);
  fs.mkdirSync(process.env.ROOST_TEST_LOG_DIR, { recursive: true });
  // Another clone's services on the default ports (its demo, its test run, its `roost stack`) are never
  // reused: this run moves to free ports, exported so the test workers and the commands they spawn follow.
  const { moved, handles } = await ensureServicesAwayFromOthers(testConfig());
  for (const m of moved) {
    process.env[m.setting] = String(m.to);
    process.stderr.write(
      `[global-setup] port ${m.from} is held by ${m.holder ?? 'another program'}: this run uses ${m.to} (${m.setting})\n`,
    );
  }
  const cfg = testConfig();
  (globalThis as Record<string, unknown>).__ROOST_SERVICES__ = handles;
  if (cfg.embedded.postgres) createDatabase(cfg, process.env.ROOST_TEST_DATABASE, true);
  await BlobStore.fromConfig(cfg).ensureContainers();
  const pool = createPool(cfg.databaseUrl, 2);
  try {
    await migrate(pool);
  } finally {
    await pool.end();
  }
  // One workflow bundle for the whole run (global-teardown.ts deletes it): every test file that starts a worker, and every worker process
  // the tests spawn, loads it instead of running webpack again (several seconds of CPU each, 30-odd times).
  if (!process.env[PREBUILT_BUNDLE_ENV]) {
    const file = path.join(__dirname, '..', '..', '.data', 'test-cache', `workflow-bundle-${process.env.ROOST_TEST_DATABASE}.json`);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    const { code, sourceMap } = await buildWorkflowBundle(false, new DefaultLogger('WARN'));
    fs.writeFileSync(file, JSON.stringify({ code, sourceMap }));
    process.env[PREBUILT_BUNDLE_ENV] = file;
  }
}
