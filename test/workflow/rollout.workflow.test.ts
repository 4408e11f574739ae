/**
 * Workflow tests of the rollout-control paths of `rolloutWorkflow` (workflows/rollout.ts) with mocked
 * activities: pause/resume, the manual promotion gate, abort, a tripped failure threshold (canary, and a
 * later wave with the automatic rollback as a child workflow) and the maintenance-window wait. No
 * PostgreSQL, no Azurite: an ephemeral Temporal dev server (the project's `temporal` CLI, started by
 * `TestWorkflowEnvironment.createLocal`), one worker on a throwaway task queue, and the client side under
 * test (workflows/client.ts: starts, control updates by their definitions, refusals by failure type).
 * Waits are real but short (the dev server does not skip time): each case takes a second or two.
 */
import { randomBytes } from 'node:crypto';
import { Context } from '@temporalio/activity';
import { QueryNotRegisteredError } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import type { RolloutActivities, RolloutPlan, RollbackStart, TransitionInput, WatchInput, WatchResult } from '../../activities/rollout';
import type { VerifyActivities, VerifyVersionInput } from '../../activities/verify';
import type { StageChange } from '../../db/rollouts';
import type { RolloutStage } from '../../domain/rollout';
import { DEFAULT_POLICY, type RolloutPolicy } from '../../domain/rollout-policy';
import { temporalBinary } from '../../stack/services';
import {
  ROOST_SEARCH_ATTRIBUTE_KEYS,
  RolloutControlRefused,
  controlRollout,
  rolloutRuntime,
  startRolloutWorkflow,
} from '../../workflows/client';
import { CHUNK_VERIFY_FAILED, type RolloutOutcome } from '../../workflows/rollout';
import { RoostStage } from '../../workflows/search-attributes';
import { quietRuntime } from '../replay/histories';
import { testConfig } from '../support/env';
import { waitFor } from '../support/wait';

jest.setTimeout(60_000);

const SITE = 'site-wf';
const ROOST = 'rst_wf';
const VERSION = 'a'.repeat(64);

/** What one mocked rollout answers and what the workflow did to it. */
interface Scenario {
  plan: RolloutPlan;
  /** Watches held until `release` (by wave index); the others answer `done` at once. */
  held: Set<number>;
  /** Result of the watch of each wave index (default: every machine of the wave succeeded). */
  results: Map<number, WatchResult>;
  /** Successive answers of `windowDelay` (ms); 0 once exhausted. */
  windowDelays: number[];
  rollback?: RollbackStart;
  /** Activity calls in order: `dispatch:<i>`, `watch:<i>:<phase>`, `transition:<action>`, `stage:<stage>[:<reason>]`, … */
  calls: string[];
  transitions: TransitionInput[];
  stage: RolloutStage;
  abortReason: string | null;
  gates: Map<number, { promise: Promise<WatchResult>; resolve: (r: WatchResult) => void }>;
}

const scenarios = new Map<string, Scenario>();

function counts(total: number, succeeded = total, failed = 0): WatchResult {
  return { total, pending: 0, dispatched: 0, succeeded, failed, cancelled: 0, timedOut: 0, staged: 0, activating: 0, outcome: 'done' };
}

/** Registers a rollout of `sizes` waves with `policy` (defaults filled in) and returns its id. */
function scenario(sizes: number[], policy: Partial<RolloutPolicy> = {}, extra: Partial<RolloutPlan> = {}): string {
  const rolloutId = `rol_${randomBytes(6).toString('hex')}`;
  scenarios.set(rolloutId, {
    plan: {
      roostId: ROOST,
      versionId: VERSION,
      stage: 'canary',
      terminal: false,
      delayMs: 0,
      policy: { ...DEFAULT_POLICY, ...policy },
      canaryCount: sizes[0] ?? 0,
      fleetCount: sizes.slice(1).reduce((a, b) => a + b, 0),
      waves: sizes.map((size, i) => ({ name: i === 0 ? 'canary' : `wave-${i}`, size })),
      rollbackOf: null,
      ...extra,
    },
    held: new Set(),
    results: new Map(),
    windowDelays: [],
    calls: [],
    transitions: [],
    stage: extra.stage ?? 'canary',
    abortReason: null,
    gates: new Map(),
  });
  return rolloutId;
}

function of(rolloutId: string): Scenario {
  const s = scenarios.get(rolloutId);
  if (!s) throw new Error(`no scenario for ${rolloutId}`);
  return s;
}

function gate(s: Scenario, wave: number) {
  let g = s.gates.get(wave);
  if (!g) {
    let resolve!: (r: WatchResult) => void;
    const promise = new Promise<WatchResult>((r) => (resolve = r));
    s.gates.set(wave, (g = { promise, resolve }));
  }
  return g;
}

/** Lets the held watch of `wave` answer `result` (default: the wave succeeded). */
function release(rolloutId: string, wave: number, result?: WatchResult): void {
  const s = of(rolloutId);
  gate(s, wave).resolve(result ?? s.results.get(wave) ?? counts(s.plan.waves?.[wave]?.size ?? 0));
}

/** Versions whose chunks the mocked verification finds bad, and every verification asked for. */
const badVersions = new Set<string>();
const verified: VerifyVersionInput[] = [];

/** The mocked rollout activities: in-memory, keyed by rollout id, recording every call. */
const activities: Partial<RolloutActivities & VerifyActivities> = {
  async verifyVersionChunks(input) {
    verified.push(input);
    return badVersions.has(input.versionId)
      ? { verified: 3, failed: 1, failedChunks: ['c'.repeat(64)] }
      : { verified: 0, failed: 0, failedChunks: [] };
  },
  async loadRollout(ref) {
    return of(ref.rolloutId).plan;
  },
  async markRolloutStarted(ref) {
    of(ref.rolloutId).calls.push('started');
    return true;
  },
  async changeRolloutStage(input): Promise<StageChange> {
    const s = of(input.rolloutId);
    s.calls.push(`stage:${input.stage}${input.abortReason ? `:${input.abortReason}` : ''}`);
    if (s.stage !== 'completed' && s.stage !== 'failed') {
      s.stage = input.stage;
      s.abortReason = input.abortReason ?? null;
    }
    const total = (s.plan.waves ?? []).reduce((a, w) => a + w.size, 0);
    const failed = [...s.results.values()].reduce((a, r) => a + r.failed, 0);
    return { stage: s.stage, changed: true, succeeded: total - failed, failed, abortReason: s.abortReason };
  },
  async dispatchWave(input) {
    const s = of(input.rolloutId);
    s.calls.push(`dispatch:${String(input.wave)}`);
    return { dispatched: s.plan.waves?.[Number(input.wave)]?.size ?? 0, deadline: 0 };
  },
  async watchWave(input: WatchInput): Promise<WatchResult> {
    const s = of(input.rolloutId);
    const wave = Number(input.wave);
    s.calls.push(`watch:${wave}:${input.phase ?? 'sync'}`);
    if (!s.held.has(wave)) return s.results.get(wave) ?? counts(s.plan.waves?.[wave]?.size ?? 0);
    const ctx = Context.current();
    const answer = gate(s, wave).promise;
    for (;;) {
      const r = await Promise.race([answer, new Promise<undefined>((ok) => setTimeout(() => ok(undefined), 500))]);
      if (r) return r;
      ctx.heartbeat();
    }
  },
  async recordTransition(input) {
    const s = of(input.rolloutId);
    s.calls.push(`transition:${input.action}`);
    s.transitions.push(input);
    // The real watcher sees the aborted state in the database and returns `aborted`.
    if (input.action === 'abort') for (const w of s.held) release(input.rolloutId, w, { ...counts(0), outcome: 'aborted' });
  },
  async windowDelay(ref) {
    const s = of(ref.rolloutId);
    const d = s.windowDelays.shift() ?? 0;
    s.calls.push(`window:${d}`);
    return d;
  },
  async activateWaves(input) {
    of(input.rolloutId).calls.push(`activate:${input.from}-${input.to}`);
    return 0;
  },
  async createRollback(input) {
    const s = of(input.rolloutId);
    s.calls.push('createRollback');
    return s.rollback ?? { refused: 'nothing_to_roll_back' };
  },
};

let env: TestWorkflowEnvironment;
let worker: Worker;
let running: Promise<void>;
const taskQueue = `wf-test-${randomBytes(4).toString('hex')}`;
const cfg = { ROOST_TASK_QUEUE: taskQueue, temporalUiUrl: 'http://temporal-ui.test', TEMPORAL_NAMESPACE: 'default' };

beforeAll(async () => {
  quietRuntime();
  env = await TestWorkflowEnvironment.createLocal({
    server: {
      executable: { type: 'existing-path', path: temporalBinary(testConfig()) },
      searchAttributes: [...ROOST_SEARCH_ATTRIBUTE_KEYS],
      extraArgs: ['--log-level', 'error'],
    },
  });
  worker = await Worker.create({
    connection: env.nativeConnection,
    taskQueue,
    workflowsPath: require.resolve('../../workflows'),
    activities,
    shutdownGraceTime: 0,
  });
  running = worker.run();
});

afterAll(async () => {
  if (worker?.getState() === 'RUNNING') worker.shutdown();
  await running;
  await env?.teardown();
});

/** Starts the rollout's workflow through workflows/client.ts; returns its workflow id. */
async function start(rolloutId: string): Promise<string> {
  const started = await startRolloutWorkflow(env.client, cfg, {
    siteId: SITE,
    roostId: ROOST,
    versionId: VERSION,
    rolloutId,
    workflowId: `rollout-test:${rolloutId}`,
  });
  return started.workflowId;
}

function outcome(workflowId: string): Promise<RolloutOutcome> {
  return env.client.workflow.getHandle(workflowId).result() as Promise<RolloutOutcome>;
}

const until = (what: string, check: () => boolean | Promise<boolean>, timeoutMs = 10_000) => waitFor(what, check, timeoutMs);

const called = (rolloutId: string, call: string) => () => of(rolloutId).calls.includes(call);

/** True once the workflow answers `status` with `waiting` (false before it registered the query). */
const waitingFor = (workflowId: string, waiting: string) => async () => {
  try {
    return (await rolloutRuntime(env.client, workflowId)).waiting === waiting;
  } catch (err) {
    if (err instanceof QueryNotRegisteredError) return false;
    throw err;
  }
};
const by = { by: 'usr_test' };

it('verifies the version before its first wave, and ends as failed (chunk_verify_failed) without dispatching when a chunk is bad', async () => {
  const good = scenario([1, 2]);
  expect(await outcome(await start(good))).toMatchObject({ stage: 'completed' });
  expect(verified).toContainEqual({ siteId: SITE, roostId: ROOST, versionId: VERSION, order: 'desc' });
  expect(of(good).calls.slice(0, 2)).toEqual(['started', 'dispatch:0']);

  const badVersion = 'b'.repeat(64);
  badVersions.add(badVersion);
  const bad = scenario([1, 2], {}, { versionId: badVersion });
  expect(await outcome(await start(bad))).toMatchObject({ stage: 'failed', abortReason: CHUNK_VERIFY_FAILED });
  expect(of(bad).calls).toEqual(['started', `stage:failed:${CHUNK_VERIFY_FAILED}`]);
});

it('pauses between waves and resumes on request; a second pause is refused by the validator', async () => {
  const id = scenario([1, 3]);
  of(id).held.add(0);
  const wf = await start(id);
  await until('the canary watch', called(id, 'watch:0:sync'));

  const paused = await controlRollout(env.client, wf, id, 'pause', { ...by, reason: 'look first' });
  expect(paused).toEqual({ rolloutId: id, state: 'paused', stage: 'canary', wave: 0 });
  await expect(controlRollout(env.client, wf, id, 'pause', by)).rejects.toMatchObject({
    reason: 'conflict',
    message: 'the rollout is already paused',
  });

  release(id, 0);
  await until('the pause wait', waitingFor(wf, 'pause'));
  expect(of(id).calls).not.toContain('dispatch:1');

  expect(await controlRollout(env.client, wf, id, 'resume', by)).toMatchObject({ state: 'running' });
  await expect(outcome(wf)).resolves.toMatchObject({ rolloutId: id, stage: 'completed', abortReason: null });
  expect(of(id).transitions.map((t) => [t.action, t.state, t.by, t.detail])).toEqual([
    ['pause', 'paused', 'usr_test', { reason: 'look first' }],
    ['resume', 'running', 'usr_test', undefined],
  ]);
  expect(of(id).calls).toEqual([
    'started',
    'dispatch:0',
    'watch:0:sync',
    'transition:pause',
    'stage:started',
    'transition:resume',
    'dispatch:1',
    'watch:1:sync',
    'stage:completed',
  ]);
});

it('waits at the manual gate after the canary until promoted; promote is refused before the gate', async () => {
  const id = scenario([1, 2, 2], { requirePromotion: 'canary' });
  of(id).held.add(0);
  const wf = await start(id);
  await until('the canary watch', called(id, 'watch:0:sync'));
  await expect(controlRollout(env.client, wf, id, 'promote', by)).rejects.toMatchObject({
    reason: 'conflict',
    message: 'the rollout is not waiting for promotion',
  });

  release(id, 0);
  await until('the promotion wait', waitingFor(wf, 'promotion'));
  expect(await rolloutRuntime(env.client, wf)).toMatchObject({ state: 'awaiting_promotion', stage: 'started', wave: 0 });
  expect(of(id).calls).not.toContain('dispatch:1');

  expect(await controlRollout(env.client, wf, id, 'promote', by)).toMatchObject({ state: 'running' });
  await expect(outcome(wf)).resolves.toMatchObject({ stage: 'completed' });
  // Only the canary is gated ('canary'): wave 2 follows wave 1 without another promotion.
  expect(of(id).transitions.map((t) => t.action)).toEqual(['awaiting_promotion', 'promote']);
  expect(of(id).calls.filter((c) => c.startsWith('dispatch:'))).toEqual(['dispatch:0', 'dispatch:1', 'dispatch:2']);
});

it('aborts a running wave: the rollout fails as aborted, and later control finds no running workflow', async () => {
  const id = scenario([1, 4]);
  of(id).held.add(0);
  const wf = await start(id);
  await until('the canary watch', called(id, 'watch:0:sync'));

  expect(await controlRollout(env.client, wf, id, 'abort', { ...by, reason: 'bad build' })).toMatchObject({ state: 'aborted' });
  await expect(outcome(wf)).resolves.toMatchObject({ stage: 'failed', abortReason: 'aborted' });
  expect(of(id).calls).not.toContain('dispatch:1');
  expect(of(id).calls.slice(-1)).toEqual(['stage:failed:aborted']);
  const desc = await env.client.workflow.getHandle(wf).describe();
  expect(desc.typedSearchAttributes.get(RoostStage)).toBe('aborted');

  const refused = controlRollout(env.client, wf, id, 'resume', by);
  await expect(refused).rejects.toBeInstanceOf(RolloutControlRefused);
  await expect(refused).rejects.toMatchObject({ reason: 'closed' });
});

it('fails as canary_failed when the canary trips the failure threshold (no rollback asked)', async () => {
  const id = scenario([2, 5]);
  of(id).results.set(0, { ...counts(2, 1, 1), outcome: 'tripped' });
  const wf = await start(id);
  await expect(outcome(wf)).resolves.toMatchObject({ stage: 'failed', abortReason: 'canary_failed' });
  expect(of(id).calls).not.toContain('createRollback');
  expect(of(id).calls).not.toContain('dispatch:1');
});

it('rolls back automatically when a later wave trips the threshold: the rollback runs as a child rollout', async () => {
  const id = scenario([1, 4], { autoRollback: true, failureThreshold: { count: 1 } });
  of(id).results.set(1, { ...counts(4, 2, 2), outcome: 'tripped' });
  const rollbackId = scenario([3], { failureThreshold: { count: 0 } }, { stage: 'started', rollbackOf: id });
  of(rollbackId).plan.waves = [{ name: 'rollback', size: 3 }];
  of(id).rollback = { rolloutId: rollbackId, workflowId: `rollback-test:${id}`, roostId: ROOST, versionId: 'b'.repeat(64), machines: 3 };

  const wf = await start(id);
  await expect(outcome(wf)).resolves.toEqual({
    rolloutId: id,
    stage: 'failed',
    succeeded: 3,
    failed: 2,
    abortReason: 'retry_budget_exhausted',
    rollback: { rolloutId: rollbackId, stage: 'completed', succeeded: 3, failed: 0 },
  });
  expect(of(id).calls.slice(-3)).toEqual(['stage:failed:retry_budget_exhausted', 'createRollback', 'transition:rollback_started']);
  expect(of(id).transitions.find((t) => t.action === 'rollback_started')?.detail).toEqual({ rollbackRolloutId: rollbackId, machines: 3 });
  expect(of(rollbackId).calls).toEqual(['started', 'dispatch:0', 'watch:0:sync', 'stage:completed']);
  expect((await env.client.workflow.getHandle(wf).describe()).typedSearchAttributes.get(RoostStage)).toBe('rolled_back');
});

it('waits for the maintenance window before a wave, with waiting_window and window_open transitions', async () => {
  const id = scenario([1, 1], { maintenanceWindow: { days: ['mon'], startSec: 0, endSec: 3600 } });
  // Long enough for the queries below to see the wait on a slow machine.
  const windowMs = 3000;
  of(id).windowDelays = [windowMs, 0];
  const wf = await start(id);
  await until('the window wait', waitingFor(wf, 'window'));
  expect(await rolloutRuntime(env.client, wf)).toMatchObject({ state: 'waiting_window', wave: null });
  expect(of(id).calls).not.toContain('dispatch:0');

  await expect(outcome(wf)).resolves.toMatchObject({ stage: 'completed' });
  expect(of(id).calls).toEqual([
    'started',
    `window:${windowMs}`,
    'transition:waiting_window',
    'window:0',
    'transition:window_open',
    'dispatch:0',
    'watch:0:sync',
    'stage:started',
    'window:0',
    'dispatch:1',
    'watch:1:sync',
    'stage:completed',
  ]);
  expect(of(id).transitions[0]).toMatchObject({
    action: 'waiting_window',
    state: 'waiting_window',
    detail: { nextWave: 0, delayMs: windowMs },
  });
});
