/**
 * The user-delete cascade survives its worker (docs/decisions/users.md): the only worker is stopped while
 * the cascade is in its site-transfer step, after keys, sessions and commands were handled; a new worker
 * finishes it, and nothing is done twice (one revocation count, one audit record per moved site, each
 * earlier step completed once in the workflow history).
 *
 * Set ROOST_RECORD_HISTORIES=1 to (re)record test/replay/histories/users/*.json from these runs.
 */
import path from 'node:path';
import { Context } from '@temporalio/activity';
import { Worker } from '@temporalio/worker';
import { recordHistory } from '../../scripts/record-history';
import { createActivities } from '../../activities';
import { workerConnection, workflowBundle, closeWorkerConnections } from '../../worker/worker';
import { userDeleteWorkflowId } from '../../workflows/client';
import { newId } from '../../domain/hex';
import { createHarness, type Harness } from '../support/harness';
import { idTokenFor, insertKey, makeUser, sessionFor } from '../support/identity';
import { startTestWorker } from './rollout-fixtures';
import { quietRuntime } from '../replay/histories';
import { waitFor } from '../support/wait';

const RECORD = process.env.ROOST_RECORD_HISTORIES === '1';
const HISTORIES = path.join(__dirname, '..', 'replay', 'histories', 'users');

let h: Harness;
let superToken: string;

beforeAll(async () => {
  quietRuntime();
  h = await createHarness();
  const owner = (await h.deps.db.query('SELECT uid, email FROM users WHERE uid = $1', [h.userId])).rows[0];
  superToken = await idTokenFor(h, owner);
});
afterAll(async () => {
  await closeWorkerConnections();
  await h?.close();
});

const deletionRow = async (uid: string) => (await h.deps.db.query('SELECT * FROM user_deletions WHERE uid = $1', [uid])).rows[0];

/** A site owner with a session and a pending command, and an admin to inherit the site. */
async function victim() {
  const owner = await h.other();
  const email = (await h.deps.db.query('SELECT email FROM users WHERE uid = $1', [owner.userId])).rows[0].email;
  await sessionFor(h, { uid: owner.userId, email });
  await h.deps.db.query(
    `INSERT INTO commands (site_id, machine_id, command_id, type, status, created_by) VALUES ($1, 'mach-r', $2, 'reboot_machine', 'pending', $3)`,
    [owner.siteId, newId('cmd'), owner.userId],
  );
  const successor = await makeUser(h.deps.db, { role: 'admin' });
  return { owner, successor };
}

const del = (uid: string, successorUid: string) =>
  h.request({ method: 'DELETE', url: `/api/users/${uid}?successorUid=${successorUid}`, key: superToken, idempotencyKey: true });

it('records a cascade that runs straight through', async () => {
  const w = await startTestWorker(h, 'cascade-clean');
  try {
    const { owner, successor } = await victim();
    expect((await del(owner.userId, successor.uid)).statusCode).toBe(202);
    const result = await h.deps.temporal.workflow.getHandle(userDeleteWorkflowId(owner.userId)).result();
    expect(result).toEqual({
      uid: owner.userId,
      keysRevoked: 1,
      sessionsRevoked: 1,
      commandsCancelled: 1,
      sitesTransferred: [owner.siteId],
    });
    if (RECORD) await recordHistory(h.deps.temporal, userDeleteWorkflowId(owner.userId), path.join(HISTORIES, 'cascade-completed.json'));
  } finally {
    await w.stop();
  }
});

it('finishes a cascade whose worker was stopped mid-way, on a new worker, doing nothing twice', async () => {
  const { owner, successor } = await victim();
  // The first worker's site-transfer step never finishes: it waits until the worker shutdown cancels it.
  let transferStarted = false;
  const real = createActivities({ cfg: h.deps.cfg, db: h.deps.db, blob: h.deps.blob });
  const first = await Worker.create({
    connection: await workerConnection(h.deps.cfg),
    namespace: h.deps.cfg.TEMPORAL_NAMESPACE,
    taskQueue: h.deps.cfg.ROOST_TASK_QUEUE,
    identity: 'cascade-before-restart',
    workflowBundle: await workflowBundle(),
    shutdownGraceTime: 0,
    activities: {
      ...real,
      async transferUserSites(): Promise<{ sitesTransferred: string[] }> {
        transferStarted = true;
        await Context.current().cancelled;
        throw new Error('unreachable');
      },
    },
  });
  const running = first.run();
  expect((await del(owner.userId, successor.uid)).statusCode).toBe(202);
  await waitFor('the transfer to start', () => transferStarted);
  const midway = await deletionRow(owner.userId);
  expect(midway).toMatchObject({ status: 'running', keys_revoked: 1, sessions_revoked: 1, commands_cancelled: 1, sites_transferred: null });
  first.shutdown();
  await running;

  // GET shows the cascade in progress while no worker runs.
  const progress = await h.request({ method: 'GET', url: `/api/users/${owner.userId}`, key: superToken });
  expect(progress.json().deletion).toMatchObject({ status: 'running', keysRevoked: 1, sitesTransferred: null });

  // A key appears meanwhile behind the API's back: the recorded revocation step does not run again, so it
  // stays as it is (and is refused anyway: its user is deleted).
  const late = await insertKey(h.deps.db, { uid: owner.userId, scopes: [] });
  const second = await startTestWorker(h, 'cascade-after-restart');
  try {
    const handle = h.deps.temporal.workflow.getHandle(userDeleteWorkflowId(owner.userId));
    expect(await handle.result()).toEqual({
      uid: owner.userId,
      keysRevoked: 1,
      sessionsRevoked: 1,
      commandsCancelled: 1,
      sitesTransferred: [owner.siteId],
    });
    expect(await deletionRow(owner.userId)).toMatchObject({ status: 'completed', keys_revoked: 1, sites_transferred: [owner.siteId] });
    const lateStatus = (await h.deps.db.query('SELECT status FROM api_keys WHERE key_id = $1', [late.keyId])).rows[0].status;
    expect(lateStatus).toBe('active');
    expect((await h.request({ method: 'GET', url: '/api/whoami', key: late.raw })).statusCode).toBe(401);
    // One audit record for the moved site, on the successor's watch.
    const audit = await h.deps.db.query(
      `SELECT count(*)::int AS n FROM audit_records WHERE site_id = $1 AND kind = 'site_owner_transferred'`,
      [owner.siteId],
    );
    expect(audit.rows[0].n).toBe(1);
    // The successor joined the site by owning it: one site_member_added (docs/decisions/users.md "Audit and events").
    const joined = await h.deps.db.query(
      `SELECT count(*)::int AS n FROM audit_records WHERE site_id = $1 AND kind = 'site_member_added' AND attributes->>'uid' = $2`,
      [owner.siteId, successor.uid],
    );
    expect(joined.rows[0].n).toBe(1);
    expect((await h.deps.db.query('SELECT owner_uid FROM sites WHERE site_id = $1', [owner.siteId])).rows[0].owner_uid).toBe(successor.uid);
    // The history: each of the first three steps completed once; the transfer was attempted on both workers.
    const history = await handle.fetchHistory();
    const scheduled = new Map<number, string>();
    const completed: string[] = [];
    for (const e of history.events ?? []) {
      const s = e.activityTaskScheduledEventAttributes;
      if (s) scheduled.set(Number(e.eventId), s.activityType?.name ?? '');
      const c = e.activityTaskCompletedEventAttributes;
      if (c) completed.push(scheduled.get(Number(c.scheduledEventId)) ?? '');
    }
    expect(completed).toEqual(['softDeleteUser', 'revokeUserCredentials', 'cancelUserCommands', 'transferUserSites', 'finishUserDelete']);
    const transferAttempts = (history.events ?? [])
      .filter((e) => e.activityTaskStartedEventAttributes)
      .map((e) => e.activityTaskStartedEventAttributes!.attempt ?? 1);
    expect(Math.max(...transferAttempts)).toBeGreaterThanOrEqual(2);
    if (RECORD)
      await recordHistory(h.deps.temporal, userDeleteWorkflowId(owner.userId), path.join(HISTORIES, 'cascade-after-restart.json'));
  } finally {
    await second.stop();
  }
});
