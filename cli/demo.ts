/**
 * The main job (`npm run demo`): the whole walk-through on the embedded default, on real
 * input. Starts the stack, bootstraps a site and key, pushes a real tree, starts a fleet of simulated
 * machines, deploys canary then fleet, verifies every machine's tree byte for byte and reported =
 * intended everywhere, changes a few files and pushes/deploys again (dedup), rolls back to the first
 * version (and deploys it), shows the diff, and prints the Temporal Web UI link of every rollout.
 *
 * `runDemo` returns a report (the `--json` document); the human summary is printed by the command.
 */
import fs from 'node:fs';
import path from 'node:path';
import { loadConfig, type Config } from '../config/env';
import { startStack, type RunningStack } from '../stack/run';
import { bootstrap } from '../db/bootstrap';
import { bootstrapSecret } from '../config/secrets';
import { RoostClient, seg } from './client';
import { push, pushTick, type PushResult } from './push';
import { createProgress } from './progress';
import { startFleet, verifyTree } from '../agent/fleet';
import { resolveExtractDir } from '../agent/agent';
import { rolloutWorkflowId, workflowUiUrl } from '../workflows/client';

/**
 * The default tree: installed packages copied side by side into one working copy (~1,800 real files,
 * ~36 MiB): TypeScript brings an 8.7 MiB file (3 chunks), the Fastify packages bring zero-byte files.
 */
const DEFAULT_PACKAGES = ['typescript', '@fastify', '@sinclair'];

/** Where every machine extracts the demo roost, relative to the machine's root. */
const EXTRACT_PATH = 'roosts/demo';

export interface DemoOptions {
  /** Tree to push (default: DEFAULT_PACKAGES from node_modules). It is copied, so the demo can change it. */
  dir?: string;
  machines: number;
  /** Keep the agents' trees and the working copy under DATA/demo after the run. */
  keep: boolean;
  /** Draw progress bars (TTY) or lines; nothing when quiet. */
  tty: boolean;
  quiet: boolean;
  /** Rollout wait limit in ms. */
  timeoutMs: number;
  /** Overrides for configuration (tests: a database of their own, port 0). */
  env?: NodeJS.ProcessEnv;
  log?: (line: string) => void;
}

export interface RolloutReport {
  label: string;
  versionId: string;
  versionNumber: number;
  rolloutId: string;
  canary: string[];
  fleet: number;
  seconds: number;
  workflowId: string;
  workflowUrl: string;
  historyLength: number;
  stage: string;
  machinesCommitted: number;
  filesSkipped: number;
  chunksDedup: number;
  chunksFetched: number;
}

export interface DemoReport {
  ok: boolean;
  siteId: string;
  roostId: string;
  source: { dir: string; files: number; bytes: number; largestFile: number; zeroByteFiles: number };
  pushes: Array<
    Pick<
      PushResult,
      | 'versionId'
      | 'versionNumber'
      | 'filesTotal'
      | 'bytesTotal'
      | 'chunksTotal'
      | 'chunksUploaded'
      | 'chunksSkipped'
      | 'bytesUploaded'
      | 'timings'
    >
  >;
  rollouts: RolloutReport[];
  verification: Array<{ label: string; machines: number; identical: number; reportedEqualsIntended: number }>;
  rollback: { currentVersionId: string; currentVersionNumber: number; previousVersionId: string | null };
  diff: { summary: Record<string, unknown>; added: string[]; removed: string[]; modified: string[] };
  urls: RunningStack['urls'];
  seconds: number;
}

/** Statistics of a tree: files, bytes, largest file, zero-byte files (regular files only). */
function treeStats(dir: string): DemoReport['source'] {
  let files = 0;
  let bytes = 0;
  let largestFile = 0;
  let zeroByteFiles = 0;
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) {
        const s = fs.statSync(p).size;
        files++;
        bytes += s;
        largestFile = Math.max(largestFile, s);
        if (s === 0) zeroByteFiles++;
      }
    }
  };
  walk(dir);
  return { dir, files, bytes, largestFile, zeroByteFiles };
}

/** Changes a few files of the working copy: appends to two, rewrites one, adds one, deletes one. */
function changeSomeFiles(dir: string): string[] {
  const files: string[] = [];
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile() && fs.statSync(p).size > 0) files.push(p);
    }
  };
  walk(dir);
  const changed: string[] = [];
  const pick = (i: number) => files[Math.floor((i * files.length) / 5) % files.length];
  for (const f of [pick(1), pick(2)]) {
    fs.appendFileSync(f, `\n// changed by the roost demo at ${new Date().toISOString()}\n`);
    changed.push(path.relative(dir, f));
  }
  const rewrite = pick(3);
  fs.writeFileSync(rewrite, `rewritten by the roost demo ${Date.now()}\n`);
  changed.push(path.relative(dir, rewrite));
  const added = path.join(dir, 'ROOST-DEMO-NOTES.txt');
  fs.writeFileSync(added, `added by the roost demo ${new Date().toISOString()}\n`);
  changed.push(path.relative(dir, added));
  const removed = pick(4);
  if (removed !== rewrite) {
    fs.rmSync(removed);
    changed.push(path.relative(dir, removed));
  }
  return changed;
}

interface MachineDeployment {
  roostId: string;
  currentVersionId: string | null;
  reportedVersionId: string | null;
  status: string | null;
  files_skipped?: number;
  chunks_dedup?: number;
  chunks_fetched?: number;
}

async function machineDeployment(
  client: RoostClient,
  siteId: string,
  machineId: string,
  roostId: string,
): Promise<MachineDeployment | undefined> {
  const res = await client.request<{ deployments: MachineDeployment[] }>(
    'GET',
    `/api/sites/${seg(siteId)}/machines/${seg(machineId)}/deployments`,
  );
  return res.body.deployments.find((d) => d.roostId === roostId);
}

/** Runs the walk-through. Throws when any check fails (after stopping everything). */
export async function runDemo(opts: DemoOptions): Promise<DemoReport> {
  const started = Date.now();
  const log = opts.log ?? (() => undefined);
  // The demo's own API listens on a free port so a running `roost stack` is left alone; service ports at
  // their defaults move to free ones when another clone's services hold them (stack.cfg has the ports used).
  const stack = await startStack(loadConfig({ ROOST_API_PORT: '0', ...process.env, ...(opts.env ?? {}) }), { log, movePortsInUse: true });
  const cfg: Config = stack.cfg;
  const demoDir = path.join(cfg.ROOST_DATA_DIR, 'demo', `run-${Date.now()}`);
  let fleet: Awaited<ReturnType<typeof startFleet>> | undefined;
  try {
    const boot = await bootstrap(stack.api.deps.db, { siteName: 'demo', email: 'demo@roost.local', secret: bootstrapSecret(cfg) });
    const siteId = boot.siteId;
    log(`site ${siteId}, key ${boot.apiKey.slice(0, 12)}…`);
    const client = new RoostClient({ baseUrl: stack.urls.api, apiKey: boot.apiKey });

    // 1. The tree: a working copy of a real software tree, so the demo can change it.
    // Symlinks are copied as what they point to: a roost carries regular files only (push skips links).
    const work = path.join(demoDir, 'source');
    fs.mkdirSync(work, { recursive: true });
    let sourceDir: string;
    if (opts.dir) {
      sourceDir = path.resolve(opts.dir);
      if (!fs.existsSync(sourceDir)) throw new Error(`no such directory: ${sourceDir}`);
      fs.cpSync(sourceDir, work, { recursive: true, dereference: true });
    } else {
      const modules = path.resolve(__dirname, '..', 'node_modules');
      sourceDir = DEFAULT_PACKAGES.map((p) => `node_modules/${p}`).join(' + ');
      for (const p of DEFAULT_PACKAGES) fs.cpSync(path.join(modules, p), path.join(work, p), { recursive: true, dereference: true });
    }
    const source = { ...treeStats(work), dir: sourceDir };
    log(
      `tree ${sourceDir}: ${source.files} files, ${(source.bytes / 1048576).toFixed(1)} MiB, largest ${(source.largestFile / 1048576).toFixed(1)} MiB, ${source.zeroByteFiles} zero-byte`,
    );

    // 2. A new roost and the first push.
    const roost = await client.request<{ roostId: string }>('POST', '/api/roosts', {
      body: { siteId, name: `demo ${new Date().toISOString()}`, targets: [], extractPath: EXTRACT_PATH },
    });
    const roostId = roost.body.roostId;
    const progress = createProgress({ tty: opts.tty, quiet: opts.quiet });
    const doPush = async (description: string) => {
      try {
        return await push({
          client,
          siteId,
          roostId,
          dir: work,
          description,
          onProgress: (p) => progress.update(pushTick(p)),
        });
      } finally {
        progress.stop();
      }
    };
    const v1 = await doPush('demo: first push');
    log(
      `pushed v${v1.versionNumber} ${v1.versionId.slice(0, 12)}: ${v1.chunksUploaded} chunks uploaded, ${v1.chunksSkipped} already stored`,
    );

    // 3. The fleet, enrolled with the site's secret, as the roost's targets.
    const secret = await client.request<{ enrolmentSecret: string }>('POST', `/api/sites/${seg(siteId)}/enrolment-secret`, {
      idempotencyKey: true,
    });
    fleet = await startFleet({
      baseUrl: stack.urls.api,
      siteId,
      enrolmentSecret: secret.body.enrolmentSecret,
      count: opts.machines,
      rootDir: path.join(demoDir, 'machines'),
      machinePrefix: 'demo-pc',
    });
    const machineIds = fleet.machineIds;
    log(`fleet of ${machineIds.length} simulated machines enrolled`);
    await client.request('PATCH', `/api/roosts/${seg(roostId)}`, { body: { siteId, targets: machineIds } });

    const rollouts: RolloutReport[] = [];
    const verification: DemoReport['verification'] = [];
    const f = fleet;
    const deployAndVerify = async (label: string, versionId: string, versionNumber: number, expectDir: string) => {
      const t0 = Date.now();
      const res = await client.request<{ rolloutId: string; canary: string[]; fleet: string[]; stage: string }>(
        'POST',
        `/api/roosts/${seg(roostId)}/deploy`,
        {
          body: { siteId, versionId },
          idempotencyKey: true,
        },
      );
      const workflowId = rolloutWorkflowId(siteId, roostId, versionId);
      log(
        `${label}: rollout ${res.body.rolloutId} (canary ${res.body.canary.join(', ')}; fleet ${res.body.fleet.length}) — watch it at ${workflowUiUrl(cfg, workflowId)}`,
      );
      const handle = stack.api.deps.temporal.workflow.getHandle(workflowId);
      let timer: NodeJS.Timeout | undefined;
      const outcome = await Promise.race([
        handle.result(),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`${label}: rollout did not finish within ${opts.timeoutMs} ms`)), opts.timeoutMs);
        }),
      ]).finally(() => clearTimeout(timer)); // a pending limit timer would keep the process alive after the demo
      const seconds = (Date.now() - t0) / 1000;
      const history = await handle.fetchHistory();
      const stage = String((outcome as { stage?: string } | undefined)?.stage ?? 'completed');
      // Every tree byte for byte, and reported = intended everywhere.
      let identical = 0;
      let agreeing = 0;
      let filesSkipped = 0;
      let chunksDedup = 0;
      let chunksFetched = 0;
      for (const agent of f.agents) {
        const diff = await verifyTree(expectDir, resolveExtractDir(agent.rootDir, EXTRACT_PATH));
        if (diff.length === 0) identical++;
        else
          log(
            `  ${agent.machineId}: ${diff.length} differences, e.g. ${diff
              .slice(0, 3)
              .map((x) => `${x.kind} ${x.path}`)
              .join('; ')}`,
          );
        const d = await machineDeployment(client, siteId, agent.machineId, roostId);
        if (d && d.reportedVersionId === versionId && d.currentVersionId === versionId && d.status === 'committed') agreeing++;
        filesSkipped += d?.files_skipped ?? 0;
        chunksDedup += d?.chunks_dedup ?? 0;
        chunksFetched += d?.chunks_fetched ?? 0;
      }
      rollouts.push({
        label,
        versionId,
        versionNumber,
        rolloutId: res.body.rolloutId,
        canary: res.body.canary,
        fleet: res.body.fleet.length,
        seconds,
        workflowId,
        workflowUrl: workflowUiUrl(cfg, workflowId),
        historyLength: history.events?.length ?? 0,
        stage,
        machinesCommitted: agreeing,
        filesSkipped,
        chunksDedup,
        chunksFetched,
      });
      verification.push({ label, machines: f.agents.length, identical, reportedEqualsIntended: agreeing });
      log(
        `${label}: ${identical}/${f.agents.length} trees identical, reported = intended on ${agreeing}, ${seconds.toFixed(1)} s, files skipped ${filesSkipped}, chunks reused ${chunksDedup}`,
      );
      if (identical !== f.agents.length || agreeing !== f.agents.length) throw new Error(`${label}: not every machine holds the version`);
    };

    // 4. Canary then fleet, verified.
    const original = path.join(demoDir, 'source-v1');
    fs.cpSync(work, original, { recursive: true });
    await deployAndVerify('deploy v1', v1.versionId, v1.versionNumber, original);

    // 5. A few changes, pushed again: only new chunks upload; agents skip unchanged files.
    const changed = changeSomeFiles(work);
    log(`changed ${changed.length} files: ${changed.join(', ')}`);
    const v2 = await doPush('demo: a few files changed');
    log(`pushed v${v2.versionNumber}: ${v2.chunksUploaded} chunks uploaded, ${v2.chunksSkipped} skipped (already stored)`);
    await deployAndVerify('deploy v2', v2.versionId, v2.versionNumber, work);

    // 6. Roll back to the first version, show the diff, and put the fleet back on it.
    const rb = await client.request<DemoReport['rollback']>('POST', `/api/roosts/${seg(roostId)}/rollback`, {
      body: { siteId, targetVersion: '1' },
      idempotencyKey: true,
    });
    log(`rolled back: current = v${rb.body.currentVersionNumber} ${rb.body.currentVersionId.slice(0, 12)}`);
    const diff = await client.request<{
      summary: Record<string, unknown>;
      added: Array<{ path: string }>;
      removed: Array<{ path: string }>;
      modified: Array<{ path: string }>;
    }>('GET', `/api/roosts/${seg(roostId)}/versions/${v2.versionId}/diff`, { query: { siteId, against: v1.versionId } });
    await deployAndVerify('redeploy v1 after rollback', v1.versionId, v1.versionNumber, original);

    const report: DemoReport = {
      ok: true,
      siteId,
      roostId,
      source,
      pushes: [v1, v2].map((p) => ({
        versionId: p.versionId,
        versionNumber: p.versionNumber,
        filesTotal: p.filesTotal,
        bytesTotal: p.bytesTotal,
        chunksTotal: p.chunksTotal,
        chunksUploaded: p.chunksUploaded,
        chunksSkipped: p.chunksSkipped,
        bytesUploaded: p.bytesUploaded,
        timings: p.timings,
      })),
      rollouts,
      verification,
      rollback: {
        currentVersionId: rb.body.currentVersionId,
        currentVersionNumber: rb.body.currentVersionNumber,
        previousVersionId: rb.body.previousVersionId,
      },
      diff: {
        summary: diff.body.summary,
        added: diff.body.added.map((x) => x.path),
        removed: diff.body.removed.map((x) => x.path),
        modified: diff.body.modified.map((x) => x.path),
      },
      urls: stack.urls,
      seconds: (Date.now() - started) / 1000,
    };
    return report;
  } finally {
    await fleet?.stop().catch(() => undefined);
    await stack.stop();
    if (!opts.keep) fs.rmSync(demoDir, { recursive: true, force: true });
  }
}
