/**
 * Polling for tests whose condition comes from background work (checks on a timer, workflows, agents,
 * other processes).
 */

/**
 * Calls `check` every `everyMs` (ms) until it returns true or `ms` (ms) have passed.
 * @returns whether it became true; the caller's own assertion then says what was missing.
 */
export async function waitUntil(check: () => boolean | Promise<boolean>, ms = 10_000, everyMs = 20): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= deadline) return false;
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

type Falsy = undefined | null | false | 0 | '';

/**
 * Calls `probe` every `everyMs` (ms) until it returns a truthy value, and returns that value (so 0 and ''
 * count as not yet).
 * @throws Error `timed out after <ms> ms waiting for <what>` when `ms` (ms) pass first. The default (60 s)
 *   stays under jest's 120 s test timeout (jest.config.js), so a state the test missed fails with its name
 *   instead of as a test timeout.
 */
export async function waitFor<T>(what: string, probe: () => T | Promise<T>, ms = 60_000, everyMs = 50): Promise<Exclude<T, Falsy>> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v) return v as Exclude<T, Falsy>;
    if (Date.now() >= deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
