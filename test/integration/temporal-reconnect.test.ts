/**
 * How soon the API sees Temporal again after an outage (docs/decisions/outages.md "Back from an outage"):
 * a gRPC channel that failed to connect waits between attempts, growing the wait up to its maximum (120 s by
 * default), and calls in between fail at once without trying; a 5-minute outage kept `/readyz` and the
 * Temporal-backed routes at 503 for 92 s after Temporal was serving again. services/deps.ts caps the wait
 * for both connections (the client's and the readiness probe's).
 *
 * The dependencies of services/deps.ts, their Temporal reached through a TCP proxy of this file (the suite's
 * own Temporal keeps serving the other files): the proxy refuses connections for 45 s, then lets them
 * through, and the test measures how long both connections take to answer again.
 */
import { closeServiceDeps, createServiceDeps } from '../../services/deps';
import { pingTemporal } from '../../workflows/client';
import { testConfig } from '../support/env';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy';

let temporal: TcpProxy;

beforeAll(async () => {
  temporal = await startTcpProxy(Number(testConfig().temporalAddress.split(':').pop()));
});
afterAll(async () => temporal?.close());

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('both Temporal connections answer within seconds of the end of a 45 s outage', async () => {
  const deps = await createServiceDeps(testConfig({ TEMPORAL_ADDRESS: `127.0.0.1:${temporal.port}` }), 1);
  const client = () => deps.temporal.connection.withDeadline(Date.now() + 2000, () => deps.temporal.workflowService.getSystemInfo({}));
  const answers = async (call: () => Promise<unknown>) =>
    call().then(
      () => true,
      () => false,
    );
  try {
    await pingTemporal(deps.temporalProbe, 5000);
    await client();
    await temporal.down();
    // The outage, probed once a second as /readyz and the routes would be asked.
    for (const until = Date.now() + 45_000; Date.now() < until; await sleep(1000)) {
      expect(await answers(() => pingTemporal(deps.temporalProbe, 1000))).toBe(false);
    }
    await temporal.up();
    const back = Date.now();
    const seen: Record<'probe' | 'client', number | undefined> = { probe: undefined, client: undefined };
    while ((seen.probe === undefined || seen.client === undefined) && Date.now() - back < 60_000) {
      if (seen.probe === undefined && (await answers(() => pingTemporal(deps.temporalProbe, 1000)))) seen.probe = Date.now() - back;
      if (seen.client === undefined && (await answers(client))) seen.client = Date.now() - back;
      await sleep(250);
    }
    // The cap is 5 s (with jitter); the default channel waited tens of seconds here.
    expect(seen).toEqual({ probe: expect.any(Number), client: expect.any(Number) });
    expect(Math.max(seen.probe!, seen.client!)).toBeLessThan(10_000);
  } finally {
    await closeServiceDeps(deps);
  }
}, 150_000);
