/**
 * The search attributes of roost workflows (all Keyword), one definition for the workflow code that upserts
 * them (workflows/rollout.ts), the client side that starts workflows with them (workflows/client.ts) and
 * the launchers that register them on a Temporal namespace (`ROOST_SEARCH_ATTRIBUTES`).
 *
 * Deterministic-safe: only key definitions, no I/O.
 */
import { type SearchAttributePair, SearchAttributeType, defineSearchAttributeKey } from '@temporalio/common';

/** Site of a rollout workflow. */
export const RoostSiteId = defineSearchAttributeKey('RoostSiteId', SearchAttributeType.KEYWORD);
/** Roost of a rollout workflow. */
export const RoostRoostId = defineSearchAttributeKey('RoostRoostId', SearchAttributeType.KEYWORD);
/** Version a rollout workflow deploys. */
export const RoostVersionId = defineSearchAttributeKey('RoostVersionId', SearchAttributeType.KEYWORD);
/** A rollout's stage, or its control state while not running (paused, awaiting_promotion, aborted, rolled_back…). */
export const RoostStage = defineSearchAttributeKey('RoostStage', SearchAttributeType.KEYWORD);

/** Classic deployment of a `classicDeploymentWorkflow` (workflows/classic-deployment.ts). */
export const RoostDeploymentId = defineSearchAttributeKey('RoostDeploymentId', SearchAttributeType.KEYWORD);
/** A classic deployment's status (pending, in_progress, completed, failed, partial, cancelled, uninstalled). */
export const RoostDeploymentStatus = defineSearchAttributeKey('RoostDeploymentStatus', SearchAttributeType.KEYWORD);

/** The user a user-delete cascade works on (workflows/user-delete.ts). */
export const RoostUserId = defineSearchAttributeKey('RoostUserId', SearchAttributeType.KEYWORD);

/** The catalog version an installer finalise works on (workflows/installer-finalize.ts). */
export const RoostInstallerVersion = defineSearchAttributeKey('RoostInstallerVersion', SearchAttributeType.KEYWORD);

/** Every search attribute above: what a namespace must have registered (test servers take the keys). */
export const ROOST_SEARCH_ATTRIBUTE_KEYS = [
  RoostSiteId,
  RoostRoostId,
  RoostVersionId,
  RoostStage,
  RoostDeploymentId,
  RoostDeploymentStatus,
  RoostUserId,
  RoostInstallerVersion,
] as const;

/** Names of every search attribute above (each of type Keyword), for `temporal server start-dev --search-attribute <name>=Keyword`. */
export const ROOST_SEARCH_ATTRIBUTES: readonly string[] = ROOST_SEARCH_ATTRIBUTE_KEYS.map((k) => k.name);

/** The search attributes a rollout workflow starts with (by a client, or as the child of an automatic rollback). */
export function rolloutSearchAttributes(r: { siteId: string; roostId: string; versionId: string; stage: string }): SearchAttributePair[] {
  return [
    { key: RoostSiteId, value: r.siteId },
    { key: RoostRoostId, value: r.roostId },
    { key: RoostVersionId, value: r.versionId },
    { key: RoostStage, value: r.stage },
  ];
}

/** The search attributes a classic deployment workflow starts with. */
export function classicDeploymentSearchAttributes(r: { siteId: string; deploymentId: string; status: string }): SearchAttributePair[] {
  return [
    { key: RoostSiteId, value: r.siteId },
    { key: RoostDeploymentId, value: r.deploymentId },
    { key: RoostDeploymentStatus, value: r.status },
  ];
}
