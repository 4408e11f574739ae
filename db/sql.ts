/**
 * Small SQL builders shared by repository modules: the SET list of a partial update and a newest-first
 * keyset page. They only assemble text and positional arguments; the queries stay in their modules.
 */
import type { QueryResultRow } from 'pg';
import type { Queryable } from './pool';

/**
 * `col = $n` items for every defined field of `fields`, appended to `args` (so `$n` continues after the
 * arguments already there); keys in `json` are sent as JSON text. Field names are column names: pass only
 * typed objects whose keys are known columns (never request bodies as such).
 */
export function updateSets(fields: Record<string, unknown>, args: unknown[], json: readonly string[] = []): string[] {
  const sets: string[] = [];
  for (const [k, v] of Object.entries(fields)) {
    if (v === undefined) continue;
    args.push(json.includes(k) ? JSON.stringify(v) : v);
    sets.push(`${k} = $${args.length}`);
  }
  return sets;
}

/**
 * One page of `select` (a `SELECT … FROM table` without WHERE) filtered by `where` (SQL over `args`, whose
 * first argument is the site id by convention), newest first by `(created_at, idColumn)`, after the
 * position `after` = `[created_at text, id]` of the previous page's last row. Reads one row more than
 * `limit` to tell whether another page follows.
 */
export async function newestFirstPage<T extends QueryResultRow>(
  q: Queryable,
  p: { select: string; idColumn: string; where: string; args: unknown[]; limit: number; after?: [string, string] },
): Promise<{ rows: T[]; more: boolean }> {
  const args = [...p.args];
  let where = p.where;
  if (p.after) {
    args.push(p.after[0], p.after[1]);
    where += ` AND (created_at, ${p.idColumn}) < ($${args.length - 1}::timestamptz, $${args.length})`;
  }
  args.push(p.limit + 1);
  const { rows } = await q.query<T>(`${p.select} WHERE ${where} ORDER BY created_at DESC, ${p.idColumn} DESC LIMIT $${args.length}`, args);
  return { rows: rows.slice(0, p.limit), more: rows.length > p.limit };
}
