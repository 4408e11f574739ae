/**
 * The agent as an installed service (README "Enrol a real machine"; docs/decisions/agent-service.md):
 *
 * - `enrolService`: enrols a machine root once with the site's enrolment secret and keeps the agent
 *   token, the pinned site signing keys (agent/transport.ts `state/agent.json`) and who it is
 *   (agent/state.ts `state/service.json`) in an owner-only state folder. The secret itself is not kept.
 * - `runService`: runs that agent in the foreground until stopped: heartbeats, long-polled commands,
 *   roost syncs and reports (agent/agent.ts), commands journaled so a killed process resumes them
 *   (agent/journal.ts), reconnecting with jittered backoff (1 s doubling to 60 s) while the API cannot be
 *   reached, structured logs (pino: JSON lines by default, human with `pretty`), `state/status.json`
 *   kept current for `roost agent status`. A stop request (SIGTERM, SIGINT — which is what a Windows
 *   service wrapper sends on the service stop control — or SIGBREAK) stops taking commands, lets the
 *   running ones finish for `stopGraceMs`, then abandons what is left between two files (it stays
 *   journaled and runs again at the next start).
 *
 * Exit codes of `runService`: 0 after a requested stop; EXIT_TOKEN_REFUSED (78, EX_CONFIG) when the API
 * refuses the token (revoked, or the machine was enrolled again elsewhere): restarting cannot help, so
 * the systemd unit and the Windows service do not restart on it.
 */
import os from 'node:os';
import pino, { type Logger } from 'pino';
import pinoPretty from 'pino-pretty';
import { Agent, type AgentCommand, type CommandOutcome } from './agent';
import { errMessage } from './errors';
import { commandLogFields, HttpError, sleep } from './http';
import { REDACTED_FIELDS, redactSecrets } from '../domain/redaction';
import { isMachineId, MACHINE_ID_RULE } from '../domain/schemas';
import { FileJournal } from './journal';
import {
  prepareStateFolder,
  readIdentity,
  readable,
  restrictStateFolder,
  type ServiceIdentity,
  type ServiceStatus,
  servicePaths,
  writeIdentity,
  writeStatus,
} from './state';

/** Exit code when the API refuses the agent's token for good (EX_CONFIG): enrol again. */
export const EXIT_TOKEN_REFUSED = 78;
/** Exit code after a self-update swapped the executable: the service wrapper restarts into the new one. */
export const EXIT_SELF_UPDATED = 75;

/** What the installed agent tells the API it can do. */
export const SERVICE_CAPABILITIES: Record<string, unknown> = { sync_pull: true, roost_activate: true, screenshot: true };

/**
 * Why `machineId` cannot be enrolled (domain/schemas.ts MACHINE_ID_RE, the rule the API applies), or null.
 * `roost agent enrol --machine-id` and `enrolService` refuse such an id without asking the API.
 */
export function machineIdProblem(machineId: string): string | null {
  return isMachineId(machineId) ? null : `machine id ${JSON.stringify(machineId)} is not valid: ${MACHINE_ID_RULE}`;
}

/** Input of `enrolService`. */
export interface EnrolInput {
  api: string;
  siteId: string;
  /** The site's enrolment secret (`ses_…`); used once, not stored. */
  secret: string;
  machineId: string;
  rootDir: string;
  hostname?: string;
  agentVersion: string;
}

/**
 * Enrols `machineId` (POST /api/agent/enrol) and saves token, pinned keys and identity owner-only.
 * Enrolling again (same or another site) replaces them; the previous token stops working.
 * @throws Error for a machine id outside the rule (machineIdProblem), before any request or file is made;
 *         HttpError 401 for a wrong secret or unknown site; network errors
 */
export async function enrolService(input: EnrolInput): Promise<{ identity: ServiceIdentity; pinnedKeys: string[] }> {
  const idProblem = machineIdProblem(input.machineId);
  if (idProblem) throw new Error(idProblem);
  await prepareStateFolder(input.rootDir);
  const api = input.api.replace(/\/+$/, '');
  const hostname = input.hostname ?? os.hostname();
  const agent = new Agent({
    baseUrl: api,
    siteId: input.siteId,
    enrolmentSecret: input.secret,
    machineId: input.machineId,
    hostname,
    agentVersion: input.agentVersion,
    timezoneIana: Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC',
    capabilities: SERVICE_CAPABILITIES,
    rootDir: input.rootDir,
  });
  await agent.enrol();
  const identity: ServiceIdentity = {
    api,
    siteId: input.siteId,
    machineId: input.machineId,
    hostname,
    enrolledAt: new Date().toISOString(),
    agentVersion: input.agentVersion,
  };
  await writeIdentity(input.rootDir, identity);
  await restrictStateFolder(servicePaths(input.rootDir).root.stateDir);
  return { identity, pinnedKeys: agent.pinnedKeys.map((k) => k.kid) };
}

/** Options of `runService`. */
export interface RunOptions {
  rootDir: string;
  agentVersion: string;
  /**
   * The executable to replace when the catalog offers a newer agent (agent/self-update.ts): the packaged
   * binary's own path. Unset (running from the repository with Node): no self-update.
   */
  selfUpdateExe?: string;
  /** Human log lines instead of JSON. */
  pretty?: boolean;
  /** Log level (default info). */
  logLevel?: string;
  /** Where logs go (default stdout). */
  logStream?: NodeJS.WritableStream;
  heartbeatMs?: number;
  pollWaitSeconds?: number;
  /** Chunk downloads in flight (default 8). */
  downloadConcurrency?: number;
  /** How long running commands may finish after a stop request (ms, default 20000). */
  stopGraceMs?: number;
  /** Resolves the run when aborted (tests, embedding); signals are handled too unless `handleSignals` is false. */
  stop?: AbortSignal;
  handleSignals?: boolean;
}

/**
 * Builds the service logger: JSON lines (pino) or pino-pretty's human lines. A line logged while a command
 * is worked on carries the command's `requestId` and `traceId` (agent/http.ts commandLogFields); secrets are
 * redacted from every line before it is written (domain/redaction.ts), as in the API's and worker's logs.
 */
export function serviceLogger(opts: Pick<RunOptions, 'pretty' | 'logLevel' | 'logStream'>, base: Record<string, unknown>): Logger {
  const level = opts.logLevel ?? 'info';
  const out = opts.logStream ?? process.stdout;
  const stream = opts.pretty
    ? pinoPretty({ destination: out, colorize: (out as { isTTY?: boolean }).isTTY === true, sync: true, translateTime: 'SYS:standard' })
    : out;
  return pino(
    {
      level,
      base: { service: 'roost-agent', ...base },
      timestamp: pino.stdTimeFunctions.isoTime,
      mixin: commandLogFields,
      redact: { paths: [...REDACTED_FIELDS], censor: '[redacted]' },
    },
    { write: (line: string) => stream.write(redactSecrets(line)) },
  );
}

/** Log fields of a failure: its message and, for an API answer, that request's `X-Request-Id` as `callRequestId`. */
function errFields(err: unknown): Record<string, unknown> {
  return { err: errMessage(err), ...(err instanceof HttpError && err.requestId ? { callRequestId: err.requestId } : {}) };
}

/** The next reconnect delay (ms) after `attempt` failed starts: 1 s doubling to 60 s, times 0.5..1. */
export function reconnectDelayMs(attempt: number, random: () => number = Math.random): number {
  return Math.min(60_000, 1000 * 2 ** attempt) * (0.5 + 0.5 * random());
}

function commandFields(cmd: AgentCommand): Record<string, unknown> {
  const p = cmd.params ?? {};
  return {
    commandId: cmd.commandId,
    type: cmd.type,
    ...(typeof p.roostId === 'string' ? { roostId: p.roostId } : {}),
    ...(typeof p.versionId === 'string' ? { versionId: p.versionId } : {}),
  };
}

/**
 * Runs the enrolled agent of `rootDir` until a stop request; resolves with the process exit code.
 * @throws Error when the root was never enrolled (no identity or token)
 */
export async function runService(opts: RunOptions): Promise<number> {
  const rootDir = opts.rootDir;
  const identity = await readIdentity(rootDir);
  const { root } = servicePaths(rootDir);
  if (!identity || !(await readable(root.agentStatePath)))
    throw new Error(
      `${root.dir} is not enrolled: run roost agent enrol --api URL --site SITE --secret ses_… --machine-id ID --root ${root.dir}`,
    );
  const log = serviceLogger(opts, { machineId: identity.machineId, siteId: identity.siteId });
  const status: ServiceStatus = {
    pid: process.pid,
    agentVersion: opts.agentVersion,
    startedAt: new Date().toISOString(),
    lastHeartbeatAt: null,
    pendingCommands: null,
    connected: false,
    lastError: null,
    lastErrorAt: null,
    stoppedAt: null,
  };
  const save = () => writeStatus(rootDir, status);
  await restrictStateFolder(root.stateDir);
  await save();

  const journal = new FileJournal(root.stateDir);
  const agent = new Agent({
    baseUrl: identity.api,
    siteId: identity.siteId,
    // No secret: the token is the credential; a refused token is final (EXIT_TOKEN_REFUSED).
    enrolmentSecret: '',
    machineId: identity.machineId,
    hostname: identity.hostname,
    agentVersion: opts.agentVersion,
    timezoneIana: Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC',
    capabilities: SERVICE_CAPABILITIES,
    rootDir,
    heartbeatMs: opts.heartbeatMs ?? 30_000,
    pollWaitSeconds: opts.pollWaitSeconds ?? 25,
    downloadConcurrency: opts.downloadConcurrency ?? 8,
    journal,
    selfUpdate: opts.selfUpdateExe
      ? { exePath: opts.selfUpdateExe, restart: (version) => requestStop(`self-updated to ${version}`, EXIT_SELF_UPDATED) }
      : undefined,
  });

  // One stop request ends the run: a signal, the caller's abort, or a refused token.
  const stopping = new AbortController();
  let exitCode = 0;
  const requestStop = (reason: string, code = 0) => {
    if (stopping.signal.aborted) return;
    exitCode = code;
    log.info({ reason }, 'stop requested');
    stopping.abort();
  };
  const onSignal = (sig: NodeJS.Signals) => requestStop(sig);
  const signals: NodeJS.Signals[] = ['SIGTERM', 'SIGINT', ...(process.platform === 'win32' ? (['SIGBREAK'] as NodeJS.Signals[]) : [])];
  if (opts.handleSignals !== false) for (const s of signals) process.on(s, onSignal);
  opts.stop?.addEventListener('abort', () => requestStop('stop'), { once: true });

  const tokenRefused = (err: unknown) => err instanceof HttpError && (err.status === 401 || err.status === 403);
  const noteError = (message: string, err: unknown) => {
    status.connected = false;
    status.lastError = message;
    status.lastErrorAt = new Date().toISOString();
    void save();
    if (tokenRefused(err)) {
      log.error(errFields(err), 'the API refused the agent token: enrol this machine again (roost agent enrol)');
      requestStop('token refused', EXIT_TOKEN_REFUSED);
    }
  };
  agent.on('warn', (message: string, err?: unknown) => {
    log.warn(err !== undefined ? errFields(err) : {}, message);
    if (err !== undefined) noteError(message, err);
  });
  agent.on('heartbeat', (res: { pendingCommands: number }) => {
    // The recovery is in the log as the failure was (docs/decisions/agent-service.md): one line when the API answers again.
    if (!status.connected && status.lastErrorAt !== null)
      log.info({ lastError: status.lastError, lastErrorAt: status.lastErrorAt }, 'API reachable again');
    status.connected = true;
    status.lastHeartbeatAt = new Date().toISOString();
    status.pendingCommands = res.pendingCommands;
    log.debug({ pendingCommands: res.pendingCommands }, 'heartbeat');
    void save();
  });
  agent.on('started', (cmd: AgentCommand) => log.info(commandFields(cmd), 'command started'));
  agent.on('command', (o: CommandOutcome) => {
    const fields = { commandId: o.commandId, type: o.type, status: o.status, result: o.result, error: o.error, counters: o.counters };
    if (o.status === 'failed') log.warn(fields, 'command failed');
    else log.info(fields, o.status === 'abandoned' ? 'command abandoned (runs again at the next start)' : 'command finished');
  });

  const resumable = await journal.pending();
  log.info(
    { api: identity.api, root: root.dir, agentVersion: opts.agentVersion, resuming: resumable.map(commandFields) },
    'agent starting',
  );

  // Start (prove the token with a heartbeat), retrying with backoff while the API is unreachable.
  for (let attempt = 0; !stopping.signal.aborted; attempt++) {
    try {
      await agent.start();
      status.connected = true;
      void save();
      log.info('agent running');
      break;
    } catch (err) {
      await agent.stop();
      noteError(`start failed: ${errMessage(err)}`, err);
      if (stopping.signal.aborted) break;
      const delay = reconnectDelayMs(attempt);
      log.warn({ ...errFields(err), retryInMs: Math.round(delay) }, 'API unreachable; retrying');
      await sleep(delay, stopping.signal);
    }
  }

  if (!stopping.signal.aborted)
    await new Promise<void>((resolve) => stopping.signal.addEventListener('abort', () => resolve(), { once: true }));
  const grace = opts.stopGraceMs ?? 20_000;
  log.info({ running: agent.busy, graceMs: grace }, 'stopping: no new commands; letting running ones finish');
  const finished = await agent.drain(grace);
  if (opts.handleSignals !== false) for (const s of signals) process.off(s, onSignal);
  status.connected = false;
  status.stoppedAt = new Date().toISOString();
  await save();
  log.info({ finished, exitCode }, finished ? 'agent stopped' : 'agent stopped; unfinished work abandoned and journaled');
  log.flush();
  return exitCode;
}
