/** Registers every route family. One file per family; find a route by its URL in one step. */
import type { FastifyInstance } from 'fastify';
import meta from './meta';
import keys from './keys';
import sessions from './sessions';
import agent from './agent';
import machines from './machines';
import chunks from './chunks';
import roosts from './roosts';
import versions from './versions';
import deploy from './deploy';
import rollouts from './rollouts';
import quota from './quota';
import events from './events';
import signingKeys from './signing-keys';
import audit from './audit';
import webhooks from './webhooks';
import observability from './observability';
import classicDeployments from './classic-deployments';
import installerTemplates from './installer-templates';
import users from './users';
import conversations from './conversations';
import sites from './sites';
import processes from './processes';

export async function registerRoutes(app: FastifyInstance): Promise<void> {
  await app.register(meta);
  await app.register(keys);
  await app.register(sessions);
  await app.register(agent);
  await app.register(machines);
  await app.register(chunks);
  await app.register(roosts);
  await app.register(versions);
  await app.register(deploy);
  await app.register(rollouts);
  await app.register(quota);
  await app.register(events);
  await app.register(signingKeys);
  await app.register(audit);
  await app.register(webhooks);
  await app.register(observability);
  await app.register(classicDeployments);
  await app.register(installerTemplates);
  await app.register(users);
  await app.register(conversations);
  await app.register(sites);
  await app.register(processes);
}
