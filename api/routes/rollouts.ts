/**
 * Rollouts as resources and their control (docs/decisions/rollout-control.md); the use cases are
 * services/rollouts.ts:
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
import { type FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { type Static, Type } from '@sinclair/typebox';
import { ApiError } from '../../domain/errors';
import type { RolloutMachine, WaveCounts } from '../../domain/rollout';
import { policyView } from '../../domain/rollout-policy';
import { DateTime, Nullable, problems, RoostId, SiteId } from '../../domain/schemas';
import {
  type RolloutControl,
  type RolloutListPosition,
  type RolloutOverview,
  controlRolloutAction,
  getRolloutDetail,
  listRolloutPage,
  rollbackRollout,
} from '../../services/rollouts';
import { pagingQuery, parsePaging } from '../pagination';
import { authorizeSite, roostRequirement } from '../plugins/auth';
import { PolicyRecord } from './deploy';

/** Page limits of the list and of the machines of one rollout. */
export const ROLLOUT_PAGE = { defaultSize: 20, maxSize: 100 };
export const ROLLOUT_MACHINE_PAGE = { defaultSize: 100, maxSize: 1000 };

const RolloutId = Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$', description: 'rollout id (rol_…)' });
const Params = Type.Object({ roostId: RoostId, rolloutId: RolloutId });
const RoostOnly = Type.Object({ roostId: RoostId });
const Stage = Type.Union([Type.Literal('canary'), Type.Literal('started'), Type.Literal('completed'), Type.Literal('failed')]);
const State = Type.Union(
  [
    Type.Literal('running'),
    Type.Literal('paused'),
    Type.Literal('awaiting_promotion'),
    Type.Literal('waiting_window'),
    Type.Literal('completed'),
    Type.Literal('failed'),
    Type.Literal('aborted'),
    Type.Literal('rolled_back'),
  ],
  { description: 'control state beside the stage (docs/decisions/rollout-control.md)' },
);

const ListQuery = Type.Object({ siteId: SiteId, stage: Type.Optional(Stage), ...pagingQuery(ROLLOUT_PAGE) });
const MachineStatus = Type.Union([
  Type.Literal('pending'),
  Type.Literal('dispatched'),
  Type.Literal('staged'),
  Type.Literal('activating'),
  Type.Literal('succeeded'),
  Type.Literal('failed'),
  Type.Literal('cancelled'),
]);
const DetailQuery = Type.Object({
  siteId: SiteId,
  status: Type.Optional(MachineStatus),
  wave: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9_-]{1,32}$', description: 'wave name (canary, fleet, wave-<i>, rollback)' })),
  ...pagingQuery(ROLLOUT_MACHINE_PAGE),
});
// siteId comes in the body or, for clients that send no body, in the query (both: they must agree). The document
// states the body form (`x-roost-required`) and leaves the query alias out (`x-roost-alias`, api/openapi.ts).
const ControlQuery = Type.Object({ siteId: Type.Optional({ ...SiteId, 'x-roost-alias': true }) });
const ControlBody = Type.Object(
  {
    siteId: Type.Optional(SiteId),
    reason: Type.Optional(Type.String({ maxLength: 500, description: 'free text kept in the rollout history' })),
  },
  {
    additionalProperties: false,
    'x-roost-required': ['siteId'],
    description: 'siteId is required here unless it is sent as the query parameter ?siteId= (a body-less POST); both must agree',
  },
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

/** The wire summary of a rollout. */
function summary({ rollout: r, counts, workflowUrl }: RolloutOverview): RolloutSummary {
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
    workflowUrl,
  };
}

/** The wire record of one machine of a rollout (`versionId`: its own target, else the rollout's). */
function machineRecord(m: RolloutMachine, rolloutVersionId: string): Static<typeof MachineRecord> {
  return {
    machineId: m.machineId,
    wave: m.wave,
    status: m.status,
    attempts: m.attempts,
    lastError: m.lastError,
    bytesFetched: m.bytesFetched,
    commandId: m.commandId,
    previousVersionId: m.previousVersionId,
    versionId: m.targetVersionId ?? rolloutVersionId,
    dispatchedAt: iso(m.dispatchedAt),
    stagedAt: iso(m.stagedAt),
    finishedAt: iso(m.finishedAt),
    deadlineAt: iso(m.deadlineAt),
    updatedAt: m.updatedAt.toISOString(),
  };
}

/** siteId of a mutation: body or query, which must agree. @throws 400 validation_failed. */
function mutationSiteId(fromBody: string | undefined, fromQuery: string | undefined): string {
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

/** A position of the rollout list this server issued. */
function isListPosition(p: unknown): p is RolloutListPosition {
  return (
    typeof p === 'object' &&
    p !== null &&
    typeof (p as RolloutListPosition).t === 'string' &&
    typeof (p as RolloutListPosition).id === 'string'
  );
}

const CONTROL: { action: RolloutControl; summary: string }[] = [
  { action: 'pause', summary: 'Pause a rollout: no new dispatch, no next wave; dispatched machines finish' },
  { action: 'resume', summary: 'Resume a paused rollout' },
  { action: 'promote', summary: 'Pass the manual promotion gate a rollout waits at' },
  { action: 'abort', summary: 'Abort a rollout: pending machines and their pending commands are cancelled' },
];

/** The rollout routes. */
const rolloutRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
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
      const paging = parsePaging(request, { ...ROLLOUT_PAGE, accept: isListPosition });
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      const page = await listRolloutPage(app.deps, {
        siteId: q.siteId,
        roostId,
        limit: paging.pageSize,
        after: paging.after,
        stage: q.stage,
      });
      return { rollouts: page.rollouts.map(summary), ...paging.tokens(page.next) };
    },
  );

  app.get(
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
      const paging = parsePaging(request, {
        ...ROLLOUT_MACHINE_PAGE,
        accept: (p): p is string => typeof p === 'string' && p.length <= 128,
      });
      await authorizeSite(request, q.siteId, roostRequirement(q.siteId, roostId, 'read'));
      const d = await getRolloutDetail(app.deps, {
        siteId: q.siteId,
        roostId,
        rolloutId,
        limit: paging.pageSize,
        after: paging.after,
        status: q.status,
        wave: q.wave,
      });
      const r = d.rollout;
      return {
        ...summary(d),
        policy: policyView(r.policy),
        waves: r.waves.map((w, index) => ({ index, name: w.name, size: w.size, counts: fullCounts(d.countsByWave.get(w.name)) })),
        history: r.history,
        machines: d.machines.map((m) => machineRecord(m, r.versionId)),
        ...paging.tokens(d.nextMachine),
      };
    },
  );

  for (const c of CONTROL) {
    app.post(
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
        // The body is optional: a POST without one has no body at all.
        const body = request.body as Static<typeof ControlBody> | undefined;
        const siteId = mutationSiteId(body?.siteId, request.query.siteId);
        const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'deploy'));
        const reason = body?.reason;
        const o = await controlRolloutAction(app.deps, {
          siteId,
          roostId,
          rolloutId,
          action: c.action,
          by: user.userId,
          reason,
          log: request.log,
          // Required on this route: the same key (same user, rollout, action) is the same Temporal update.
          idempotencyKey: String(request.headers['idempotency-key']),
        });
        return summary(o);
      },
    );
  }

  app.post(
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
      const body = request.body as Static<typeof ControlBody> | undefined;
      const siteId = mutationSiteId(body?.siteId, request.query.siteId);
      // Rolling a rollout back is the roost `rollback` permission, like POST /api/roosts/{roostId}/rollback.
      const user = await authorizeSite(request, siteId, roostRequirement(siteId, roostId, 'rollback'));
      const rb = await rollbackRollout(app.deps, { siteId, roostId, rolloutId, by: user.userId, log: request.log });
      reply.header('X-Roost-Workflow-Url', rb.runUrl);
      return reply.code(202).send(summary(rb));
    },
  );
};

export default rolloutRoutes;
