/**
 * Activities of the classic deployment workflow (workflows/classic-deployment.ts;
 * docs/decisions/classic-deployments.md). All SQL is db/classic-deployments.ts's.
 *
 * Payloads carry ids and counts only. Every activity is idempotent: dispatch uses deterministic command ids
 * and only picks targets without a command, reconcile folds command statuses that are already stored, and
 * the control actions are guarded by target statuses. A deployment deleted meanwhile ends the workflow
 * (`gone`), it does not fail it.
 */
import { Context, log } from '@temporalio/activity';
import type { ActivityDeps } from './deps';
import { commandOrigin } from '../telemetry/tracing';
import {
  type ActionResult,
  cancelPendingTargets,
  dispatchTargets,
  getDeployment,
  queueUninstall,
  reconcileDeployment,
  requeueFailedTargets,
  targetTotal,
} from '../db/classic-deployments';
import {
  DEFAULT_INSTALL_TIMEOUT_SECONDS,
  type DeploymentStatus,
  TARGET_DEADLINE_MARGIN_MS,
  TERMINAL_DEPLOYMENT_STATUSES,
  type ClassicAction,
  type ClassicActionResult,
  type ClassicRef,
  type TargetCounts,
  emptyTargetCounts,
} from '../domain/classic';

export type { ClassicAction, ClassicActionResult, ClassicRef };

/** What the workflow needs to run (small, independent of the number of targets). */
export interface ClassicPlan {
  status: DeploymentStatus;
  parallel: boolean;
  /** start-to-close of one drive activity (ms): long enough for every target's deadline in turn. */
  driveTimeoutMs: number;
}

/** Where a deployment stands (counts per target status). */
export interface ClassicProgress {
  status: DeploymentStatus;
  counts: TargetCounts;
  open: number;
  /** True when the deployment was deleted meanwhile. */
  gone: boolean;
}

/** Builds the classic deployment activities over their dependencies (`createActivities` merges them). */
export function createClassicDeploymentActivities({ db, cfg }: ActivityDeps) {
  const goneProgress = (): ClassicProgress => ({ status: 'cancelled', counts: emptyTargetCounts(), open: 0, gone: true });

  return {
    /** Reads the deployment's mode and sizes the drive activity's timeout. */
    async loadClassicDeployment(ref: ClassicRef): Promise<ClassicPlan> {
      const d = await getDeployment(db, ref.siteId, ref.deploymentId);
      if (!d) return { status: 'cancelled', parallel: false, driveTimeoutMs: 60_000 };
      const perTarget = (d.timeout_seconds ?? DEFAULT_INSTALL_TIMEOUT_SECONDS) * 1000 + TARGET_DEADLINE_MARGIN_MS;
      // A serial deployment may need every target's deadline in turn; Temporal retries a timed-out drive anyway.
      const n = await targetTotal(db, ref.siteId, ref.deploymentId);
      const waves = d.parallel_install ? Math.ceil(n / cfg.ROOST_CLASSIC_PARALLELISM) : n;
      return {
        status: d.status,
        parallel: d.parallel_install,
        driveTimeoutMs: Math.min(7 * 86_400_000, Math.max(1, waves) * perTarget + 60_000),
      };
    },

    /**
     * Reconciles agent reports and dispatches targets until none is pending or in flight: serial
     * deployments keep one target in flight, parallel ones up to ROOST_CLASSIC_PARALLELISM. Polls every
     * ROOST_CLASSIC_POLL_MS and heartbeats the counts on every pass, so another worker resumes from the
     * database after a crash.
     */
    async driveClassicDeployment(ref: ClassicRef): Promise<ClassicProgress> {
      const ctx = Context.current();
      for (;;) {
        const d = await getDeployment(db, ref.siteId, ref.deploymentId);
        if (!d) return goneProgress();
        const r = await reconcileDeployment(db, ref.siteId, ref.deploymentId);
        if (!r) return goneProgress();
        ctx.heartbeat(r.counts);
        if (r.open === 0) return { status: r.status, counts: r.counts, open: 0, gone: false };
        const limit = d.parallel_install ? cfg.ROOST_CLASSIC_PARALLELISM : 1;
        if (r.undispatched > 0 && r.dispatchedOpen < limit) {
          const n = await dispatchTargets(db, d, limit - r.dispatchedOpen, undefined, commandOrigin());
          if (n > 0) log.info('classic targets dispatched', { deploymentId: ref.deploymentId, dispatched: n });
          if (n > 0) continue; // reconcile at once: the status moves to in_progress
        }
        await ctx.sleep(cfg.ROOST_CLASSIC_POLL_MS); // throws CancelledFailure on cancellation or worker shutdown
      }
    },

    /** One reconcile pass: the deployment's status and counts now. */
    async settleClassicDeployment(ref: ClassicRef): Promise<ClassicProgress> {
      const r = await reconcileDeployment(db, ref.siteId, ref.deploymentId);
      if (!r) return goneProgress();
      return { status: r.status, counts: r.counts, open: r.open, gone: false };
    },

    /**
     * Applies retry (failed targets requeued), cancel (pending targets cancelled) or uninstall (every
     * target requeued as an uninstall; only on a terminal deployment). Refused, with nothing changed, when
     * the deployment is gone, when there is nothing to retry or cancel, or when uninstall meets a deployment
     * in flight.
     */
    async applyClassicAction(input: ClassicRef & { action: ClassicAction; by: string }): Promise<ClassicActionResult> {
      const { siteId, deploymentId, action } = input;
      let r: ActionResult | null;
      if (action === 'retry') r = await requeueFailedTargets(db, siteId, deploymentId);
      else if (action === 'cancel') r = await cancelPendingTargets(db, siteId, deploymentId);
      else {
        const u = await queueUninstall(db, siteId, deploymentId, TERMINAL_DEPLOYMENT_STATUSES);
        if (u === 'in_flight')
          return { refused: 'the deployment is in flight; uninstall it once it has ended', code: 'deployment_in_flight' };
        r = u;
      }
      if (!r) return { refused: 'the deployment no longer exists' };
      if (r.affected === 0) {
        return { refused: action === 'retry' ? 'the deployment has no failed targets' : 'the deployment has no pending targets' };
      }
      return { ...r, action };
    },
  };
}

/** The classic deployment activities by name (workflows import them by type through `Activities`). */
export type ClassicDeploymentActivities = ReturnType<typeof createClassicDeploymentActivities>;
