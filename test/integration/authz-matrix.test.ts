/**
 * The authorisation matrix (docs/contract.md Authentication 5, 6, 10): for EVERY route the server
 * registers, a request with
 *   (a) no credential                                   → 401 unauthorized,
 *   (b) a full-access key of ANOTHER site (a member)     → 404 not_found (the site stays hidden),
 *   (c) a key of this site lacking the exact permission  → 403 scope_insufficient with `required`,
 *   (d) an agent token on a user route                   → 401 unauthorized,
 *   (f) a full-access key of a member removed from the site → 404 (membership is read on every request),
 *   (g) a full-access key of a deleted member            → 401 unauthorized,
 *   (e) a full-access svk_test_ key of a member on this live site → 403 forbidden (test keys act on
 *       sandbox sites only: docs/decisions/test-keys.md),
 * and nothing changes in the database (row hashes of every site-scoped table for the two sites, and of
 * the users, keys and sessions of their users). Public, agent, self-service and platform routes are
 * listed explicitly with their own expected answers. One table drives it: a route the server registers
 * without a row here fails the test, so new routes must say what they need.
 */
import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { newId, sha256Hex } from '../../domain/hex';
import { PERMISSIONS, RESOURCES, type Requirement, type Scope } from '../../domain/scopes';
import { createHarness, type Harness, idemKey } from '../support/harness';
import { addMember, idTokenFor, insertKey, makeUser, sessionFor } from '../support/identity';
import { bootstrap, fullAccessScopes } from '../../db/bootstrap';

let h: Harness;
let other: { siteId: string; userId: string; apiKey: string };
let member: { uid: string; email: string };
let agentToken: string;
let otherAgentToken: string;
let testKey: string;
let removedKey: string;
let deletedKey: string;

const HASH = 'a'.repeat(64);
const VERSION_ID = 'b'.repeat(64);
const ROOST = 'rst_matrix';
const MACHINE = 'mach-matrix';
const COMMAND = 'cmd_matrix';
const WEBHOOK = `wh_${'c'.repeat(24)}`;
const DELIVERY = `dlv_${'d'.repeat(24)}`;
const DEPLOYMENT = `dep_${'e'.repeat(24)}`;
const TEMPLATE = `itp_${'f'.repeat(24)}`;
/** A site-wide conversation of the harness site (seeded in beforeAll; by-id routes find it, then authorise). */
const CONVERSATION = `cnv_${'e'.repeat(24)}`;
const PROCESS = `prc_${'a'.repeat(24)}`;

/** What a route is, for the matrix. */
type Kind =
  /** site-scoped user route: (a) 401, (b) 404, (c) 403 scope_insufficient, (d) 401 */
  | { kind: 'site'; needs: (siteId: string) => Requirement[]; agentAllowed?: boolean }
  /** no credential needed: (a) answers `status` */
  | { kind: 'public'; status: number; code?: string }
  /** agent-token route: (a), (b), (c) all 401 */
  | { kind: 'agent' }
  /** the caller's own identity: (a) 401, (b) and (c) 200 */
  | { kind: 'self' }
  /** key lifecycle or session routes: (a) 401, API keys (b) (c) 403 forbidden */
  | { kind: 'interactive' }
  /** platform routes (users, installer catalog): superadmins only, so (a) 401, (b) (c) 403 forbidden, (d) 401 */
  | { kind: 'platform' };

interface Row {
  /** `METHOD /fastify/:url` exactly as registered. */
  route: string;
  what: Kind;
  /** Concrete request (valid in shape, so that authorisation is what answers). */
  req: (siteId: string) => { url: string; body?: unknown };
}

const site =
  (permission: Requirement['permission']) =>
  (s: string): Requirement[] => [{ resource: 'site', id: s, permission }];
/** Site-wide routes that also accept the permission on every resource of a kind (`roost=*`, `machine=*`). */
const siteOrAny =
  (resource: Requirement['resource'], permission: Requirement['permission']) =>
  (s: string): Requirement[] => [
    { resource: 'site', id: s, permission },
    { resource, id: '*', permission },
  ];
const roost =
  (permission: Requirement['permission']) =>
  (s: string): Requirement[] => [
    { resource: 'roost', id: ROOST, permission },
    { resource: 'site', id: s, permission },
  ];
const machine =
  (permission: Requirement['permission']) =>
  (s: string): Requirement[] => [
    { resource: 'machine', id: MACHINE, permission },
    { resource: 'site', id: s, permission },
  ];

const MATRIX: Row[] = [
  // ---- public
  { route: 'GET /api/version', what: { kind: 'public', status: 200 }, req: () => ({ url: '/api/version' }) },
  { route: 'GET /healthz', what: { kind: 'public', status: 200 }, req: () => ({ url: '/healthz' }) },
  { route: 'GET /readyz', what: { kind: 'public', status: 200 }, req: () => ({ url: '/readyz' }) },
  // Without ROOST_METRICS_TOKEN the API listener does not serve metrics (docs/observability.md).
  { route: 'GET /metrics', what: { kind: 'public', status: 404, code: 'not_found' }, req: () => ({ url: '/metrics' }) },
  { route: 'GET /api/openapi.json', what: { kind: 'public', status: 200 }, req: () => ({ url: '/api/openapi.json' }) },
  { route: 'GET /.well-known/jwks.json', what: { kind: 'public', status: 200 }, req: () => ({ url: '/.well-known/jwks.json' }) },
  {
    route: 'GET /.well-known/openid-configuration',
    what: { kind: 'public', status: 200 },
    req: () => ({ url: '/.well-known/openid-configuration' }),
  },
  {
    route: 'POST /api/auth/session',
    what: { kind: 'public', status: 401, code: 'unauthorized' },
    req: () => ({ url: '/api/auth/session', body: { idToken: 'e30.e30.e30' } }),
  },
  {
    route: 'POST /api/agent/enrol',
    what: { kind: 'public', status: 401, code: 'unauthorized' },
    req: (s) => ({
      url: '/api/agent/enrol',
      body: { siteId: s, enrolmentSecret: 'ses_wrong', machineId: 'mach-new', hostname: 'h', agentVersion: '1.0.0' },
    }),
  },
  // ---- identity
  { route: 'GET /api/whoami', what: { kind: 'self' }, req: () => ({ url: '/api/whoami' }) },
  { route: 'GET /api/auth/session', what: { kind: 'interactive' }, req: () => ({ url: '/api/auth/session' }) },
  { route: 'DELETE /api/auth/session', what: { kind: 'interactive' }, req: () => ({ url: '/api/auth/session' }) },
  { route: 'POST /api/keys', what: { kind: 'interactive' }, req: () => ({ url: '/api/keys', body: { name: 'm', preset: 'admin' } }) },
  { route: 'GET /api/keys', what: { kind: 'interactive' }, req: () => ({ url: '/api/keys' }) },
  { route: 'POST /api/keys/:keyId/rotate', what: { kind: 'interactive' }, req: () => ({ url: `/api/keys/${keyOfMain()}/rotate` }) },
  { route: 'DELETE /api/keys/:keyId', what: { kind: 'interactive' }, req: () => ({ url: `/api/keys/${keyOfMain()}` }) },
  { route: 'GET /api/account/api-keys', what: { kind: 'interactive' }, req: () => ({ url: '/api/account/api-keys' }) },
  {
    route: 'POST /api/account/api-keys',
    what: { kind: 'interactive' },
    req: () => ({ url: '/api/account/api-keys', body: { userId: member.uid, name: 'm', preset: 'admin' } }),
  },
  {
    route: 'DELETE /api/account/api-keys/:keyId',
    what: { kind: 'interactive' },
    req: () => ({ url: `/api/account/api-keys/${keyOfMain()}` }),
  },
  // ---- roosts and versions
  {
    route: 'POST /api/roosts',
    what: { kind: 'site', needs: siteOrAny('roost', 'write') },
    req: (s) => ({ url: '/api/roosts', body: { siteId: s, name: 'matrix' } }),
  },
  { route: 'GET /api/roosts', what: { kind: 'site', needs: siteOrAny('roost', 'read') }, req: (s) => ({ url: `/api/roosts?siteId=${s}` }) },
  {
    route: 'GET /api/roosts/:roostId',
    what: { kind: 'site', needs: roost('read') },
    req: (s) => ({ url: `/api/roosts/${ROOST}?siteId=${s}` }),
  },
  {
    route: 'PATCH /api/roosts/:roostId',
    what: { kind: 'site', needs: roost('write') },
    req: (s) => ({ url: `/api/roosts/${ROOST}`, body: { siteId: s, name: 'renamed' } }),
  },
  {
    route: 'DELETE /api/roosts/:roostId',
    what: { kind: 'site', needs: roost('write') },
    req: (s) => ({ url: `/api/roosts/${ROOST}?siteId=${s}` }),
  },
  {
    route: 'POST /api/roosts/:roostId/versions',
    what: { kind: 'site', needs: roost('write') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/versions`, body: { siteId: s, version: {} } }),
  },
  {
    route: 'GET /api/roosts/:roostId/versions',
    what: { kind: 'site', needs: roost('read') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/versions?siteId=${s}` }),
  },
  {
    route: 'GET /api/roosts/:roostId/versions/:versionRef',
    what: { kind: 'site', needs: roost('read') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/versions/latest?siteId=${s}` }),
  },
  {
    route: 'PATCH /api/roosts/:roostId/versions/:versionRef',
    what: { kind: 'site', needs: roost('write') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/versions/latest`, body: { siteId: s, description: 'x' } }),
  },
  {
    route: 'GET /api/roosts/:roostId/versions/:versionRef/files',
    what: { kind: 'site', needs: roost('read') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/versions/latest/files?siteId=${s}` }),
  },
  {
    route: 'GET /api/roosts/:roostId/versions/:versionRef/diff',
    what: { kind: 'site', needs: roost('read') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/versions/latest/diff?siteId=${s}&against=previous` }),
  },
  {
    route: 'POST /api/roosts/:roostId/rollback',
    what: { kind: 'site', needs: roost('rollback') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/rollback`, body: { siteId: s } }),
  },
  {
    route: 'POST /api/roosts/:roostId/deploy',
    what: { kind: 'site', needs: roost('deploy') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/deploy`, body: { siteId: s } }),
  },
  {
    route: 'GET /api/roosts/:roostId/rollouts',
    what: { kind: 'site', needs: roost('read') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/rollouts?siteId=${s}` }),
  },
  {
    route: 'GET /api/roosts/:roostId/rollouts/:rolloutId',
    what: { kind: 'site', needs: roost('read') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/rollouts/rol_matrix?siteId=${s}` }),
  },
  ...(['pause', 'resume', 'promote', 'abort', 'rollback'] as const).map((a): Row => ({
    route: `POST /api/roosts/:roostId/rollouts/:rolloutId/${a}`,
    // Rolling back is its own permission (docs/contract.md "Authentication" 6); steering needs deploy.
    what: { kind: 'site', needs: roost(a === 'rollback' ? 'rollback' : 'deploy') },
    req: (s) => ({ url: `/api/roosts/${ROOST}/rollouts/rol_matrix/${a}`, body: { siteId: s } }),
  })),
  // ---- chunks
  {
    route: 'POST /api/chunks/check',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({ url: '/api/chunks/check', body: { siteId: s, hashes: [HASH] } }),
  },
  {
    route: 'POST /api/chunks/upload-urls',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({ url: '/api/chunks/upload-urls', body: { siteId: s, hashes: [HASH] } }),
  },
  {
    route: 'POST /api/chunks/download-urls',
    what: { kind: 'site', needs: site('read'), agentAllowed: true },
    req: (s) => ({ url: '/api/chunks/download-urls', body: { siteId: s, hashes: [HASH] } }),
  },
  {
    route: 'GET /api/chunks/download-urls',
    what: { kind: 'site', needs: site('read'), agentAllowed: true },
    req: (s) => ({ url: `/api/chunks/download-urls?siteId=${s}&hash=${HASH}` }),
  },
  {
    route: 'POST /api/chunks/:digest/mount',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({ url: `/api/chunks/${HASH}/mount`, body: { siteId: s, from: ROOST, to: 'rst_other' } }),
  },
  {
    route: 'GET /api/chunks/:digest/referrers',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/chunks/${HASH}/referrers?siteId=${s}` }),
  },
  // ---- webhooks (api/routes/webhooks.ts: reads site read, mutations and the probe site admin)
  {
    route: 'POST /api/sites/:siteId/webhooks',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks`, body: { url: 'https://example.com/hook', name: 'm', events: ['version.published'] } }),
  },
  {
    route: 'GET /api/sites/:siteId/webhooks',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks` }),
  },
  {
    route: 'GET /api/sites/:siteId/webhooks/:webhookId',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks/${WEBHOOK}` }),
  },
  {
    route: 'PATCH /api/sites/:siteId/webhooks/:webhookId',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks/${WEBHOOK}`, body: { name: 'x' } }),
  },
  {
    route: 'DELETE /api/sites/:siteId/webhooks/:webhookId',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks/${WEBHOOK}` }),
  },
  {
    route: 'POST /api/sites/:siteId/webhooks/:webhookId/rotate-secret',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks/${WEBHOOK}/rotate-secret`, body: {} }),
  },
  {
    route: 'GET /api/sites/:siteId/webhooks/:webhookId/deliveries',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks/${WEBHOOK}/deliveries` }),
  },
  {
    route: 'POST /api/sites/:siteId/webhooks/:webhookId/deliveries/:deliveryId/retry',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}/webhooks/${WEBHOOK}/deliveries/${DELIVERY}/retry` }),
  },
  {
    route: 'POST /api/webhooks/probe',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({
      url: `/api/webhooks/probe?siteId=${s}`,
      body: { url: 'https://example.com/hook', event: 'version.published', payload: {} },
    }),
  },
  // ---- sites, machines, quota
  {
    route: 'POST /api/sites/:siteId/enrolment-secret',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}/enrolment-secret` }),
  },
  { route: 'GET /api/sites/:siteId/quota', what: { kind: 'site', needs: site('read') }, req: (s) => ({ url: `/api/sites/${s}/quota` }) },
  {
    route: 'GET /api/sites/:siteId/signing-keys',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/signing-keys` }),
  },
  {
    route: 'GET /api/sites/:siteId/audit-log',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/audit-log` }),
  },
  {
    route: 'GET /api/sites/:siteId/audit-log/:recordHash',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/audit-log/${HASH}` }),
  },
  { route: 'GET /api/events/stream', what: { kind: 'site', needs: site('read') }, req: (s) => ({ url: `/api/events/stream?siteId=${s}` }) },
  {
    route: 'GET /api/sites/:siteId/machines',
    what: { kind: 'site', needs: siteOrAny('machine', 'read') },
    req: (s) => ({ url: `/api/sites/${s}/machines` }),
  },
  {
    route: 'GET /api/sites/:siteId/machines/:machineId',
    what: { kind: 'site', needs: machine('read') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}` }),
  },
  {
    route: 'GET /api/sites/:siteId/machines/:machineId/deployments',
    what: { kind: 'site', needs: machine('read') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/deployments` }),
  },
  {
    route: 'POST /api/sites/:siteId/machines/:machineId/commands',
    what: { kind: 'site', needs: machine('write') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/commands`, body: { type: 'reboot_machine' } }),
  },
  {
    route: 'GET /api/sites/:siteId/machines/:machineId/commands/:commandId',
    what: { kind: 'site', needs: machine('read') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/commands/${COMMAND}` }),
  },
  // ---- managed processes
  {
    route: 'GET /api/sites/:siteId/machines/:machineId/processes',
    what: { kind: 'site', needs: machine('read') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/processes` }),
  },
  {
    route: 'GET /api/sites/:siteId/machines/:machineId/processes/:processId',
    what: { kind: 'site', needs: machine('read') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/processes/${PROCESS}` }),
  },
  {
    route: 'POST /api/sites/:siteId/machines/:machineId/processes',
    what: { kind: 'site', needs: machine('write') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/processes`, body: { name: 'm', exe_path: '/bin/true' } }),
  },
  {
    route: 'PATCH /api/sites/:siteId/machines/:machineId/processes/:processId',
    what: { kind: 'site', needs: machine('write') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/processes/${PROCESS}`, body: { priority: 'high' } }),
  },
  {
    route: 'DELETE /api/sites/:siteId/machines/:machineId/processes/:processId',
    what: { kind: 'site', needs: machine('write') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/processes/${PROCESS}` }),
  },
  ...(['kill', 'restart', 'start', 'stop'] as const).map((a): Row => ({
    route: `POST /api/sites/:siteId/machines/:machineId/processes/:processId/${a}`,
    what: { kind: 'site', needs: machine('write') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/processes/${PROCESS}/${a}` }),
  })),
  {
    route: 'POST /api/sites/:siteId/machines/:machineId/processes/:processId/schedule',
    what: { kind: 'site', needs: machine('write') },
    req: (s) => ({ url: `/api/sites/${s}/machines/${MACHINE}/processes/${PROCESS}/schedule`, body: { mode: 'off' } }),
  },
  { route: 'GET /api/agent/processes', what: { kind: 'agent' }, req: () => ({ url: '/api/agent/processes' }) },
  // ---- classic deployments and installer templates (not roost deploys)
  {
    route: 'POST /api/sites/:siteId/deployments',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({
      url: `/api/sites/${s}/deployments`,
      body: { name: 'm', installer_url: 'https://x.example.test/a.msi', installer_name: 'a.msi', silent_flags: '', machines: [MACHINE] },
    }),
  },
  {
    route: 'GET /api/sites/:siteId/deployments',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/deployments` }),
  },
  {
    route: 'GET /api/sites/:siteId/deployments/:deploymentId',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/deployments/${DEPLOYMENT}` }),
  },
  ...(['retry', 'cancel', 'uninstall'] as const).map((a): Row => ({
    route: `POST /api/sites/:siteId/deployments/:deploymentId/${a}`,
    // Uninstall is site admin (docs/contract.md "Authentication" 6); write does not imply it.
    what: { kind: 'site', needs: site(a === 'uninstall' ? 'admin' : 'write') },
    req: (s) => ({ url: `/api/sites/${s}/deployments/${DEPLOYMENT}/${a}` }),
  })),
  {
    route: 'DELETE /api/sites/:siteId/deployments/:deploymentId',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({ url: `/api/sites/${s}/deployments/${DEPLOYMENT}` }),
  },
  {
    route: 'POST /api/sites/:siteId/installer-templates',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({
      url: `/api/sites/${s}/installer-templates`,
      body: { name: 't', installer_url: 'https://x.example.test/a.msi', installer_name: 'a.msi' },
    }),
  },
  {
    route: 'GET /api/sites/:siteId/installer-templates',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/installer-templates` }),
  },
  {
    route: 'GET /api/sites/:siteId/installer-templates/:templateId',
    what: { kind: 'site', needs: site('read') },
    req: (s) => ({ url: `/api/sites/${s}/installer-templates/${TEMPLATE}` }),
  },
  {
    route: 'PATCH /api/sites/:siteId/installer-templates/:templateId',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({ url: `/api/sites/${s}/installer-templates/${TEMPLATE}`, body: { name: 'u' } }),
  },
  {
    route: 'DELETE /api/sites/:siteId/installer-templates/:templateId',
    what: { kind: 'site', needs: site('write') },
    req: (s) => ({ url: `/api/sites/${s}/installer-templates/${TEMPLATE}` }),
  },
  // ---- sites
  {
    route: 'POST /api/sites',
    what: { kind: 'platform' },
    req: () => ({ url: '/api/sites', body: { name: `matrix-${randomBytes(4).toString('hex')}` } }),
  },
  { route: 'GET /api/sites', what: { kind: 'self' }, req: () => ({ url: '/api/sites' }) },
  { route: 'GET /api/sites/:siteId', what: { kind: 'site', needs: site('read') }, req: (s) => ({ url: `/api/sites/${s}` }) },
  {
    route: 'PATCH /api/sites/:siteId',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}`, body: { roostEnabled: false } }),
  },
  {
    route: 'GET /api/sites/:siteId/members',
    what: { kind: 'site', needs: site('admin') },
    req: (s) => ({ url: `/api/sites/${s}/members` }),
  },
  // ---- platform: users
  { route: 'GET /api/users', what: { kind: 'platform' }, req: () => ({ url: '/api/users' }) },
  { route: 'GET /api/users/:uid', what: { kind: 'platform' }, req: () => ({ url: `/api/users/${member.uid}` }) },
  {
    route: 'POST /api/users/:uid/promote',
    what: { kind: 'platform' },
    req: () => ({ url: `/api/users/${member.uid}/promote`, body: { role: 'superadmin' } }),
  },
  { route: 'POST /api/users/:uid/demote', what: { kind: 'platform' }, req: () => ({ url: `/api/users/${h.userId}/demote` }) },
  {
    route: 'POST /api/users/:uid/assign-sites',
    what: { kind: 'platform' },
    req: (s) => ({ url: `/api/users/${other.userId}/assign-sites`, body: { siteIds: [s] } }),
  },
  {
    route: 'POST /api/users/:uid/remove-sites',
    what: { kind: 'platform' },
    req: (s) => ({ url: `/api/users/${member.uid}/remove-sites`, body: { siteIds: [s] } }),
  },
  { route: 'DELETE /api/users/:uid', what: { kind: 'platform' }, req: () => ({ url: `/api/users/${member.uid}` }) },
  // ---- platform: the agent-installer catalog (api/routes/installer.ts)
  { route: 'GET /api/installer', what: { kind: 'platform' }, req: () => ({ url: '/api/installer' }) },
  { route: 'GET /api/installer/latest', what: { kind: 'platform' }, req: () => ({ url: '/api/installer/latest' }) },
  {
    route: 'POST /api/installer/upload',
    what: { kind: 'platform' },
    req: () => ({ url: '/api/installer/upload', body: { version: '999999999.0.0', sha256: HASH } }),
  },
  {
    route: 'PUT /api/installer/upload',
    what: { kind: 'platform' },
    req: () => ({ url: '/api/installer/upload', body: { version: '999999999.0.0' } }),
  },
  {
    route: 'POST /api/installer/:version/set-latest',
    what: { kind: 'platform' },
    req: () => ({ url: '/api/installer/999999999.0.0/set-latest' }),
  },
  { route: 'DELETE /api/installer/:version', what: { kind: 'platform' }, req: () => ({ url: '/api/installer/999999999.0.0' }) },
  { route: 'GET /api/agent/installer/:version', what: { kind: 'agent' }, req: () => ({ url: '/api/agent/installer/latest' }) },
  // ---- conversations (api/routes/conversations.ts): chat read to list and read back, chat write for the rest; the
  // /api/chat alias runs the same handlers
  ...['/api/cortex/conversations', '/api/chat'].flatMap((base): Row[] => {
    const chat =
      (permission: Requirement['permission']) =>
      (s: string): Requirement[] => [{ resource: 'chat', id: s, permission }];
    const one = `${base}/${CONVERSATION}`;
    return [
      { route: `POST ${base}`, what: { kind: 'site', needs: chat('write') }, req: (s) => ({ url: base, body: { siteId: s } }) },
      { route: `GET ${base}`, what: { kind: 'site', needs: chat('read') }, req: (s) => ({ url: `${base}?siteId=${s}` }) },
      { route: `GET ${base}/:conversationId`, what: { kind: 'site', needs: chat('read') }, req: () => ({ url: one }) },
      {
        route: `POST ${base}/:conversationId`,
        what: { kind: 'site', needs: chat('write') },
        req: () => ({ url: one, body: { message: 'hi' } }),
      },
      {
        route: `PATCH ${base}/:conversationId`,
        what: { kind: 'site', needs: chat('write') },
        req: () => ({ url: one, body: { title: 't' } }),
      },
      { route: `DELETE ${base}/:conversationId`, what: { kind: 'site', needs: chat('write') }, req: () => ({ url: one }) },
      {
        route: `POST ${base}/:conversationId/restore`,
        what: { kind: 'site', needs: chat('write') },
        req: () => ({ url: `${one}/restore` }),
      },
    ];
  }),
  // ---- agent protocol
  { route: 'POST /api/agent/heartbeat', what: { kind: 'agent' }, req: () => ({ url: '/api/agent/heartbeat', body: {} }) },
  { route: 'GET /api/agent/commands', what: { kind: 'agent' }, req: () => ({ url: '/api/agent/commands' }) },
  { route: 'GET /api/agent/signing-keys', what: { kind: 'agent' }, req: () => ({ url: '/api/agent/signing-keys' }) },
  {
    route: 'POST /api/agent/commands/:commandId',
    what: { kind: 'agent' },
    req: () => ({ url: `/api/agent/commands/${COMMAND}`, body: { status: 'completed' } }),
  },
  {
    route: 'PUT /api/agent/commands/:commandId/screenshot',
    what: { kind: 'agent' },
    req: () => ({ url: `/api/agent/commands/${COMMAND}/screenshot` }),
  },
  {
    route: 'GET /api/agent/roosts/:roostId/versions/:versionId',
    what: { kind: 'agent' },
    req: () => ({ url: `/api/agent/roosts/${ROOST}/versions/${VERSION_ID}` }),
  },
  {
    route: 'PUT /api/agent/roosts/:roostId/state',
    what: { kind: 'agent' },
    req: () => ({ url: `/api/agent/roosts/${ROOST}/state`, body: { reportedVersionId: VERSION_ID, status: 'pending' } }),
  },
];

/** The API reference page's own routes (static assets and the rendered document) are public. */
const DOCS_PREFIX = '/docs';

let mainKeyId: string;
const keyOfMain = () => mainKeyId;

// ---------------------------------------------------------------------------------------------------
// Route enumeration

/** Every `METHOD url` the server registers (HEAD of GET routes left out). */
function registeredRoutes(app: FastifyInstance): string[] {
  const table = (app as unknown as { routeTable?: { method: string; url: string }[] }).routeTable;
  if (table) return [...new Set(table.filter((r) => r.method !== 'HEAD').map((r) => `${r.method} ${r.url}`))].sort();
  // Fallback: walk the printed router tree (one line per node: `├── /segment (GET, POST)`).
  const out: string[] = [];
  const stack: string[] = [];
  for (const line of app.printRoutes({ commonPrefix: false }).split('\n')) {
    const m = /^([│ ]*)[├└]── (.*?)(?: \(([A-Z, ]+)\))?$/.exec(line);
    if (!m) continue;
    const depth = m[1].length / 4;
    stack.length = depth;
    stack.push(m[2]);
    for (const method of (m[3] ?? '').split(', ').filter((x) => x && x !== 'HEAD')) out.push(`${method} ${stack.join('')}`);
  }
  return [...new Set(out)].sort();
}

// ---------------------------------------------------------------------------------------------------
// Database fingerprint

let siteTables: { table_name: string }[] | undefined;

/** Row hashes of every table with a site_id (for the two sites) and of the two users' identity rows. */
async function fingerprint(): Promise<Record<string, string>> {
  const db = h.deps.db;
  const siteIds = [h.siteId, other.siteId];
  const uids = [h.userId, other.userId, member.uid];
  siteTables ??= (
    await db.query<{ table_name: string }>(
      `SELECT DISTINCT table_name FROM information_schema.columns
        WHERE table_schema = current_schema() AND column_name = 'site_id' ORDER BY table_name`,
    )
  ).rows;
  const tables = siteTables;
  const out: Record<string, string> = {};
  const agg = (filter: string) =>
    `SELECT count(*)::int AS n, md5(coalesce(string_agg((to_jsonb(t) - 'last_used_at')::text, '|' ORDER BY (to_jsonb(t) - 'last_used_at')::text), '')) AS h FROM %T t WHERE ${filter}`;
  for (const { table_name } of tables) {
    const r = (await db.query(agg('t.site_id = ANY($1::text[])').replace('%T', `"${table_name}"`), [siteIds])).rows[0];
    out[table_name] = `${r.n}:${r.h}`;
  }
  for (const t of ['users', 'api_keys', 'sessions']) {
    const r = (await db.query(agg('t.uid = ANY($1::text[])').replace('%T', t), [uids])).rows[0];
    out[t] = `${r.n}:${r.h}`;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Credentials

/** A key of this site's member holding every permission except the one the route needs. */
const lackingKeys = new Map<string, string>();
async function lackingKey(needs: Requirement[]): Promise<string> {
  const sig = JSON.stringify(needs.map((n) => [n.resource, n.permission]));
  const hit = lackingKeys.get(sig);
  if (hit) return hit;
  const scopes: Scope[] = RESOURCES.map((resource) => ({
    resource,
    id: '*',
    permissions: PERMISSIONS.filter((p) => !needs.some((n) => n.resource === resource && n.permission === p)),
  })).filter((s) => s.permissions.length > 0);
  const { raw } = await insertKey(h.deps.db, { uid: member.uid, scopes, name: `lacks ${sig}` });
  lackingKeys.set(sig, raw);
  return raw;
}

async function agentFor(siteId: string): Promise<string> {
  const token = `sat_${randomBytes(32).toString('base64url')}`;
  await h.deps.db.query('INSERT INTO machines (site_id, machine_id, agent_token_hash) VALUES ($1, $2, $3)', [
    siteId,
    newId('mach'),
    sha256Hex(token),
  ]);
  return token;
}

beforeAll(async () => {
  h = await createHarness();
  other = await h.other();
  member = await makeUser(h.deps.db);
  await addMember(h.deps.db, h.siteId, member.uid);
  agentToken = await agentFor(h.siteId);
  otherAgentToken = await agentFor(other.siteId);
  testKey = (await insertKey(h.deps.db, { uid: member.uid, scopes: fullAccessScopes(), environment: 'test', name: 'full test key' })).raw;
  mainKeyId = (await h.deps.db.query<{ key_id: string }>('SELECT key_id FROM api_keys WHERE uid = $1', [h.userId])).rows[0].key_id;
  // A member removed from the site through the Users route, and a member whose user was deleted.
  const removed = await makeUser(h.deps.db);
  await addMember(h.deps.db, h.siteId, removed.uid);
  removedKey = (await insertKey(h.deps.db, { uid: removed.uid, scopes: fullAccessScopes(), name: 'removed member' })).raw;
  const removal = await h.request({
    method: 'POST',
    url: `/api/users/${removed.uid}/remove-sites`,
    body: { siteIds: [h.siteId] },
    idempotencyKey: true,
  });
  expect(removal.json()).toMatchObject({ removedSiteIds: [h.siteId] });
  const gone = await makeUser(h.deps.db);
  await addMember(h.deps.db, h.siteId, gone.uid);
  deletedKey = (await insertKey(h.deps.db, { uid: gone.uid, scopes: fullAccessScopes(), name: 'deleted member' })).raw;
  await h.deps.db.query('UPDATE users SET deleted = true, deleted_at = now() WHERE uid = $1', [gone.uid]);
  await h.deps.db.query('INSERT INTO conversations (site_id, conversation_id, created_by) VALUES ($1, $2, $3)', [
    h.siteId,
    CONVERSATION,
    h.userId,
  ]);
});
afterAll(async () => h.close());

async function send(row: Row, key: string | null): Promise<{ status: number; body: any }> {
  const method = row.route.split(' ')[0];
  const { url, body } = row.req(h.siteId);
  const headers: Record<string, string> = method === 'GET' ? {} : { 'idempotency-key': idemKey() };
  const res = await h.request({ method, url, body, key, headers });
  let parsed: any;
  try {
    parsed = res.json();
  } catch {
    parsed = res.body;
  }
  return { status: res.statusCode, body: parsed };
}

const answer = (r: { status: number; body: any }) => ({ status: r.status, code: r.body?.code });

// ---------------------------------------------------------------------------------------------------

describe('authorisation matrix', () => {
  it('has a row for every registered route (and no row for a route that does not exist)', () => {
    const registered = registeredRoutes(h.app).filter((r) => !r.split(' ')[1].startsWith(DOCS_PREFIX));
    const listed = MATRIX.map((r) => r.route).sort();
    expect({ missing: registered.filter((r) => !listed.includes(r)), stale: listed.filter((r) => !registered.includes(r)) }).toEqual({
      missing: [],
      stale: [],
    });
  });

  it('serves the API reference page without a credential', async () => {
    const docs = registeredRoutes(h.app).filter((r) => r.startsWith(`GET ${DOCS_PREFIX}`));
    expect(docs.length).toBeGreaterThan(0);
    for (const r of docs) {
      const url = r
        .split(' ')[1]
        .replace('*', 'index.html')
        .replace(/:[A-Za-z]+/g, 'x');
      const res = await h.request({ method: 'GET', url, key: null });
      expect({ route: r, unauthorized: res.statusCode === 401 || res.statusCode === 403, serverError: res.statusCode >= 500 }).toEqual({
        route: r,
        unauthorized: false,
        serverError: false,
      });
    }
  });

  it.each(MATRIX.map((r) => [r.route, r] as const))('%s', async (_name, row) => {
    const w = row.what;
    const needs = w.kind === 'site' ? w.needs(h.siteId) : [];
    const lackingRaw = await lackingKey(needs);
    const before = await fingerprint();
    const got: Record<string, unknown> = {};
    const want: Record<string, unknown> = {};

    // (a) no credential
    got.none = answer(await send(row, null));
    want.none = w.kind === 'public' ? { status: w.status, code: w.code } : { status: 401, code: 'unauthorized' };

    if (w.kind !== 'public') {
      // (b) a full-access key of another site, held by a plain member of that site
      got.otherSite = answer(await send(row, other.apiKey));
      want.otherSite =
        w.kind === 'site'
          ? { status: 404, code: 'not_found' }
          : w.kind === 'agent'
            ? { status: 401, code: 'unauthorized' }
            : w.kind === 'interactive' || w.kind === 'platform'
              ? { status: 403, code: 'forbidden' }
              : { status: 200, code: undefined };

      // (c) a key of this site lacking exactly the permission the route needs
      const lacking = await send(row, lackingRaw);
      got.lacking = answer(lacking);
      want.lacking =
        w.kind === 'site'
          ? { status: 403, code: 'scope_insufficient' }
          : w.kind === 'agent'
            ? { status: 401, code: 'unauthorized' }
            : w.kind === 'interactive' || w.kind === 'platform'
              ? { status: 403, code: 'forbidden' }
              : { status: 200, code: undefined };
      if (w.kind === 'site') {
        got.required = lacking.body?.required;
        want.required = { resource: needs[0].resource, id: needs[0].id, permission: needs[0].permission };
      }

      // (e) a test key with every scope, of a member of this live site
      got.testKey = answer(await send(row, testKey));
      want.testKey =
        w.kind === 'site' || w.kind === 'interactive' || w.kind === 'platform'
          ? { status: 403, code: 'forbidden' }
          : w.kind === 'agent'
            ? { status: 401, code: 'unauthorized' }
            : { status: 200, code: undefined };

      // (f) a full-access key of a user removed from this site (POST /api/users/{uid}/remove-sites): the site
      // is hidden again from the next request on, whatever its wildcard scopes say
      got.removed = answer(await send(row, removedKey));
      want.removed =
        w.kind === 'site'
          ? { status: 404, code: 'not_found' }
          : w.kind === 'agent'
            ? { status: 401, code: 'unauthorized' }
            : w.kind === 'interactive' || w.kind === 'platform'
              ? { status: 403, code: 'forbidden' }
              : { status: 200, code: undefined };

      // (g) a full-access key of a deleted member: 401 everywhere
      got.deletedUser = answer(await send(row, deletedKey));
      want.deletedUser = { status: 401, code: 'unauthorized' };

      // (d) agent tokens: on user routes 401; on routes agents may use, another site's agent gets 404
      if (w.kind !== 'agent') {
        got.agent = answer(await send(row, w.kind === 'site' && w.agentAllowed ? otherAgentToken : agentToken));
        want.agent = w.kind === 'site' && w.agentAllowed ? { status: 404, code: 'not_found' } : { status: 401, code: 'unauthorized' };
      }
    }

    got.db = await fingerprint();
    want.db = before;
    expect(got).toEqual(want);
  });
});

describe('svk_test_ keys act on sandbox sites only; svk_live_ keys on live sites only (docs/decisions/test-keys.md)', () => {
  let sandbox: { siteId: string; userId: string; apiKey: string };
  let liveKeyOfSandboxOwner: string;
  const tag = randomBytes(4).toString('hex');
  beforeAll(async () => {
    sandbox = await bootstrap(h.deps.db, {
      siteName: `sandbox-${tag}`,
      email: `sandbox-${tag}@example.test`,
      secret: 'test-bootstrap-secret',
      environment: 'test',
    });
    liveKeyOfSandboxOwner = (await insertKey(h.deps.db, { uid: sandbox.userId, scopes: fullAccessScopes(), name: 'live key' })).raw;
  });

  it('bootstrap of a sandbox site issues a svk_test_ key, which reads and writes there', async () => {
    expect(sandbox.apiKey).toMatch(/^svk_test_/);
    const created = await h.request({
      method: 'POST',
      url: '/api/roosts',
      key: sandbox.apiKey,
      body: { siteId: sandbox.siteId, name: 'sandboxed' },
    });
    expect(created.statusCode).toBe(201);
    const listed = await h.request({ method: 'GET', url: `/api/roosts?siteId=${sandbox.siteId}`, key: sandbox.apiKey });
    expect([listed.statusCode, listed.json().roosts.length]).toEqual([200, 1]);
    const whoami = await h.request({ method: 'GET', url: '/api/whoami', key: sandbox.apiKey });
    expect(whoami.json().key.environment).toBe('test');
  });

  it('a svk_live_ key is refused on a sandbox site with 403 forbidden, and nothing changes', async () => {
    const before = await h.deps.db.query('SELECT count(*)::int AS n FROM roosts WHERE site_id = $1', [sandbox.siteId]);
    for (const req of [
      { method: 'GET', url: `/api/roosts?siteId=${sandbox.siteId}` },
      { method: 'POST', url: '/api/roosts', body: { siteId: sandbox.siteId, name: 'from a live key' } },
      { method: 'GET', url: `/api/sites/${sandbox.siteId}/machines` },
    ]) {
      const res = await h.request({ ...req, key: liveKeyOfSandboxOwner });
      expect([req.url, res.statusCode, res.json().code, res.headers['content-type']]).toEqual([
        req.url,
        403,
        'forbidden',
        'application/problem+json; charset=utf-8',
      ]);
      expect(res.json().detail).toContain('sandbox');
    }
    const after = await h.deps.db.query('SELECT count(*)::int AS n FROM roosts WHERE site_id = $1', [sandbox.siteId]);
    expect(after.rows[0].n).toBe(before.rows[0].n);
  });

  it("the sandbox owner's svk_test_ key is refused on live sites they may act on; sessions and ID tokens act on both", async () => {
    await addMember(h.deps.db, h.siteId, sandbox.userId);
    const res = await h.request({ method: 'GET', url: `/api/roosts?siteId=${h.siteId}`, key: sandbox.apiKey });
    expect([res.statusCode, res.json().code]).toEqual([403, 'forbidden']);
    expect(res.json().detail).toContain('svk_test_');
    const idToken = await idTokenFor(h, { uid: sandbox.userId, email: `sandbox-${tag}@example.test` });
    for (const siteId of [h.siteId, sandbox.siteId]) {
      const r = await h.request({ method: 'GET', url: `/api/roosts?siteId=${siteId}`, key: idToken });
      expect([siteId, r.statusCode]).toEqual([siteId, 200]);
    }
  });

  it('a svk_test_ key reads platform routes but changes nothing platform-wide, and creates sandbox sites only', async () => {
    const other = await h.other(); // a live site and its owner
    const memberships = async () =>
      (await h.deps.db.query('SELECT site_id FROM site_members WHERE uid = $1 ORDER BY site_id', [other.userId])).rows;
    const role = async () => (await h.deps.db.query('SELECT role FROM users WHERE uid = $1', [other.userId])).rows[0].role;
    const before = {
      members: await memberships(),
      sites: (await h.deps.db.query('SELECT count(*)::int AS n FROM sites')).rows[0].n,
      role: await role(),
    };
    for (const url of ['/api/users', `/api/users/${other.userId}`, '/api/installer']) {
      const r = await h.request({ method: 'GET', url, key: sandbox.apiKey });
      expect([url, r.statusCode]).toEqual([url, 200]);
    }
    const changes = [
      { method: 'POST', url: `/api/users/${other.userId}/assign-sites`, body: { siteIds: [h.siteId] } },
      { method: 'POST', url: `/api/users/${other.userId}/remove-sites`, body: { siteIds: [other.siteId] } },
      { method: 'POST', url: `/api/users/${other.userId}/promote`, body: { role: 'superadmin' } },
      { method: 'POST', url: `/api/users/${other.userId}/demote` },
      { method: 'POST', url: '/api/installer/9.9.9/set-latest' },
      { method: 'DELETE', url: '/api/installer/9.9.9' },
      { method: 'POST', url: '/api/sites', body: { name: `live-from-test-${tag}`, environment: 'live' } },
    ];
    for (const req of changes) {
      const res = await h.request({ ...req, key: sandbox.apiKey, idempotencyKey: true });
      expect([req.url, res.statusCode, res.json().code]).toEqual([req.url, 403, 'forbidden']);
      expect(res.json().detail).toContain('svk_test_');
    }
    expect(await memberships()).toEqual(before.members);
    expect((await h.deps.db.query('SELECT count(*)::int AS n FROM sites')).rows[0].n).toBe(before.sites);
    expect(await role()).toBe(before.role);
    // With no environment named, a test key's site is a sandbox site, which the key then acts on.
    const made = await h.request({
      method: 'POST',
      url: '/api/sites',
      key: sandbox.apiKey,
      idempotencyKey: true,
      body: { name: `sandbox-made-${tag}` },
    });
    expect([made.statusCode, made.json().environment]).toEqual([201, 'test']);
    const patched = await h.request({
      method: 'PATCH',
      url: `/api/sites/${made.json().siteId}`,
      key: sandbox.apiKey,
      idempotencyKey: true,
      body: { timezone: 'Europe/Oslo' },
    });
    expect([patched.statusCode, patched.json().timezone]).toEqual([200, 'Europe/Oslo']);
    // A live key still provisions sandbox sites, as `roost admin bootstrap --sandbox` does.
    const byLive = await h.request({
      method: 'POST',
      url: '/api/sites',
      idempotencyKey: true,
      body: { name: `sandbox-by-live-${tag}`, environment: 'test' },
    });
    expect([byLive.statusCode, byLive.json().environment]).toEqual([201, 'test']);
  });

  it('bootstrap refuses to turn an existing live site into a sandbox one (and back)', async () => {
    const { rows } = await h.deps.db.query<{ name: string }>('SELECT name FROM sites WHERE site_id = $1', [h.siteId]);
    await expect(
      bootstrap(h.deps.db, {
        siteName: rows[0].name,
        email: `ops-${randomBytes(3).toString('hex')}@example.test`,
        secret: 's',
        environment: 'test',
      }),
    ).rejects.toThrow(/live site/);
  });
});

/**
 * Bad input over every route of the same table (docs/decisions/hostile-input.md): with a credential that may act,
 * a malformed id in each path parameter (U+0000; wrong characters and over-long), U+0000 in a query parameter,
 * a body of the wrong type, a key with U+0000 and lists far past any documented maximum are each a
 * problem+json 400 (validation_failed, or the route's own version_ref_malformed; 413 payload_too_large when the
 * list is past the route's body limit; 415 for a JSON body where the route takes bytes) and change nothing. A
 * route added to MATRIX is covered the day it lands.
 */
describe('bad input on every route: problem+json with the documented status and code, nothing changed', () => {
  // Key lifecycle routes take a session (API keys are 403 there whatever the input): a superadmin's.
  let session: string;
  beforeAll(async () => {
    const admin = await makeUser(h.deps.db, { role: 'superadmin' });
    await addMember(h.deps.db, h.siteId, admin.uid);
    session = (await sessionFor(h, admin)).token;
  });
  const credential = (row: Row): string | null =>
    row.what.kind === 'agent' ? agentToken : row.what.kind === 'public' ? null : row.what.kind === 'interactive' ? session : h.apiKey;
  const params = (row: Row) => [...row.route.split(' ')[1].matchAll(/:([A-Za-z0-9_]+)/g)].map((m) => m[1]);

  /** The row's concrete URL with the `name` path parameter replaced by `value` (already URL-encoded). */
  function withParam(row: Row, name: string, value: string): string {
    const [path, query] = row.req(h.siteId).url.split('?');
    const template = row.route.split(' ')[1].split('/');
    const parts = path.split('/');
    parts[template.indexOf(`:${name}`)] = value;
    return parts.join('/') + (query === undefined ? '' : `?${query}`);
  }

  async function attempt(row: Row, url: string, body: unknown, raw?: string) {
    const method = row.route.split(' ')[0];
    const headers: Record<string, string> = method === 'GET' ? {} : { 'idempotency-key': idemKey() };
    const key = credential(row);
    if (key) headers.authorization = `Bearer ${key}`;
    if (raw !== undefined) headers['content-type'] = 'application/json';
    const res = await h.app.inject({ method: method as 'GET', url, headers, payload: raw ?? (body as object) });
    const json = (() => {
      try {
        return res.json();
      } catch {
        return undefined;
      }
    })();
    return {
      status: res.statusCode,
      code: json?.code,
      problem: String(res.headers['content-type']).startsWith('application/problem+json'),
    };
  }

  it.each(MATRIX.filter((r) => !r.route.includes(' /docs')).map((r) => [r.route, r] as const))('%s', async (_name, row) => {
    const before = await fingerprint();
    const { url, body } = row.req(h.siteId);
    const got: Record<string, unknown> = {};
    const want: Record<string, unknown> = {};
    const sent = body;

    got.queryNul = await attempt(row, `${url}${url.includes('?') ? '&' : '?'}probe=a%00b`, sent);
    want.queryNul = { status: 400, code: 'validation_failed', problem: true };
    for (const name of params(row)) {
      got[`${name}Nul`] = await attempt(row, withParam(row, name, 'bad%00id'), sent);
      want[`${name}Nul`] = { status: 400, code: 'validation_failed', problem: true };
      const long = await attempt(row, withParam(row, name, `${'x'.repeat(80)}%20%2A`), sent);
      got[`${name}Malformed`] = { ...long, code: long.code === 'version_ref_malformed' ? 'validation_failed' : long.code };
      want[`${name}Malformed`] = { status: 400, code: 'validation_failed', problem: true };
    }
    const entry = h.app.routeTable.find((r) => `${r.method} ${r.url}` === row.route && r.hasBody);
    // A route that takes bytes (the screenshot upload: image/png) refuses a JSON body as 415 naming its type.
    if (entry && !entry.consumes.includes('application/json')) {
      got.bodyJson = await attempt(row, url, undefined, '[1]');
      want.bodyJson = { status: 415, code: 'unsupported_media_type', problem: true };
    } else if (entry) {
      got.bodyArray = await attempt(row, url, undefined, '[1]');
      want.bodyArray = { status: 400, code: 'validation_failed', problem: true };
      got.bodyNulKey = await attempt(row, url, undefined, JSON.stringify({ ...(body as object), 'a\u0000': 1 }));
      want.bodyNulKey = { status: 400, code: 'validation_failed', problem: true };
      // Every list of the body far past any documented maximum (10,000 ids is the largest).
      const lists = Object.entries((body ?? {}) as Record<string, unknown>).filter(([, v]) => Array.isArray(v) && v.length > 0);
      for (const [k, v] of lists) {
        const res = await attempt(row, url, { ...(body as object), [k]: Array.from({ length: 20_001 }, () => (v as unknown[])[0]) });
        got[`${k}Oversized`] = {
          ...res,
          status: res.status === 413 ? 400 : res.status,
          code: res.code === 'payload_too_large' ? 'validation_failed' : res.code,
        };
        want[`${k}Oversized`] = { status: 400, code: 'validation_failed', problem: true };
      }
    }
    got.db = await fingerprint();
    want.db = before;
    expect(got).toEqual(want);
  });
});
