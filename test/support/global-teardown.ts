/** Jest global teardown: drops this run's database and blob containers, and stops the services global-setup started. */
import { dropDatabase, type ServiceHandle, stopServices } from '../../stack/services';
import fs from 'node:fs';
import { testConfig } from './env';
import { checkLogDir, describeCheck } from './log-leaks';
import { BlobStore } from '../../storage/blob';
import { PREBUILT_BUNDLE_ENV } from '../../worker/worker';

export default async function globalTeardown(): Promise<void> {
  // The secret grep over this run's logs. scripts/run-tests.ts (`npm test`, CI) fails the run on a
  // finding; a partial run (`npx jest <files>`) gets the report here and keeps the logs to look at.
  const logDir = process.env.ROOST_TEST_LOG_DIR;
  if (logDir && !process.env.ROOST_TEST_LOG_CHECKED_BY_RUNNER) {
    const check = checkLogDir(logDir);
    if (check.leaks.length > 0) process.stderr.write(`\n${describeCheck(logDir, check)}\n`);
    else if (!process.env.ROOST_KEEP_TEST_LOGS) fs.rmSync(logDir, { recursive: true, force: true });
  }
  // The run's workflow bundle (global-setup.ts), when this run built it.
  const bundleFile = process.env[PREBUILT_BUNDLE_ENV];
  if (bundleFile?.includes(`workflow-bundle-${process.env.ROOST_TEST_DATABASE}.json`)) fs.rmSync(bundleFile, { force: true });
  const cfg = testConfig();
  if (cfg.embedded.postgres && process.env.ROOST_TEST_DATABASE?.startsWith('roost_test_')) {
    try {
      dropDatabase(cfg, process.env.ROOST_TEST_DATABASE);
    } catch {
      /* best effort: a stopped cluster has nothing to drop */
    }
  }
  if (cfg.ROOST_BLOB_CONTAINER_PREFIX) {
    try {
      await BlobStore.fromConfig(cfg).deleteContainers();
    } catch {
      /* best effort: a stopped Azurite has nothing to delete */
    }
  }
  const handles = (globalThis as Record<string, unknown>).__ROOST_SERVICES__ as ServiceHandle[] | undefined;
  if (handles && !process.env.ROOST_KEEP_SERVICES) await stopServices(handles);
}
