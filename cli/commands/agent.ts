/**
 * `roost agent …`: the agent on this machine (agent/service.ts; README "Enrol a real machine"):
 *
 *   agent enrol --api URL --site SITE --secret ses_… --machine-id ID [--root DIR] [--hostname H]
 *   agent run [--root DIR] [--pretty] [--log-level L] [--heartbeat-seconds s] [--stop-grace-seconds s]
 *   agent status [--root DIR] [--json]
 *   agent --version
 *
 * The root defaults to ROOST_AGENT_ROOT, else `%ProgramData%\Roost\agent` on Windows and
 * `/var/lib/roost-agent` elsewhere (the service definitions in deploy/ use the same). Everything the
 * agent writes is owner-only (umask 077 on POSIX; agent/state.ts restricts the state folder's ACL on
 * Windows). `run` exits 0 after SIGTERM/SIGINT/the service stop control, 78 when the API refuses the
 * token (enrol again), 2 when the root is not enrolled.
 */
import { isSea } from 'node:sea';
import path from 'node:path';
import { type Command, Option } from 'commander';
import { ClientError } from '../client';
import { commandContext, positiveInt, UsageError, withJson } from '../context';
import { CLI_VERSION } from '../version';
import { HttpError } from '../../agent/http';
import { enrolService, machineIdProblem, runService } from '../../agent/service';
import { readStatusReport } from '../../agent/state';

/** The default machine root of an installed agent on this platform. */
export function defaultAgentRoot(platform: NodeJS.Platform = process.platform, env: NodeJS.ProcessEnv = process.env): string {
  if (env.ROOST_AGENT_ROOT) return env.ROOST_AGENT_ROOT;
  if (platform === 'win32') return path.win32.join(env.ProgramData ?? 'C:\\ProgramData', 'Roost', 'agent');
  return '/var/lib/roost-agent';
}

/** The agent's files are owner-only from the first byte on (POSIX; Windows uses ACLs, agent/state.ts). */
function ownerOnly(): void {
  if (process.platform !== 'win32') process.umask(0o077);
}

/** An agent-side HTTP refusal as the CLI's ClientError, so it prints and exits like any other (4, 5…). */
function asClientError(err: unknown, url: string): unknown {
  if (!(err instanceof HttpError)) return err;
  const p = err.problem ?? {};
  return new ClientError({
    code: err.code ?? `http_${err.status}`,
    status: err.status,
    detail: typeof p.detail === 'string' ? p.detail : err.message,
    body: p,
    requestId: typeof p.requestId === 'string' ? p.requestId : undefined,
    method: 'POST',
    url,
    attempts: 1,
  });
}

const rootOption = () =>
  new Option('--root <dir>', 'machine root: state, chunk store and extracted roosts (default: ROOST_AGENT_ROOT or the platform folder)');

export function registerAgent(program: Command): void {
  const agent = program
    .command('agent')
    .description('the agent on this machine: enrol, run (as a service), status')
    .version(CLI_VERSION, '-V, --version', 'print the agent version');

  withJson(
    agent
      .command('enrol')
      .description("enrol this machine with the site's enrolment secret; keeps the token and pinned signing keys, owner-only")
      .requiredOption('--secret <ses_…>', 'the site enrolment secret (roost machines enrolment-secret); not stored')
      .requiredOption('--machine-id <id>', 'the machine id to enrol as (1..64 of [A-Za-z0-9._-], not only dots)', (raw: string) => {
        const problem = machineIdProblem(raw);
        if (problem) throw new UsageError(`--machine-id: ${problem}`);
        return raw;
      })
      .option('--hostname <name>', 'hostname to report (default: this host)')
      .addOption(rootOption()),
  ).action(async (opts: { secret: string; machineId: string; hostname?: string; root?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    ownerOnly();
    const rootDir = path.resolve(opts.root ?? defaultAgentRoot());
    const api = ctx.globals.api;
    let res;
    try {
      res = await enrolService({
        api,
        siteId: ctx.siteId(),
        secret: opts.secret,
        machineId: opts.machineId,
        rootDir,
        hostname: opts.hostname,
        agentVersion: CLI_VERSION,
      });
    } catch (err) {
      throw asClientError(err, `${api}/api/agent/enrol`);
    }
    ctx.emit({ ...res.identity, root: rootDir, pinnedKeys: res.pinnedKeys }, () =>
      process.stdout.write(
        `enrolled ${res.identity.machineId} in ${res.identity.siteId} at ${res.identity.api}; state in ${rootDir} (${res.pinnedKeys.length} signing key(s) pinned)\n` +
          `start it: roost agent run --root ${rootDir}\n`,
      ),
    );
  });

  agent
    .command('run')
    .description('run the enrolled agent in the foreground until SIGTERM/SIGINT (what the service definitions start)')
    .addOption(rootOption())
    .option('--pretty', 'human log lines instead of JSON')
    .addOption(new Option('--log-level <level>', 'log level').choices(['debug', 'info', 'warn', 'error']).default('info'))
    .option('--heartbeat-seconds <s>', 'seconds between heartbeats', positiveInt('--heartbeat-seconds'), 30)
    .option('--poll-wait-seconds <s>', 'long-poll wait for commands (max 30)', positiveInt('--poll-wait-seconds'), 25)
    .option('--download-concurrency <n>', 'chunk downloads in flight', positiveInt('--download-concurrency'), 8)
    .option(
      '--stop-grace-seconds <s>',
      'how long running work may finish after a stop request (0: abandon it at once; it runs again at the next start)',
      (raw: string) => {
        if (!/^[0-9]+$/.test(raw)) throw new UsageError(`--stop-grace-seconds must be a whole number of seconds, got "${raw}"`);
        return Number(raw);
      },
      20,
    )
    .option(
      '--self-update',
      'replace this executable with a newer catalog version when the API offers one, then exit 75 for the service wrapper to restart it (packaged executable only)',
    )
    .action(
      async (
        opts: {
          root?: string;
          pretty?: boolean;
          logLevel: string;
          heartbeatSeconds: number;
          pollWaitSeconds: number;
          downloadConcurrency: number;
          stopGraceSeconds: number;
          selfUpdate?: boolean;
        },
        cmd: Command,
      ) => {
        commandContext(cmd);
        ownerOnly();
        const rootDir = path.resolve(opts.root ?? defaultAgentRoot());
        const report = await readStatusReport(rootDir);
        if (!report.enrolled)
          throw new UsageError(
            `${rootDir} is not enrolled: run roost agent enrol --api URL --site SITE --secret ses_… --machine-id ID --root ${rootDir}`,
          );
        process.exitCode = await runService({
          rootDir,
          agentVersion: CLI_VERSION,
          // Only the packaged single-file executable replaces itself from the installer catalog.
          selfUpdateExe: opts.selfUpdate && isSea() ? process.execPath : undefined,
          pretty: opts.pretty,
          logLevel: opts.logLevel,
          heartbeatMs: opts.heartbeatSeconds * 1000,
          pollWaitSeconds: Math.min(30, opts.pollWaitSeconds),
          downloadConcurrency: opts.downloadConcurrency,
          stopGraceMs: opts.stopGraceSeconds * 1000,
        });
      },
    );

  withJson(
    agent.command('status').description('what the agent of this machine knows (read from its state folder)').addOption(rootOption()),
  ).action(async (opts: { root?: string }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const rootDir = path.resolve(opts.root ?? defaultAgentRoot());
    const r = await readStatusReport(rootDir);
    ctx.emit(r, () => {
      if (!r.enrolled) return void process.stdout.write(`${rootDir}: not enrolled\n`);
      const id = r.identity;
      const s = r.status;
      const lines = [
        `machine    ${id?.machineId} (${id?.hostname}) in ${id?.siteId}`,
        `api        ${id?.api}`,
        `root       ${r.root}`,
        `process    ${r.running ? `running (pid ${s?.pid}, since ${s?.startedAt})` : s?.stoppedAt ? `stopped at ${s.stoppedAt}` : 'not running'}`,
        `heartbeat  ${s?.lastHeartbeatAt ?? 'never'}${s?.connected ? '' : s?.lastError ? ` (last error: ${s.lastError})` : ''}`,
        `keys       ${r.pinnedKeys.join(', ') || '-'}`,
        `roosts     ${r.roosts.length === 0 ? '-' : ''}`,
        ...r.roosts.map(
          (x) => `  ${x.roostId}  ${x.versionId.slice(0, 16)}…  ${x.files} files in ${x.extractDir}, committed ${x.committedAt}`,
        ),
        `pending    ${r.pendingWork.length === 0 ? '-' : ''}`,
        ...r.pendingWork.map(
          (w) => `  ${w.commandId}  ${w.type}${w.roostId ? ` ${w.roostId}` : ''}${w.versionId ? ` ${w.versionId.slice(0, 16)}…` : ''}`,
        ),
      ];
      process.stdout.write(`${lines.join('\n')}\n`);
    });
    if (!r.enrolled) process.exitCode = 1;
  });
}
