/**
 * API key scopes (docs/contract.md "API key and scope", Authentication 5–7). Pure rules.
 * A scope is { resource, id, permissions }; permissions are exact (write does not imply read).
 */
export const RESOURCES = ['roost', 'site', 'machine', 'chat', 'deploy', 'process', 'user', 'installer'] as const;
export const PERMISSIONS = ['read', 'write', 'deploy', 'rollback', 'admin'] as const;
export type Resource = (typeof RESOURCES)[number];
export type Permission = (typeof PERMISSIONS)[number];

export interface Scope {
  resource: Resource;
  id: string;
  permissions: Permission[];
}

/** What a route needs: any one of `anyOf` suffices. */
export interface Requirement {
  resource: Resource;
  id: string;
  permission: Permission;
}

/** True when one scope grants the exact resource, id (or `*`) and permission. */
export function scopeGrants(scope: Scope, req: Requirement): boolean {
  return scope.resource === req.resource && (scope.id === '*' || scope.id === req.id) && scope.permissions.includes(req.permission);
}

/** True when any scope grants any of the requirements. */
export function scopesAllow(scopes: Scope[], anyOf: Requirement[]): boolean {
  return anyOf.some((req) => scopes.some((s) => scopeGrants(s, req)));
}

/**
 * Parses the tooling grammar `<resource>=<id>:<perm>[,<perm>...]`.
 * @throws Error with a readable message on a bad spec.
 */
export function parseScopeSpec(spec: string): Scope {
  const m = /^([a-z]+)=([^:=\s]+):([a-z]+(?:,[a-z]+)*)$/.exec(spec.trim());
  if (!m) throw new Error(`bad scope "${spec}": expected <resource>=<id>:<perm>[,<perm>...]`);
  const [, resource, id, perms] = m;
  if (!(RESOURCES as readonly string[]).includes(resource)) throw new Error(`bad scope "${spec}": unknown resource ${resource}`);
  const permissions = perms.split(',');
  for (const p of permissions)
    if (!(PERMISSIONS as readonly string[]).includes(p)) throw new Error(`bad scope "${spec}": unknown permission ${p}`);
  return { resource: resource as Resource, id, permissions: [...new Set(permissions)] as Permission[] };
}

/** Presets wildcard the roost, site, machine and chat resources (docs/contract.md "API key and scope"). */
export const PRESETS: Record<'readonly' | 'publisher' | 'operator' | 'admin', Permission[]> = {
  readonly: ['read'],
  publisher: ['read', 'write'],
  operator: ['read', 'write', 'deploy', 'rollback'],
  admin: ['read', 'write', 'deploy', 'rollback', 'admin'],
};

export function presetScopes(preset: keyof typeof PRESETS): Scope[] {
  return (['roost', 'site', 'machine', 'chat'] as Resource[]).map((resource) => ({ resource, id: '*', permissions: [...PRESETS[preset]] }));
}
