import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ChunkerError, SYNC_READ_MAX, buildVersionBody, chunkFile, comparePaths, readChunk, scanTree, walkTree } from '../../cli/chunker';
import { CHUNK_SIZE, VERSION_MEDIA_TYPE, computeVersionId, validateVersionBody } from '../../domain/version';
import { hashFiles } from '../../cli/hash-pool';
import { POOL_MIN_BYTES } from '../../cli/chunker';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const PINNED = { producer: 'roost-cli', cliVersion: 'test', createdAt: '2024-01-01T00:00:00.000Z', hostname: 'h', platform: 'linux' };

/** Deterministic pseudo-random bytes (xorshift32), so chunks at different offsets differ. */
function bytes(n: number, seed: number): Buffer {
  const words = new Uint32Array(Math.ceil(n / 4));
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = x >>> 0;
  }
  return Buffer.from(words.buffer, 0, n);
}

let tmp: string;
beforeEach(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'roost-chunker-'));
});
afterEach(async () => {
  await fsp.rm(tmp, { recursive: true, force: true });
});

async function write(rel: string, data: Buffer | string): Promise<string> {
  const abs = path.join(tmp, ...rel.split('/'));
  await fsp.mkdir(path.dirname(abs), { recursive: true });
  await fsp.writeFile(abs, data);
  return abs;
}

describe('chunkFile boundaries', () => {
  it('a file of exactly 4 MiB is one full chunk', async () => {
    const data = bytes(CHUNK_SIZE, 1);
    const chunks = await chunkFile(await write('exact.bin', data), CHUNK_SIZE);
    expect(chunks).toEqual([{ hash: sha(data), size: CHUNK_SIZE }]);
  });

  it('4 MiB + 1 byte is a full chunk and a 1-byte chunk', async () => {
    const data = bytes(CHUNK_SIZE + 1, 2);
    const chunks = await chunkFile(await write('plus1.bin', data), data.length);
    expect(chunks).toEqual([
      { hash: sha(data.subarray(0, CHUNK_SIZE)), size: CHUNK_SIZE },
      { hash: sha(data.subarray(CHUNK_SIZE)), size: 1 },
    ]);
  });

  it('8 MiB + 5 bytes gives three chunks, concatenation reproducing the file', async () => {
    const data = bytes(2 * CHUNK_SIZE + 5, 3);
    const chunks = await chunkFile(await write('big.bin', data), data.length);
    expect(chunks.map((c) => c.size)).toEqual([CHUNK_SIZE, CHUNK_SIZE, 5]);
    expect(chunks.map((c) => c.hash)).toEqual([
      sha(data.subarray(0, CHUNK_SIZE)),
      sha(data.subarray(CHUNK_SIZE, 2 * CHUNK_SIZE)),
      sha(data.subarray(2 * CHUNK_SIZE)),
    ]);
  });

  it('a zero-byte file has no chunks; a small file has one chunk of its size', async () => {
    expect(await chunkFile(await write('empty', ''), 0)).toEqual([]);
    expect(await chunkFile(await write('small', 'hello'), 5)).toEqual([{ hash: sha(Buffer.from('hello')), size: 5 }]);
  });

  it('fails when the file is not the size the walk saw', async () => {
    const abs = await write('grew.txt', 'abc');
    await expect(chunkFile(abs, 2)).rejects.toBeInstanceOf(ChunkerError);
  });
});

describe('walkTree', () => {
  it('lists regular files with forward-slash paths sorted by UTF-8 bytes, skipping and reporting symlinks', async () => {
    await write('b.txt', 'b');
    await write('a/b/c.txt', 'c');
    await write('a-b.txt', 'x');
    await write('C.txt', 'C');
    await write('a/z.txt', 'z');
    await fsp.mkdir(path.join(tmp, 'empty-dir'));
    await fsp.symlink(path.join(tmp, 'b.txt'), path.join(tmp, 'link-to-file'));
    await fsp.symlink(path.join(tmp, 'a'), path.join(tmp, 'a', 'loop'));
    const { files, skipped } = await walkTree(tmp);
    // '-' (0x2d) sorts before '/' (0x2f); uppercase before lowercase.
    expect(files.map((f) => f.path)).toEqual(['C.txt', 'a-b.txt', 'a/b/c.txt', 'a/z.txt', 'b.txt']);
    expect(files.find((f) => f.path === 'a/b/c.txt')).toMatchObject({ size: 1, absPath: path.join(tmp, 'a', 'b', 'c.txt') });
    expect(skipped).toEqual([
      { path: 'a/loop', reason: 'symlink' },
      { path: 'link-to-file', reason: 'symlink' },
    ]);
  });

  it('normalises names to Unicode NFC', async () => {
    const nfd = 'cafe\u0301.txt';
    await write(nfd, 'x');
    const { files } = await walkTree(tmp);
    expect(files.map((f) => f.path)).toEqual(['caf\u00e9.txt']);
    expect(path.basename(files[0].absPath)).toBe(nfd); // still read from the name on disk
  });

  it('refuses names a version cannot carry instead of leaving them out', async () => {
    await write('ok.txt', 'x');
    await write('bad\\name.txt', 'x');
    await expect(walkTree(tmp)).rejects.toMatchObject({ name: 'ChunkerError', paths: ['bad\\name.txt'] });
  });

  it('refuses names that are one file on Windows (docs/decisions/windows-paths.md)', async () => {
    await write('Readme.md', 'x');
    await write('README.md', 'y');
    await write('aux.txt', 'z');
    await expect(walkTree(tmp)).rejects.toMatchObject({ name: 'ChunkerError', paths: ['aux.txt'] });
    await fsp.rm(path.join(tmp, 'aux.txt'));
    await expect(walkTree(tmp)).rejects.toMatchObject({ name: 'ChunkerError', message: expect.stringMatching(/collide on Windows/) });
  });

  it('refuses a root that is not a directory', async () => {
    const abs = await write('f.txt', 'x');
    await expect(walkTree(abs)).rejects.toBeInstanceOf(ChunkerError);
    await expect(walkTree(path.join(tmp, 'nope'))).rejects.toBeInstanceOf(ChunkerError);
  });
});

describe('scanTree', () => {
  async function makeTree(order: 'forward' | 'reverse'): Promise<void> {
    const entries: Array<[string, Buffer | string]> = [
      ['bin/app.exe', bytes(CHUNK_SIZE + 100, 7)],
      ['config/settings.json', '{"a":1}'],
      ['config/empty.cfg', ''],
      ['readme.txt', 'hello'],
      ['dup/copy.txt', 'hello'],
    ];
    for (const [rel, data] of order === 'forward' ? entries : [...entries].reverse()) await write(rel, data);
  }

  it('builds a valid version body: schemaVersion 2, media type, producer config, files sorted, zero-byte without chunks', async () => {
    await makeTree('forward');
    const scan = await scanTree(tmp);
    const { body } = scan;
    expect(validateVersionBody(body)).toBeNull();
    expect(body.schemaVersion).toBe(2);
    expect(body.mediaType).toBe(VERSION_MEDIA_TYPE);
    expect(body.config).toMatchObject({ producer: 'roost-cli', hostname: os.hostname(), platform: process.platform });
    expect(typeof body.config.cliVersion).toBe('string');
    expect(new Date(String(body.config.createdAt)).toISOString()).toBe(body.config.createdAt);
    expect(body.files.map((f) => f.path)).toEqual([
      'bin/app.exe',
      'config/empty.cfg',
      'config/settings.json',
      'dup/copy.txt',
      'readme.txt',
    ]);
    expect(body.files[1]).toEqual({ path: 'config/empty.cfg', size: 0, chunks: [] });
    expect(body.files[0].chunks.map((c) => c.size)).toEqual([CHUNK_SIZE, 100]);
    expect(scan.bytesTotal).toBe(CHUNK_SIZE + 100 + 7 + 5 + 5);
    // identical content is one distinct chunk with one location; the empty file contributes none
    expect(scan.locations.size).toBe(4);
    const second = body.files[0].chunks[1];
    expect(scan.locations.get(second.hash)).toEqual({ absPath: path.join(tmp, 'bin', 'app.exe'), offset: CHUNK_SIZE, size: 100 });
  });

  it('is deterministic: same tree, any creation order, any concurrency → same body and version id', async () => {
    await makeTree('forward');
    const a = await scanTree(tmp, { config: PINNED, concurrency: 1 });
    await fsp.rm(tmp, { recursive: true, force: true });
    await fsp.mkdir(tmp);
    await makeTree('reverse');
    const b = await scanTree(tmp, { config: PINNED, concurrency: 4 });
    expect(b.body).toEqual(a.body);
    expect(computeVersionId(b.body)).toBe(computeVersionId(a.body));
  });

  it('reports progress up to every byte and file', async () => {
    await makeTree('forward');
    const ticks: Array<{ filesDone: number; bytesDone: number; bytesTotal: number }> = [];
    await scanTree(tmp, { onProgress: (p) => ticks.push(p) });
    const last = ticks[ticks.length - 1];
    expect(last).toMatchObject({ filesDone: 5, filesTotal: 5, bytesDone: last.bytesTotal });
  });

  it('rejects a tree with no regular files', async () => {
    await fsp.mkdir(path.join(tmp, 'only-dirs', 'deeper'), { recursive: true });
    await expect(scanTree(tmp)).rejects.toThrow(/no regular files/);
  });
});

/** A tree above POOL_MIN_BYTES: chunk boundaries, an empty file, and more small files than one batch holds. */
async function bigTree(): Promise<void> {
  await write('big/two-and-a-bit.bin', bytes(2 * CHUNK_SIZE + 3, 11));
  await write('big/exact.bin', bytes(CHUNK_SIZE, 12));
  await write('big/empty.bin', '');
  for (let i = 0; i < 300; i++) await write(`small/f${String(i).padStart(3, '0')}.txt`, `file ${i % 250}`);
}

describe('hashing on threads (cli/hash-pool.ts)', () => {
  it('gives the same body, chunks and locations as hashing on the main thread', async () => {
    await bigTree();
    const inline = await scanTree(tmp, { config: PINNED, threads: 1 });
    expect(inline.bytesTotal).toBeGreaterThanOrEqual(POOL_MIN_BYTES);
    const ticks: Array<{ filesDone: number; bytesDone: number }> = [];
    const pooled = await scanTree(tmp, { config: PINNED, threads: 3, onProgress: (p) => ticks.push(p) });
    expect(pooled.body).toEqual(inline.body);
    expect([...pooled.locations.entries()]).toEqual([...inline.locations.entries()]);
    expect(pooled.body.files.find((f) => f.path === 'big/two-and-a-bit.bin')?.chunks.map((c) => c.size)).toEqual([
      CHUNK_SIZE,
      CHUNK_SIZE,
      3,
    ]);
    expect(ticks[ticks.length - 1]).toMatchObject({ filesDone: 303, bytesDone: inline.bytesTotal });
  });

  it('reports a file it cannot read per file, in job order, and counts every byte it hashed', async () => {
    const a = await write('a.bin', bytes(CHUNK_SIZE + 1, 3));
    let seen = 0;
    const out = await hashFiles(
      [
        { absPath: a, size: CHUNK_SIZE + 1 },
        { absPath: path.join(tmp, 'missing.bin'), size: 1 },
      ],
      { threads: 2, onBytes: (n) => (seen += n) },
    );
    expect(out[0]).toEqual({ chunks: await chunkFile(a), total: CHUNK_SIZE + 1 });
    expect(out[1]).toMatchObject({ code: 'ENOENT' });
    expect(seen).toBe(CHUNK_SIZE + 1);
  });

  it('hands each outcome to onOutcome once, as its batch comes back, equal to the returned list', async () => {
    await bigTree();
    const { files } = await walkTree(tmp);
    const streamed = new Map<number, unknown>();
    const out = await hashFiles(files, {
      threads: 2,
      onOutcome: (i, o) => {
        expect(streamed.has(i)).toBe(false);
        streamed.set(i, o);
      },
    });
    expect(streamed.size).toBe(files.length);
    out.forEach((o, i) => expect(streamed.get(i)).toEqual(o));
  });
});

describe('hashFiles carrying small files (CarryBudget)', () => {
  it("hands over small files' bytes with their chunks, only through onOutcome, and asks the budget per batch", async () => {
    const small = await write('small.bin', bytes(1000, 1));
    const edge = await write('edge.bin', bytes(4096, 2));
    const over = await write('over.bin', bytes(4097, 3));
    const empty = await write('empty.bin', Buffer.alloc(0));
    const asked: number[] = [];
    const handed = new Map<number, Uint8Array | undefined>();
    const jobs = [small, edge, over, empty].map((absPath) => ({ absPath, size: 0 }));
    for (const j of jobs) j.size = (await fsp.stat(j.absPath)).size;
    const out = await hashFiles(jobs, {
      threads: 2,
      carry: { maxFileBytes: 4096, take: (n) => (asked.push(n), true) },
      onOutcome: (i, o) => handed.set(i, 'bytes' in o ? o.bytes : undefined),
    });
    expect(asked).toEqual([1000 + 4096]); // one batch; the 4097-byte and empty files are not carried
    expect(Buffer.from(handed.get(0)!).equals(bytes(1000, 1))).toBe(true);
    expect(Buffer.from(handed.get(1)!).equals(bytes(4096, 2))).toBe(true);
    expect([handed.get(2), handed.get(3)]).toEqual([undefined, undefined]);
    // Same chunks as hashing without carrying; the returned list holds no bytes.
    const plain = await hashFiles(jobs, { threads: 2 });
    expect(out).toEqual(plain);
    expect(out.every((o) => !('bytes' in o))).toBe(true);
  });

  it('carries nothing from a batch the budget refuses', async () => {
    const a = await write('a.bin', bytes(100, 4));
    const handed: unknown[] = [];
    await hashFiles([{ absPath: a, size: 100 }], {
      threads: 1,
      carry: { maxFileBytes: 1 << 20, take: () => false },
      onOutcome: (_i, o) => handed.push('bytes' in o ? o.bytes : undefined),
    });
    expect(handed).toEqual([undefined]);
  });

  it('shows a carried file that grew since the walk in its total and hands no bytes over', async () => {
    const a = await write('grew.bin', bytes(200, 5));
    const [o] = await hashFiles([{ absPath: a, size: 100 }], {
      threads: 1,
      carry: { maxFileBytes: 1 << 20, take: () => true },
      onOutcome: () => undefined,
    });
    expect(o).toMatchObject({ total: 101 });
    expect('bytes' in o && o.bytes).toBeFalsy();
  });

  it('scanTree passes the bytes to onEntry on hashing threads, and they hash to the entry', async () => {
    await bigTree();
    const carried: Array<[string, Buffer]> = [];
    await scanTree(tmp, {
      config: PINNED,
      threads: 2,
      carry: { maxFileBytes: 64 * 1024, take: () => true },
      onEntry: (_f, entry, b) => {
        if (b) carried.push([entry.chunks[0].hash, b]);
      },
    });
    expect(carried.length).toBeGreaterThan(0);
    for (const [hash, b] of carried) expect(sha(b)).toBe(hash);
  });
});

describe('readChunk', () => {
  it('reads a chunk back from its offset and checks its digest', async () => {
    const data = bytes(CHUNK_SIZE + 10, 9);
    const abs = await write('f.bin', data);
    const tail = data.subarray(CHUNK_SIZE);
    expect((await readChunk({ absPath: abs, offset: CHUNK_SIZE, size: 10 }, sha(tail))).equals(tail)).toBe(true);
  });

  it('returns bytes the hashing carried as they are, without opening the file', async () => {
    const carried = Buffer.from('carried');
    const gone = path.join(tmp, 'deleted-since.bin');
    expect(await readChunk({ absPath: gone, offset: 0, size: carried.length, bytes: carried }, sha(carried))).toBe(carried);
  });

  it('fails when the file changed since hashing', async () => {
    const abs = await write('f.txt', 'hello');
    const hash = sha(Buffer.from('hello'));
    await fsp.writeFile(abs, 'jello');
    await expect(readChunk({ absPath: abs, offset: 0, size: 5 }, hash)).rejects.toBeInstanceOf(ChunkerError);
  });

  it('reads a chunk above SYNC_READ_MAX (the asynchronous path) whole', async () => {
    const data = bytes(CHUNK_SIZE, 4);
    const abs = await write('big.bin', data);
    expect(CHUNK_SIZE).toBeGreaterThan(SYNC_READ_MAX);
    expect((await readChunk({ absPath: abs, offset: 0, size: CHUNK_SIZE }, sha(data))).equals(data)).toBe(true);
  });

  it.each([
    ['small (synchronous read)', 1000],
    ['large (asynchronous read)', SYNC_READ_MAX + 1],
  ])('fails when a %s chunk was truncated since hashing', async (_name, size) => {
    const data = bytes(size, 7);
    const abs = await write(`t-${size}.bin`, data);
    await fsp.truncate(abs, size - 1);
    await expect(readChunk({ absPath: abs, offset: 0, size }, sha(data))).rejects.toBeInstanceOf(ChunkerError);
  });

  it('rejects with the fs error when the file is gone', async () => {
    const abs = await write('gone.bin', 'x');
    await fsp.rm(abs);
    await expect(readChunk({ absPath: abs, offset: 0, size: 1 }, sha(Buffer.from('x')))).rejects.toMatchObject({ code: 'ENOENT' });
  });
});

describe('ordering helpers', () => {
  it('buildVersionBody sorts files by path whatever the input order', () => {
    const body = buildVersionBody(
      [
        { path: 'z', size: 0, chunks: [] },
        { path: 'a/b', size: 0, chunks: [] },
      ],
      PINNED,
    );
    expect(body.files.map((f) => f.path)).toEqual(['a/b', 'z']);
  });

  it('comparePaths orders by UTF-8 bytes (astral after BMP private use)', () => {
    expect(['\u{1F600}', '\uE000', 'a'].sort(comparePaths)).toEqual(['a', '\uE000', '\u{1F600}']);
  });
});
