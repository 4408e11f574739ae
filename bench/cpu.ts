/**
 * CPU time of processes, read from /proc (Linux only): a process's own user+system seconds, and a
 * PostgreSQL cluster's (the postmaster, its live backends and the backends it already reaped), so a
 * benchmark can report CPU seconds per unit of work next to its wall time. Elsewhere every figure is -1.
 */
import fs from 'node:fs';

/** Clock ticks per second of /proc/<pid>/stat times (USER_HZ: 100 on every Linux this runs on). */
const CLK_TCK = 100;

/** Fields 14–17 of /proc/<pid>/stat in seconds (utime, stime, cutime, cstime) and the parent pid; null when gone. */
function statTimes(pid: number): { own: number; children: number; ppid: number } | null {
  let text: string;
  try {
    text = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  // The command name (field 2) is in parentheses and may contain spaces: split after the last ')'.
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // f[0] is field 3 (state): field n is f[n - 3].
  const n = (i: number) => Number(f[i - 3]);
  return { own: (n(14) + n(15)) / CLK_TCK, children: (n(16) + n(17)) / CLK_TCK, ppid: n(4) };
}

/** User+system CPU seconds of one process (its reaped children not included); -1 when it cannot be read. */
export function processCpuSeconds(pid: number): number {
  return statTimes(pid)?.own ?? -1;
}

/** Pid of the postmaster serving the data directory `pgDataDir` (its command line holds `-D <dir>`), or null. */
export function postmasterPid(pgDataDir: string): number | null {
  let pids: string[];
  try {
    pids = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p));
  } catch {
    return null;
  }
  for (const p of pids) {
    try {
      const argv = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      const d = argv.indexOf('-D');
      if (d >= 0 && argv[d + 1] && fs.realpathSync(argv[d + 1]) === fs.realpathSync(pgDataDir) && /postgres$/.test(argv[0]))
        return Number(p);
    } catch {
      /* gone, or not ours */
    }
  }
  return null;
}

/**
 * CPU seconds of a PostgreSQL cluster so far: the postmaster's own and reaped children's time plus every
 * live child's (backends, WAL writer, checkpointer…). A difference of two readings is the cluster's CPU
 * between them (a backend that exits in between moves from "live" to "reaped": still counted once).
 * -1 when the postmaster cannot be read.
 */
export function postgresCpuSeconds(postmaster: number): number {
  const pm = statTimes(postmaster);
  if (!pm) return -1;
  let total = pm.own + pm.children;
  for (const p of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    const t = statTimes(Number(p));
    if (t && t.ppid === postmaster) total += t.own;
  }
  return total;
}
