/** Jest runs TypeScript through SWC; the services (PostgreSQL, Azurite, Temporal) are started once in globalSetup. */
const swc = ['@swc/jest', { jsc: { target: 'es2022', parser: { syntax: 'typescript' } }, module: { type: 'commonjs' } }];
module.exports = {
  testEnvironment: 'node',
  // A few dependencies ship ESM only; SWC turns them into CommonJS for Jest on Node 20.
  transform: { '^.+\\.ts$': swc, '^.+\\.m?js$': ['@swc/jest', { jsc: { target: 'es2022' }, module: { type: 'commonjs' } }] },
  transformIgnorePatterns: [
    '/node_modules/(?!(.*/)?(cookie|set-cookie-parser|eventsource|eventsource-parser|env-paths|is-safe-filename)/)',
  ],
  // Local state (demo copies of packages, benchmark trees) is never part of the module graph.
  modulePathIgnorePatterns: ['<rootDir>/.data'],
  testPathIgnorePatterns: ['/node_modules/', '<rootDir>/.data/'],
  testMatch: ['<rootDir>/test/**/*.test.ts'],
  globalSetup: '<rootDir>/test/support/global-setup.ts',
  globalTeardown: '<rootDir>/test/support/global-teardown.ts',
  testTimeout: 120000,
  maxWorkers: 2,
};
