/**
 * Managed processes (`/api/sites/{siteId}/machines/{machineId}/processes`; docs/decisions/managed-processes.md):
 * the enums and formats of the process config, schedule blocks, the commands the process routes queue, and
 * whether a schedule is open at an instant in a time zone (shared by the API and the reference agent).
 * Pure: no I/O.
 */
import { type MaintenanceWindow, WEEKDAYS, type Weekday, parseLocalTime, windowDelayMs } from './rollout-policy';

export const PRIORITIES = ['idle', 'below', 'normal', 'above', 'high', 'realtime'] as const;
export const VISIBILITIES = ['visible', 'hidden', 'minimized', 'maximized'] as const;
export const LAUNCH_MODES = ['off', 'always', 'scheduled'] as const;
export type LaunchMode = (typeof LAUNCH_MODES)[number];
/** Days of a schedule block, Monday first (docs/contract.md "Process config"). */
export const SCHEDULE_DAYS = ['mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun'] as const;

/** Process ids (`prc_<24 hex>`): 1..64 of [A-Za-z0-9_-]. */
export const PROCESS_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
/** HH:MM, 00:00..23:59 (a block ending at midnight ends at 00:00 of the next day). */
export const HHMM_RE = /^([01][0-9]|2[0-3]):[0-5][0-9]$/;

/** Bounds of the numeric fields (seconds; attempts). */
export const MAX_TIME_DELAY_SECONDS = 86_400;
export const MAX_TIME_TO_INIT_SECONDS = 3_600;
export const MAX_RELAUNCH_ATTEMPTS = 100;
/** Most blocks of one schedule. */
export const MAX_SCHEDULE_BLOCKS = 64;

/** One schedule block: on each of `days`, from `start` to `end` (HH:MM, local time of the site). */
export interface ScheduleBlock {
  days: string[];
  start: string;
  end: string;
}

/** Process control commands the routes queue (`POST …/processes/{processId}/{kill|restart|start|stop}`). */
export const PROCESS_COMMANDS = { kill: 'kill_process', restart: 'restart_process', start: 'start_process', stop: 'stop_process' } as const;
export type ProcessAction = keyof typeof PROCESS_COMMANDS;
export const PROCESS_COMMAND_TYPES: readonly string[] = Object.values(PROCESS_COMMANDS);

/**
 * Problems of a schedule, keyed by dotted path under `prefix` (empty when valid): each block needs
 * non-empty, distinct `days` of mon..sun, `start` and `end` as HH:MM, and `end` different from `start`
 * (an `end` earlier than `start` spans midnight into the next day).
 */
export function scheduleProblems(blocks: unknown, prefix: string): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  const add = (k: string, m: string) => (out[k] ??= []).push(m);
  if (!Array.isArray(blocks)) {
    add(prefix, 'must be an array of blocks');
    return out;
  }
  if (blocks.length > MAX_SCHEDULE_BLOCKS) add(prefix, `must have at most ${MAX_SCHEDULE_BLOCKS} blocks`);
  blocks.forEach((b: unknown, i) => {
    const at = `${prefix}.${i}`;
    if (typeof b !== 'object' || b === null || Array.isArray(b)) return add(at, 'must be an object {days, start, end}');
    const blk = b as Record<string, unknown>;
    for (const k of Object.keys(blk)) if (!['days', 'start', 'end'].includes(k)) add(`${at}.${k}`, 'is not a field of a block');
    if (!Array.isArray(blk.days) || blk.days.length === 0) add(`${at}.days`, 'must be a non-empty array of mon..sun');
    else {
      blk.days.forEach((d, j) => {
        if (!(SCHEDULE_DAYS as readonly unknown[]).includes(d)) add(`${at}.days.${j}`, 'must be one of mon, tue, wed, thu, fri, sat, sun');
      });
      if (new Set(blk.days).size !== blk.days.length) add(`${at}.days`, 'must not repeat a day');
    }
    for (const k of ['start', 'end'] as const) {
      if (typeof blk[k] !== 'string' || !HHMM_RE.test(blk[k])) add(`${at}.${k}`, 'must be HH:MM (00:00..23:59)');
    }
    if (typeof blk.start === 'string' && blk.start === blk.end) add(`${at}.end`, 'must differ from start (an earlier end spans midnight)');
  });
  return out;
}

/** A block as a window of domain/rollout-policy.ts (seconds of day; an end before the start spans midnight). */
export function blockWindow(b: ScheduleBlock): MaintenanceWindow {
  return { days: b.days as Weekday[], startSec: parseLocalTime(b.start) ?? 0, endSec: parseLocalTime(b.end) ?? 0 };
}

/** True when `nowMs` falls inside any block of `blocks` in `timeZone`. */
export function scheduleOpen(blocks: readonly ScheduleBlock[], timeZone: string, nowMs: number): boolean {
  return blocks.some((b) => windowDelayMs(blockWindow(b), timeZone, nowMs) === 0);
}

/** Milliseconds until the schedule next opens (0: open now); a week when it never does. */
export function msUntilOpen(blocks: readonly ScheduleBlock[], timeZone: string, nowMs: number): number {
  if (blocks.length === 0) return 7 * 86_400_000;
  return Math.min(...blocks.map((b) => windowDelayMs(blockWindow(b), timeZone, nowMs)));
}

export { WEEKDAYS };
