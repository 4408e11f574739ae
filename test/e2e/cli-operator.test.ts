/**
 * The operator commands as a person runs them: `roost admin bootstrap` twice (no duplicates, same key)
 * and `roost stack` (prints `ready` with the URLs, serves the API, has started the event relay and the sweep
 * schedules of its task queue, stops cleanly on SIGTERM).
 */
import path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { testConfig } from '../support/env';
import { createPool } from '../../db/pool';
import { Client, Connection } from '@temporalio/client';
import { eventRelayWorkflowId, sweepScheduleId, sweepSchedules } from '../../worker/background';

const ROOT = path.resolve(__dirname, '..', '..');
const BIN = path.join(ROOT, 'bin', 'roost.js');

function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { ...process.env, ROOST_PG_DATABASE: process.env.ROOST_TEST_DATABASE ?? 'roost_test', ROOST_LOG_LEVEL: 'silent', ...extra };
}

describe('roost admin bootstrap', () => {
  it('creates a site, a superadmin and a key once, and returns the same on a second run', async () => {
    const site = `cli-site-${randomBytes(3).toString('hex')}`;
    const run = () => {
      const r = spawnSync(process.execPath, [BIN, 'admin', 'bootstrap', '--site', site, '--email', `${site}@example.test`, '--json'], {
        env: env(),
        encoding: 'utf8',
      });
      expect(r.status).toBe(0);
      return JSON.parse(r.stdout) as { siteId: string; userId: string; apiKey: string };
    };
    const a = run();
    const b = run();
    expect(b).toEqual(a);
    expect(a.apiKey).toMatch(/^svk_live_[A-Za-z0-9_-]{43}$/);
    const pool = createPool(testConfig().databaseUrl, 1);
    try {
      const counts = await pool.query(
        `SELECT (SELECT count(*) FROM sites WHERE name = $1) AS sites, (SELECT count(*) FROM users WHERE email = $2) AS users,
                (SELECT count(*) FROM api_keys WHERE primary_site_id = $3) AS keys`,
        [site, `${site}@example.test`, a.siteId],
      );
      expect(counts.rows[0]).toEqual({ sites: 1, users: 1, keys: 1 });
    } finally {
      await pool.end();
    }
  });

  it('fails with a usage error when --site is missing', () => {
    const r = spawnSync(process.execPath, [BIN, 'admin', 'bootstrap', '--email', 'x@example.test'], { env: env(), encoding: 'utf8' });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/--site/);
  });
});

describe('roost stack', () => {
  it('prints a ready line with the URLs, serves the API, runs the background workflows and stops cleanly on SIGTERM', async () => {
    const taskQueue = `roost-stack-${randomBytes(3).toString('hex')}`;
    const child = spawn(process.execPath, [BIN, 'stack', '--json'], {
      env: env({ ROOST_API_PORT: '0', ROOST_TASK_QUEUE: taskQueue }),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    const ready = await new Promise<{ ready: boolean; api: string; reference: string; temporalUi: string }>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no ready line: ${out}`)), 60_000);
      child.stdout.on('data', (d) => {
        out += d.toString();
        const line = out.split('\n').find((l) => l.includes('ready'));
        if (line) {
          clearTimeout(t);
          resolve(JSON.parse(line));
        }
      });
      child.once('exit', (code) => reject(new Error(`stack exited early with ${code}: ${out}`)));
    });
    expect(ready.ready).toBe(true);
    expect(ready.temporalUi).toMatch(/^http:\/\/127\.0\.0\.1:\d+/);
    const version = await fetch(`${ready.api}/api/version`);
    expect(version.status).toBe(200);
    const docs = await fetch(ready.reference + '/');
    expect(docs.status).toBe(200);
    // The worker start-up ensured the event relay and one schedule per sweep on this task queue.
    const cfg = testConfig();
    const connection = await Connection.connect({ address: cfg.temporalAddress });
    const temporal = new Client({ connection, namespace: cfg.TEMPORAL_NAMESPACE });
    const relay = temporal.workflow.getHandle(eventRelayWorkflowId(taskQueue));
    try {
      expect((await relay.describe()).status.name).toBe('RUNNING');
      for (const spec of sweepSchedules(cfg)) {
        const d = await temporal.schedule.getHandle(sweepScheduleId(spec.name, taskQueue)).describe();
        expect(d.action).toMatchObject({ workflowType: spec.workflowType, taskQueue });
      }
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      // This task queue is the test's own: leave nothing behind on the shared dev server.
      await relay.terminate('test over').catch(() => undefined);
      for (const spec of sweepSchedules(cfg))
        await temporal.schedule
          .getHandle(sweepScheduleId(spec.name, taskQueue))
          .delete()
          .catch(() => undefined);
      await connection.close();
    }
  });
});
