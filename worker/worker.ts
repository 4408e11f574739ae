/**
 * Worker wiring (docs/decisions/worker-process.md): a Temporal worker serving every workflow of workflows/index.ts
 * (bundled once per process) and every activity of activities/index.ts (built by the `createActivities`
 * factory over the caller's pool, blob store and configuration) on the configured task queue
 * (ROOST_TASK_QUEUE), through a NativeConnection to `cfg.temporalAddress`.
 *
 * Workers of one process share one NativeConnection per address (a restarted worker reuses it); close
 * them with `closeWorkerConnections()` when the process is done with Temporal.
 */
import fs from 'node:fs/promises';
import {
  type LogLevel,
  type Logger as SdkLogger,
  NativeConnection,
  Runtime,
  Worker,
  bundleWorkflowCode,
  type WorkflowBundleWithSourceMap,
} from '@temporalio/worker';
import type { Duration } from '@temporalio/common';
import type { Config } from '../config/env';
import { createActivities } from '../activities';
import type { ActivityDeps } from '../activities/deps';
import { activityMetrics } from './metrics';
import { activityLogContext, runtimeLogger } from './logging';
import type { Logger } from 'pino';
import { createLogger } from '../telemetry/logging';
import type { Context as ActivityContext } from '@temporalio/activity';
import {
  makeWorkflowExporter,
  OpenTelemetryActivityInboundInterceptor,
  OpenTelemetryActivityOutboundInterceptor,
} from '@temporalio/interceptors-opentelemetry';
import { activeTracing, workflowSpanProcessor } from '../telemetry/tracing';

/** Absolute path of the workflow bundle's entry point. */
export const WORKFLOWS_PATH = require.resolve('../workflows');

let bundle: Promise<WorkflowBundleWithSourceMap> | undefined;
let bundleTraced = false;
let runtimeInstalled = false;

/**
 * Installs the SDK Runtime once per process: logs at ROOST_WORKER_LOG_LEVEL (default WARN, so the demo and
 * the stack are not drowned in per-activity lines), no SDK signal handlers (our entry points own
 * SIGINT/SIGTERM and shut workers down gracefully) and, with `cfg.ROOST_TEMPORAL_METRICS_ADDRESS`, the
 * SDK's own Prometheus exporter on that address (docs/observability.md "Worker"). A Runtime installed
 * earlier by the host is kept; the first call decides.
 */
export function installRuntime(cfg?: Pick<Config, 'ROOST_TEMPORAL_METRICS_ADDRESS'>, opts: { logger?: Logger } = {}): void {
  if (runtimeInstalled) return;
  runtimeInstalled = true;
  const level = (process.env.ROOST_WORKER_LOG_LEVEL ?? 'WARN').toUpperCase() as LogLevel;
  const address = cfg?.ROOST_TEMPORAL_METRICS_ADDRESS;
  // JSON lines through the process logger (worker/logging.ts); both levels apply, the SDK's first.
  const logger = opts.logger ?? createLogger({ service: 'roost-worker', level: process.env.ROOST_LOG_LEVEL ?? 'info' });
  try {
    Runtime.install({
      logger: runtimeLogger(logger, level),
      shutdownSignals: [],
      ...(address
        ? {
            telemetryOptions: {
              metrics: { prometheus: { bindAddress: address, countersTotalSuffix: true, useSecondsForDurations: true } },
            },
          }
        : {}),
    });
  } catch {
    /* already installed (e.g. by a test): keep it */
  }
}

/** Workflow interceptors passing the starting request's id on to activities (workflows/request-id.ts; always bundled). */
const REQUEST_ID_INTERCEPTORS = require.resolve('../workflows/request-id');

/** Workflow interceptors of @temporalio/interceptors-opentelemetry (bundled only while tracing is on). */
const OTEL_WORKFLOW_INTERCEPTORS = require.resolve('@temporalio/interceptors-opentelemetry/lib/workflow-interceptors');

/**
 * Builds the workflow bundle of workflows/index.ts with webpack (seconds of CPU); `traced` adds the
 * OpenTelemetry workflow interceptors. `logger` takes webpack's lines (default: the installed Runtime's).
 */
export function buildWorkflowBundle(traced: boolean, logger?: SdkLogger): Promise<WorkflowBundleWithSourceMap> {
  return bundleWorkflowCode({
    workflowsPath: WORKFLOWS_PATH,
    workflowInterceptorModules: [REQUEST_ID_INTERCEPTORS, ...(traced ? [OTEL_WORKFLOW_INTERCEPTORS] : [])],
    logger: logger ?? Runtime.instance().logger,
  });
}

/**
 * Environment variable naming a prebuilt untraced bundle (a JSON file `{code, sourceMap}` as
 * buildWorkflowBundle returns it) that workflowBundle() loads instead of building one. The test suite's
 * global setup (test/support/global-setup.ts) builds it once per run for every test file and the processes
 * they spawn; nothing else sets it.
 */
export const PREBUILT_BUNDLE_ENV = 'ROOST_WORKFLOW_BUNDLE_FILE';

/**
 * The workflow bundle, built (or loaded from ROOST_WORKFLOW_BUNDLE_FILE when untraced) on first use and shared
 * by every worker of the process; with tracing on (telemetry/tracing.ts) it includes the OpenTelemetry
 * workflow interceptors.
 */
export function workflowBundle(): Promise<WorkflowBundleWithSourceMap> {
  installRuntime();
  const traced = activeTracing() !== undefined;
  if (bundle && bundleTraced !== traced) bundle = undefined;
  bundleTraced = traced;
  const prebuilt = traced ? undefined : process.env[PREBUILT_BUNDLE_ENV];
  bundle ??= (
    prebuilt ? fs.readFile(prebuilt, 'utf8').then((text) => JSON.parse(text) as WorkflowBundleWithSourceMap) : buildWorkflowBundle(traced)
  ).catch((err) => {
    bundle = undefined;
    throw err;
  });
  return bundle;
}

const connections = new Map<string, Promise<NativeConnection>>();

/** The process's shared NativeConnection to `cfg.temporalAddress` (connects on first use). */
export function workerConnection(cfg: Pick<Config, 'temporalAddress' | 'ROOST_TEMPORAL_METRICS_ADDRESS'>): Promise<NativeConnection> {
  installRuntime(cfg);
  let c = connections.get(cfg.temporalAddress);
  if (!c) {
    c = NativeConnection.connect({ address: cfg.temporalAddress });
    c.catch(() => connections.delete(cfg.temporalAddress));
    connections.set(cfg.temporalAddress, c);
  }
  return c;
}

/** Closes every shared worker connection (call after the process's workers have stopped). */
export async function closeWorkerConnections(): Promise<void> {
  const all = [...connections.values()];
  connections.clear();
  await Promise.all(all.map((c) => c.then((conn) => conn.close()).catch(() => undefined)));
}

/** Per-worker overrides (tests use a unique task queue and a short grace time). */
export interface CreateWorkerOptions {
  /** Defaults to cfg.ROOST_TASK_QUEUE. */
  taskQueue?: string;
  /** Time running activities get to finish on shutdown before they are cancelled (default 5 s). */
  shutdownGraceTime?: Duration;
  /** Worker identity shown in the Web UI (default `roost-worker@<pid>`). */
  identity?: string;
}

/**
 * Creates (does not run) the worker: `worker.run()` polls until `worker.shutdown()` or a shutdown signal.
 * `deps` (pool, blob store) stay owned by the caller; the worker never closes them.
 * @throws when Temporal is unreachable or the workflow bundle fails to build.
 */
export async function createWorker(cfg: Config, deps: ActivityDeps, opts: CreateWorkerOptions = {}): Promise<Worker> {
  const [connection, workflowBundleCode] = await Promise.all([workerConnection(cfg), workflowBundle()]);
  const tracing = activeTracing();
  return Worker.create({
    connection,
    namespace: cfg.TEMPORAL_NAMESPACE,
    taskQueue: opts.taskQueue ?? cfg.ROOST_TASK_QUEUE,
    identity: opts.identity ?? `roost-worker@${process.pid}`,
    workflowBundle: workflowBundleCode,
    activities: createActivities(deps),
    // Activity latency, failures and business counters by activity type (worker/metrics.ts); with tracing
    // on, spans for workflows and activities, joined to the trace that started the workflow.
    interceptors: {
      activity: [
        activityLogContext,
        activityMetrics,
        ...(tracing
          ? [
              (ctx: ActivityContext) => ({
                inbound: new OpenTelemetryActivityInboundInterceptor(ctx),
                outbound: new OpenTelemetryActivityOutboundInterceptor(ctx),
              }),
            ]
          : []),
      ],
    },
    ...(tracing
      ? { sinks: { exporter: makeWorkflowExporter(workflowSpanProcessor(tracing.spanProcessor) as never, tracing.resource as never) } }
      : {}),
    shutdownGraceTime: opts.shutdownGraceTime ?? '5 seconds',
  });
}

/**
 * Creates a worker and runs it until `signal` aborts (or a shutdown signal handled by the SDK Runtime, when
 * the Runtime was installed with its default signal handlers). Resolves once the worker has drained.
 */
export async function runWorker(cfg: Config, deps: ActivityDeps, opts: CreateWorkerOptions & { signal?: AbortSignal } = {}): Promise<void> {
  const worker = await createWorker(cfg, deps, opts);
  const stop = () => {
    if (worker.getState() === 'RUNNING') worker.shutdown();
  };
  const running = worker.run();
  if (opts.signal) {
    if (opts.signal.aborted) stop();
    else opts.signal.addEventListener('abort', stop, { once: true });
  }
  await running;
}
