/**
 * The agent's self-upgrade from the agent-installer catalog (docs/decisions/agent-self-update.md).
 *
 * A heartbeat answer carrying `agentUpdate: { version, sha256 }` (the catalog's latest is newer than this
 * agent) starts it: `GET /api/agent/installer/{version}` with the agent token gives the catalog's
 * checksum and a 15-minute signed URL; the bytes are streamed to `<exe>.new` while hashed, and nothing
 * is swapped unless the digest equals the catalog's checksum (and the offer's), and the file is an
 * executable for this platform (PE `MZ` on Windows; ELF or a `#!` script elsewhere). The swap works with the
 * running file: Windows lets a running .exe be renamed but not overwritten, so the current one is renamed
 * to `<exe>.old` (a previous `.old` is removed first) and the new one renamed into its place; the same two
 * renames on Linux. Then `restart` runs: the service wrapper (systemd `Restart=always`, WinSW
 * `onfailure restart`) starts the new binary, which reports its own `agentVersion` in its first heartbeat.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import fs from 'node:fs/promises';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';

/** What the catalog answers for one version (`GET /api/agent/installer/{version}`). */
export interface InstallerDownload {
  version: string;
  sha256: string;
  sizeBytes: number | null;
  downloadUrl: string;
}

/** How to upgrade this agent: the file to replace and how to restart into it. */
export interface SelfUpdateOptions {
  /** The executable that runs this agent (process.execPath of the packaged binary). */
  exePath: string;
  /** Called after the swap; the service wrapper restarts the new binary (e.g. exit with a non-zero code). */
  restart: (version: string) => void | Promise<void>;
  /** Platform whose executable format is required (default process.platform). */
  platform?: NodeJS.Platform;
}

/**
 * A self-update that was refused (checksum, format, or the offer is the executable running now); nothing was
 * swapped. `sameBuild`: the offered bytes are this very executable, so taking them would restart into the
 * same build, which reports the same version and is offered the update again, in a loop.
 */
export class SelfUpdateRefused extends Error {
  constructor(
    message: string,
    readonly sameBuild = false,
  ) {
    super(message);
    this.name = 'SelfUpdateRefused';
  }
}

/** The SHA-256 (hex) of the file at `file`, read as a stream. */
export async function fileSha256(file: string): Promise<string> {
  const hash = createHash('sha256');
  await pipeline(createReadStream(file), hash);
  return hash.digest('hex');
}

/** True when `head` (the first bytes of a file) starts an executable for `platform`. */
export function isExecutableFor(head: Buffer, platform: NodeJS.Platform): boolean {
  if (platform === 'win32') return head.subarray(0, 2).toString('latin1') === 'MZ';
  return head.subarray(0, 4).equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46])) || head.subarray(0, 2).toString('latin1') === '#!';
}

/**
 * Downloads `download` (the catalog's answer for the offered version), verifies it and swaps it in for
 * `opts.exePath`, then calls `opts.restart`. `offeredSha256` is the heartbeat's checksum: both must agree.
 * @returns the paths of the new executable and of the previous one kept aside
 * @throws SelfUpdateRefused on a checksum or format mismatch (the download is deleted, the current
 *   executable untouched), or with `sameBuild` before any download when the offer is the running executable's
 *   own bytes; network and file-system errors as they come
 */
export async function applySelfUpdate(
  download: InstallerDownload,
  offeredSha256: string,
  opts: SelfUpdateOptions,
): Promise<{ version: string; exePath: string; previousPath: string }> {
  if (download.sha256 !== offeredSha256) {
    throw new SelfUpdateRefused(`the catalog's checksum of ${download.version} differs from the heartbeat's offer`);
  }
  if ((await fileSha256(opts.exePath)) === offeredSha256) {
    throw new SelfUpdateRefused(
      `agent ${download.version} is the executable running now, which reports another version: build it with that version (npm run build:agent -- --version ${download.version}) or make another version latest`,
      true,
    );
  }
  const staged = `${opts.exePath}.new`;
  const previousPath = `${opts.exePath}.old`;
  const res = await fetch(download.downloadUrl);
  if (!res.ok || !res.body) throw new Error(`download of agent ${download.version} failed: HTTP ${res.status}`);
  const hash = createHash('sha256');
  let head = Buffer.alloc(0);
  const body = Readable.fromWeb(res.body as Parameters<typeof Readable.fromWeb>[0]);
  body.on('data', (chunk: Buffer) => {
    hash.update(chunk);
    if (head.length < 4) head = Buffer.concat([head, chunk]).subarray(0, 4);
  });
  await pipeline(body, createWriteStream(staged, { mode: 0o755 }));
  const digest = hash.digest('hex');
  try {
    if (digest !== download.sha256) {
      throw new SelfUpdateRefused(`agent ${download.version} downloaded with sha256 ${digest}, the catalog says ${download.sha256}`);
    }
    if (!isExecutableFor(head, opts.platform ?? process.platform)) {
      throw new SelfUpdateRefused(`agent ${download.version} is not an executable for ${opts.platform ?? process.platform}`);
    }
  } catch (err) {
    await fs.rm(staged, { force: true });
    throw err;
  }
  await fs.chmod(staged, 0o755);
  await fs.rm(previousPath, { force: true });
  await fs.rename(opts.exePath, previousPath);
  try {
    await fs.rename(staged, opts.exePath);
  } catch (err) {
    await fs.rename(previousPath, opts.exePath); // put the running one back
    throw err;
  }
  await opts.restart(download.version);
  return { version: download.version, exePath: opts.exePath, previousPath };
}
