/**
 * `roost processes list|show|create|update|delete|start|stop|restart|kill|schedule <machineId> …`: managed
 * processes of a machine (`/api/sites/{siteId}/machines/{machineId}/processes`,
 * docs/decisions/managed-processes.md). Control commands wait for the agent's answer with `--wait` (a timeout after
 * `--timeout` seconds exits 1 with code `timeout`, like `roost machines command`).
 */
import { type Command, Option } from 'commander';
import { seg } from '../client';
import { type CommandContext, UsageError, commandContext, positiveInt, table, withJson } from '../context';
import { LAUNCH_MODES, PRIORITIES, VISIBILITIES } from '../../domain/processes';
import { waitForCommand } from './machines';

interface ProcessRecord {
  processId: string;
  name: string;
  exe_path: string;
  launch_mode: string;
  live: { pid: number | null; status: string; responsive: boolean | null; restarts?: number } | null;
  [extra: string]: unknown;
}

const base = (ctx: CommandContext, machineId: string) => `/api/sites/${seg(ctx.siteId())}/machines/${seg(machineId)}/processes`;

function row(p: ProcessRecord) {
  return [p.processId, p.name, p.launch_mode, p.live?.status ?? '-', p.live?.pid ?? null, p.live?.restarts ?? null, p.exe_path];
}
const HEAD = ['PROCESS', 'NAME', 'LAUNCH', 'STATUS', 'PID', 'RESTARTS', 'EXE'];

/** Config options shared by create and update, to the API's field names. */
function configOptions(cmd: Command): Command {
  return cmd
    .option('--exe <path>', 'absolute path of the executable')
    .option('--args <text>', 'arguments / document (file_path)')
    .option('--cwd <path>', 'absolute working directory')
    .addOption(new Option('--priority <p>', 'process priority').choices(PRIORITIES))
    .addOption(new Option('--visibility <v>', 'window visibility').choices(VISIBILITIES))
    .addOption(new Option('--launch <mode>', 'launch mode').choices(LAUNCH_MODES))
    .option('--delay <seconds>', 'time_delay', positiveInt('--delay'))
    .option('--init <seconds>', 'time_to_init', positiveInt('--init'))
    .option('--relaunch <n>', 'relaunch_attempts', (v) => Number(v))
    .option('--name <name>', 'new name (update)');
}

function configBody(o: Record<string, unknown>): Record<string, unknown> {
  const map: Record<string, string> = {
    exe: 'exe_path',
    args: 'file_path',
    cwd: 'cwd',
    priority: 'priority',
    visibility: 'visibility',
    launch: 'launch_mode',
    delay: 'time_delay',
    init: 'time_to_init',
    relaunch: 'relaunch_attempts',
    name: 'name',
  };
  const body: Record<string, unknown> = {};
  for (const [k, f] of Object.entries(map)) if (o[k] !== undefined) body[f] = o[k];
  return body;
}

/** Parses `mon,tue@08:00-17:00` blocks. */
function parseBlock(raw: string, prev: unknown[] = []): unknown[] {
  const m = /^([a-z,]+)@([0-9]{2}:[0-9]{2})-([0-9]{2}:[0-9]{2})$/.exec(raw);
  if (!m) throw new UsageError(`--block ${raw}: expected days@HH:MM-HH:MM, e.g. mon,tue@08:00-17:00`);
  return [...prev, { days: m[1].split(','), start: m[2], end: m[3] }];
}

/** Registers `roost processes`. */
export function registerProcesses(program: Command): void {
  const processes = program.command('processes').description('managed processes of a machine');

  withJson(processes.command('list').description('processes of a machine with live status').argument('<machineId>')).action(
    async (machineId: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const res = await ctx.client().get<{ processes: ProcessRecord[] }>(base(ctx, machineId));
      ctx.emit(res, () =>
        process.stdout.write(res.processes.length ? table(HEAD, res.processes.map(row)) + '\n' : 'no managed processes\n'),
      );
    },
  );

  withJson(processes.command('show').argument('<machineId>').argument('<processId>').description('one process')).action(
    async (machineId: string, id: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const p = await ctx.client().get<ProcessRecord>(`${base(ctx, machineId)}/${seg(id)}`);
      ctx.emit(p, () => process.stdout.write(table(HEAD, [row(p)]) + '\n'));
    },
  );

  withJson(configOptions(processes.command('create').argument('<machineId>').argument('<name>').description('register a process'))).action(
    async (machineId: string, name: string, o: Record<string, unknown>, cmd: Command) => {
      const ctx = commandContext(cmd);
      if (!o.exe) throw new UsageError('--exe is required');
      const p = await ctx.client().post<ProcessRecord>(base(ctx, machineId), { ...configBody(o), name }, { idempotencyKey: true });
      ctx.emit(p, () => process.stdout.write(`created ${p.processId} (${p.name})\n`));
    },
  );

  withJson(configOptions(processes.command('update').argument('<machineId>').argument('<processId>').description('change fields'))).action(
    async (machineId: string, id: string, o: Record<string, unknown>, cmd: Command) => {
      const ctx = commandContext(cmd);
      const p = await ctx.client().patch<ProcessRecord>(`${base(ctx, machineId)}/${seg(id)}`, configBody(o), { idempotencyKey: true });
      ctx.emit(p, () => process.stdout.write(`updated ${p.processId}\n`));
    },
  );

  withJson(processes.command('delete').argument('<machineId>').argument('<processId>').description('delete (idempotent)')).action(
    async (machineId: string, id: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const r = await ctx.client().delete<{ alreadyDeleted: boolean }>(`${base(ctx, machineId)}/${seg(id)}`, { idempotencyKey: true });
      ctx.emit(r, () => process.stdout.write(r.alreadyDeleted ? `${id} was already deleted\n` : `deleted ${id}\n`));
    },
  );

  for (const action of ['start', 'stop', 'restart', 'kill'] as const) {
    withJson(
      processes
        .command(action)
        .argument('<machineId>')
        .argument('<processId>')
        .description(`${action} a process (queues ${action}_process)`)
        .option('--wait', "wait for the agent's answer")
        .option('--timeout <seconds>', 'how long --wait waits (default 120)', positiveInt('--timeout'), 120),
    ).action(async (machineId: string, id: string, o: { wait?: boolean; timeout: number }, cmd: Command) => {
      const ctx = commandContext(cmd);
      const client = ctx.client();
      const q = await client.post<{ commandId: string; status: string }>(`${base(ctx, machineId)}/${seg(id)}/${action}`, undefined, {
        idempotencyKey: true,
      });
      const state: Record<string, unknown> = o.wait
        ? await waitForCommand(client, ctx.siteId(), machineId, q.commandId, o.timeout * 1000)
        : q;
      ctx.emit(state, () =>
        process.stdout.write(
          `${action} ${id}: command ${q.commandId} ${String(state.status)}${state.error ? ` (${String(state.error)})` : ''}\n`,
        ),
      );
      // A command that failed (or was cancelled, or expired) is a failure of this command: exit 1 (README "exit code").
      if (o.wait && state.status !== 'completed') process.exitCode = 1;
    });
  }

  withJson(
    processes
      .command('schedule')
      .argument('<machineId>')
      .argument('<processId>')
      .argument('<mode>', 'off|always|scheduled')
      .option('--block <days@HH:MM-HH:MM>', 'a schedule block (repeatable), e.g. mon,tue@08:00-17:00', parseBlock)
      .description('set the launch mode and schedule blocks (site time zone; an end before the start spans midnight)'),
  ).action(async (machineId: string, id: string, mode: string, o: { block?: unknown[] }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const p = await ctx
      .client()
      .post<ProcessRecord>(
        `${base(ctx, machineId)}/${seg(id)}/schedule`,
        { mode, ...(o.block ? { blocks: o.block } : {}) },
        { idempotencyKey: true },
      );
    ctx.emit(p, () => process.stdout.write(`${id}: launch_mode ${p.launch_mode}\n`));
  });
}
