/**
 * The reference agent's calls to the Roost API (docs/agent-protocol.md), over agent/http.ts: enrolment and
 * re-enrolment (a 401 means the token was rotated or revoked: enrol again once and repeat the call),
 * retries of transient failures with jittered backoff, the saved credentials (`<rootDir>/state/agent.json`:
 * token and pinned signing keys), and one method per agent route.
 */
import type { InstallerDownload } from './self-update';
import type { Dispatcher } from 'undici';
import fs from 'node:fs/promises';
import os from 'node:os';
import type { SyncCounters, TargetStatus } from '../domain/target-state';
import { ApiClient, HttpError, type RequestOptions, isTransient, requestCounters, sleep } from './http';
import { type MachineRoot, writeAtomic } from './machine-root';
import type { KeyRing } from './trust';

/** The agentVersion the reference agent reports unless told otherwise. */
export const AGENT_VERSION = '0.1.0-reference';

/** Longest pause between two retries of one call (ms). */
export const RETRY_BACKOFF_CAP_MS = 5000;
/** Longest Retry-After the agent honours (ms); a longer one is cut to this. */
export const MAX_RETRY_AFTER_MS = 60_000;
/**
 * How long a sync keeps retrying one of its calls (version answer, download URLs, signing keys) before the
 * sync fails (ms): 15 minutes, longer than the outages of the database, the API or blob storage the
 * rollout loop is to survive (docs/decisions/outages.md).
 */
export const SYNC_RETRY_WINDOW_MS = 15 * 60 * 1000;

/** Who the agent is and how it enrols. */
export interface AgentIdentity {
  baseUrl: string;
  siteId: string;
  enrolmentSecret: string;
  machineId: string;
  hostname?: string;
  agentVersion?: string;
  timezone?: string;
  timezoneIana?: string;
  capabilities?: Record<string, unknown>;
  /** Keep the agent token in `<rootDir>/state/agent.json` and reuse it on restart (default true). */
  persistToken?: boolean;
  /**
   * Connection pools (undici Dispatchers; default Node's global one): `api` for every API call but the
   * long-poll, `poll` for the long-poll, which holds its connection for up to `wait` seconds. The fleet
   * simulator shares a bounded `api` pool among its agents and gives the polls a pool of their own, so a
   * process never holds more than one poll connection per agent plus the bounded pool.
   */
  dispatchers?: { api?: Dispatcher; poll?: Dispatcher };
}

/** A command as the agent receives it (`GET /api/agent/commands`). */
export interface AgentCommand {
  commandId: string;
  type: string;
  params: Record<string, unknown>;
  createdAt: string;
  expiresAt: string | null;
  /** W3C trace context the command was queued in, when the server traces: sent back on this command's requests. */
  traceparent?: string;
  /** Id of the API request the command was queued for (`X-Request-Id`): the agent's log lines about it carry it. */
  requestId?: string;
  /** A sync_pull's inline sync (polls with `inline=sync`; docs/agent-protocol.md "Inline sync"). */
  sync?: InlineSync;
  /**
   * Least gap between two progress reports the server asked for in the poll answer that carried this
   * command (ms; `progressIntervalMs`, larger while many of the site's commands are in flight).
   */
  progressIntervalMs?: number;
}

/**
 * What the long-poll answer carries for a sync_pull when asked with `inline=sync`: the version answer,
 * and for a small version its body and the signed URLs of its chunks.
 */
export interface InlineSync {
  version: VersionInfo & { versionId?: string; expiresAt?: string };
  body?: unknown;
  chunkUrls?: DownloadUrls;
}

/** A target state sent with a command report (one request for both). */
export interface TargetStateReport extends SyncCounters {
  roostId: string;
  reportedVersionId: string;
  status: TargetStatus;
  error?: string;
}

/** A command report (`POST /api/agent/commands/{commandId}`); `progress` in percent. */
export interface CommandReport {
  status: string;
  progress?: number;
  result?: string;
  error?: string;
  /** Stored with the report in one transaction (as `PUT /api/agent/roosts/{roostId}/state` would). */
  targetState?: TargetStateReport;
}

/** The sync answer of a version (`GET /api/agent/roosts/{roostId}/versions/{versionId}`), as far as the agent reads it. */
export interface VersionInfo {
  versionUrl: string;
  extractPath: string;
  signature?: string;
  signingKeyId?: string;
}

/** Signed download URLs of a batch of chunks (`POST /api/chunks/download-urls`). */
export interface DownloadUrls {
  urls: Record<string, string>;
  /** ISO time the URLs stop working. */
  expiresAt: string;
  missing?: string[];
}

/** The agent's API channel: one credential, retried and re-enrolled as the protocol asks. */
export class AgentTransport {
  /** The HTTP client (its `token` is the agent token once enrolled). */
  readonly client: ApiClient;
  private enrolling: Promise<void> | undefined;

  /**
   * @param stopSignal the agent's current stop signal (a restarted agent has a new one): retries end and
   *        no re-enrolment starts once it aborts
   * @param random jitter source of the retry backoff
   * @param retryBaseMs first retry pause before jitter (ms; doubles per attempt up to RETRY_BACKOFF_CAP_MS)
   */
  constructor(
    private readonly id: AgentIdentity,
    private readonly root: MachineRoot,
    private readonly keys: KeyRing,
    private readonly stopSignal: () => AbortSignal,
    private readonly random: () => number,
    private readonly retryBaseMs = 100,
  ) {
    this.client = new ApiClient(id.baseUrl, undefined, id.dispatchers?.api);
  }

  /** Agent token (after enrolment or loadState). */
  get token(): string | undefined {
    return this.client.token;
  }

  /**
   * Runs `fn`, retrying transient failures (network, 408, 429, 5xx, idempotency_key_in_use) with jittered
   * backoff (`retryBaseMs` doubling, at most RETRY_BACKOFF_CAP_MS) and never sooner than a 503's Retry-After:
   * up to `tries` attempts (a number), or for `{ forMs }` since the first attempt, or `'untilStopped'`: until
   * it lands or the agent stops (what a report needs: it is never dropped). Throws the last error, or at
   * once a non-transient one.
   */
  async retrying<T>(fn: () => Promise<T>, tries: number | { forMs: number } | 'untilStopped' = 5): Promise<T> {
    const started = Date.now();
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        const signal = this.stopSignal();
        if (!isTransient(err) || signal.aborted) throw err;
        const backoff = Math.min(RETRY_BACKOFF_CAP_MS, this.retryBaseMs * 2 ** Math.min(attempt, 16)) * (0.5 + this.random() / 2);
        // A 503 (the API's database, blob storage or Temporal is down) says when to come back; a 429's
        // Retry-After is the rate limit's, which the agent's own backoff already spreads.
        const after =
          err instanceof HttpError && err.status === 503 && err.retryAfterMs !== undefined
            ? Math.min(err.retryAfterMs, MAX_RETRY_AFTER_MS)
            : 0;
        const delay = Math.max(backoff, after);
        if (typeof tries === 'number' ? attempt >= tries : tries !== 'untilStopped' && Date.now() + delay - started > tries.forMs)
          throw err;
        await sleep(delay, signal);
        if (signal.aborted) throw err;
      }
    }
  }

  /**
   * Calls the API; a 401 (token rotated or revoked) re-enrols once and retries when the agent has an
   * enrolment secret. @throws HttpError, network errors.
   */
  async call<T = unknown>(method: string, p: string, opts: RequestOptions = {}): Promise<T> {
    try {
      return await this.client.json<T>(method, p, opts);
    } catch (err) {
      // Without an enrolment secret (an installed agent keeps only its token) a refused token is final.
      if (err instanceof HttpError && err.status === 401 && this.id.enrolmentSecret && !this.stopSignal().aborted) {
        await this.enrol();
        return this.client.json<T>(method, p, opts);
      }
      throw err;
    }
  }

  /**
   * Like `call`, retrying transient failures (network, 429, 5xx) with backoff as `retrying` does; by default
   * for SYNC_RETRY_WINDOW_MS, so a sync outlives an outage of the API or its dependencies of several minutes.
   */
  callRetrying<T = unknown>(
    method: string,
    p: string,
    opts: RequestOptions = {},
    tries: number | { forMs: number } | 'untilStopped' = { forMs: SYNC_RETRY_WINDOW_MS },
  ): Promise<T> {
    return this.retrying(() => this.call<T>(method, p, opts), tries);
  }

  /**
   * POST /api/agent/enrol: a new token (any previous one stops working); pins the site keys and saves
   * both. Concurrent calls share one enrolment. @throws HttpError when refused (401: wrong secret).
   */
  async enrol(): Promise<void> {
    if (this.enrolling) return this.enrolling;
    this.enrolling = (async () => {
      const res = await this.client.json<{ agentToken: string; signingKeys?: unknown[] }>('POST', '/api/agent/enrol', {
        body: {
          siteId: this.id.siteId,
          enrolmentSecret: this.id.enrolmentSecret,
          machineId: this.id.machineId,
          hostname: this.id.hostname ?? this.id.machineId,
          agentVersion: this.id.agentVersion ?? AGENT_VERSION,
          ...(this.id.timezone ? { timezone: this.id.timezone } : {}),
          timezoneIana: this.id.timezoneIana ?? 'UTC',
          capabilities: this.id.capabilities ?? { sync_pull: true, screenshot: true, simulated: true },
        },
      });
      this.client.token = res.agentToken;
      this.keys.pin(res.signingKeys);
      await this.saveState();
    })();
    try {
      await this.enrolling;
    } finally {
      this.enrolling = undefined;
    }
  }

  /** Loads a saved token (and its pinned keys) of this site and machine, if there is one. */
  async loadState(): Promise<void> {
    try {
      const saved = JSON.parse(await fs.readFile(this.root.agentStatePath, 'utf8'));
      if (saved.siteId === this.id.siteId && saved.machineId === this.id.machineId && typeof saved.agentToken === 'string') {
        this.client.token = saved.agentToken;
        this.keys.pin(saved.signingKeys);
      }
    } catch {
      /* no saved token */
    }
  }

  /** Saves token and pinned keys to `<rootDir>/state/agent.json` (unless `persistToken` is false). */
  async saveState(): Promise<void> {
    if (this.id.persistToken === false || !this.client.token) return;
    await fs.mkdir(this.root.stateDir, { recursive: true });
    await writeAtomic(
      this.root.agentStatePath,
      JSON.stringify({ siteId: this.id.siteId, machineId: this.id.machineId, agentToken: this.client.token, signingKeys: this.keys.keys }),
    );
  }

  /**
   * POST /api/agent/heartbeat with a small snapshot (no retry); `extra` fields (the managed processes, the
   * rebooting / shuttingDown flags) are sent beside it.
   */
  heartbeat(
    signal?: AbortSignal,
    extra: Record<string, unknown> = {},
  ): Promise<{ pendingCommands: number; processConfigStamp?: string; agentUpdate?: { version: string; sha256: string } | null }> {
    return this.call('POST', '/api/agent/heartbeat', {
      signal,
      body: {
        agentVersion: this.id.agentVersion ?? AGENT_VERSION,
        hostname: this.id.hostname ?? this.id.machineId,
        metrics: {
          schemaVersion: 2,
          timestamp: new Date().toISOString(),
          // availableParallelism, not cpus().length: cpus() reads /proc/cpuinfo on each call, 3% of the
          // simulated fleet's CPU at 10,000 machines (docs/benchmarks.md "The long-poll check").
          cpus: { count: os.availableParallelism(), load1: os.loadavg()[0] },
          memory: { totalBytes: os.totalmem(), freeBytes: os.freemem() },
        },
        info: { os: 'simulated', platform: process.platform, agent: 'reference' },
        processes: [],
        ...extra,
      },
    });
  }

  /** GET /api/agent/installer/{version}: an agent installer's checksum and signed download URL (self-update). */
  installerDownload(version: string): Promise<InstallerDownload> {
    return this.call('GET', `/api/agent/installer/${encodeURIComponent(version)}`);
  }

  /**
   * GET /api/agent/commands?wait=… (long-poll, `wait` in seconds; no retry); `inline`: ask for each
   * sync_pull's inline sync (`inline=sync`).
   */
  async pollCommands(wait: number, signal: AbortSignal, inline = false): Promise<{ commands: AgentCommand[] }> {
    const res = await this.call<{ commands: AgentCommand[]; progressIntervalMs?: number }>('GET', '/api/agent/commands', {
      query: inline ? { wait, inline: 'sync' } : { wait },
      signal,
      dispatcher: this.id.dispatchers?.poll,
      longPoll: true,
    });
    if (res.commands?.length > 0) requestCounters.delivering++;
    const ask = res.progressIntervalMs;
    // Servers before the progress budget send no progressIntervalMs.
    if (typeof ask === 'number' && Number.isFinite(ask) && ask > 0) for (const c of res.commands ?? []) c.progressIntervalMs = ask;
    return res;
  }

  /**
   * Reports a command status; returns the server's view (`applied` false when it was already closed).
   * Retried until it lands or the agent stops: a report is never dropped for an outage.
   */
  reportCommand(commandId: string, body: CommandReport): Promise<{ status: string; applied: boolean }> {
    return this.callRetrying('POST', `/api/agent/commands/${encodeURIComponent(commandId)}`, { body }, 'untilStopped');
  }

  /** PUT /api/agent/commands/{commandId}/screenshot with a PNG. */
  async uploadScreenshot(commandId: string, png: Buffer): Promise<void> {
    await this.callRetrying('PUT', `/api/agent/commands/${encodeURIComponent(commandId)}/screenshot`, {
      raw: png,
      contentType: 'image/png',
    });
  }

  /**
   * PUT /api/agent/roosts/{roostId}/state: the machine's target state of a roost, with the sync's counters.
   * Retried until it lands or the agent stops, like `reportCommand`.
   */
  async reportState(roostId: string, versionId: string, status: TargetStatus, counters: SyncCounters, error?: string): Promise<void> {
    await this.callRetrying(
      'PUT',
      `/api/agent/roosts/${encodeURIComponent(roostId)}/state`,
      { body: { reportedVersionId: versionId, status, ...counters, ...(error ? { error } : {}) } },
      'untilStopped',
    );
  }

  /** GET /api/agent/roosts/{roostId}/versions/{versionId}: the signed body URL and signature of a version. */
  versionInfo(roostId: string, versionId: string): Promise<VersionInfo> {
    return this.callRetrying('GET', `/api/agent/roosts/${encodeURIComponent(roostId)}/versions/${versionId}`);
  }

  /** GET /api/agent/signing-keys and pins any new valid key (saved with the token when there is one). */
  async refreshSigningKeys(): Promise<void> {
    const res = await this.callRetrying<{ keys: unknown[] }>('GET', '/api/agent/signing-keys');
    if (this.keys.pin(res.keys) > 0) await this.saveState();
  }

  /** Signed download URLs of a batch (≤1000 hashes) of this site's chunks, in one call. */
  downloadUrls(hashes: string[]): Promise<DownloadUrls> {
    return this.callRetrying('POST', '/api/chunks/download-urls', { body: { siteId: this.id.siteId, hashes } });
  }
}
