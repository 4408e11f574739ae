/**
 * `roost machines …`: the site's machines and their commands (docs/contract.md "Machines (site scoped)"):
 *
 *   machines list [--all]                          GET /api/sites/{siteId}/machines
 *   machines show <machineId>                      GET /api/sites/{siteId}/machines/{machineId}
 *   machines deployments <machineId>               GET …/machines/{machineId}/deployments
 *   machines command <machineId> <reboot|shutdown|screenshot> [--delay s] [--monitor m] [--wait] [--out file]
 *                                                  POST …/machines/{machineId}/commands (one Idempotency-Key)
 *   machines command-status <machineId> <commandId>  GET …/machines/{machineId}/commands/{commandId}
 *   machines enrolment-secret                      POST /api/sites/{siteId}/enrolment-secret (shown once)
 *
 * `command … screenshot` waits for the agent and saves the PNG to `--out` (default
 * `<machineId>-<commandId>.png`); `--wait` makes reboot and shutdown wait for a terminal status too. A
 * command that ends failed or cancelled exits 1; one still open when `--timeout` passes exits 1 with
 * code `timeout`.
 */
import fs from 'node:fs';
import { type Command } from 'commander';
import { ClientError, type RoostClient, seg } from '../client';
import { commandContext, positiveInt, table, UsageError, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';

/** Machine summary fields the CLI shows (docs/contract.md "Machine"). */
interface MachineSummary {
  machineId: string;
  hostname: string | null;
  online: boolean;
  lastHeartbeat: string | null;
  agent_version: string | null;
  rebooting: boolean;
  shuttingDown: boolean;
  [extra: string]: unknown;
}

/** Command state (docs/contract.md "Command"). */
export interface CommandState {
  commandId: string;
  machineId: string;
  type: string;
  status: string;
  progress: number | null;
  result: string | null;
  error: string | null;
  screenshotUrl?: string;
  [extra: string]: unknown;
}

/** The short names `machines command` takes, and the API's command types. */
export const COMMAND_TYPES: Record<string, string> = {
  reboot: 'reboot_machine',
  shutdown: 'shutdown_machine',
  screenshot: 'capture_screenshot',
};

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

/**
 * Polls a command every `intervalMs` until it is completed, failed or cancelled.
 * @throws ClientError code `timeout` (status 0) after `timeoutMs`
 */
export async function waitForCommand(
  client: RoostClient,
  siteId: string,
  machineId: string,
  commandId: string,
  timeoutMs: number,
  intervalMs = 500,
): Promise<CommandState> {
  const path = `/api/sites/${seg(siteId)}/machines/${seg(machineId)}/commands/${seg(commandId)}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const state = await client.get<CommandState>(path);
    if (TERMINAL.has(state.status)) return state;
    if (Date.now() >= deadline)
      throw new ClientError({
        code: 'timeout',
        status: 0,
        detail: `command ${commandId} is still ${state.status} after ${Math.round(timeoutMs / 1000)} s`,
        body: { command: state },
        method: 'GET',
        url: path,
        attempts: 1,
      });
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

function commandLine(s: CommandState): string {
  const extra = s.error ? ` (${s.error})` : s.progress !== null && !TERMINAL.has(s.status) ? ` ${s.progress}%` : '';
  return `${s.commandId} ${s.type} on ${s.machineId}: ${s.status}${extra}`;
}

export function registerMachines(program: Command): void {
  const machines = program.command('machines').description("the site's machines and their commands");

  withJson(addPagingOptions(machines.command('list').description('list the machines of the site'), 'machines')).action(
    async (opts: PagingOptions, cmd: Command) => {
      const ctx = commandContext(cmd);
      const siteId = ctx.siteId();
      const page = await fetchList<MachineSummary>(ctx.client(), `/api/sites/${seg(siteId)}/machines`, 'machines', {}, opts);
      ctx.emit({ siteId, machines: page.items, next_page_token: page.next }, () => {
        if (page.items.length === 0) return void process.stdout.write('no machines\n');
        process.stdout.write(
          table(
            ['MACHINE', 'HOSTNAME', 'ONLINE', 'LAST HEARTBEAT', 'AGENT'],
            page.items.map((m) => [
              m.machineId,
              m.hostname,
              m.online ? 'yes' : m.rebooting ? 'rebooting' : m.shuttingDown ? 'shutting down' : 'no',
              m.lastHeartbeat,
              m.agent_version,
            ]),
          ) + '\n',
        );
        process.stdout.write(morePagesHint(page.next));
      });
    },
  );

  withJson(machines.command('show').description('show one machine').argument('<machineId>', 'machine id')).action(
    async (machineId: string, _opts: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const m = await ctx
        .client()
        .get<MachineSummary & { info?: Record<string, unknown>; metrics?: unknown }>(
          `/api/sites/${seg(ctx.siteId())}/machines/${seg(machineId)}`,
        );
      ctx.emit(m, () => {
        process.stdout.write(
          [
            `${m.machineId} (${m.hostname ?? '-'})`,
            `  online          ${m.online ? 'yes' : 'no'}`,
            `  last heartbeat  ${m.lastHeartbeat ?? '-'}`,
            `  agent           ${m.agent_version ?? '-'}`,
            `  timezone        ${String(m.machine_timezone_iana ?? m.machine_timezone ?? '-')}`,
            `  capabilities    ${Object.keys((m.capabilities as Record<string, unknown>) ?? {}).join(', ') || '-'}`,
          ].join('\n') + '\n',
        );
      });
    },
  );

  withJson(
    machines
      .command('deployments')
      .description('per roost: the intended (current) and the reported version of a machine')
      .argument('<machineId>', 'machine id'),
  ).action(async (machineId: string, _opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const res = await ctx
      .client()
      .get<{ deployments: Array<Record<string, unknown>> }>(`/api/sites/${seg(ctx.siteId())}/machines/${seg(machineId)}/deployments`);
    ctx.emit(res, () => {
      if (res.deployments.length === 0) return void process.stdout.write('no roosts target this machine\n');
      process.stdout.write(
        table(
          ['ROOST', 'NAME', 'CURRENT', 'REPORTED', 'STATUS', 'IN SYNC'],
          res.deployments.map((d) => [
            d.roostId as string,
            d.name as string,
            d.currentVersionNumber as number | null,
            d.reportedVersionNumber as number | null,
            (d.status as string | null) ?? null,
            d.inSync ? 'yes' : 'no',
          ]),
        ) + '\n',
      );
    });
  });

  withJson(
    machines
      .command('command')
      .description('send a command to a machine: reboot, shutdown or screenshot (saved to a file)')
      .argument('<machineId>', 'machine id')
      .argument('<type>', 'reboot | shutdown | screenshot')
      .option('--delay <seconds>', 'reboot/shutdown: seconds before it happens', (v) => nonNegativeInt('--delay', v))
      .option('--monitor <monitor>', 'screenshot: all, primary or a monitor index')
      .option('--expires-in <seconds>', 'seconds before an unfinished command expires', positiveInt('--expires-in'))
      .option('--wait', 'wait until the command completes, fails or is cancelled (always for screenshot)')
      .option('--timeout <seconds>', 'how long to wait', positiveInt('--timeout'), 120)
      .option('-o, --out <file>', 'screenshot: where to save the PNG (default <machineId>-<commandId>.png)'),
  ).action(
    async (
      machineId: string,
      typeName: string,
      opts: { delay?: number; monitor?: string; expiresIn?: number; wait?: boolean; timeout: number; out?: string },
      cmd: Command,
    ) => {
      const ctx = commandContext(cmd);
      const type = COMMAND_TYPES[typeName] ?? (Object.values(COMMAND_TYPES).includes(typeName) ? typeName : undefined);
      if (!type) throw new UsageError(`unknown command "${typeName}": use ${Object.keys(COMMAND_TYPES).join(', ')}`);
      const params: Record<string, unknown> = {};
      if (opts.delay !== undefined) params.delaySeconds = opts.delay;
      if (opts.monitor !== undefined) params.monitor = /^[0-9]+$/.test(opts.monitor) ? Number(opts.monitor) : opts.monitor;
      const siteId = ctx.siteId();
      const client = ctx.client();
      const queued = await client.post<CommandState & { expiresAt: string }>(
        `/api/sites/${seg(siteId)}/machines/${seg(machineId)}/commands`,
        { type, params, ...(opts.expiresIn ? { timeout_seconds: opts.expiresIn } : {}) },
        { idempotencyKey: true },
      );
      const screenshot = type === 'capture_screenshot';
      if (!screenshot && !opts.wait) {
        ctx.emit(queued, () => process.stdout.write(`queued ${queued.commandId} (${type}) on ${machineId}\n`));
        return;
      }
      ctx.info(`queued ${queued.commandId} (${type}); waiting for ${machineId}`);
      const done = await waitForCommand(client, siteId, machineId, queued.commandId, opts.timeout * 1000);
      let savedTo: string | undefined;
      if (screenshot && done.status === 'completed') {
        if (!done.screenshotUrl) throw new Error(`command ${done.commandId} completed without a screenshot`);
        const res = await fetch(done.screenshotUrl);
        if (!res.ok) throw new Error(`screenshot download failed: HTTP ${res.status}`);
        savedTo = opts.out ?? `${machineId}-${done.commandId}.png`;
        fs.writeFileSync(savedTo, Buffer.from(await res.arrayBuffer()));
      }
      ctx.emit({ ...done, ...(savedTo ? { savedTo } : {}) }, () => {
        process.stdout.write(`${commandLine(done)}\n`);
        if (savedTo) process.stdout.write(`screenshot saved to ${savedTo}\n`);
      });
      if (done.status !== 'completed') process.exitCode = 1;
    },
  );

  withJson(
    machines
      .command('command-status')
      .description('show the state of a command')
      .argument('<machineId>', 'machine id')
      .argument('<commandId>', 'command id (cmd_…)'),
  ).action(async (machineId: string, commandId: string, _opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const s = await ctx.client().get<CommandState>(`/api/sites/${seg(ctx.siteId())}/machines/${seg(machineId)}/commands/${seg(commandId)}`);
    ctx.emit(s, () => process.stdout.write(`${commandLine(s)}\n`));
  });

  withJson(
    machines
      .command('enrolment-secret')
      .description("create or rotate the site's agent enrolment secret (shown once; tokens already issued keep working)"),
  ).action(async (_opts: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const siteId = ctx.siteId();
    const res = await ctx
      .client()
      .post<{ siteId: string; enrolmentSecret: string }>(`/api/sites/${seg(siteId)}/enrolment-secret`, undefined, { idempotencyKey: true });
    ctx.emit(res, () =>
      process.stdout.write(
        `${res.enrolmentSecret}\n(enrol a machine: roost agent enrol --api ${ctx.globals.api} --site ${siteId} --secret <this> --machine-id <id>)\n`,
      ),
    );
  });
}

function nonNegativeInt(name: string, raw: string): number {
  if (!/^[0-9]+$/.test(raw)) throw new UsageError(`${name} must be a whole number of seconds, got "${raw}"`);
  return Number(raw);
}
