/**
 * Version of the `roost` CLI and agent, emitted as `config.cliVersion`, in User-Agent and as the agent's
 * `agentVersion`: package.json `version`, unless the packaged executable was built with another
 * (`npm run build:agent -- --version X` defines ROOST_BUILD_VERSION in the bundle: scripts/build-agent.ts), so
 * a build uploaded to the installer catalog as X reports X after its self-update
 * (docs/decisions/agent-self-update.md).
 */
import { version } from '../package.json';

/** Replaced by esbuild's `define` in the packaged build; undeclared (typeof 'undefined') everywhere else. */
declare const ROOST_BUILD_VERSION: string | undefined;

export const CLI_VERSION: string = typeof ROOST_BUILD_VERSION === 'string' ? ROOST_BUILD_VERSION : version;
