/**
 * The API process's pass over workflow starts lost to a killed API process (docs/decisions/outages.md "Lost
 * workflow starts"): a deploy or classic deployment create commits its rows, then starts the workflow; an API
 * killed in between (while Temporal was down, say) leaves a rollout `running` or a deployment `pending` with
 * nothing behind it. Every ROOST_LOST_START_PASS_SECONDS (first pass at start) each is settled the way the
 * request itself settles a failed start: the rollout fails with `workflow_start_failed`
 * (services/rollouts.ts failLostRolloutStarts), the deployment is deleted
 * (services/classic-deployments.ts dropLostDeploymentStarts). The same pass sends the abort a roost delete
 * could not send (a delete during a Temporal outage; services/rollouts.ts abortDeletedRoostRollouts). Several
 * API processes may run it: each step is idempotent. A pass Temporal cannot answer is logged and tried again at the next.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { AppDeps } from './context';
import { abortDeletedRoostRollouts, failLostRolloutStarts } from '../services/rollouts';
import { dropLostDeploymentStarts } from '../services/classic-deployments';

/** Starts the periodic pass (nothing when the interval is 0); `stop()` ends it. */
export function startLostStartPass(deps: AppDeps, log: FastifyBaseLogger): { stop(): void } {
  const everyMs = deps.cfg.ROOST_LOST_START_PASS_SECONDS * 1000;
  if (everyMs === 0) return { stop: () => undefined };
  let running = false;
  const pass = async () => {
    if (running) return;
    running = true;
    try {
      await failLostRolloutStarts(deps, { log });
      await dropLostDeploymentStarts(deps, { log });
      await abortDeletedRoostRollouts(deps, { log });
    } catch (err) {
      log.warn({ err }, 'lost workflow start pass failed; trying again at the next');
    } finally {
      running = false;
    }
  };
  void pass();
  const timer = setInterval(() => void pass(), everyMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
