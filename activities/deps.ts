/**
 * What activities may touch: the database pool, blob storage and configuration. Every activity family is a
 * factory over these (`createRolloutActivities(deps)`, …), merged by `createActivities` in activities/index.ts.
 */
import type { Pool } from 'pg';
import type { Config } from '../config/env';
import type { BlobStore } from '../storage/blob';

/** The dependencies the worker injects into every activity factory (owned by the caller, never closed here). */
export interface ActivityDeps {
  db: Pool;
  blob: BlobStore;
  cfg: Config;
}
