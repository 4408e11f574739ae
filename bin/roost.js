#!/usr/bin/env node
// Entry point for `npx roost`: registers tsx's CommonJS loader so the TypeScript CLI runs without a build step.
// On a fresh clone (no node_modules yet) it first installs what is missing with scripts/ensure-deps.sh, as
// `npm run demo` and `npm test` do: everything `roost stack` needs for `stack`, the npm packages for any other
// command. A failed install exits with the script's status; its last line says what to install or set.
const path = require('node:path');

function tsxInstalled() {
  try {
    require.resolve('tsx/cjs');
    return true;
  } catch {
    return false;
  }
}

if (!tsxInstalled()) {
  const { spawnSync } = require('node:child_process');
  const purpose = process.argv[2] === 'stack' ? 'stack' : 'cli';
  const script = path.join(__dirname, '..', 'scripts', 'ensure-deps.sh');
  const r = spawnSync('bash', [script, purpose], { stdio: ['ignore', 'inherit', 'inherit'] });
  if (r.status !== 0) {
    console.error(`roost: scripts/ensure-deps.sh ${purpose} exited ${r.status ?? r.signal}: the line above says what to install or set`);
    process.exit(r.status || 1);
  }
}
require('tsx/cjs');
require('../cli/main.ts');
