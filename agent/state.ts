/**
 * What an installed agent keeps in its state folder besides the token and pinned keys
 * (`<rootDir>/state/agent.json`, agent/transport.ts) and the committed manifests (agent/machine-root.ts):
 *
 *   <rootDir>/state/service.json   who it is: API URL, site, machine, hostname, when it enrolled
 *   <rootDir>/state/status.json    what the running process last knew: pid, start, last heartbeat,
 *                                  last error, whether it is connected (read by `roost agent status`)
 *   <rootDir>/state/work/          commands taken and not finished (agent/journal.ts)
 *   <rootDir>/state/processes/     managed processes launched and not ended (agent/process-records.ts)
 *
 * The state folder holds the agent token: it is created owner-only (0700, files 0600) on POSIX, and on
 * Windows `restrictStateFolder` replaces its inherited ACL with full control for SYSTEM and
 * Administrators only (icacls), the account the service runs as.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import { constants as fsConstants } from 'node:fs';
import path from 'node:path';
import { MachineRoot, type Manifest, writeAtomic } from './machine-root';
import { FileJournal } from './journal';

/** Who an enrolled agent is (`state/service.json`). */
export interface ServiceIdentity {
  /** API base URL, no trailing slash. */
  api: string;
  siteId: string;
  machineId: string;
  hostname: string;
  /** ISO time of the enrolment. */
  enrolledAt: string;
  /** Agent version that enrolled. */
  agentVersion: string;
}

/** What the running agent process last knew (`state/status.json`); times are ISO strings. */
export interface ServiceStatus {
  pid: number;
  agentVersion: string;
  startedAt: string;
  /** Last accepted heartbeat, or null. */
  lastHeartbeatAt: string | null;
  /** Commands the server said were waiting at the last heartbeat. */
  pendingCommands: number | null;
  /** True between a successful heartbeat or poll and the next failure. */
  connected: boolean;
  lastError: string | null;
  lastErrorAt: string | null;
  /** Set when the process stopped cleanly. */
  stoppedAt: string | null;
}

/** Everything `roost agent status` prints. */
export interface AgentStatusReport {
  root: string;
  enrolled: boolean;
  identity: ServiceIdentity | null;
  /** The token file exists (its value is never printed). */
  hasToken: boolean;
  pinnedKeys: string[];
  status: ServiceStatus | null;
  /** The process of status.pid is alive now (false after a clean stop or a crash). */
  running: boolean;
  roosts: Array<{ roostId: string; versionId: string; extractDir: string; committedAt: string; files: number }>;
  pendingWork: Array<{ commandId: string; type: string; roostId: string | null; versionId: string | null }>;
}

/** Paths of the service files of a machine root. */
export function servicePaths(rootDir: string): { root: MachineRoot; identity: string; status: string } {
  const root = new MachineRoot(rootDir);
  return { root, identity: path.join(root.stateDir, 'service.json'), status: path.join(root.stateDir, 'status.json') };
}

/** Creates the root and its state folder owner-only (0700) and restricts the state folder (see above). */
export async function prepareStateFolder(rootDir: string): Promise<void> {
  const { root } = servicePaths(rootDir);
  await fs.mkdir(root.dir, { recursive: true, mode: 0o700 });
  await fs.mkdir(root.stateDir, { recursive: true, mode: 0o700 });
  await restrictStateFolder(root.stateDir);
}

/**
 * Owner-only access to the state folder and every file in it: chmod 0700/0600 on POSIX; on Windows an
 * ACL without inheritance granting full control to SYSTEM and Administrators only.
 * @throws Error when the permissions cannot be set (an agent must not run with a readable token)
 */
export async function restrictStateFolder(stateDir: string, platform: NodeJS.Platform = process.platform): Promise<void> {
  if (platform === 'win32') {
    // *S-1-5-18 is LocalSystem, *S-1-5-32-544 the Administrators group (SIDs: no localised names).
    execFileSync('icacls', [stateDir, '/inheritance:r', '/grant:r', '*S-1-5-18:(OI)(CI)F', '*S-1-5-32-544:(OI)(CI)F', '/T', '/Q'], {
      stdio: 'ignore',
    });
    return;
  }
  await fs.chmod(stateDir, 0o700);
  for (const entry of await fs.readdir(stateDir, { withFileTypes: true })) {
    const p = path.join(stateDir, entry.name);
    if (entry.isDirectory()) await restrictStateFolder(p, platform);
    else if (entry.isFile()) await fs.chmod(p, 0o600);
  }
}

/** The mode bits of a file or folder (POSIX), for checks and `roost agent status`. */
export async function modeOf(p: string): Promise<number> {
  return (await fs.stat(p)).mode & 0o777;
}

/** Saves who the agent is. */
export async function writeIdentity(rootDir: string, identity: ServiceIdentity): Promise<void> {
  await writeAtomic(servicePaths(rootDir).identity, JSON.stringify(identity, null, 2));
}

/** Who the agent is, or null when this root was never enrolled. */
export async function readIdentity(rootDir: string): Promise<ServiceIdentity | null> {
  return readJson<ServiceIdentity>(servicePaths(rootDir).identity);
}

/** Saves the running process's status (best effort: a full disk must not stop the agent). */
export async function writeStatus(rootDir: string, status: ServiceStatus): Promise<void> {
  await writeAtomic(servicePaths(rootDir).status, JSON.stringify(status, null, 2)).catch(() => undefined);
}

async function readJson<T>(file: string): Promise<T | null> {
  try {
    return JSON.parse(await fs.readFile(file, 'utf8')) as T;
  } catch {
    return null;
  }
}

/** True when a process with this pid exists now (signal 0 probes without signalling). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Reads everything `roost agent status` shows from the state folder (no API call). */
export async function readStatusReport(rootDir: string): Promise<AgentStatusReport> {
  const { root, status: statusFile } = servicePaths(rootDir);
  const identity = await readIdentity(rootDir);
  const saved = await readJson<{ agentToken?: string; signingKeys?: Array<{ kid?: string }> }>(root.agentStatePath);
  const status = await readJson<ServiceStatus>(statusFile);
  const roosts: AgentStatusReport['roosts'] = [];
  let names: string[] = [];
  try {
    names = await fs.readdir(root.stateDir);
  } catch {
    names = [];
  }
  for (const name of names.sort()) {
    if (!name.endsWith('.json') || ['agent.json', 'service.json', 'status.json'].includes(name) || name.startsWith('.')) continue;
    const m = await readJson<Manifest>(path.join(root.stateDir, name));
    if (m && typeof m.roostId === 'string' && typeof m.versionId === 'string')
      roosts.push({
        roostId: m.roostId,
        versionId: m.versionId,
        extractDir: m.extractDir,
        committedAt: m.committedAt,
        files: m.files?.length ?? 0,
      });
  }
  const pending = await new FileJournal(root.stateDir).pending();
  return {
    root: root.dir,
    enrolled: identity !== null && typeof saved?.agentToken === 'string',
    identity,
    hasToken: typeof saved?.agentToken === 'string',
    pinnedKeys: (saved?.signingKeys ?? []).map((k) => String(k.kid)),
    status,
    running: status !== null && status.stoppedAt === null && alive(status.pid),
    roosts,
    pendingWork: pending.map((c) => ({
      commandId: c.commandId,
      type: c.type,
      roostId: typeof c.params?.roostId === 'string' ? c.params.roostId : null,
      versionId: typeof c.params?.versionId === 'string' ? c.params.versionId : null,
    })),
  };
}

/** True when `p` can be read by this process (used before a run to give a clear message). */
export async function readable(p: string): Promise<boolean> {
  try {
    await fs.access(p, fsConstants.R_OK);
    return true;
  } catch {
    return false;
  }
}
