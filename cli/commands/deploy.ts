/**
 * `roost deploy <roostId> [versionRef]`: queue a canary-then-fleet rollout of a version (docs/contract.md POST
 * /api/roosts/{roostId}/deploy; one Idempotency-Key per invocation) and print the rollout record.
 * The version ref takes any form (a positional, since `--version` belongs to the program); a non-id
 * ref is resolved to its concrete id first (the route takes a concrete versionId).
 * `--watch` then polls every machine of the rollout through
 * GET /api/sites/{siteId}/machines/{machineId}/deployments until each reports the version committed,
 * failed or cancelled (or the machine is unknown: `not_found`), or `--timeout` passes
 * (docs/decisions/cli-deploy-watch.md). Exit code 1 when a watched machine failed or the watch timed out.
 * `--policy <json|@file>` sends a rollout policy (docs/decisions/rollout-control.md); a value that is not a
 * JSON object, or a file that cannot be read, is a usage error (exit 2, code usage_error) before any request.
 *
 * `roost rollout <list|show|pause|resume|promote|abort|rollback> <roostId> [rolloutId]`: the rollout routes
 * (GET …/rollouts, GET …/rollouts/{id}, POST …/rollouts/{id}/{action} with an Idempotency-Key).
 */
import fs from 'node:fs';
import { type Command } from 'commander';
import pLimit from 'p-limit';
import { ClientError, type RoostClient, seg } from '../client';
import { type CommandContext, commandContext, idList, positiveInt, table, UsageError, withJson } from '../context';
import { createProgress } from '../progress';

/** Rollout record (docs/contract.md "Rollout"). */
export interface Rollout {
  rolloutId: string;
  versionId: string;
  siteId: string;
  roostId: string;
  stage: string;
  canary: string[];
  fleet: string[];
  extractRoot: string;
  versionUrl: string;
  alreadyRunning?: boolean;
  dryRun?: boolean;
  [extra: string]: unknown;
}

/** What one machine reports for the rollout's roost (docs/contract.md "Roost target state"). */
export interface MachineProgress {
  machineId: string;
  wave: 'canary' | 'fleet';
  /** Reported status for this version; `waiting` until the machine reports the rollout's version. */
  status: string;
  reportedVersionId: string | null;
  error: string | null;
}

export interface WatchOutcome {
  outcome: 'committed' | 'failed' | 'timeout';
  machines: MachineProgress[];
}

const TERMINAL = new Set(['committed', 'failed', 'cancelled', 'not_found']);

/** One poll of a machine: its per-roost deployment row for `roostId`. */
async function pollMachine(
  client: RoostClient,
  siteId: string,
  roostId: string,
  versionId: string,
  machineId: string,
  wave: 'canary' | 'fleet',
): Promise<MachineProgress> {
  let res: { deployments?: Array<Record<string, unknown>> };
  try {
    res = await client.get(`/api/sites/${seg(siteId)}/machines/${seg(machineId)}/deployments`);
  } catch (err) {
    // A target id no machine ever enrolled under will never report: count it as finished, not committed.
    if (err instanceof ClientError && err.code === 'not_found')
      return { machineId, wave, status: 'not_found', reportedVersionId: null, error: 'machine not found' };
    throw err;
  }
  const row = (res.deployments ?? []).find((d) => d.roostId === roostId);
  const reported = typeof row?.reportedVersionId === 'string' ? row.reportedVersionId : null;
  const status = reported === versionId && typeof row?.status === 'string' ? row.status : 'waiting';
  const error = reported === versionId && typeof row?.error === 'string' ? row.error : null;
  return { machineId, wave, status, reportedVersionId: reported, error };
}

/**
 * Polls until every machine of the rollout is terminal for its version, or `timeoutMs` passes.
 * `onTick` sees each round's states. Polling uses at most 8 requests in flight.
 */
export async function watchRollout(
  client: RoostClient,
  rollout: Rollout,
  opts: { intervalMs: number; timeoutMs: number; onTick?: (machines: MachineProgress[]) => void },
): Promise<WatchOutcome> {
  const targets = [
    ...rollout.canary.map((m) => ({ m, wave: 'canary' as const })),
    ...rollout.fleet.map((m) => ({ m, wave: 'fleet' as const })),
  ];
  const deadline = Date.now() + opts.timeoutMs;
  const limit = pLimit(8);
  for (;;) {
    const machines = await Promise.all(
      targets.map((t) => limit(() => pollMachine(client, rollout.siteId, rollout.roostId, rollout.versionId, t.m, t.wave))),
    );
    opts.onTick?.(machines);
    if (machines.every((m) => TERMINAL.has(m.status))) {
      return { outcome: machines.every((m) => m.status === 'committed') ? 'committed' : 'failed', machines };
    }
    // A failed canary stops the rollout before the fleet wave: nothing more will move.
    const canary = machines.filter((m) => m.wave === 'canary');
    if (
      canary.length > 0 &&
      canary.every((m) => TERMINAL.has(m.status)) &&
      canary.some((m) => m.status !== 'committed') &&
      machines.filter((m) => m.wave === 'fleet').every((m) => m.status === 'waiting')
    ) {
      return { outcome: 'failed', machines };
    }
    if (Date.now() >= deadline) return { outcome: 'timeout', machines };
    await new Promise((r) => setTimeout(r, opts.intervalMs));
  }
}

async function resolveVersionId(ctx: CommandContext, siteId: string, roostId: string, ref: string): Promise<string> {
  if (/^[0-9a-f]{64}$/.test(ref)) return ref;
  const v = await ctx.client().get<{ versionId: string }>(`/api/roosts/${seg(roostId)}/versions/${seg(ref)}`, { siteId });
  return v.versionId;
}

export function registerDeploy(program: Command): void {
  registerRolloutControl(program);
  withJson(
    program
      .command('deploy')
      .description('roll a version of a roost out to its target machines (canary, then fleet)')
      .argument('<roostId>', 'roost id')
      .argument('[versionRef]', 'version to deploy: id, number (3, #3, v3) or alias (default: current)')
      .option('--machines <ids>', 'comma-separated machine ids (default: the roost targets)', idList)
      .option('--schedule-at <iso>', 'start time (ISO 8601)')
      .option('--dry-run', 'plan only; nothing is written (prints the delta plan)')
      .option('--policy <json>', 'rollout policy as JSON, or @file with the JSON (waves, thresholds, gates, window, activation)')
      .option('--watch', 'poll the machines until every one reports the version committed or failed')
      .option('--interval <seconds>', 'with --watch: seconds between polls', positiveInt('--interval'), 3)
      .option('--timeout <seconds>', 'with --watch: give up after this many seconds', positiveInt('--timeout'), 1800),
  ).action(
    async (
      roostId: string,
      versionRef: string | undefined,
      opts: {
        machines?: string[];
        scheduleAt?: string;
        dryRun?: boolean;
        policy?: string;
        watch?: boolean;
        interval: number;
        timeout: number;
      },
      cmd: Command,
    ) => {
      const ctx = commandContext(cmd);
      // A bad --policy is a usage error before any request (not even the version lookup) is made.
      const policy = opts.policy === undefined ? undefined : parsePolicyOption(opts.policy);
      const client = ctx.client();
      const siteId = ctx.siteId();
      const body: Record<string, unknown> = { siteId };
      if (versionRef !== undefined) body.versionId = await resolveVersionId(ctx, siteId, roostId, versionRef);
      if (opts.machines !== undefined) body.machines = opts.machines;
      if (opts.scheduleAt !== undefined) body.scheduleAt = opts.scheduleAt;
      if (opts.dryRun) body.dryRun = true;
      if (policy !== undefined) body.policy = policy;
      const rollout = await client.post<Rollout>(`/api/roosts/${seg(roostId)}/deploy`, body, { idempotencyKey: true });

      let watched: WatchOutcome | undefined;
      if (opts.watch && !rollout.dryRun) {
        const progress = createProgress(ctx);
        const total = rollout.canary.length + rollout.fleet.length;
        try {
          watched = await watchRollout(client, rollout, {
            intervalMs: opts.interval * 1000,
            timeoutMs: opts.timeout * 1000,
            onTick: (ms) => progress.update({ stage: 'machines', done: ms.filter((m) => TERMINAL.has(m.status)).length, total }),
          });
        } finally {
          progress.stop();
        }
        if (watched.outcome !== 'committed') {
          const notCommitted = watched.machines.filter((m) => m.status !== 'committed').length;
          process.stderr.write(
            `error: rollout_${watched.outcome}: ${notCommitted} of ${total} machine(s) did not commit version ${rollout.versionId}\n`,
          );
          process.exitCode = 1;
        }
      }

      ctx.emit(watched ? { rollout, watch: watched } : rollout, () => {
        const lines = [
          `${rollout.dryRun ? 'dry run: would roll out' : rollout.alreadyRunning ? 'already rolling out' : 'rolling out'} ${roostId} version ${rollout.versionId}`,
          `  rollout   ${rollout.rolloutId ?? '-'} (stage ${rollout.stage})`,
          `  canary    ${rollout.canary.join(', ') || '-'}`,
          `  fleet     ${rollout.fleet.join(', ') || '-'}`,
          `  extract   ${rollout.extractRoot}`,
        ];
        if (watched) {
          lines.push('', `outcome: ${watched.outcome}`);
          lines.push(
            table(
              ['MACHINE', 'WAVE', 'STATUS', 'ERROR'],
              watched.machines.map((m) => [m.machineId, m.wave, m.status, m.error]),
            ),
          );
        }
        process.stdout.write(lines.join('\n') + '\n');
      });
    },
  );
}

/**
 * `--policy` value: a JSON object, or `@path` of a file holding one. Checked before any request: the API
 * validates the policy's fields (400 validation_failed keyed by dotted path), the CLI only its form.
 * @throws UsageError (exit 2) on an unreadable file, invalid JSON, or JSON that is not an object
 */
export function parsePolicyOption(raw: string): Record<string, unknown> {
  let text = raw;
  if (raw.startsWith('@')) {
    const file = raw.slice(1);
    if (!file) throw new UsageError('--policy @file needs a file name after the @');
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      throw new UsageError(`--policy: cannot read ${file}: ${e.code ?? e.message}`);
    }
  }
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new UsageError(
      raw.startsWith('@') ? `--policy: ${raw.slice(1)} does not hold JSON` : '--policy must be JSON (or @file holding JSON)',
    );
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new UsageError('--policy must be a JSON object');
  return v as Record<string, unknown>;
}

const ROLLOUT_ACTIONS = ['list', 'show', 'pause', 'resume', 'promote', 'abort', 'rollback'] as const;

/** Registers `roost rollout <action> <roostId> [rolloutId]` (called by registerDeploy's caller through it). */
export function registerRolloutControl(program: Command): void {
  withJson(
    program
      .command('rollout')
      .description(`inspect or control rollouts: ${ROLLOUT_ACTIONS.join(', ')}`)
      .argument('<action>', ROLLOUT_ACTIONS.join(' | '))
      .argument('<roostId>', 'roost id')
      .argument('[rolloutId]', 'rollout id (all actions but list)')
      .option('--reason <text>', 'kept in the rollout history (control actions)')
      .option('--stage <stage>', 'list: only rollouts in this stage'),
  ).action(
    async (action: string, roostId: string, rolloutId: string | undefined, opts: { reason?: string; stage?: string }, cmd: Command) => {
      const ctx = commandContext(cmd);
      const client = ctx.client();
      const siteId = ctx.siteId();
      if (!(ROLLOUT_ACTIONS as readonly string[]).includes(action))
        throw new UsageError(`unknown action ${action}; use one of ${ROLLOUT_ACTIONS.join(', ')}`);
      if (action === 'list') {
        const res = await client.get<{ rollouts: Array<Record<string, unknown>> }>(`/api/roosts/${seg(roostId)}/rollouts`, {
          siteId,
          ...(opts.stage ? { stage: opts.stage } : {}),
        });
        ctx.emit(res, () =>
          process.stdout.write(
            table(
              ['ROLLOUT', 'VERSION', 'STAGE', 'STATE', 'OK', 'FAILED', 'CREATED'],
              res.rollouts.map((r) => [
                String(r.rolloutId),
                String(r.versionId).slice(0, 12),
                String(r.stage),
                String(r.state),
                Number(r.succeeded),
                Number(r.failed),
                String(r.createdAt),
              ]),
            ) + '\n',
          ),
        );
        return;
      }
      if (!rolloutId) throw new UsageError(`${action} needs a rollout id`);
      const base = `/api/roosts/${seg(roostId)}/rollouts/${seg(rolloutId)}`;
      const r =
        action === 'show'
          ? await client.get<Record<string, unknown>>(base, { siteId })
          : await client.post<Record<string, unknown>>(
              `${base}/${action}`,
              { siteId, ...(opts.reason ? { reason: opts.reason } : {}) },
              { idempotencyKey: true },
            );
      ctx.emit(r, () =>
        process.stdout.write(
          [
            `rollout ${String(r.rolloutId)} (${String(r.versionId).slice(0, 12)})`,
            `  stage ${String(r.stage)}, state ${String(r.state)}`,
            `  workflow ${String(r.workflowUrl)}`,
          ].join('\n') + '\n',
        ),
      );
    },
  );
}
