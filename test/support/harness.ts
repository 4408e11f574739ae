/**
 * Per-test-file harness: builds the real app (real PostgreSQL, Azurite, Temporal) once, bootstraps a
 * fresh site with a full-access key, and offers small helpers around `app.inject`.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import type { Logger } from 'pino';
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { buildApp } from '../../api/app';
import { closeServiceDeps as closeDeps, createServiceDeps as createDeps } from '../../services/deps';
import type { AppDeps } from '../../api/context';
import { bootstrap } from '../../db/bootstrap';
import { testConfig } from './env';
import { testLogger } from './test-log';

export interface Harness {
  app: FastifyInstance;
  deps: AppDeps;
  siteId: string;
  userId: string;
  apiKey: string;
  /** A second, unrelated site with its own full-access key (for cross-site checks). */
  other: () => Promise<{ siteId: string; userId: string; apiKey: string }>;
  /** Listens on 127.0.0.1 (a free port) once, for real HTTP clients (agents, the CLI); returns the base URL. */
  listen: () => Promise<string>;
  /** Creates (rotates) the site's enrolment secret through the API and returns it, for enrolling agents. */
  enrolmentSecret: () => Promise<string>;
  /** app.inject with the site's key unless `key` is given (null sends no credential). */
  request: (opts: {
    method: string;
    url: string;
    body?: unknown;
    key?: string | null;
    headers?: Record<string, string>;
    idempotencyKey?: string | true;
  }) => Promise<LightMyRequestResponse>;
  close: () => Promise<void>;
}

/** A random idempotency key. */
export function idemKey(): string {
  return `idem-${randomBytes(8).toString('hex')}`;
}

/**
 * Builds the harness; `overrides` adjust configuration (task queue etc.); `opts.logger` logs the app's
 * lines there (telemetry/logging.ts createLogger), else into the run's log file (test/support/test-log.ts).
 */
export async function createHarness(overrides: Record<string, string> = {}, opts: { logger?: Logger } = {}): Promise<Harness> {
  const cfg = testConfig({ ROOST_TASK_QUEUE: `roost-test-${randomBytes(4).toString('hex')}`, ...overrides });
  const deps = await createDeps(cfg);
  const app = await buildApp(deps, { loggerInstance: opts.logger ?? testLogger('roost-api') });
  await app.ready();
  const secret = 'test-bootstrap-secret';
  const tag = randomBytes(4).toString('hex');
  const main = await bootstrap(deps.db, { siteName: `test-site-${tag}`, email: `owner-${tag}@example.test`, secret });
  const request: Harness['request'] = async (opts) => {
    const headers: Record<string, string> = { ...(opts.headers ?? {}) };
    const key = opts.key === undefined ? main.apiKey : opts.key;
    if (key) headers.authorization = `Bearer ${key}`;
    if (opts.idempotencyKey) headers['idempotency-key'] = opts.idempotencyKey === true ? idemKey() : opts.idempotencyKey;
    return app.inject({ method: opts.method as any, url: opts.url, headers, payload: opts.body as any });
  };
  const listen = async (): Promise<string> => {
    if (!app.server.listening) await app.listen({ port: 0, host: '127.0.0.1' });
    return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  };
  const enrolmentSecret = async (): Promise<string> => {
    const res = await request({ method: 'POST', url: `/api/sites/${main.siteId}/enrolment-secret`, idempotencyKey: true });
    if (res.statusCode !== 201) throw new Error(`enrolment secret: ${res.statusCode} ${res.body}`);
    return res.json().enrolmentSecret;
  };
  return {
    app,
    deps,
    listen,
    enrolmentSecret,
    siteId: main.siteId,
    userId: main.userId,
    apiKey: main.apiKey,
    other: async () => {
      const t = randomBytes(4).toString('hex');
      const o = await bootstrap(deps.db, { siteName: `other-site-${t}`, email: `other-${t}@example.test`, secret });
      // A plain member, not superadmin, so site membership is really checked.
      await deps.db.query(`UPDATE users SET role = 'member' WHERE uid = $1`, [o.userId]);
      return { siteId: o.siteId, userId: o.userId, apiKey: o.apiKey };
    },
    request,
    close: async () => {
      await app.close();
      await closeDeps(deps);
    },
  };
}
