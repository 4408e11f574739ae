/**
 * The agent protocol (docs/agent-protocol.md; DESIGN.md "Agent protocol"):
 *
 *   POST /api/sites/{siteId}/enrolment-secret            create/rotate the site's enrolment secret (site admin)
 *   POST /api/agent/enrol                                machine enrols with the secret → sat_ token
 *   POST /api/agent/heartbeat                            liveness + metrics/processes/info snapshot
 *   GET  /api/agent/commands?wait=0..30                  pending commands, long-polled
 *   POST /api/agent/commands/{commandId}                 intermediate or terminal command status
 *   PUT  /api/agent/commands/{commandId}/screenshot      PNG of a capture_screenshot command
 *   GET  /api/agent/roosts/{roostId}/versions/{versionId} signed read URL of the version body, its signature and key id
 *   PUT  /api/agent/roosts/{roostId}/state               roost target-state report
 *
 * Every /api/agent/* route but enrol takes `Authorization: Bearer sat_…`, which binds the request to one
 * site and one machine (api/plugins/auth.ts). Secrets and tokens are stored as SHA-256 digests only.
 *
 * Long-poll: waiting requests register in a per-process `CommandWaiters` registry; one loop checks the
 * database every ~250 ms for all waiting machines of a site with a single query, so a thousand waiting
 * agents cost four queries a second, not four thousand.
 */
import type { FastifyInstance, FastifyBaseLogger } from 'fastify';
import type { Pool } from 'pg';
import { Type } from '@sinclair/typebox';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError } from '../../domain/errors';
import { hexEqual, randomToken, sha256Hex } from '../../domain/hex';
import { authorizeSite, requireAgent } from '../plugins/auth';
import {
  TARGET_STATUSES,
  claimCommands,
  enrolMachine,
  expirePendingCommands,
  getCommand,
  machinesWithDeliverable,
  recordHeartbeat,
  reportCommand,
  roostAndVersionExist,
  roostVersionForAgent,
  setCommandArtifact,
  setSiteEnrolmentSecretHash,
  siteEnrolmentSecretHash,
  upsertTargetState,
} from '../../db/machines';
import { CommandState, SyncCountersProps, commandView } from './machines';
import { DateTime, MachineId, Problem, RoostId, SiteId } from '../../domain/schemas';
import { ensureVersionSignatures, listSigningKeys, sealKeyOf } from '../../services/signing';
import { SigningKeyJwk } from './signing-keys';

/** Longest long-poll (seconds); larger `wait` values are capped. */
export const MAX_WAIT_SECONDS = 30;
/** Interval of the shared long-poll check. */
export const POLL_INTERVAL_MS = 250;
/** Largest screenshot PNG accepted. */
export const MAX_SCREENSHOT_BYTES = 10 * 1024 * 1024;
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

export const ENROLMENT_SECRET_RE = /^ses_[A-Za-z0-9_-]{43}$/;

/** Blob name of a command's screenshot in the screenshots container. */
export function screenshotBlobName(siteId: string, machineId: string, commandId: string): string {
  return `sites/${siteId}/machines/${machineId}/screenshots/${commandId}.png`;
}

interface Waiter {
  resolve: (signalled: boolean) => void;
  timer: NodeJS.Timeout;
}

/**
 * Per-process registry of long-polling agents. `wait()` resolves true when the machine has a
 * deliverable command (checked every `intervalMs` for all waiters of a site with one query), false at
 * the deadline or when cancelled/closed.
 */
export class CommandWaiters {
  private readonly bySite = new Map<string, Map<string, Set<Waiter>>>();
  private loop: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    private readonly db: Pool,
    private readonly log: FastifyBaseLogger,
    private readonly intervalMs = POLL_INTERVAL_MS,
  ) {}

  /** Waits until `deadline` (epoch ms) for a deliverable command. `cancel()` resolves false at once. */
  wait(siteId: string, machineId: string, deadline: number): { promise: Promise<boolean>; cancel: () => void } {
    let waiter!: Waiter;
    const promise = new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => this.finish(siteId, machineId, waiter, false), Math.max(0, deadline - Date.now()));
      waiter = { resolve, timer };
    });
    if (this.closed) {
      this.finish(siteId, machineId, waiter, false);
      return { promise, cancel: () => undefined };
    }
    let machines = this.bySite.get(siteId);
    if (!machines) this.bySite.set(siteId, (machines = new Map()));
    let set = machines.get(machineId);
    if (!set) machines.set(machineId, (set = new Set()));
    set.add(waiter);
    this.schedule();
    return { promise, cancel: () => this.finish(siteId, machineId, waiter, false) };
  }

  /** Number of requests currently waiting (for tests and metrics). */
  get size(): number {
    let n = 0;
    for (const machines of this.bySite.values()) for (const set of machines.values()) n += set.size;
    return n;
  }

  /** Releases every waiter (false) and stops the loop. */
  close(): void {
    this.closed = true;
    if (this.loop) clearTimeout(this.loop);
    this.loop = undefined;
    for (const [siteId, machines] of this.bySite) {
      for (const [machineId, set] of machines) for (const w of [...set]) this.finish(siteId, machineId, w, false);
    }
  }

  private finish(siteId: string, machineId: string, w: Waiter, signalled: boolean): void {
    clearTimeout(w.timer);
    const machines = this.bySite.get(siteId);
    const set = machines?.get(machineId);
    if (set) {
      set.delete(w);
      if (set.size === 0) machines!.delete(machineId);
      if (machines!.size === 0) this.bySite.delete(siteId);
    }
    w.resolve(signalled);
  }

  private schedule(): void {
    if (this.loop || this.closed || this.bySite.size === 0) return;
    this.loop = setTimeout(() => {
      this.tick()
        .catch((err) => this.log.warn({ err }, 'long-poll check failed'))
        .finally(() => {
          this.loop = undefined;
          this.schedule();
        });
    }, this.intervalMs);
    this.loop.unref();
  }

  private async tick(): Promise<void> {
    for (const [siteId, machines] of [...this.bySite]) {
      const ids = [...machines.keys()];
      for (let i = 0; i < ids.length; i += 5000) {
        const ready = await machinesWithDeliverable(this.db, siteId, ids.slice(i, i + 5000));
        for (const machineId of ready) {
          const set = this.bySite.get(siteId)?.get(machineId);
          if (set) for (const w of [...set]) this.finish(siteId, machineId, w, true);
        }
      }
    }
  }
}

const Timestamp = DateTime;
const AnyMap = Type.Record(Type.String(), Type.Unknown());
const Hex64 = Type.String({ pattern: '^[0-9a-f]{64}$', description: 'lowercase SHA-256 hex' });
const Counter = Type.Integer({ minimum: 0, maximum: 2147483647 });
const agentErrors = { 400: Problem, 401: Problem, 404: Problem };

const EnrolBody = Type.Object(
  {
    siteId: SiteId,
    enrolmentSecret: Type.String({ minLength: 1, maxLength: 256 }),
    machineId: MachineId,
    hostname: Type.String({ minLength: 1, maxLength: 255 }),
    agentVersion: Type.String({ minLength: 1, maxLength: 64 }),
    timezone: Type.Optional(Type.String({ maxLength: 128 })),
    timezoneIana: Type.Optional(Type.String({ maxLength: 64 })),
    capabilities: Type.Optional(AnyMap),
  },
  { additionalProperties: false },
);

const HeartbeatBody = Type.Object(
  {
    agentVersion: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
    hostname: Type.Optional(Type.String({ minLength: 1, maxLength: 255 })),
    timezone: Type.Optional(Type.String({ maxLength: 128 })),
    timezoneIana: Type.Optional(Type.String({ maxLength: 64 })),
    metrics: Type.Optional(AnyMap),
    processes: Type.Optional(Type.Array(Type.Unknown(), { maxItems: 5000 })),
    info: Type.Optional(AnyMap),
    capabilities: Type.Optional(AnyMap),
    cortexEnabled: Type.Optional(Type.Boolean()),
    rebooting: Type.Optional(Type.Boolean()),
    shuttingDown: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: true, description: 'unknown fields are ignored (newer agents)' },
);

const CommandReportBody = Type.Object(
  {
    status: Type.String({
      pattern: '^[a-z][a-z_]{0,31}$',
      description:
        'completed, failed or cancelled close the command; any other lowercase word but pending (e.g. downloading) keeps it open',
    }),
    progress: Type.Optional(Type.Number({ minimum: 0, maximum: 100, description: 'percent' })),
    result: Type.Optional(
      Type.Union([Type.Literal('success'), Type.Literal('cancelled'), Type.Literal('staged')], {
        description: "'staged': a sync_pull with activation 'staged' has its tree staged (completed, not yet active)",
      }),
    ),
    error: Type.Optional(Type.String({ maxLength: 65536 })),
  },
  { additionalProperties: false },
);

const TargetStateBody = Type.Object(
  {
    reportedVersionId: Hex64,
    status: Type.Union(TARGET_STATUSES.map((s) => Type.Literal(s))),
    error: Type.Optional(Type.Union([Type.String({ maxLength: 65536 }), Type.Null()])),
    chunks_fetched: Counter,
    chunks_total: Counter,
    chunks_dedup: Counter,
    files_total: Counter,
    files_assembled: Counter,
    files_skipped: Counter,
    bytes_fetched: Type.Optional(Type.Integer({ minimum: 0 })),
  },
  { additionalProperties: false },
);

const TargetStateView = Type.Object({
  siteId: Type.String(),
  machineId: Type.String(),
  roostId: Type.String(),
  reportedVersionId: Type.Union([Type.String(), Type.Null()]),
  status: Type.String(),
  error: Type.Union([Type.String(), Type.Null()]),
  ...SyncCountersProps,
  updatedAt: Timestamp,
});

const PendingCommand = Type.Object({
  commandId: Type.String(),
  type: Type.String(),
  params: AnyMap,
  createdAt: Timestamp,
  expiresAt: Type.Union([Timestamp, Type.Null()]),
});

export default async function agentRoutes(root: FastifyInstance): Promise<void> {
  const app = root.withTypeProvider<TypeBoxTypeProvider>();
  const stale = () => app.deps.cfg.ROOST_HEARTBEAT_STALE_SECONDS;
  const waiters = new CommandWaiters(app.deps.db, app.log);
  // preClose: release waiting long-polls first, so closing the server does not wait out their `wait`.
  app.addHook('preClose', async () => waiters.close());
  app.addHook('onClose', async () => waiters.close());
  app.addContentTypeParser('image/png', { parseAs: 'buffer', bodyLimit: MAX_SCREENSHOT_BYTES }, (_req, body, done) => done(null, body));

  app.post(
    '/api/sites/:siteId/enrolment-secret',
    {
      config: { idempotency: 'required' },
      schema: {
        tags: ['agent'],
        summary: "Create or rotate the site's agent enrolment secret (shown once)",
        params: Type.Object({ siteId: SiteId }),
        response: {
          201: Type.Object({ siteId: Type.String(), enrolmentSecret: Type.String() }),
          400: Problem,
          401: Problem,
          403: Problem,
          404: Problem,
        },
      },
    },
    async (request, reply) => {
      const { siteId } = request.params;
      await authorizeSite(request, siteId, [{ resource: 'site', id: siteId, permission: 'admin' }]);
      const enrolmentSecret = `ses_${randomToken()}`;
      if (!(await setSiteEnrolmentSecretHash(app.deps.db, siteId, sha256Hex(enrolmentSecret))))
        throw new ApiError('not_found', 'site not found');
      reply.code(201);
      return { siteId, enrolmentSecret };
    },
  );

  app.post(
    '/api/agent/enrol',
    {
      config: { auth: 'none' },
      schema: {
        tags: ['agent'],
        summary: 'Enrol a machine with the site enrolment secret; returns its agent token (re-enrolling rotates it)',
        body: EnrolBody,
        response: {
          201: Type.Object({
            siteId: Type.String(),
            machineId: Type.String(),
            agentToken: Type.String(),
            signingKeys: Type.Array(SigningKeyJwk, {
              description: "the site's public signing keys; the agent pins them (docs/agent-protocol.md)",
            }),
          }),
          400: Problem,
          401: Problem,
        },
      },
    },
    async (request, reply) => {
      const body = request.body;
      const stored = await siteEnrolmentSecretHash(app.deps.db, body.siteId);
      const digest = sha256Hex(body.enrolmentSecret);
      if (!stored || !ENROLMENT_SECRET_RE.test(body.enrolmentSecret) || !hexEqual(stored, digest)) {
        throw new ApiError('unauthorized', 'unknown site or wrong enrolment secret');
      }
      const agentToken = `sat_${randomToken()}`;
      await enrolMachine(
        app.deps.db,
        {
          siteId: body.siteId,
          machineId: body.machineId,
          hostname: body.hostname,
          agentVersion: body.agentVersion,
          timezone: body.timezone,
          timezoneIana: body.timezoneIana,
          capabilities: body.capabilities,
        },
        sha256Hex(agentToken),
        stale(),
      );
      const signingKeys = (await listSigningKeys(app.deps.db, sealKeyOf(app.deps.cfg), body.siteId)).map((k) => ({
        ...k.jwk,
        active: k.active,
        createdAt: k.createdAt.toISOString(),
      }));
      reply.code(201);
      return { siteId: body.siteId, machineId: body.machineId, agentToken, signingKeys };
    },
  );

  app.post(
    '/api/agent/heartbeat',
    {
      config: { auth: 'agent' },
      // A heartbeat without a body is a plain liveness ping.
      preValidation: async (request) => {
        request.body ??= {};
      },
      schema: {
        tags: ['agent'],
        summary: 'Heartbeat: online = true, lastHeartbeat = now, plus the snapshot fields sent',
        body: HeartbeatBody,
        response: { 200: Type.Object({ ok: Type.Literal(true), serverTime: Timestamp, pendingCommands: Type.Integer() }), ...agentErrors },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const r = await recordHeartbeat(app.deps.db, agent.siteId, agent.machineId, request.body, stale());
      if (!r) throw new ApiError('unauthorized', 'this machine is no longer enrolled');
      return { ok: true as const, serverTime: r.serverTime.toISOString(), pendingCommands: r.pendingCommands };
    },
  );

  app.get(
    '/api/agent/commands',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: `Pending commands of this machine, oldest first; long-polls up to wait seconds (cap ${MAX_WAIT_SECONDS})`,
        querystring: Type.Object({
          wait: Type.Optional(Type.Integer({ minimum: 0, default: 0, description: `seconds, capped at ${MAX_WAIT_SECONDS}` })),
        }),
        response: { 200: Type.Object({ commands: Type.Array(PendingCommand) }), ...agentErrors },
      },
    },
    async (request, reply) => {
      const agent = requireAgent(request);
      const db = app.deps.db;
      const waitMs = Math.min(request.query.wait ?? 0, MAX_WAIT_SECONDS) * 1000;
      const deadline = Date.now() + waitMs;
      await expirePendingCommands(db, agent.siteId, agent.machineId);
      let rows = await claimCommands(db, agent.siteId, agent.machineId);
      let gone = false;
      while (rows.length === 0 && !gone && Date.now() < deadline) {
        const w = waiters.wait(agent.siteId, agent.machineId, deadline);
        // The agent hung up (fleet stop, network): stop waiting so nothing is marked delivered to nobody.
        const onClose = () => {
          if (!reply.raw.writableFinished) {
            gone = true;
            w.cancel();
          }
        };
        reply.raw.once('close', onClose);
        const signalled = await w.promise;
        reply.raw.off('close', onClose);
        if (!signalled || gone) break;
        rows = await claimCommands(db, agent.siteId, agent.machineId);
      }
      return {
        commands: rows.map((r) => ({
          commandId: r.command_id,
          type: r.type,
          params: r.params ?? {},
          createdAt: r.created_at.toISOString(),
          expiresAt: r.expires_at ? r.expires_at.toISOString() : null,
        })),
      };
    },
  );

  app.post(
    '/api/agent/commands/:commandId',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary:
          'Report a command status: intermediate values keep it open, completed/failed/cancelled close it (reports on a closed command are no-ops)',
        params: Type.Object({ commandId: Type.String({ minLength: 1, maxLength: 64 }) }),
        body: CommandReportBody,
        response: { 200: Type.Composite([CommandState, Type.Object({ applied: Type.Boolean() })]), ...agentErrors },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const body = request.body;
      if (body.status === 'pending') {
        throw new ApiError('validation_failed', 'status pending cannot be reported', {
          extras: { param: 'status', errors: { status: ['must not be pending'] } },
        });
      }
      const r = await reportCommand(app.deps.db, agent.siteId, agent.machineId, request.params.commandId, body);
      if (!r) throw new ApiError('not_found', 'command not found');
      return { ...(await commandView(r.row)), applied: r.changed };
    },
  );

  app.put(
    '/api/agent/commands/:commandId/screenshot',
    {
      config: { auth: 'agent' },
      bodyLimit: MAX_SCREENSHOT_BYTES,
      schema: {
        tags: ['agent'],
        summary: 'Upload the PNG of an open capture_screenshot command (Content-Type: image/png)',
        params: Type.Object({ commandId: Type.String({ minLength: 1, maxLength: 64 }) }),
        response: { 200: Type.Object({ commandId: Type.String(), bytes: Type.Integer() }), ...agentErrors, 409: Problem, 413: Problem },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const { commandId } = request.params;
      const png = request.body as unknown;
      if (!Buffer.isBuffer(png) || png.length < PNG_SIGNATURE.length || !png.subarray(0, 8).equals(PNG_SIGNATURE)) {
        throw new ApiError('validation_failed', 'body must be a PNG image sent as Content-Type: image/png', { extras: { param: 'body' } });
      }
      const cmd = await getCommand(app.deps.db, agent.siteId, agent.machineId, commandId);
      if (!cmd || cmd.type !== 'capture_screenshot') throw new ApiError('not_found', 'capture_screenshot command not found');
      if (cmd.completed_at) throw new ApiError('conflict', 'the command is closed; upload before reporting completed');
      const blobName = screenshotBlobName(agent.siteId, agent.machineId, commandId);
      await app.deps.blob.put('screenshots', blobName, png, 'image/png');
      await setCommandArtifact(app.deps.db, agent.siteId, agent.machineId, commandId, blobName);
      return { commandId, bytes: png.length };
    },
  );

  app.get(
    '/api/agent/roosts/:roostId/versions/:versionId',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: 'Signed read URL (15 min) of a version body of a roost of this site',
        params: Type.Object({ roostId: RoostId, versionId: Hex64 }),
        response: {
          200: Type.Object({
            roostId: Type.String(),
            versionId: Type.String(),
            versionNumber: Type.Integer(),
            versionUrl: Type.String(),
            expiresAt: Timestamp,
            extractPath: Type.String(),
            signature: Type.String({ description: 'Ed25519 signature (base64url) of roost-version-v1:<siteId>:<roostId>:<versionId>' }),
            signingKeyId: Type.String({ description: 'kid of the site key that made it' }),
          }),
          ...agentErrors,
        },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const { roostId, versionId } = request.params;
      const row = await roostVersionForAgent(app.deps.db, agent.siteId, roostId, versionId);
      if (!row) {
        const exists = await roostAndVersionExist(app.deps.db, agent.siteId, roostId, versionId);
        if (!exists.roost) throw new ApiError('not_found', 'roost not found');
        throw new ApiError('version_not_found', 'version not found in this roost');
      }
      // Versions published before signing existed are signed on first read.
      const [sig] = await ensureVersionSignatures(app.deps.db, sealKeyOf(app.deps.cfg), agent.siteId, [
        { roost_id: roostId, version_id: versionId, signature: row.signature, signing_key_id: row.signing_key_id },
      ]);
      const signed = await app.deps.blob.readUrl('versions', row.blob_name);
      return {
        roostId,
        versionId,
        versionNumber: row.version_number,
        versionUrl: signed.url,
        expiresAt: new Date(signed.expiresAt).toISOString(),
        extractPath: row.extract_path,
        signature: sig.signature!,
        signingKeyId: sig.signing_key_id!,
      };
    },
  );

  app.put(
    '/api/agent/roosts/:roostId/state',
    {
      config: { auth: 'agent' },
      schema: {
        tags: ['agent'],
        summary: "Report this machine's target state for a roost",
        params: Type.Object({ roostId: RoostId }),
        body: TargetStateBody,
        response: { 200: TargetStateView, ...agentErrors },
      },
    },
    async (request) => {
      const agent = requireAgent(request);
      const { roostId } = request.params;
      const body = request.body;
      const exists = await roostAndVersionExist(app.deps.db, agent.siteId, roostId, body.reportedVersionId);
      if (!exists.roost) throw new ApiError('not_found', 'roost not found');
      if (!exists.version)
        throw new ApiError('version_not_found', 'reportedVersionId is not a version of this roost', {
          extras: { param: 'reportedVersionId' },
        });
      const s = await upsertTargetState(app.deps.db, agent.siteId, agent.machineId, roostId, body);
      return {
        siteId: s.site_id,
        machineId: s.machine_id,
        roostId: s.roost_id,
        reportedVersionId: s.reported_version_id,
        status: s.status,
        error: s.error,
        chunks_fetched: s.chunks_fetched,
        chunks_total: s.chunks_total,
        chunks_dedup: s.chunks_dedup,
        files_total: s.files_total,
        files_assembled: s.files_assembled,
        files_skipped: s.files_skipped,
        bytes_fetched: s.bytes_fetched,
        updatedAt: s.updated_at.toISOString(),
      };
    },
  );
}
