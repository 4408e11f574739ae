/**
 * Import directions of the layers (docs/architecture.md), checked by `npm run lint` in CI:
 *
 *   api → services → db | storage | net | workflows/client.ts → domain | config
 *   telemetry (metrics, tracing, logging) sits beside config: api, services, activities and worker may use it
 *   worker → workflows (+ activities → db | storage) ; agent, cli → domain and their own HTTP client
 *   stack/ (the embedded default's launchers) is imported only by entry points; `roost agent` (cli/commands/agent.ts)
 *   is the launcher of the agent process.
 *
 * Every rule is an error, and so is any import cycle.
 */

/** Entry points that may wire anything together (the launchers of the embedded default, tests, benchmarks). */
const LAUNCHERS =
  '^(stack|test|bench|scripts)/|^cli/(demo|main)\\.ts$|^cli/commands/(admin|agent|demo|stack|token)\\.ts$|^worker/main\\.ts$|^api/server\\.ts$';

const layer = (name, from, allowed) => ({
  name,
  severity: 'error',
  comment: `${from} may import only ${allowed.join(', ')}`,
  from: { path: from, pathNot: LAUNCHERS },
  to: {
    path: '^(api|services|db|storage|domain|config|telemetry|workflows|activities|worker|cli|agent|stack)/',
    pathNot: allowed.map((a) => `^${a}`),
  },
});

module.exports = {
  forbidden: [
    { name: 'no-circular', severity: 'error', comment: 'import cycles', from: {}, to: { circular: true } },
    layer('domain-is-pure', '^domain/', ['domain/']),
    layer('config', '^config/', ['config/', 'domain/']),
    layer('telemetry', '^telemetry/', ['telemetry/', 'domain/', 'config/']),
    layer('db', '^db/', ['db/', 'domain/', 'config/']),
    layer('storage', '^storage/', ['storage/', 'domain/', 'config/']),
    layer('net', '^net/', ['net/', 'domain/', 'config/']),
    layer('services', '^services/', [
      'services/',
      'db/',
      'storage/',
      'net/',
      'workflows/client\\.ts',
      'workflows/',
      'domain/',
      'config/',
      'telemetry/',
    ]),
    layer('api', '^api/', ['api/', 'services/', 'domain/', 'config/', 'telemetry/']),
    layer('activities', '^activities/', [
      'activities/',
      'db/',
      'storage/',
      'net/',
      'workflows/client\\.ts',
      'domain/',
      'config/',
      'telemetry/',
    ]),
    layer('worker', '^worker/', ['worker/', 'workflows/', 'activities/', 'db/', 'storage/', 'domain/', 'config/', 'telemetry/']),
    layer('agent', '^agent/', ['agent/', 'domain/']),
    layer('cli', '^cli/', ['cli/', 'domain/']),
    {
      name: 'workflow-code-is-deterministic',
      severity: 'error',
      comment: 'workflow files import only domain rules, other workflow files and activity types',
      from: { path: '^workflows/', pathNot: '^workflows/client\\.ts$' },
      to: {
        pathNot: '^(workflows/(?!client\\.ts)|domain/|node_modules/@temporalio/(workflow|common)/)',
        dependencyTypesNot: ['type-only'],
      },
    },
    {
      name: 'workflow-client-side',
      severity: 'error',
      comment: 'workflows/client.ts is the Temporal client side: domain, config and the workflow definitions',
      from: { path: '^workflows/client\\.ts$' },
      to: { path: '^(api|services|db|storage|net|activities|worker|cli|agent|stack)/' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(node_modules|\\.data|coverage)/' },
    tsConfig: { fileName: 'tsconfig.json' },
    tsPreCompilationDeps: true,
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default'] },
  },
};
