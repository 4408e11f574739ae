/**
 * The built-in fleet assistant (ROOST_CORTEX_PROVIDER=local, the embedded default; docs/decisions/cortex.md):
 * a deterministic retrieval assistant behind the AI SDK's language-model interface (LanguageModelV3), so it
 * runs through exactly the pipeline a real model does (`streamText`, the same tools, scoping, storage and
 * stream). It is not a language model and says so: it picks tools by matching the question's words against
 * the tools it was offered, follows up on ids and names the results mention, and writes its answer only
 * from what the tools returned. Token usage is reported in words (it has no tokenizer).
 */
import type {
  LanguageModelV3,
  LanguageModelV3CallOptions,
  LanguageModelV3FunctionTool,
  LanguageModelV3Prompt,
  LanguageModelV3StreamPart,
  LanguageModelV3Usage,
} from '@ai-sdk/provider';

/** Model id the local assistant reports (stored with each reply). */
export const LOCAL_MODEL_ID = 'roost-local-retrieval-1';
/** First line of every local answer: what answered. */
export const LOCAL_DISCLOSURE = 'Roost local assistant (retrieval over your fleet data, not a language model):';

type Json = Record<string, unknown>;
interface Call {
  toolCallId: string;
  toolName: string;
  input: Json;
}
interface Result {
  toolName: string;
  input: Json;
  output: unknown;
  error: string | null;
}

/** Words of the question that point at each tool (besides the words of the tool's own name and description). */
const KEYWORDS: Record<string, string[]> = {
  list_machines: [
    'machine',
    'machines',
    'fleet',
    'host',
    'hosts',
    'computer',
    'computers',
    'pc',
    'pcs',
    'online',
    'offline',
    'heartbeat',
    'agents',
    'down',
    'up',
  ],
  get_machine: ['cpu', 'memory', 'ram', 'disk', 'disks', 'metrics', 'load', 'health', 'process', 'processes'],
  list_roosts: ['roost', 'roosts', 'bundle', 'bundles', 'version', 'versions', 'release', 'releases', 'published', 'current', 'files'],
  list_rollouts: ['rollout', 'rollouts', 'deployment', 'deployments', 'deployed', 'canary', 'wave', 'waves', 'progress'],
  list_classic_deployments: ['installer', 'installers', 'classic', 'msi', 'setup', 'installation', 'installations'],
  recent_audit: ['audit', 'who', 'changed', 'log', 'did'],
  recent_events: ['event', 'events', 'happened', 'recent', 'recently', 'lately', 'today'],
};
const DEPLOY_WORDS = ['deploy', 'ship', 'push'];
const CLASSIC_ACTIONS = ['retry', 'cancel', 'uninstall'];
const ROLLBACK_WORDS = ['rollback', 'revert', 'back'];
const COMMAND_WORDS: Record<string, string> = {
  reboot: 'reboot_machine',
  restart: 'reboot_machine',
  shutdown: 'shutdown_machine',
  shut: 'shutdown_machine',
  screenshot: 'capture_screenshot',
};

function words(text: string): string[] {
  return text.toLowerCase().match(/[a-z0-9][a-z0-9._-]*/g) ?? [];
}

function usage(input: number, output: number): LanguageModelV3Usage {
  return {
    inputTokens: { total: input, noCache: input, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: output, text: output, reasoning: undefined },
  };
}

/** The last user message's text, and the tool calls/results that followed it in this reply. */
function readPrompt(prompt: LanguageModelV3Prompt): { question: string; system: string; calls: Call[]; results: Result[]; words: number } {
  let last = -1;
  prompt.forEach((m, i) => {
    if (m.role === 'user') last = i;
  });
  const system = prompt
    .filter((m) => m.role === 'system')
    .map((m) => m.content)
    .join('\n');
  let question = '';
  let count = words(system).length;
  const calls: Call[] = [];
  const results: Result[] = [];
  prompt.forEach((m, i) => {
    if (m.role === 'system') return;
    for (const p of m.content) {
      if (p.type === 'text') count += words(p.text).length;
      if (i === last && p.type === 'text') question += `${p.text}\n`;
      if (i <= last) continue;
      if (p.type === 'tool-call') calls.push({ toolCallId: p.toolCallId, toolName: p.toolName, input: (p.input ?? {}) as Json });
      if (p.type === 'tool-result') {
        const call = calls.find((c) => c.toolCallId === p.toolCallId);
        const o = p.output;
        const isError = o.type === 'error-text' || o.type === 'error-json' || o.type === 'execution-denied';
        const value = o.type === 'execution-denied' ? o.reason : o.value;
        results.push({
          toolName: p.toolName,
          input: call?.input ?? {},
          output: isError ? null : value,
          error: isError ? String(typeof value === 'string' ? value : JSON.stringify(value)) : null,
        });
      }
    }
  });
  return { question: question.trim(), system, calls, results, words: count };
}

/** The conversation's machine, as the system prompt names it (services/conversations.ts systemPrompt). */
function conversationMachine(system: string): string | null {
  return /^Conversation machine: (\S+)$/m.exec(system)?.[1] ?? null;
}

/** Ids or names from `candidates` that the question mentions as whole words (case-insensitive). */
function mentioned(question: string, candidates: (string | null | undefined)[]): string[] {
  const q = ` ${question.toLowerCase().replace(/[^a-z0-9._-]+/g, ' ')} `;
  return candidates.filter((c): c is string => typeof c === 'string' && c.length > 0 && q.includes(` ${c.toLowerCase()} `));
}

const asList = (v: unknown): Json[] => (Array.isArray(v) ? (v as Json[]) : []);
const obj = (v: unknown): Json => (v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Json) : {});

/**
 * The next tool calls for a question, given the tools offered and the results so far (empty: answer now).
 * Exported for unit tests.
 */
export function planCalls(question: string, offered: Set<string>, results: Result[], machine: string | null): Omit<Call, 'toolCallId'>[] {
  const q = new Set(words(question));
  const done = (name: string, input: Json = {}) =>
    results.some((r) => r.toolName === name && JSON.stringify(r.input) === JSON.stringify(input));
  const has = (name: string) => offered.has(name);
  const deploy = DEPLOY_WORDS.some((w) => q.has(w));
  const rollback = ROLLBACK_WORDS.some((w) => q.has(w)) && (q.has('rollback') || q.has('revert') || q.has('roll'));
  const command = Object.entries(COMMAND_WORDS).find(([w]) => q.has(w))?.[1];
  const out: Omit<Call, 'toolCallId'>[] = [];
  const add = (toolName: string, input: Json = {}) => {
    if (
      has(toolName) &&
      !done(toolName, input) &&
      !out.some((c) => c.toolName === toolName && JSON.stringify(c.input) === JSON.stringify(input))
    )
      out.push({ toolName, input });
  };

  if (results.length === 0) {
    // First round: the listings the question points at (the machine of a narrowed conversation directly).
    if (machine) add('get_machine', {});
    if (!machine && (KEYWORDS.list_machines.some((w) => q.has(w)) || KEYWORDS.get_machine.some((w) => q.has(w)) || command))
      add('list_machines', {});
    if (KEYWORDS.list_roosts.some((w) => q.has(w)) || KEYWORDS.list_rollouts.some((w) => q.has(w)) || deploy || rollback)
      add('list_roosts', {});
    if (
      KEYWORDS.list_classic_deployments.some((w) => q.has(w)) ||
      CLASSIC_ACTIONS.some((w) => q.has(w)) ||
      [...q].some((w) => w.startsWith('dep_'))
    )
      add('list_classic_deployments', {});
    if (KEYWORDS.recent_audit.some((w) => q.has(w))) add('recent_audit', {});
    if (KEYWORDS.recent_events.some((w) => q.has(w))) add('recent_events', {});
    if (machine && command) add('propose_machine_command', { type: command });
    return out;
  }

  // Follow-ups: the machines and roosts the question names, and what it asks to do with them.
  for (const r of results) {
    if (r.toolName === 'list_machines') {
      const machines = asList(obj(r.output).machines);
      const named = new Set<string>();
      for (const m of machines) {
        if (mentioned(question, [m.machineId as string, m.hostname as string]).length) named.add(m.machineId as string);
      }
      for (const id of named) {
        add('get_machine', { machineId: id });
        if (command) add('propose_machine_command', { machineId: id, type: command });
      }
    }
    if (r.toolName === 'list_classic_deployments') {
      const action = CLASSIC_ACTIONS.find((w) => q.has(w));
      for (const d of asList(obj(r.output).deployments)) {
        if (!mentioned(question, [d.deploymentId as string, d.name as string]).length) continue;
        const deploymentId = d.deploymentId as string;
        if (action) add('propose_classic_deployment_action', { deploymentId, action });
        else add('get_classic_deployment', { deploymentId });
      }
    }
    if (r.toolName === 'list_roosts') {
      for (const roost of asList(obj(r.output).roosts)) {
        if (!mentioned(question, [roost.roostId as string, roost.name as string]).length) continue;
        const roostId = roost.roostId as string;
        if (deploy) add('propose_roost_deploy', { roostId });
        else if (rollback) add('propose_roost_rollback', { roostId });
        else if (KEYWORDS.list_rollouts.some((w) => q.has(w))) add('list_rollouts', { roostId });
        else add('get_roost', { roostId });
      }
    }
  }
  return out;
}

const size = (n: unknown) => {
  const b = Number(n);
  if (!Number.isFinite(b)) return '?';
  if (b < 1024) return `${b} B`;
  if (b < 1024 ** 2) return `${(b / 1024).toFixed(1)} KiB`;
  if (b < 1024 ** 3) return `${(b / 1024 ** 2).toFixed(1)} MiB`;
  return `${(b / 1024 ** 3).toFixed(1)} GiB`;
};
const j = (v: unknown) => JSON.stringify(v);
/** The non-zero entries of a count map. */
const nonZero = (v: unknown) => Object.fromEntries(Object.entries(obj(v)).filter(([, n]) => n !== 0));

/** The paragraph one tool result contributes to the answer. */
function describe(r: Result, question: string): string {
  if (r.error) return `${r.toolName} was refused: ${r.error}`;
  const o = obj(r.output);
  if (typeof o.error === 'string') return `${r.toolName}: ${o.error}: ${String(o.detail ?? '')}`;
  const q = new Set(words(question));
  switch (r.toolName) {
    case 'list_machines': {
      let machines = asList(o.machines);
      const head = `The site has ${machines.length}${o.moreThanListed ? '+' : ''} machine(s), ${String(o.online)} online.`;
      if (q.has('offline') || q.has('down')) machines = machines.filter((m) => !m.online);
      else if (q.has('online') || q.has('up')) machines = machines.filter((m) => m.online);
      const lines = machines.map(
        (m) =>
          `- ${String(m.machineId)}${m.hostname ? ` (${String(m.hostname)})` : ''}: ${m.online ? 'online' : 'offline'}, last heartbeat ${String(m.lastHeartbeat ?? 'never')}, agent ${String(m.agentVersion ?? '?')}${m.rebooting ? ', rebooting' : ''}${m.cortexEnabled ? '' : ', assistant disabled'}`,
      );
      return [head, ...lines].join('\n');
    }
    case 'get_machine': {
      const roosts = asList(o.roosts).map(
        (d) =>
          `- roost ${String(d.name)} (${String(d.roostId)}): intended v${String(d.currentVersionNumber ?? '-')}, reported v${String(d.reportedVersionNumber ?? '-')}, ${String(d.status ?? 'no report')}${d.inSync ? ', in sync' : ''}${d.error ? `, error: ${String(d.error)}` : ''}`,
      );
      const metrics = o.metrics ? ` Metrics: ${j(o.metrics)}.` : ' No metrics reported.';
      return [
        `Machine ${String(o.machineId)} is ${o.online ? 'online' : 'offline'} (last heartbeat ${String(o.lastHeartbeat ?? 'never')}, agent ${String(o.agentVersion ?? '?')}, ${String(o.processCount)} process(es)).${metrics}`,
        ...roosts,
      ].join('\n');
    }
    case 'list_roosts': {
      const roosts = asList(o.roosts);
      return [
        `The site has ${roosts.length}${o.moreThanListed ? '+' : ''} roost(s).`,
        ...roosts.map(
          (r) =>
            `- ${String(r.name)} (${String(r.roostId)}): ${r.currentVersionNumber ? `version ${String(r.currentVersionNumber)}` : 'no version yet'}, ${String(r.totalFiles)} file(s), ${size(r.totalSize)}, ${String(asList(obj(r.targets).items).length)} target(s)`,
        ),
      ].join('\n');
    }
    case 'get_roost': {
      const versions = asList(o.latestVersions).map(
        (v) =>
          `- v${String(v.versionNumber)}: ${String(v.totalFiles)} file(s), ${size(v.totalSize)}${v.description ? `, "${String(v.description)}"` : ''}`,
      );
      return [
        `Roost ${String(o.name)} (${String(o.roostId)}) is at version ${String(o.currentVersionNumber ?? 'none')}. Latest versions:`,
        ...versions,
      ].join('\n');
    }
    case 'list_rollouts': {
      const rollouts = asList(o.rollouts);
      if (!rollouts.length) return `Roost ${String(r.input.roostId)} has no rollouts.`;
      return [
        `Rollouts of ${String(r.input.roostId)}, newest first:`,
        ...rollouts.map((x) => `- ${String(x.rolloutId)}: ${String(x.stage)}/${String(x.state)}, counts ${j(x.counts)}`),
      ].join('\n');
    }
    case 'get_rollout':
      return `Rollout ${String(o.rolloutId)} is ${String(o.stage)}/${String(o.state)}: ${j(o.counts)}.`;
    case 'diff_versions':
      return `Diff ${String(o.fromVersionId)} → ${String(o.toVersionId)}: ${j(o.summary)}.`;
    case 'list_classic_deployments': {
      const ds = asList(o.deployments);
      return [
        `The site has ${ds.length}${o.moreThanListed ? '+' : ''} classic installer deployment(s), newest first.`,
        ...ds.map(
          (d) =>
            `- ${String(d.name)} (${String(d.deploymentId)}): ${String(d.installerName)}, ${String(d.status)}, targets ${j(nonZero(d.counts))}`,
        ),
      ].join('\n');
    }
    case 'get_classic_deployment': {
      const targets = asList(obj(o.targets).items).map(
        (t) => `- ${String(t.machineId)}: ${String(t.action)} ${String(t.status)}${t.error ? `, error: ${String(t.error)}` : ''}`,
      );
      return [`Classic deployment ${String(o.name)} (${String(o.deploymentId)}) is ${String(o.status)}:`, ...targets].join('\n');
    }
    case 'recent_audit':
      return [
        'Latest audit records:',
        ...asList(o.records).map((x) => `- ${String(x.occurredAt)} ${String(x.kind)} by ${String(x.actor)}`),
      ].join('\n');
    case 'recent_events':
      return ['Latest events:', ...asList(o.events).map((x) => `- ${String(x.occurredAt)} ${String(x.event)} ${j(x.data)}`)].join('\n');
    case 'propose_roost_deploy':
    case 'propose_roost_rollback':
    case 'propose_machine_command':
    case 'propose_classic_deployment_action': {
      const req = obj(o.request);
      const dry = o.dryRun ? `\nDry run: ${j(o.dryRun)}` : '';
      return `Proposed, not done (${String(req.note)}): ${String(req.method)} ${String(req.path)} with Idempotency-Key and body ${j(req.body)}.${dry}`;
    }
    default:
      return `${r.toolName}: ${j(r.output)}`;
  }
}

/** The answer for a question given the tool results (and the tools offered, for what could not be done). */
export function composeAnswer(question: string, offered: Set<string>, results: Result[]): string {
  const q = new Set(words(question));
  const parts = [LOCAL_DISCLOSURE];
  const wantsChange =
    DEPLOY_WORDS.some((w) => q.has(w)) ||
    CLASSIC_ACTIONS.some((w) => q.has(w)) ||
    q.has('rollback') ||
    q.has('revert') ||
    Object.keys(COMMAND_WORDS).some((w) => q.has(w));
  const proposed = results.some((r) => r.toolName.startsWith('propose_'));
  if (!results.length) {
    const reads = [...offered].filter((t) => !t.startsWith('propose_'));
    parts.push(
      reads.length
        ? `I found nothing in your question that I can look up. I can read, with your key: ${reads.join(', ')}. Ask about machines, roosts, rollouts, audit records or events.`
        : 'Your key cannot read anything of this site that I could answer from.',
    );
  }
  for (const r of results) parts.push(describe(r, question));
  if (wantsChange && !proposed) {
    const plans = [...offered].filter((t) => t.startsWith('propose_'));
    parts.push(
      plans.length
        ? 'I change nothing myself; name the roost or machine and I will propose the exact request for you to send.'
        : 'Your key cannot make that change, so I cannot propose it. I change nothing myself.',
    );
  } else if (proposed) parts.push('I changed nothing: send the request above to do it.');
  return parts.join('\n\n');
}

/** Splits text into stream deltas (a word with its following spaces each). */
function deltas(text: string): string[] {
  return text.match(/\S+\s*|\s+/g) ?? [];
}

/** The local assistant as an AI SDK language model (specification v3). */
export function createLocalAssistantModel(): LanguageModelV3 {
  let callNo = 0;
  const respond = (options: LanguageModelV3CallOptions): LanguageModelV3StreamPart[] => {
    const offeredTools = (options.tools ?? []).filter((t): t is LanguageModelV3FunctionTool => t.type === 'function');
    const offered = new Set(offeredTools.map((t) => t.name));
    const p = readPrompt(options.prompt);
    const next = planCalls(p.question, offered, p.results, conversationMachine(p.system));
    const parts: LanguageModelV3StreamPart[] = [{ type: 'stream-start', warnings: [] }];
    if (next.length) {
      for (const c of next)
        parts.push({ type: 'tool-call', toolCallId: `local_${++callNo}`, toolName: c.toolName, input: JSON.stringify(c.input) });
      parts.push({ type: 'finish', finishReason: { unified: 'tool-calls', raw: 'tool-calls' }, usage: usage(p.words, next.length) });
      return parts;
    }
    const answer = composeAnswer(p.question, offered, p.results);
    parts.push({ type: 'text-start', id: 'answer' });
    for (const d of deltas(answer)) parts.push({ type: 'text-delta', id: 'answer', delta: d });
    parts.push({ type: 'text-end', id: 'answer' });
    parts.push({ type: 'finish', finishReason: { unified: 'stop', raw: 'stop' }, usage: usage(p.words, words(answer).length) });
    return parts;
  };
  return {
    specificationVersion: 'v3',
    provider: 'roost-local',
    modelId: LOCAL_MODEL_ID,
    supportedUrls: {},
    async doGenerate(options) {
      const parts = respond(options);
      const text = parts.map((x) => (x.type === 'text-delta' ? x.delta : '')).join('');
      const finish = parts.find((x) => x.type === 'finish');
      return {
        content: [...(text ? [{ type: 'text' as const, text }] : []), ...parts.flatMap((x) => (x.type === 'tool-call' ? [x] : []))],
        finishReason: finish && finish.type === 'finish' ? finish.finishReason : { unified: 'stop', raw: 'stop' },
        usage: finish && finish.type === 'finish' ? finish.usage : usage(0, 0),
        warnings: [],
      };
    },
    async doStream(options) {
      const parts = respond(options);
      return {
        stream: new ReadableStream<LanguageModelV3StreamPart>({
          start(controller) {
            for (const part of parts) controller.enqueue(part);
            controller.close();
          },
        }),
      };
    },
  };
}
