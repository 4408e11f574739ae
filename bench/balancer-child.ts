/**
 * The scale-out benchmark's load balancer, in processes of its own (bench/scaleout.ts starts it): a
 * node:cluster primary that forks `ROOST_BALANCER_PROCESSES` workers, each running a `RoundRobin`
 * (bench/balancer.ts) on one shared loopback port (the primary accepts and hands connections out in
 * turn). A spliced connection holds two descriptors (client side and upstream), so 10,000 long-polling
 * machines need 20,000 of them: the whole open-file limit of one process on this machine. Spread over
 * several processes, each stays well inside it.
 *
 * Environment: `ROOST_BALANCER_BACKENDS` (JSON array of loopback ports), `ROOST_BALANCER_PROCESSES`.
 * IPC with the parent (stdio 'ipc'): the primary sends `{ type: 'ready', port }` once every worker
 * listens; it answers `{ type: 'stats' }` with `{ type: 'stats', connections }` (connections handed to
 * each backend, summed over the workers). It exits when the parent disconnects.
 */
import cluster, { type Worker } from 'node:cluster';
import { RoundRobin } from './balancer';

type FromWorker = { type: 'listening'; port: number } | { type: 'connections'; id: number; connections: number[] };

const backends = JSON.parse(process.env.ROOST_BALANCER_BACKENDS ?? '[]') as number[];

if (cluster.isPrimary) {
  const n = Math.max(1, Number(process.env.ROOST_BALANCER_PROCESSES ?? '2'));
  const workers: Worker[] = [];
  let listening = 0;
  const fail = (message: string) => {
    console.error(`balancer: ${message}`);
    process.exit(1);
  };
  for (let i = 0; i < n; i++) {
    const w = cluster.fork();
    workers.push(w);
    w.on('message', (m: FromWorker) => {
      if (m.type === 'listening' && ++listening === n) process.send?.({ type: 'ready', port: m.port });
    });
    w.on('exit', (code, signal) => fail(`worker ${i} exited (${code ?? signal})`));
  }
  /** Asks every worker for its counters and sums them. */
  const stats = async (): Promise<number[]> => {
    const each = await Promise.all(
      workers.map(
        (w) =>
          new Promise<number[]>((resolve) => {
            const onMsg = (m: FromWorker) => {
              if (m.type !== 'connections') return;
              w.off('message', onMsg);
              resolve(m.connections);
            };
            w.on('message', onMsg);
            w.send({ type: 'stats' });
          }),
      ),
    );
    return backends.map((_, b) => each.reduce((s, c) => s + (c[b] ?? 0), 0));
  };
  process.on('message', (m: { type: string }) => {
    if (m.type === 'stats') void stats().then((connections) => process.send?.({ type: 'stats', connections }));
  });
  process.on('disconnect', () => {
    for (const w of workers) w.removeAllListeners('exit').process.kill('SIGKILL');
    process.exit(0);
  });
} else {
  const rr = new RoundRobin(backends);
  void rr.open().then(() => process.send?.({ type: 'listening', port: rr.port } satisfies FromWorker));
  process.on('message', (m: { type: string }) => {
    if (m.type === 'stats')
      process.send?.({ type: 'connections', id: cluster.worker?.id ?? 0, connections: [...rr.connections] } satisfies FromWorker);
  });
}
