/**
 * Rollouts as resources and their control (issue #5; docs/decisions/rollout-control.md):
 *
 * - GET  /api/roosts/{roostId}/rollouts?siteId=…            newest first, paged (page_size default 20, max
 *   100, page_token; aliases limit, cursor), `stage` filter. Scope roost read.
 * - GET  /api/roosts/{roostId}/rollouts/{rolloutId}?siteId=… the rollout with its policy, waves (counts per
 *   wave), counts, history, workflow URL, and one page of its machines (ordered by machine id; page_size
 *   default 100, max 1000; `status` and `wave` filters). Scope roost read.
 * - POST /api/roosts/{roostId}/rollouts/{rolloutId}/{pause|resume|promote|abort}  Temporal updates on the
 *   running workflow; 200 with the rollout. Scope roost deploy; Idempotency-Key required.
 * - POST /api/roosts/{roostId}/rollouts/{rolloutId}/rollback  a failed or aborted rollout's switched
 *   machines go back to their previous versions as a new rollout (202 with it). Scope roost deploy;
 *   Idempotency-Key required.
 *
 * `siteId` comes in the query (reads) and in the body or the query (mutations; both must agree), like the
 * other roost routes. Errors: 400 validation_failed, 404 not_found (site hidden, rollout unknown or of
 * another roost), 409 conflict (terminal rollout, refused by the workflow, nothing to roll back),
 * 503 service_unavailable (workflow service unavailable).
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { type Static, Type } from '@sinclair/typebox';
import { ApiError } from '../../domain/errors';
import { policyView } from '../../domain/rollout-policy';
import {
  type Rollout,
  type RolloutListPosition,
  type RolloutStage,
  type WaveCounts,
  countsByRollout,
  countsByWave,
  createRollbackRollout,
  failUnstartedRollout,
  getRollout,
  listRolloutMachines,
  listRollouts,
} from '../../db/rollouts';
import { PagingQuery, pageTokens, parsePaging } from '../pagination';
import { authorizeSite, roostRequirement } from '../plugins/auth';
import { type RolloutControl, RolloutControlRefused, controlRollout, startRolloutWorkflow, workflowUiUrl } from '../temporal';
import { PolicyRecord } from './deploy';
import { DateTime, Nullable, problems, RoostId, SiteId } from '../../domain/schemas';

/** Page limits of the list and of the machines of one rollout. */
export const ROLLOUT_PAGE = { defaultSize: 20, maxSize: 100 };
export const ROLLOUT_MACHINE_PAGE = { defaultSize: 100, maxSize: 1000 };

const RolloutId = Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$', description: 'rollout id (rol_…)' });
const Params = Type.Object({ roostId: RoostId, rolloutId: RolloutId });
const RoostOnly = Type.Object({ roostId: RoostId });
const Stage = Type.Union([Type.Literal('canary'), Type.Literal('started'), Type.Literal('completed'), Type.Literal('failed')]);
const State = Type.Union(
  ['running', 'paused', 'awaiting_promotion', 'waiting_window', 'completed', 'failed', 'aborted', 'rolled_back'].map((s) =>
    Type.Literal(s),
  ),
  { description: 'control state beside the stage (docs/decisions/rollout-control.md)' },
);

const ListQuery = Type.Object({ siteId: SiteId, stage: Type.Optional(Stage), ...PagingQuery });
const MachineStatus = Type.Union(
  ['pending', 'dispatched', 'staged', 'activating', 'succeeded', 'failed', 'cancelled'].map((s) => Type.Literal(s)),
);
const DetailQuery = Type.Object({
  siteId: SiteId,
  status: Type.Optional(MachineStatus),
  wave: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9_-]{1,32}$', description: 'wave name (canary, fleet, wave-<i>, rollback)' })),
  ...PagingQuery,
});
const ControlQuery = Type.Object({ siteId: Type.Optional(SiteId) });
const ControlBody = Type.Object(
  {
    siteId: Type.Optional(SiteId),
    reason: Type.Optional(Type.String({ maxLength: 500, description: 'free text kept in the rollout history' })),
  },
  { additionalProperties: false },
);

const Counts = Type.Object({
  total: Type.Integer(),
  pending: Type.Integer(),
  dispatched: Type.Integer(),
  staged: Type.Integer(),
  activating: Type.Integer(),
  succeeded: Type.Integer(),
  failed: Type.Integer(),
  cancelled: Type.Integer(),
  timedOut: Type.Integer(),
});
const HistoryEntry = Type.Object(
  {
    seq: Type.Integer(),
    at: Type.String(),
    action: Type.String(),
    state: Type.Optional(Type.String()),
    by: Type.Optional(Type.String()),
    wave: Type.Optional(Type.Integer()),
    detail: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  },
  { additionalProperties: true },
);

/** A rollout as listed (no machine lists). */
const RolloutSummary = Type.Object({
  rolloutId: Type.String(),
  siteId: Type.String(),
  roostId: Type.String(),
  versionId: Type.String(),
  stage: Stage,
  state: State,
  active: Type.Boolean(),
  abortReason: Nullable(Type.String()),
  succeeded: Type.Integer(),
  failed: Type.Integer(),
  counts: Counts,
  waveCount: Type.Integer(),
  currentWave: Nullable(Type.Integer()),
  extractRoot: Type.String(),
  scheduleAt: Nullable(DateTime),
  rollbackOf: Nullable(Type.String()),
  rolledBackBy: Nullable(Type.String()),
  createdAt: DateTime,
  createdBy: Type.String(),
  updatedAt: DateTime,
  completedAt: Nullable(DateTime),
  workflowId: Type.String(),
  workflowUrl: Type.String(),
});
type RolloutSummary = Static<typeof RolloutSummary>;

const MachineRecord = Type.Object({
  machineId: Type.String(),
  wave: Type.String(),
  status: MachineStatus,
  attempts: Type.Integer(),
  lastError: Nullable(Type.String()),
  bytesFetched: Type.Number(),
  commandId: Nullable(Type.String()),
  previousVersionId: Nullable(Type.String()),
  versionId: Type.String(),
  dispatchedAt: Nullable(DateTime),
  stagedAt: Nullable(DateTime),
  finishedAt: Nullable(DateTime),
  deadlineAt: Nullable(DateTime),
  updatedAt: DateTime,
});

const RolloutDetail = Type.Intersect([
  RolloutSummary,
  Type.Object({
    policy: PolicyRecord,
    waves: Type.Array(Type.Object({ index: Type.Integer(), name: Type.String(), size: Type.Integer(), counts: Counts })),
    history: Type.Array(HistoryEntry),
    machines: Type.Array(MachineRecord),
    next_page_token: Type.String(),
    nextPageToken: Type.String(),
  }),
]);

const ListResponse = Type.Object({ rollouts: Type.Array(RolloutSummary), next_page_token: Type.String(), nextPageToken: Type.String() });

function fullCounts(c: WaveCounts | undefined): Static<typeof Counts> {
  return {
    total: c?.total ?? 0,
    pending: c?.pending ?? 0,
    dispatched: c?.dispatched ?? 0,
    staged: c?.staged ?? 0,
    activating: c?.activating ?? 0,
    succeeded: c?.succeeded ?? 0,
    failed: c?.failed ?? 0,
    cancelled: c?.cancelled ?? 0,
    timedOut: c?.timedOut ?? 0,
  };
}

const iso = (d: Date | null) => (d ? d.toISOString() : null);

/** The rollout routes. */
export default async function rolloutRoutes(app: FastifyInstance): Promise<void> {
  const { db, temporal, cfg } = app.deps;

  function summary(r: Rollout, counts: WaveCounts | undefined): RolloutSummary {
    return {
      rolloutId: r.rolloutId,
      siteId: r.siteId,
      roostId: r.roostId,
      versionId: r.versionId,
      stage: r.stage,
      state: r.state,
      active: r.active,
      abortReason: r.abortReason,
      succeeded: r.succeeded,
      failed: r.failed,
      counts: fullCounts(counts),
      waveCount: r.waves.filter((w) => w.size > 0).length,
      currentWave: r.currentWave,
      extractRoot: r.extractRoot,
      scheduleAt: iso(r.scheduleAt),
      rollbackOf: r.rollbackOf,
      rolledBackBy: r.rolledBackBy,
      createdAt: r.createdAt.toISOString(),
      createdBy: r.createdBy,
      updatedAt: r.updatedAt.toISOString(),
      completedAt: iso(r.completedAt),
      workflowId: r.workflowId,
      workflowUrl: workflowUiUrl(cfg, r.workflowId),
    };
  }

  /** The rollout of this site and roost. @throws 404 not_found. */
  async function requireRollout(siteId: string, roostId: string, rolloutId: string): Promise<Rollout> {
    const r = await getRollout(db, siteId, rolloutId);
    if (!r || r.roostId !== roostId) throw new ApiError('not_found', 'rollout not found', { extras: { param: 'rolloutId' } });
    return r;
  }

  async function summaryOf(r: Rollout): Promise<RolloutSummary> {
    return summary(r, (await countsByRollout(db, r.siteId, [r.rolloutId])).get(r.rolloutId));
  }

  /** siteId of a mutation: body or query, which must agree. @throws 400 validation_failed. */
  function mutationSiteId(
    request: FastifyRequest<{ Querystring: Static<typeof ControlQuery>; Body: Static<typeof ControlBody> | undefined }>,
  ): string {
    const fromBody = request.body?.siteId;
    const fromQuery = request.query.siteId;
    if (fromBody && fromQuery && fromBody !== fromQuery) {
      throw new ApiError('validation_failed', 'siteId in the body and in the query differ', {
        extras: { param: 'siteId', errors: { siteId: ['differs between body and query'] } },
      });
    }
    const siteId = fromBody ?? fromQuery;
    if (!siteId)
      throw new ApiError('validation_failed', 'siteId is required (body or query)', {
        extras: { param: 'siteId', errors: { siteId: ['is required'] } },
      });
    return siteId;
  }

  app.get<{ Params: Static<typeof RoostOnly>; Querystring: Static<typeof ListQuery> }>(
    '/api/roosts/:roostId/rollouts',
    {
      schema: {
        summary: "List a roost's rollouts, newest first",
        tags: ['versions'],
        params: RoostOnly,
        querystring: ListQuery,
        response: { 200: ListResponse, ...problems() },
      },
    },
    async (request) => {
      const { roostId } = request.params;
      const q = request.query;
      const paging = parsePaging<RolloutListPosition>(q, {
        ...ROLLOUT_PAGE,
        accept: (p) =>
          typeof p === 'object' &&
          p !== null &&
          typeof (p as RolloutListPosition).t === 'string' &&
          typeof (p as RolloutListPosition).id === 'string',
      });
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      const page = await listRollouts(db, q.siteId, roostId, {
        limit: paging.pageSize,
        after: paging.after,
        stage: q.stage as RolloutStage | undefined,
      });
      const counts = await countsByRollout(
        db,
        q.siteId,
        page.rows.map((r) => r.rolloutId),
      );
      const last = page.rows[page.rows.length - 1];
      return {
        rollouts: page.rows.map((r) => summary(r, counts.get(r.rolloutId))),
        ...pageTokens(page.more && last ? { t: last.createdAt.toISOString(), id: last.rolloutId } : undefined),
      };
    },
  );

  app.get<{ Params: Static<typeof Params>; Querystring: Static<typeof DetailQuery> }>(
    '/api/roosts/:roostId/rollouts/:rolloutId',
    {
      schema: {
        summary: 'Get a rollout: policy, waves, counts, history and a page of its machines',
        tags: ['versions'],
        params: Params,
        querystring: DetailQuery,
        response: { 200: RolloutDetail, ...problems() },
      },
    },
    async (request) => {
      const { roostId, rolloutId } = request.params;
      const q = request.query;
      const paging = parsePaging<string>(q, { ...ROLLOUT_MACHINE_PAGE, accept: (p) => typeof p === 'string' && p.length <= 128 });
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      const r = await requireRollout(q.siteId, roostId, rolloutId);
      const byWave = await countsByWave(db, q.siteId, rolloutId, null);
      let total: WaveCounts | undefined;
      for (const c of byWave.values()) {
        if (!total) total = { ...c };
        else for (const k of Object.keys(c) as (keyof WaveCounts)[]) (total[k] as number) = (total[k] ?? 0) + (c[k] ?? 0);
      }
      const page = await listRolloutMachines(db, q.siteId, rolloutId, {
        limit: paging.pageSize,
        after: paging.after,
        status: q.status,
        wave: q.wave,
      });
      const last = page.rows[page.rows.length - 1];
      return {
        ...summary(r, total),
        policy: policyView(r.policy),
        waves: r.waves.map((w, index) => ({ index, name: w.name, size: w.size, counts: fullCounts(byWave.get(w.name)) })),
        history: r.history,
        machines: page.rows.map((m) => ({
          machineId: m.machine_id,
          wave: m.wave,
          status: m.status as Static<typeof MachineStatus>,
          attempts: m.attempts,
          lastError: m.last_error,
          bytesFetched: Number(m.bytes_fetched),
          commandId: m.command_id,
          previousVersionId: m.previous_version_id,
          versionId: m.target_version_id ?? r.versionId,
          dispatchedAt: iso(m.dispatched_at),
          stagedAt: iso(m.staged_at),
          finishedAt: iso(m.finished_at),
          deadlineAt: iso(m.deadline_at),
          updatedAt: m.updated_at.toISOString(),
        })),
        ...pageTokens(page.more && last ? last.machine_id : undefined),
      };
    },
  );

  const CONTROL: { action: RolloutControl; summary: string }[] = [
    { action: 'pause', summary: 'Pause a rollout: no new dispatch, no next wave; dispatched machines finish' },
    { action: 'resume', summary: 'Resume a paused rollout' },
    { action: 'promote', summary: 'Pass the manual promotion gate a rollout waits at' },
    { action: 'abort', summary: 'Abort a rollout: pending machines and their pending commands are cancelled' },
  ];
  for (const c of CONTROL) {
    app.post<{ Params: Static<typeof Params>; Querystring: Static<typeof ControlQuery>; Body: Static<typeof ControlBody> | undefined }>(
      `/api/roosts/:roostId/rollouts/:rolloutId/${c.action}`,
      {
        config: { idempotency: 'required' },
        schema: {
          summary: c.summary,
          tags: ['versions'],
          params: Params,
          querystring: ControlQuery,
          body: ControlBody,
          response: { 200: RolloutSummary, ...problems(409, 422, 503) },
        },
      },
      async (request) => {
        const { roostId, rolloutId } = request.params;
        const siteId = mutationSiteId(request);
        const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'deploy'));
        const r = await requireRollout(siteId, roostId, rolloutId);
        if (!r.active)
          throw new ApiError('conflict', `the rollout has ended (stage ${r.stage}, state ${r.state}); ${c.action} is not possible`, {
            extras: { state: r.state, stage: r.stage },
          });
        try {
          await controlRollout(temporal, r.workflowId, r.rolloutId, c.action, {
            by: user.userId,
            ...(request.body?.reason ? { reason: request.body.reason } : {}),
          });
        } catch (err) {
          if (err instanceof RolloutControlRefused) {
            const now = await requireRollout(siteId, roostId, rolloutId);
            throw new ApiError('conflict', `${c.action} refused: ${err.message}`, { extras: { state: now.state, stage: now.stage } });
          }
          request.log.error({ err }, 'rollout control failed');
          throw new ApiError('service_unavailable', 'the workflow service is unavailable; retry later', {
            headers: { 'Retry-After': '5' },
          });
        }
        return summaryOf(await requireRollout(siteId, roostId, rolloutId));
      },
    );
  }

  app.post<{ Params: Static<typeof Params>; Querystring: Static<typeof ControlQuery>; Body: Static<typeof ControlBody> | undefined }>(
    '/api/roosts/:roostId/rollouts/:rolloutId/rollback',
    {
      config: { idempotency: 'required' },
      schema: {
        summary: 'Roll back a failed or aborted rollout: switched machines return to their previous versions in one wave',
        tags: ['versions'],
        params: Params,
        querystring: ControlQuery,
        body: ControlBody,
        response: { 202: RolloutSummary, ...problems(409, 422, 503) },
      },
    },
    async (request, reply) => {
      const { roostId, rolloutId } = request.params;
      const siteId = mutationSiteId(request);
      const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'deploy'));
      const r = await requireRollout(siteId, roostId, rolloutId);
      if (r.rolledBackBy)
        throw new ApiError('conflict', 'the rollout was already rolled back', { extras: { rollbackRolloutId: r.rolledBackBy } });
      const out = await createRollbackRollout(db, siteId, rolloutId, user.userId);
      if (typeof out === 'string') {
        const why: Record<string, string> = {
          not_found: 'rollout not found',
          not_terminal: 'the rollout is still running; abort it first',
          completed: 'the rollout completed; deploy the version you want instead',
          already_rolled_back: 'the rollout was already rolled back',
          is_rollback: 'a rollback rollout cannot be rolled back; deploy the version you want instead',
          nothing_to_roll_back: 'no machine of the rollout switched to its version from a previous one',
          version_busy: 'another rollout of the previous version is running',
        };
        if (out === 'not_found') throw new ApiError('not_found', why[out], { extras: { param: 'rolloutId' } });
        throw new ApiError('conflict', why[out], { extras: { reason: out } });
      }
      const rb = out.rollout;
      try {
        const started = await startRolloutWorkflow(temporal, cfg, {
          siteId,
          roostId,
          versionId: rb.versionId,
          rolloutId: rb.rolloutId,
          workflowId: rb.workflowId,
        });
        reply.header('X-Roost-Workflow-Url', started.url);
      } catch (err) {
        request.log.error({ err }, 'rollback workflow start failed');
        await failUnstartedRollout(db, siteId, rb.rolloutId, 'workflow_start_failed');
        throw new ApiError('service_unavailable', 'the rollback could not be started (workflow service unavailable); retry later', {
          headers: { 'Retry-After': '5' },
        });
      }
      return reply.code(202).send(await summaryOf(rb));
    },
  );
}
