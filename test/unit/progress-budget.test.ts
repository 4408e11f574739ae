/**
 * services/agent.ts progressIntervalFor: the progress gap the poll answer asks for spreads
 * PROGRESS_REPORTS_PER_SECOND over the site's commands in flight, capped at MAX_PROGRESS_INTERVAL_MS.
 */
import { MAX_PROGRESS_INTERVAL_MS, PROGRESS_REPORTS_PER_SECOND, progressIntervalFor } from '../../services/agent';

describe('progressIntervalFor', () => {
  it('is 0 with nothing in flight (no ask) and grows linearly with the commands in flight', () => {
    expect(progressIntervalFor(0)).toBe(0);
    expect(progressIntervalFor(-3)).toBe(0);
    expect(progressIntervalFor(1)).toBe(Math.ceil(1000 / PROGRESS_REPORTS_PER_SECOND));
    expect(progressIntervalFor(250)).toBe(10_000);
    expect(progressIntervalFor(500)).toBe(20_000);
  });

  it('keeps the reports of the whole site at the budget: in-flight ÷ interval ≤ PROGRESS_REPORTS_PER_SECOND', () => {
    for (const n of [1, 7, 99, 250, 500, 749]) expect(n / (progressIntervalFor(n) / 1000)).toBeLessThanOrEqual(PROGRESS_REPORTS_PER_SECOND);
  });

  it('never asks for more than MAX_PROGRESS_INTERVAL_MS, well inside the stall bound', () => {
    expect(progressIntervalFor(750)).toBe(MAX_PROGRESS_INTERVAL_MS);
    expect(progressIntervalFor(1000)).toBe(MAX_PROGRESS_INTERVAL_MS);
    expect(progressIntervalFor(1_000_000)).toBe(MAX_PROGRESS_INTERVAL_MS);
    expect(MAX_PROGRESS_INTERVAL_MS).toBeLessThan(120_000);
  });
});
