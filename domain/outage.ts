/**
 * Which failures mean "a dependency is down" rather than "a bug" (docs/decisions/outages.md): a client then gets
 * 503 `service_unavailable` with `Retry-After`, which the CLI and the agent retry, instead of 500.
 *
 * Pure: classifies by the error's own fields (error codes, SQLSTATE classes, the `dependency` mark db/pool.ts puts on
 * connection failures that carry no SQLSTATE), never by message text.
 */

/** Network error codes of Node's sockets and DNS that mean the other side could not be reached or went away. */
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
  'ENOTFOUND',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_SOCKET',
]);

/**
 * SQLSTATEs of an unavailable database: class 08 (connection exception), 57P01..57P03 (administrator or crash
 * shutdown, cannot connect now), 53300 (too many connections).
 */
function isUnavailableSqlState(code: string): boolean {
  return code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03' || code === '53300';
}

/** gRPC status codes (Temporal's client) that mean the service is unreachable: UNAVAILABLE (14), DEADLINE_EXCEEDED (4). */
const GRPC_UNAVAILABLE = new Set([4, 14]);

/** The dependency a failure says is unavailable, or null when the failure is something else. */
export function unavailableDependency(err: unknown): 'database' | 'blob storage' | 'temporal' | 'network' | null {
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e !== null && typeof e === 'object' && !seen.has(e)) {
    seen.add(e);
    const o = e as {
      code?: unknown;
      name?: unknown;
      severity?: unknown;
      routine?: unknown;
      statusCode?: unknown;
      cause?: unknown;
      dependency?: unknown;
    };
    // Marked where the failure happened (db/pool.ts tagConnectionError: a connection lost without a SQLSTATE).
    if (o.dependency === 'database') return 'database';
    const code = typeof o.code === 'string' ? o.code : undefined;
    if (code && /^[0-9A-Z]{5}$/.test(code) && (o.severity !== undefined || o.routine !== undefined) && isUnavailableSqlState(code))
      return 'database';
    // A gRPC status (the cause of the Temporal client's ServiceError) carries its metadata beside the code.
    if (typeof o.code === 'number' && GRPC_UNAVAILABLE.has(o.code) && 'metadata' in o) return 'temporal';
    if (o.name === 'RestError' && (o.statusCode === undefined || o.statusCode === 503) && code && NETWORK_CODES.has(code))
      return 'blob storage';
    if (code && NETWORK_CODES.has(code)) return 'network';
    e = o.cause;
  }
  return null;
}

/**
 * How old a rollout or classic deployment with nothing dispatched must be before the API's lost-start pass
 * (api/plugins/lost-starts.ts) asks Temporal whether its workflow was ever started (ms). Far beyond the time a
 * create or deploy takes to start its workflow or answer 503 (under 20 s in the fault runs).
 */
export const LOST_START_AFTER_MS = 2 * 60_000;
