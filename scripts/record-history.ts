/**
 * Records a workflow's event history as JSON for replay tests (test/replay/histories/).
 *
 *   tsx scripts/record-history.ts <workflowId> <out.json> [runId]
 *
 * Connects to TEMPORAL_ADDRESS (default the embedded dev server), fetches the run's history
 * (`client.workflow.getHandle(id, runId).fetchHistory()`) and writes it as proto3 JSON (the form
 * `temporal workflow show --output json` prints); `historyFromJson` reads it back for
 * `Worker.runReplayHistory`. The rollout integration test calls `recordHistory` itself when
 * ROOST_RECORD_HISTORIES=1.
 */
import fs from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import * as proto from '@temporalio/proto';
import { patchProtobufRoot } from '@temporalio/proto/lib/patch-protobuf-root';
import { loadConfig } from '../config/env';

type History = proto.temporal.api.history.v1.IHistory;

interface ProtoJson {
  toJson(type: unknown, message: unknown): unknown;
  fromJson(type: unknown, json: unknown, options?: { ignoreUnknownFields?: boolean }): unknown;
}

let codec: { json: ProtoJson; historyType: unknown } | undefined;

/**
 * protobufjs' proto3-JSON codec loaded from the same protobufjs copy as @temporalio/proto's message
 * types. npm nests one protobufjs copy per @temporalio package here, so the SDK's own
 * historyToJSON/historyFromJSON fail their `instanceof Type` check ("type must be a Type"); using the
 * codec of the types' own copy avoids that (docs/decisions/replay-histories.md).
 */
function historyCodec(): { json: ProtoJson; historyType: unknown } {
  if (!codec) {
    const protoDir = path.dirname(require.resolve('@temporalio/proto/package.json'));

    const json = require(require.resolve('protobufjs/ext/protojson', { paths: [protoDir] })) as ProtoJson;
    const root = patchProtobufRoot(proto) as unknown as { lookupType(name: string): unknown };
    codec = { json, historyType: root.lookupType('temporal.api.history.v1.History') };
  }
  return codec;
}

/** A history as proto3 JSON (the form `temporal workflow show --output json` prints). */
export function historyToJson(history: History): unknown {
  const { json, historyType } = historyCodec();
  return json.toJson(historyType, proto.temporal.api.history.v1.History.fromObject(history));
}

/** A History message from proto3 JSON, ready for `Worker.runReplayHistory`. @throws TypeError on bad JSON. */
export function historyFromJson(value: unknown): History {
  const { json, historyType } = historyCodec();
  const h = json.fromJson(historyType, value, { ignoreUnknownFields: true }) as History | null;
  if (!h || !Array.isArray(h.events) || h.events.length === 0) throw new TypeError('not a workflow history');
  return h;
}

/**
 * Fetches the history of `workflowId` (latest run unless `runId`) and writes it to `file` as JSON.
 * Refuses a run that has not closed (a partial history replays, but proves less). Returns the event count.
 */
export async function recordHistory(client: Client, workflowId: string, file: string, runId?: string): Promise<number> {
  const handle = client.workflow.getHandle(workflowId, runId);
  const desc = await handle.describe();
  if (desc.status.name === 'RUNNING') throw new Error(`workflow ${workflowId} is still running; record a closed run`);
  const history = await handle.fetchHistory();
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, `${JSON.stringify(historyToJson(history), null, 2)}\n`);
  return history.events?.length ?? 0;
}

async function main(): Promise<void> {
  const [workflowId, out, runId] = process.argv.slice(2);
  if (!workflowId || !out) {
    console.error('usage: tsx scripts/record-history.ts <workflowId> <out.json> [runId]');
    process.exit(2);
  }
  const cfg = loadConfig();
  const connection = await Connection.connect({ address: cfg.temporalAddress });
  try {
    const client = new Client({ connection, namespace: cfg.TEMPORAL_NAMESPACE });
    const n = await recordHistory(client, workflowId, path.resolve(out), runId);
    console.log(`wrote ${n} events to ${out}`);
  } finally {
    await connection.close();
  }
}

if (require.main === module) {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
