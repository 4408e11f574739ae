/**
 * Stage-then-activate, server side (docs/agent-protocol.md "Staged sync and activation";
 * docs/decisions/stage-activate.md): queues `roost_activate` commands for machines of a rollout that
 * have staged a version (their `sync_pull` with `activation: 'staged'` completed with result `staged`).
 *
 * The rollout workflow (workflows/, through db/rollouts.ts) decides which machines to activate and when;
 * this module only writes the command rows, set-based (one statement per batch of `ACTIVATION_BATCH`
 * machines) and idempotent: command ids are derived from (rolloutId, machineId, versionId, attempt), so a
 * retried activity inserts nothing twice (`ON CONFLICT DO NOTHING`). Every statement names `site_id`.
 */
import { createHash } from 'node:crypto';
import type { Queryable } from './pool';

/** Machines per INSERT statement. */
export const ACTIVATION_BATCH = 500;
/** Default lifetime of a roost_activate command (ms): activation downloads nothing, so it is short. */
export const DEFAULT_ACTIVATION_TTL_MS = 10 * 60 * 1000;

/** What to activate: the rollout, its roost and version, and the extract root the version was staged for. */
export interface ActivationTarget {
  siteId: string;
  rolloutId: string;
  roostId: string;
  /** 64-hex version id that the machines staged. */
  versionId: string;
  /** The rollout's extract root (as in sync_pull params). */
  extractRoot: string;
  /** Who the commands are created by (the rollout's creator). */
  createdBy: string;
  /** Trace context and request id the commands carry (docs/observability.md), if any. */
  traceparent?: string;
  requestId?: string;
}

/**
 * Deterministic id of the roost_activate command of one machine in a rollout (`cmd_` + 24 hex), so the
 * workflow can find it again (commands.command_id) and a retried dispatch never queues it twice.
 * `attempt` (default 1) distinguishes a deliberate re-activation.
 */
export function activateCommandId(rolloutId: string, machineId: string, versionId: string, attempt = 1): string {
  return `cmd_${createHash('sha256').update(`roost_activate:${rolloutId}:${machineId}:${versionId}:${attempt}`).digest('hex').slice(0, 24)}`;
}

/**
 * Queues one `roost_activate` command (params `{ roostId, versionId, rolloutId, extractRoot }`,
 * commands.rollout_id = rolloutId, expires after `commandTtlMs`) for each of `machineIds`, in batches of
 * ACTIVATION_BATCH machines (one INSERT … SELECT FROM UNNEST each). Duplicate machine ids are ignored.
 * Idempotent: a command that already exists (same deterministic id) is left as it is.
 *
 * Does not check that the machines staged the version: the agent answers a command for a version it has
 * not staged with command status `failed`, error `not_staged`, and changes nothing.
 *
 * @param q a pool, or the caller's transaction (each batch is a single statement either way)
 * @returns `queued`: rows inserted by this call; `commandIds`: machineId → command id for every machine
 */
export async function dispatchActivation(
  q: Queryable,
  target: ActivationTarget,
  machineIds: string[],
  opts: { commandTtlMs?: number; attempt?: number } = {},
): Promise<{ queued: number; commandIds: Map<string, string> }> {
  const ttl = opts.commandTtlMs ?? DEFAULT_ACTIVATION_TTL_MS;
  const attempt = opts.attempt ?? 1;
  const unique = [...new Set(machineIds)];
  const commandIds = new Map(unique.map((m) => [m, activateCommandId(target.rolloutId, m, target.versionId, attempt)]));
  let queued = 0;
  for (let i = 0; i < unique.length; i += ACTIVATION_BATCH) {
    const batch = unique.slice(i, i + ACTIVATION_BATCH);
    const r = await q.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, rollout_id, created_by, expires_at,
                             traceparent, request_id)
       SELECT $1, u.machine_id, u.command_id, 'roost_activate', 'pending',
              jsonb_build_object('roostId', $2::text, 'versionId', $3::text, 'rolloutId', $4::text, 'extractRoot', $5::text),
              $4, $6, now() + $7::float8 * INTERVAL '1 millisecond', $10::text, $11::text
         FROM UNNEST($8::text[], $9::text[]) AS u (machine_id, command_id)
       ON CONFLICT (site_id, machine_id, command_id) DO NOTHING`,
      [
        target.siteId,
        target.roostId,
        target.versionId,
        target.rolloutId,
        target.extractRoot,
        target.createdBy,
        ttl,
        batch,
        batch.map((m) => commandIds.get(m)!),
        target.traceparent ?? null,
        target.requestId ?? null,
      ],
    );
    queued += r.rowCount ?? 0;
  }
  return { queued, commandIds };
}
