/**
 * Every activity the worker serves, built by one factory over its dependencies (activities/deps.ts), typed
 * by `ReturnType`. Workflows import `Activities` by type only.
 *
 * Add an activity family by spreading its factory's result below; activity names must be unique across
 * families.
 */
import type { ActivityDeps } from './deps';
import { createRolloutActivities } from './rollout';
import { createSweepActivities } from './sweeps';
import { createEventActivities } from './events';
import { createWebhookActivities } from './webhooks';
import { createClassicDeploymentActivities } from './classic-deployment';
import { createUserActivities } from './users';
import { createConversationActivities } from './conversations';
import { createVerifyActivities } from './verify';
import { createInstallerActivities } from './installers';

/** All activities keyed by name. */
export function createActivities(deps: ActivityDeps) {
  return {
    ...createRolloutActivities(deps),
    ...createSweepActivities(deps),
    ...createEventActivities(deps),
    ...createWebhookActivities(deps),
    ...createClassicDeploymentActivities(deps),
    ...createUserActivities(deps),
    ...createConversationActivities(deps),
    ...createVerifyActivities(deps),
    ...createInstallerActivities(deps),
  };
}

/** Every activity by name: what workflows pass to `proxyActivities<Activities>` (type only). */
export type Activities = ReturnType<typeof createActivities>;
