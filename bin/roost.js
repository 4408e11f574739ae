#!/usr/bin/env node
// Entry point for `npx roost`: registers tsx's CommonJS loader so the TypeScript CLI runs without a build step.
require('tsx/cjs');
require('../cli/main.ts');
