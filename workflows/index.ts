/**
 * Every workflow the worker serves (the workflow bundle's entry point: worker/worker.ts bundles this
 * file). Find a workflow by its name here in one step.
 */
export { rolloutWorkflow } from './rollout';
export { heartbeatStalenessSweepWorkflow, chunkGcSweepWorkflow, chunkVerifySweepWorkflow, keyExpirySweepWorkflow } from './sweeps';
export { eventRelayWorkflow } from './events';
export { webhookDeliveryWorkflow } from './webhooks';
export { classicDeploymentWorkflow } from './classic-deployment';
export { userDeleteWorkflow } from './user-delete';
export { conversationPurgeSweepWorkflow } from './conversation-purge';
export { versionVerifyWorkflow } from './verify';
export { installerFinalizeWorkflow } from './installer-finalize';
