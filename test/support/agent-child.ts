/**
 * One reference agent as a process of its own, for crash tests: `node -r tsx/cjs test/support/agent-child.ts`
 * with its options as JSON in ROOST_AGENT_OPTIONS (agent/agent.ts AgentOptions: baseUrl, siteId,
 * enrolmentSecret, machineId, rootDir, faults…). With ROOST_AGENT_JOURNAL=1 it journals its commands in the
 * root's state folder as `roost agent run` does (agent/journal.ts). Prints `ready` once started; runs until killed.
 */
import path from 'node:path';
import { Agent, type AgentOptions } from '../../agent/agent';
import { FileJournal } from '../../agent/journal';

const opts = JSON.parse(process.env.ROOST_AGENT_OPTIONS ?? '{}') as AgentOptions;
if (process.env.ROOST_AGENT_JOURNAL === '1') opts.journal = new FileJournal(path.join(path.resolve(opts.rootDir), 'state'));
const agent = new Agent(opts);
agent.on('warn', (m: string) => process.stderr.write(`warn: ${m}\n`));
agent
  .start()
  .then(() => process.stdout.write('ready\n'))
  .catch((err: unknown) => {
    process.stderr.write(`agent failed to start: ${String(err)}\n`);
    process.exit(1);
  });
