/**
 * test/support/wait.ts: the polling helpers every background-work test waits with.
 */
import { waitFor, waitUntil } from '../support/wait';

describe('waitFor', () => {
  it('returns the first truthy value the probe gives, after the falsy ones (0 and empty string count as not yet)', async () => {
    const answers: unknown[] = [undefined, null, false, 0, '', { ready: true }];
    let calls = 0;
    const v = await waitFor('the sixth answer', () => answers[calls++], 5_000, 1);
    expect(v).toEqual({ ready: true });
    expect(calls).toBe(6);
  });

  it('fails naming what it waited for once the deadline passes, after polling more than once', async () => {
    let calls = 0;
    const started = Date.now();
    await expect(
      waitFor(
        'a state that never comes',
        async () => {
          calls++;
          return false;
        },
        200,
        20,
      ),
    ).rejects.toThrow('timed out after 200 ms waiting for a state that never comes');
    expect(Date.now() - started).toBeGreaterThanOrEqual(200);
    expect(calls).toBeGreaterThan(1);
  });

  it('passes a probe error through at once', async () => {
    await expect(waitFor('a broken probe', () => Promise.reject(new Error('probe failed')), 5_000)).rejects.toThrow('probe failed');
  });
});

describe('waitUntil', () => {
  it('answers true when the check holds and false at the deadline', async () => {
    let n = 0;
    expect(await waitUntil(() => ++n === 3, 5_000, 1)).toBe(true);
    expect(n).toBe(3);
    expect(await waitUntil(() => false, 50, 10)).toBe(false);
  });
});
