/**
 * Classic installs on the machine (`classic_install` / `classic_uninstall` commands of
 * `POST /api/sites/{siteId}/deployments`; docs/agent-protocol.md "Classic installs"). Not roost syncs:
 * those are agent/sync.ts.
 *
 * Per command, reporting each step as the command's status (the deployment workflow folds it into the
 * target): `closing_processes` (named processes asked to end, killed after a grace time) → `downloading`
 * (HTTPS GET of the installer with progress reports at most every `progressIntervalMs`) → sha256 check
 * BEFORE anything runs (a mismatch deletes the file and fails the command, nothing run) → `installing`
 * (the installer with its silent flags and a time limit; an uninstall runs it in uninstall mode) →
 * verify_path (must exist after an install, must be gone after an uninstall) → `completed` | `failed`.
 *
 * `suppress_projects`: while the command runs, managed processes (agent/processes.ts) whose name or path an
 * entry names are stopped and not relaunched; they run again per their launch mode once it ended.
 *
 * A first report answered `applied: false` means the server cancelled the command before it started
 * (deployment cancel): the agent stops without doing anything.
 */
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import fs from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { CLASSIC_UNINSTALL, type ClassicCommandParams } from '../domain/classic';
import type { CommandOutcome } from './commands';
import { errMessage } from './errors';
import type { AgentOs, Invocation } from './os';
import type { AgentCommand, AgentTransport } from './transport';

/** What a classic install needs from the agent. */
export interface InstallContext {
  transport: AgentTransport;
  os: AgentOs;
  /** Folder the installers are downloaded to (under the agent's state folder). */
  downloadDir: string;
  /** Extra trusted CA certificates (PEM) for installer downloads (a private PKI; tests' self-signed server). */
  ca?: string | Buffer;
  /** Gap between two download progress reports (ms). */
  progressIntervalMs: number;
  /** Time named processes get to end before they are killed (ms). */
  closeGraceMs: number;
  /**
   * Holds the managed processes matching `suppress_projects` stopped (agent/processes.ts `suppress`):
   * resolves once they ended, with the function that lets them run again. Absent: nothing is suppressed.
   */
  suppress?: (entries: string[]) => Promise<() => void>;
  signal: AbortSignal;
  warn: (message: string) => void;
}

/** Thrown for a failed step: its message is the command's error. */
class StepFailure extends Error {}

/** Runs one classic install or uninstall command to its end. */
export async function runClassicCommand(ctx: InstallContext, cmd: AgentCommand): Promise<CommandOutcome> {
  const p = cmd.params as unknown as ClassicCommandParams;
  const mode = cmd.type === CLASSIC_UNINSTALL ? 'uninstall' : 'install';
  const report = async (status: string, extra: { progress?: number; error?: string } = {}) =>
    ctx.transport.reportCommand(cmd.commandId, { status, ...extra });
  const outcome = (status: CommandOutcome['status'], error?: string): CommandOutcome => ({
    commandId: cmd.commandId,
    type: cmd.type,
    status,
    ...(status === 'completed' ? { result: 'success' as const } : {}),
    ...(error ? { error } : {}),
  });

  let release = () => {};
  try {
    const first = await report('closing_processes', { progress: 0 });
    if (!first.applied) return outcome('cancelled', 'cancelled before it started');
    // Suppressed projects first: managed processes the supervisor would otherwise relaunch mid-install.
    if (ctx.suppress && p.suppress_projects?.length) release = await ctx.suppress(p.suppress_projects);
    await closeProcesses(ctx, p.close_processes ?? []);

    await report('downloading', { progress: 0 });
    const dir = path.join(ctx.downloadDir, safeName(p.deploymentId), String(p.attempt));
    await fs.mkdir(dir, { recursive: true });
    const file = path.join(dir, safeName(p.installer_name));
    const digest = await download(
      ctx,
      p.installer_url,
      file,
      (pct) => void report('downloading', { progress: pct }).catch(() => undefined),
    );
    if (p.sha256 && digest !== p.sha256.toLowerCase()) {
      await fs.rm(file, { force: true });
      throw new StepFailure(`sha256_mismatch: expected ${p.sha256.toLowerCase()}, got ${digest}; nothing was run`);
    }

    await report('installing', { progress: 100 });
    await fs.chmod(file, 0o755);
    const inv = ctx.os.installerInvocation(file, p.silent_flags ?? '', mode);
    const code = await runWithTimeout(ctx.os, inv, path.dirname(file), (p.timeout_seconds ?? 1800) * 1000, ctx.signal);
    if (!ctx.os.installerSucceeded(code)) throw new StepFailure(`installer exited with code ${code}`);
    if (p.verify_path) {
      const exists = await ctx.os.pathExists(p.verify_path);
      if (mode === 'install' && !exists) throw new StepFailure(`verify_path ${p.verify_path} does not exist after the install`);
      if (mode === 'uninstall' && exists) throw new StepFailure(`verify_path ${p.verify_path} still exists after the uninstall`);
    }
    await report('completed', { progress: 100 });
    return outcome('completed');
  } catch (err) {
    if (ctx.signal.aborted) return outcome('abandoned', 'agent stopped');
    const message = err instanceof StepFailure ? err.message : errMessage(err);
    try {
      await report('failed', { error: message });
    } catch (e) {
      ctx.warn(`could not report ${cmd.commandId}: ${errMessage(e)}`);
    }
    return outcome('failed', message);
  } finally {
    release();
  }
}

/** A file or folder name made safe for the download folder (anything outside [A-Za-z0-9._-] becomes `_`). */
function safeName(s: string): string {
  const n = String(s).replace(/[^A-Za-z0-9._-]/g, '_');
  return n === '' || n === '.' || n === '..' ? '_' : n;
}

/** Asks every running process named in `names` to end, then kills what is left after the grace time. */
async function closeProcesses(ctx: InstallContext, names: string[]): Promise<void> {
  if (names.length === 0) return;
  const matches = async () => {
    const all = await ctx.os.listProcesses();
    return all.filter((p) => p.pid !== process.pid && names.some((n) => sameName(p.name, n, ctx.os.platform)));
  };
  const first = await matches();
  for (const p of first) await ctx.os.terminate(p.pid);
  const deadline = Date.now() + ctx.closeGraceMs;
  let left = first;
  while (left.length > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    const now = new Set((await matches()).filter((p) => p.state !== 'Z').map((p) => p.pid));
    left = left.filter((p) => now.has(p.pid));
  }
  for (const p of left) await ctx.os.kill(p.pid);
}

/** Process names compare without a `.exe` suffix, case-insensitively on Windows. */
function sameName(processName: string, wanted: string, platform: 'posix' | 'win32'): boolean {
  const norm = (s: string) => {
    const base = s.replace(/\.exe$/i, '');
    return platform === 'win32' ? base.toLowerCase() : base;
  };
  // Linux truncates comm to 15 characters.
  const a = norm(processName);
  const b = norm(wanted);
  return a === b || (platform === 'posix' && a.length === 15 && b.startsWith(a));
}

/** Downloads `url` to `file` (following up to 5 redirects), reporting percent progress; returns the SHA-256 hex. */
function download(ctx: InstallContext, url: string, file: string, progress: (pct: number) => void, redirects = 5): Promise<string> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const get = u.protocol === 'https:' ? https.get : http.get;
    const req = get(u, { ca: ctx.ca, signal: ctx.signal }, (res) => {
      const status = res.statusCode ?? 0;
      if (status >= 300 && status < 400 && res.headers.location && redirects > 0) {
        res.resume();
        download(ctx, new URL(res.headers.location, u).toString(), file, progress, redirects - 1).then(resolve, reject);
        return;
      }
      if (status !== 200) {
        res.resume();
        reject(new StepFailure(`download failed: HTTP ${status}`));
        return;
      }
      const total = Number(res.headers['content-length'] ?? 0);
      const hash = createHash('sha256');
      const out = createWriteStream(file);
      let got = 0;
      let last = Date.now();
      res.on('data', (chunk: Buffer) => {
        hash.update(chunk);
        got += chunk.length;
        if (total > 0 && Date.now() - last >= ctx.progressIntervalMs) {
          last = Date.now();
          progress(Math.min(99, Math.floor((got * 100) / total)));
        }
      });
      res.pipe(out);
      out.on('finish', () => resolve(hash.digest('hex')));
      out.on('error', reject);
      res.on('error', reject);
    });
    req.on('error', (err) => reject(new StepFailure(`download failed: ${errMessage(err)}`)));
  });
}

/**
 * Runs an installer; resolves its exit code. Killed (then failed) after `timeoutMs`, and killed when the
 * agent stops (`signal`: the command is abandoned). A kill ends the installer's whole process tree
 * (`AgentOs.killTree`), so a hung msiexec or setup.exe child does not keep running, holding the MSI lock,
 * while a retry starts another copy; should that kill fail, at least the installer itself is killed.
 */
function runWithTimeout(os: AgentOs, inv: Invocation, cwd: string, timeoutMs: number, signal: AbortSignal): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = os.startInstaller(inv, cwd);
    const killAll = () => {
      const pid = child.pid;
      if (pid === undefined) return;
      void os.killTree(pid).then(
        (killed) => killed || child.kill('SIGKILL'),
        () => child.kill('SIGKILL'),
      );
    };
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killAll();
    }, timeoutMs);
    const onAbort = () => killAll();
    signal.addEventListener('abort', onAbort, { once: true });
    // The agent stopped while the installer was being started: the listener above will not fire.
    if (signal.aborted) killAll();
    child.on('error', (err) => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      reject(new StepFailure(`installer could not start: ${errMessage(err)}`));
    });
    child.on('exit', (code, sig) => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      if (timedOut) reject(new StepFailure(`installer timed out after ${Math.round(timeoutMs / 1000)} s and was killed`));
      else if (code === null) reject(new StepFailure(`installer ended by signal ${sig}`));
      else resolve(code);
    });
  });
}
