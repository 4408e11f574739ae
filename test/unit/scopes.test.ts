/** Scope rules (domain/scopes.ts; docs/contract.md "API key and scope", Authentication 5-7). */
import { parseScopeSpec, presetScopes, PRESETS, type Requirement, type Scope, scopeGrants, scopesAllow } from '../../domain/scopes';
import { roostRequirement } from '../../api/plugins/auth';

const req = (resource: Requirement['resource'], id: string, permission: Requirement['permission']): Requirement => ({
  resource,
  id,
  permission,
});

describe('scopeGrants / scopesAllow', () => {
  const s: Scope = { resource: 'roost', id: 'rst_1', permissions: ['read', 'write'] };

  it('matches resource, id (or *) and exact permission', () => {
    expect(scopeGrants(s, req('roost', 'rst_1', 'read'))).toBe(true);
    expect(scopeGrants(s, req('roost', 'rst_2', 'read'))).toBe(false);
    expect(scopeGrants(s, req('site', 'rst_1', 'read'))).toBe(false);
    expect(scopeGrants({ ...s, id: '*' }, req('roost', 'rst_2', 'write'))).toBe(true);
  });

  it('never implies one permission from another', () => {
    expect(scopeGrants({ resource: 'site', id: '*', permissions: ['write'] }, req('site', 's', 'read'))).toBe(false);
    expect(scopeGrants({ resource: 'roost', id: '*', permissions: ['deploy'] }, req('roost', 'r', 'write'))).toBe(false);
    expect(scopeGrants({ resource: 'roost', id: '*', permissions: ['admin'] }, req('roost', 'r', 'rollback'))).toBe(false);
  });

  it('a specific id scope does not satisfy a wildcard requirement', () => {
    expect(scopeGrants(s, req('roost', '*', 'write'))).toBe(false);
  });

  it('allows when any scope grants any requirement', () => {
    const scopes: Scope[] = [
      { resource: 'machine', id: '*', permissions: ['read'] },
      { resource: 'site', id: 's1', permissions: ['rollback'] },
    ];
    expect(scopesAllow(scopes, roostRequirement('s1', 'rst_9', 'rollback'))).toBe(true);
    expect(scopesAllow(scopes, roostRequirement('s2', 'rst_9', 'rollback'))).toBe(false);
    expect(scopesAllow([], roostRequirement('s1', 'rst_9', 'read'))).toBe(false);
    expect(scopesAllow(scopes, [])).toBe(false);
  });
});

describe('roostRequirement', () => {
  it('accepts the roost scope first, then the same permission on the site', () => {
    expect(roostRequirement('s1', 'rst_1', 'write')).toEqual([req('roost', 'rst_1', 'write'), req('site', 's1', 'write')]);
  });
});

describe('parseScopeSpec', () => {
  it('parses <resource>=<id>:<perm>[,<perm>...] and drops repeated permissions', () => {
    expect(parseScopeSpec('roost=rst_1:read,write')).toEqual({ resource: 'roost', id: 'rst_1', permissions: ['read', 'write'] });
    expect(parseScopeSpec(' site=*:admin ')).toEqual({ resource: 'site', id: '*', permissions: ['admin'] });
    expect(parseScopeSpec('deploy=x:deploy,deploy')).toEqual({ resource: 'deploy', id: 'x', permissions: ['deploy'] });
  });

  it.each([
    'roost',
    'roost=:read',
    'roost=x',
    'roost=x:',
    'roost=x:read,',
    'boat=x:read',
    'roost=x:execute',
    'roost=x:Read',
    'roost=a b:read',
    'roost=x:y:read',
  ])('rejects %p', (spec) => {
    expect(() => parseScopeSpec(spec)).toThrow(/bad scope/);
  });
});

describe('presets', () => {
  it('wildcard roost, site, machine and chat with nested permission sets', () => {
    const op = presetScopes('operator');
    expect(op.map((s) => s.resource)).toEqual(['roost', 'site', 'machine', 'chat']);
    expect(op.every((s) => s.id === '*')).toBe(true);
    expect(scopesAllow(op, roostRequirement('s', 'r', 'rollback'))).toBe(true);
    expect(scopesAllow(presetScopes('publisher'), roostRequirement('s', 'r', 'rollback'))).toBe(false);
    expect(scopesAllow(presetScopes('readonly'), roostRequirement('s', 'r', 'write'))).toBe(false);
    expect(PRESETS.admin).toEqual(['read', 'write', 'deploy', 'rollback', 'admin']);
    // Presets never reach the platform resources.
    expect(scopesAllow(presetScopes('admin'), [req('user', '*', 'admin'), req('installer', '*', 'read')])).toBe(false);
  });
});
