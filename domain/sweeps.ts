/**
 * Types the background sweeps share between their workflow (workflows/sweeps.ts), activities
 * (activities/sweeps.ts) and repository (db/sweeps.ts); docs/decisions/sweeps.md.
 */

/** A chunk position in (site_id, hash) order: where the next condemn batch of chunk GC starts scanning. */
export type ChunkCursor = [siteId: string, hash: string];
