/** Configuration the test suite runs under: the embedded services, a database of this run's own. */
import { type Config, loadConfig } from '../../config/env';

/** Set by global-setup for the whole run (each run gets a fresh database, so runs never collide). */
export function testDatabase(): string {
  return process.env.ROOST_TEST_DATABASE ?? 'roost_test';
}

/** The test configuration; `overrides` replace individual variables (e.g. a unique task queue). */
export function testConfig(overrides: Record<string, string> = {}): Config {
  return loadConfig({
    ...process.env,
    ROOST_PG_DATABASE: testDatabase(),
    ROOST_LOG_LEVEL: process.env.ROOST_LOG_LEVEL ?? 'silent',
    ...overrides,
  });
}
