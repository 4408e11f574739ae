/**
 * A mutation's audit record commits with the mutation (api/plugins/audit.ts, services/audit.ts AuditedMutation,
 * docs/decisions/audit-recording.md). A real API process is killed (SIGKILL) after `POST /api/roosts` committed
 * and before the record was linked into the site's chain: the proxy in front of its database holds back the
 * linking transaction's first statement on the key's addresses. The record is in the outbox all the same, and the
 * pass every API process runs links it: no committed mutation lacks its record, and the chain still verifies.
 */
import type { ChildProcess } from 'node:child_process';
import { createHarness, type Harness } from '../support/harness';
import { PgProxy, killHard, startApiChild } from '../support/api-child';
import { linkStaleAuditOutbox } from '../../services/audit';

let h: Harness;
const proxy = new PgProxy();
let child: ChildProcess | undefined;

beforeAll(async () => {
  h = await createHarness();
  await proxy.open();
});
afterAll(async () => {
  if (child) await killHard(child);
  await proxy.close();
  await h?.close();
});

async function counts(): Promise<{ roosts: number; records: number }> {
  const { rows } = await h.deps.db.query<{ roosts: number; records: number }>(
    `SELECT (SELECT count(*)::int FROM roosts WHERE site_id = $1) AS roosts,
            (SELECT count(*)::int FROM audit_records WHERE site_id = $1 AND kind = 'roost_created') AS records`,
    [h.siteId],
  );
  return rows[0];
}

test('an API killed between the commit of a mutation and the append of its record loses no record', async () => {
  // Through the in-process API: the record is linked before the answer.
  const made = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name: 'before the crash' } });
  expect(made.statusCode).toBe(201);
  expect(await counts()).toEqual({ roosts: 1, records: 1 });

  const started = await startApiChild(proxy);
  child = started.child;
  const linking = proxy.holdAt('audit_key_addresses');
  const request = fetch(`${started.url}/api/roosts`, {
    method: 'POST',
    headers: { authorization: `Bearer ${h.apiKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ siteId: h.siteId, name: 'killed before its record was linked' }),
  }).catch((err: unknown) => err);
  await linking;
  await killHard(child);
  proxy.cut();
  expect(String(await request)).toMatch(/fetch failed/);

  // The roost committed; its record waits in the outbox, not yet in the chain.
  expect(await counts()).toEqual({ roosts: 2, records: 1 });
  const { rows: waiting } = await h.deps.db.query(`SELECT kind, actor FROM audit_outbox WHERE site_id = $1`, [h.siteId]);
  expect(waiting).toEqual([{ kind: 'roost_created', actor: expect.any(String) }]);

  // The periodic pass of any API process links it (here without waiting for it to be a minute old).
  await linkStaleAuditOutbox(h.deps, 0);
  expect(await counts()).toEqual({ roosts: 2, records: 2 });
  const log = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/audit-log?kind=roost_created` });
  const [latest] = log.json().records as { hash: string; attributes: Record<string, unknown> }[];
  expect(latest.attributes).toMatchObject({ method: 'POST', route: '/api/roosts', status: null, linkedAfterCrash: true });
  const verified = await h.request({ method: 'GET', url: `/api/sites/${h.siteId}/audit-log/${latest.hash}` });
  expect(verified.json().verification).toMatchObject({ hashValid: true, linkageValid: true, ok: true });
});
