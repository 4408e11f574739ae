/**
 * One reference agent as a process of its own, for crash tests: `node -r tsx/cjs test/support/agent-child.ts`
 * with its options as JSON in ROOST_AGENT_OPTIONS (agent/agent.ts AgentOptions: baseUrl, siteId,
 * enrolmentSecret, machineId, rootDir, faults…). Prints `ready` once started; runs until killed.
 */
import { Agent, type AgentOptions } from '../../agent/agent';

const opts = JSON.parse(process.env.ROOST_AGENT_OPTIONS ?? '{}') as AgentOptions;
const agent = new Agent(opts);
agent.on('warn', (m: string) => process.stderr.write(`warn: ${m}\n`));
agent
  .start()
  .then(() => process.stdout.write('ready\n'))
  .catch((err: unknown) => {
    process.stderr.write(`agent failed to start: ${String(err)}\n`);
    process.exit(1);
  });
