/**
 * Polling for tests whose condition comes from background work (checks on a timer, other processes).
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
