/** Jest global teardown: drops this run's database and blob containers, and stops the services global-setup started. */
import { dropDatabase, type ServiceHandle, stopServices } from '../../stack/services';
import { testConfig } from './env';
import { BlobStore } from '../../storage/blob';

export default async function globalTeardown(): Promise<void> {
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
