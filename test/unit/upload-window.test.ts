/**
 * The upload window of a push (cli/upload-window.ts): how many chunk PUTs run at once, chosen from the
 * chunks' sizes (many small ones, 4 MiB ones bounded by bytes), or a plain count with --concurrency.
 */
import {
  UPLOAD_BYTES_IN_FLIGHT,
  UPLOAD_CHUNKS_IN_FLIGHT,
  UploadWindow,
  admits,
  concurrencyFor,
  uploadLimits,
} from '../../cli/upload-window';
import { CHUNK_SIZE } from '../../domain/version';

const many = (n: number, size: number) => new Array<number>(n).fill(size);

describe('the concurrency rule', () => {
  const auto = uploadLimits();

  it('runs up to 32 small chunks at once', () => {
    expect(auto).toEqual({ maxChunks: UPLOAD_CHUNKS_IN_FLIGHT, maxBytes: UPLOAD_BYTES_IN_FLIGHT });
    expect(concurrencyFor(auto, many(500, 2_000))).toBe(32);
    expect(concurrencyFor(auto, many(500, 200_000))).toBe(32);
  });

  it('bounds 4 MiB chunks by bytes in flight: 16 at once', () => {
    expect(concurrencyFor(auto, many(100, CHUNK_SIZE))).toBe(UPLOAD_BYTES_IN_FLIGHT / CHUNK_SIZE);
    expect(concurrencyFor(auto, many(100, CHUNK_SIZE))).toBe(16);
    // a mix: the bytes decide as soon as the large chunks fill the budget
    expect(concurrencyFor(auto, [...many(15, CHUNK_SIZE), ...many(10, 1_000)])).toBe(25);
    expect(concurrencyFor(auto, [...many(16, CHUNK_SIZE), 1])).toBe(16);
  });

  it('always lets one chunk start, whatever its size', () => {
    expect(admits(auto, { chunks: 0, bytes: 0 }, UPLOAD_BYTES_IN_FLIGHT * 2)).toBe(true);
    expect(admits(auto, { chunks: 1, bytes: 10 }, UPLOAD_BYTES_IN_FLIGHT)).toBe(false);
    expect(concurrencyFor(auto, [])).toBe(0);
  });

  it('--concurrency N is N chunks whatever their size', () => {
    expect(uploadLimits(4)).toEqual({ maxChunks: 4, maxBytes: Infinity });
    expect(concurrencyFor(uploadLimits(4), many(50, 10))).toBe(4);
    expect(concurrencyFor(uploadLimits(40), many(50, CHUNK_SIZE))).toBe(40);
    expect(() => uploadLimits(0)).toThrow(RangeError);
    expect(() => uploadLimits(2.5)).toThrow(RangeError);
  });
});

describe('UploadWindow', () => {
  /** A task that finishes when its `release` is called. */
  function gate() {
    let release!: () => void;
    const done = new Promise<void>((r) => (release = r));
    return { done, release };
  }

  it('starts chunks as the rule admits them, in queue order, and never exceeds it', async () => {
    const w = new UploadWindow(uploadLimits());
    const started: number[] = [];
    const gates = Array.from({ length: 20 }, gate);
    const sizes = [...many(3, CHUNK_SIZE), ...many(17, 1_000)];
    sizes[16] = 40 * CHUNK_SIZE; // an outsized chunk: waits until it is alone
    const runs = sizes.map((size, i) =>
      w.run(size, async () => {
        started.push(i);
        expect(w.inFlight.chunks).toBeLessThanOrEqual(UPLOAD_CHUNKS_IN_FLIGHT);
        await gates[i].done;
        return i;
      }),
    );
    await Promise.resolve();
    expect(started).toEqual([...Array(16).keys()]); // 3 × 4 MiB + 13 small, then the outsized one blocks the queue
    expect(w.queued).toBe(4);
    for (let i = 0; i < 16; i++) gates[i].release();
    await new Promise((r) => setImmediate(r));
    expect(started).toEqual([...Array(17).keys()]); // alone now
    expect(w.inFlight).toEqual({ chunks: 1, bytes: 40 * CHUNK_SIZE });
    gates[16].release();
    for (let i = 17; i < 20; i++) gates[i].release();
    expect(await Promise.all(runs)).toEqual([...Array(20).keys()]);
    expect(w.inFlight).toEqual({ chunks: 0, bytes: 0 });
    expect(w.peakChunks).toBe(16);
  });

  it('frees the place of a chunk whose PUT failed, and clear() rejects only the queued ones', async () => {
    const w = new UploadWindow(uploadLimits(1));
    const first = gate();
    const a = w.run(10, async () => {
      await first.done;
      throw new Error('PUT failed');
    });
    const b = w.run(10, async () => 'b');
    const c = w.run(10, async () => 'c');
    expect(w.queued).toBe(2);
    first.release();
    await expect(a).rejects.toThrow('PUT failed');
    expect(await b).toBe('b');
    expect(await c).toBe('c');

    const hold = gate();
    const d = w.run(10, () => hold.done.then(() => 'd'));
    const e = w.run(10, async () => 'e');
    w.clear(new Error('push stopped'));
    await expect(e).rejects.toThrow('push stopped');
    hold.release();
    expect(await d).toBe('d');
    expect(w.inFlight).toEqual({ chunks: 0, bytes: 0 });
  });

  it('in key order starts queued chunks by ascending key (ties in queueing order)', async () => {
    const w = new UploadWindow(uploadLimits(1), 'key');
    const started: string[] = [];
    const first = gate();
    const runs = [w.run(1, () => first.done.then(() => started.push('m')), 'm')];
    for (const [key, label] of [
      ['f', 'f1'],
      ['c', 'c'],
      ['f', 'f2'],
      ['a', 'a'],
      ['z', 'z'],
    ] as const) {
      runs.push(w.run(1, async () => started.push(label), key));
    }
    expect(w.queued).toBe(5);
    first.release();
    await Promise.all(runs);
    expect(started).toEqual(['m', 'a', 'c', 'f1', 'f2', 'z']);

    // FIFO (the default) ignores keys.
    const fifo = new UploadWindow(uploadLimits(1));
    const order: string[] = [];
    const hold = gate();
    const more = [fifo.run(1, () => hold.done.then(() => order.push('x')), 'x')];
    for (const key of ['q', 'b', 'k']) more.push(fifo.run(1, async () => order.push(key), key));
    hold.release();
    await Promise.all(more);
    expect(order).toEqual(['x', 'q', 'b', 'k']);
  });
});
