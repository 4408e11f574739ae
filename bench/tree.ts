/**
 * The benchmark tree: a deterministic, pseudo-random (incompressible) file tree of a given size, generated
 * once under `DATA/bench/tree-<size>mib/` and reused by later runs (a manifest `tree-<size>mib.json`
 * beside it records what was generated; the tree is regenerated when the manifest or any file size does
 * not match the plan).
 *
 * The mix, by bytes (docs/benchmarks.md): ~15 % many small files (64 B..64 KiB, log-uniform, ~13 KiB on
 * average: about 12,000 files per GiB), ~35 % medium files (64 KiB..4 MiB, log-uniform), ~50 % a few
 * large files (9..48 MiB, so several 4 MiB chunks each), one zero-byte file, and two medium files
 * duplicated under other paths (a realistic tree repeats a few files; the push uploads their chunks once).
 * Content is AES-256-CTR keystream keyed by the seed, one stream per distinct content, so every run and
 * every machine generates byte-identical trees.
 */
import { createCipheriv, createHash } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { log, mib, prng } from './util';

const KiB = 1024;
const MiB = 1024 * KiB;
/** Bump when the plan or the content function changes, so old trees are regenerated. */
const GENERATOR_VERSION = 2;
const DEFAULT_SEED = 20240611;

/** One planned file: relative path, size in bytes, and which content stream fills it. */
export interface PlannedFile {
  path: string;
  size: number;
  /** Files with the same content key hold identical bytes (the duplicates). */
  contentKey: number;
  kind: 'small' | 'medium' | 'large' | 'empty' | 'duplicate';
}

/** What a generated tree holds (also the manifest's content). */
export interface TreeInfo {
  generator: number;
  seed: number;
  sizeMiB: number;
  root: string;
  files: number;
  bytes: number;
  /** Files per kind. */
  kinds: Record<PlannedFile['kind'], number>;
  /** Largest file in bytes. */
  largest: number;
}

/** Log-uniform integer in [lo, hi]. */
function logUniform(random: () => number, lo: number, hi: number): number {
  return Math.round(Math.exp(Math.log(lo) + random() * (Math.log(hi) - Math.log(lo))));
}

/**
 * The file list of a tree of about `sizeMiB` MiB (exactly `sizeMiB` MiB of content in total). Pure:
 * the same arguments always give the same plan.
 */
export function planTree(sizeMiB: number, seed = DEFAULT_SEED): PlannedFile[] {
  const total = Math.round(sizeMiB * MiB);
  const random = prng(seed);
  const files: PlannedFile[] = [];
  let key = 0;

  // Large: 9..48 MiB each, about half the bytes (at least one when the tree can hold it).
  let largeBudget = Math.round(total * 0.5);
  let n = 0;
  while (largeBudget >= 9 * MiB) {
    const size = Math.min(largeBudget, 9 * MiB + Math.floor(random() * 39 * MiB) + Math.floor(random() * MiB));
    files.push({ path: `packs/pack${String(n).padStart(3, '0')}.pak`, size, contentKey: ++key, kind: 'large' });
    largeBudget -= size;
    n++;
  }
  const largeBytes = files.reduce((s, f) => s + f.size, 0);

  // Small: 64 B..64 KiB, ~15 % of the bytes, 64 per folder.
  const smallBudget = Math.round(total * 0.15);
  let smallBytes = 0;
  n = 0;
  while (smallBytes < smallBudget) {
    const size = Math.min(smallBudget - smallBytes, logUniform(random, 64, 64 * KiB));
    const folder = `res/s${String(Math.floor(n / 64)).padStart(3, '0')}`;
    const ext = ['json', 'xml', 'txt', 'cfg', 'dat'][n % 5];
    files.push({ path: `${folder}/item${String(n).padStart(5, '0')}.${ext}`, size, contentKey: ++key, kind: 'small' });
    smallBytes += size;
    n++;
  }

  // Medium: 64 KiB..4 MiB, the rest, 32 per folder: random sizes up to ~90 % of the budget, then two
  // duplicates of the two smallest medium files (when they fit), then one file with the remainder.
  const mediumBudget = total - largeBytes - smallBytes;
  const medium: PlannedFile[] = [];
  let mediumBytes = 0;
  n = 0;
  const mediumFile = (size: number): PlannedFile => {
    const folder = `lib/m${String(Math.floor(n / 32)).padStart(2, '0')}`;
    const ext = ['dll', 'bin', 'so', 'dat'][n % 4];
    const f: PlannedFile = { path: `${folder}/module${String(n).padStart(4, '0')}.${ext}`, size, contentKey: ++key, kind: 'medium' };
    n++;
    return f;
  };
  while (mediumBytes < mediumBudget * 0.9) {
    const size = Math.min(mediumBudget - mediumBytes, logUniform(random, 64 * KiB, 4 * MiB));
    medium.push(mediumFile(size));
    mediumBytes += size;
  }
  const smallestFirst = [...medium].sort((a, b) => a.size - b.size || a.contentKey - b.contentKey);
  for (let d = 0; d < 2 && d < smallestFirst.length; d++) {
    const src = smallestFirst[d];
    if (mediumBytes + src.size > mediumBudget) break;
    files.push({
      path: `plugins/copy${d}/${path.posix.basename(src.path)}`,
      size: src.size,
      contentKey: src.contentKey,
      kind: 'duplicate',
    });
    mediumBytes += src.size;
  }
  if (mediumBudget > mediumBytes) medium.push(mediumFile(mediumBudget - mediumBytes));
  files.push(...medium);
  files.push({ path: 'config/empty.flag', size: 0, contentKey: 0, kind: 'empty' });
  return files;
}

/** Summary of a plan (what the manifest records). */
export function treeInfo(root: string, sizeMiB: number, plan: PlannedFile[], seed = DEFAULT_SEED): TreeInfo {
  const kinds: TreeInfo['kinds'] = { small: 0, medium: 0, large: 0, empty: 0, duplicate: 0 };
  for (const f of plan) kinds[f.kind]++;
  return {
    generator: GENERATOR_VERSION,
    seed,
    sizeMiB,
    root,
    files: plan.length,
    bytes: plan.reduce((s, f) => s + f.size, 0),
    kinds,
    largest: plan.reduce((m, f) => Math.max(m, f.size), 0),
  };
}

/** Writes `size` bytes of content stream `contentKey` to `abs` (1 MiB blocks). */
async function writeContent(abs: string, size: number, contentKey: number, key: Buffer): Promise<void> {
  const iv = Buffer.alloc(16);
  iv.writeUInt32BE(contentKey, 0);
  const cipher = createCipheriv('aes-256-ctr', key, iv);
  const fh = await fsp.open(abs, 'w');
  try {
    const zeros = Buffer.alloc(Math.min(size, MiB));
    let left = size;
    while (left > 0) {
      const n = Math.min(left, zeros.length);
      await fh.write(cipher.update(zeros.subarray(0, n)));
      left -= n;
    }
  } finally {
    await fh.close();
  }
}

/** True when every planned file exists with its planned size (cheap: one stat per file). */
async function matchesPlan(root: string, plan: PlannedFile[]): Promise<boolean> {
  for (const f of plan) {
    const st = await fsp.stat(path.join(root, f.path)).catch(() => null);
    if (!st || !st.isFile() || st.size !== f.size) return false;
  }
  return true;
}

/**
 * Returns the tree of `sizeMiB` MiB under `benchDir`, generating it when missing or stale.
 * @throws when the disk cannot hold it.
 */
export async function ensureTree(benchDir: string, sizeMiB: number, seed = DEFAULT_SEED): Promise<TreeInfo> {
  const name = `tree-${sizeMiB}mib`;
  const root = path.join(benchDir, name);
  const manifestPath = path.join(benchDir, `${name}.json`);
  const plan = planTree(sizeMiB, seed);
  const info = treeInfo(root, sizeMiB, plan, seed);
  if (fs.existsSync(manifestPath)) {
    const stored = JSON.parse(fs.readFileSync(manifestPath, 'utf8')) as Partial<TreeInfo>;
    if (
      stored.generator === info.generator &&
      stored.seed === seed &&
      stored.bytes === info.bytes &&
      stored.files === info.files &&
      (await matchesPlan(root, plan))
    ) {
      log(`tree ${root}: reusing (${info.files} files, ${mib(info.bytes)})`);
      return info;
    }
  }
  log(
    `tree ${root}: generating ${info.files} files, ${mib(info.bytes)} (small ${info.kinds.small}, medium ${info.kinds.medium}, large ${info.kinds.large}, duplicates ${info.kinds.duplicate}, empty ${info.kinds.empty})`,
  );
  await fsp.rm(manifestPath, { force: true });
  await fsp.rm(root, { recursive: true, force: true });
  const key = createHash('sha256').update(`roost-bench:${seed}`).digest();
  const folders = new Set(plan.map((f) => path.dirname(path.join(root, f.path))));
  for (const d of folders) await fsp.mkdir(d, { recursive: true });
  let written = 0;
  let nextReport = 256 * MiB;
  for (const f of plan) {
    await writeContent(path.join(root, f.path), f.size, f.contentKey, key);
    written += f.size;
    if (written >= nextReport) {
      log(`tree: ${mib(written)} of ${mib(info.bytes)} written`);
      nextReport += 256 * MiB;
    }
  }
  fs.writeFileSync(manifestPath, JSON.stringify(info, null, 2) + '\n');
  return info;
}
