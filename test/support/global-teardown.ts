/** Jest global teardown: drops this run's database and stops the services global-setup started. */
import { dropDatabase, ServiceHandle, stopServices } from '../../stack/services';
import { testConfig } from './env';

export default async function globalTeardown(): Promise<void> {
  const cfg = testConfig();
  if (cfg.embedded.postgres && process.env.ROOST_TEST_DATABASE?.startsWith('roost_test_')) {
    try {
      dropDatabase(cfg, process.env.ROOST_TEST_DATABASE);
    } catch {
      /* best effort: a stopped cluster has nothing to drop */
    }
  }
  const handles = (globalThis as Record<string, unknown>).__ROOST_SERVICES__ as ServiceHandle[] | undefined;
  if (handles && !process.env.ROOST_KEEP_SERVICES) await stopServices(handles);
}
