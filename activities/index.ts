/**
 * Every activity the worker serves, built by one factory over its dependencies (DESIGN.md "Temporal";
 * STYLE.md: activities as a factory, typed by ReturnType). Workflows import `Activities` by type only.
 *
 * Add an activity family by spreading its factory's result below; activity names must be unique across
 * families.
 */
import type { Pool } from 'pg';
import type { Config } from '../config/env';
import type { BlobStore } from '../storage/blob';
import { createRolloutActivities } from './rollout';
import { createSweepActivities } from './sweeps';
import { createEventActivities } from './events';
import { createWebhookActivities } from './webhooks';

/** What activities may touch: the database pool, blob storage and configuration. */
export interface ActivityDeps {
  db: Pool;
  blob: BlobStore;
  cfg: Config;
}

/** All activities keyed by name. */
export function createActivities(deps: ActivityDeps) {
  return {
    ...createRolloutActivities(deps),
    ...createSweepActivities(deps),
    ...createEventActivities(deps),
    ...createWebhookActivities(deps),
  };
}

export type Activities = ReturnType<typeof createActivities>;
