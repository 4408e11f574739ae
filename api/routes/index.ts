/** Registers every route family. One file per family; find a route by its URL in one step. */
import type { FastifyInstance } from 'fastify';
import meta from './meta';

export async function registerRoutes(app: FastifyInstance): Promise<void> {
  await app.register(meta);
}
