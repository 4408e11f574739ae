/** Agent tokens (`sat_…`): the machine a token digest belongs to (`machines.agent_token_hash`, written at enrolment by db/machines.ts). */
import { prepared, type Queryable } from './pool';

/**
 * The site, machine and stored digest of the machine holding the token with SHA-256 hex `digest`; undefined
 * when none. A named statement (db/pool.ts `prepared`): every agent request (heartbeats, long-polls,
 * reports) sends it.
 */
export async function machineForAgentToken(
  db: Queryable,
  digest: string,
): Promise<{ site_id: string; machine_id: string; agent_token_hash: string } | undefined> {
  const { rows } = await prepared<{ site_id: string; machine_id: string; agent_token_hash: string }>(
    db,
    'agent_token',
    'SELECT site_id, machine_id, agent_token_hash FROM machines WHERE agent_token_hash = $1',
    [digest],
  );
  return rows[0];
}
