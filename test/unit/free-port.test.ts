/**
 * stack/ports.ts freePort: ports picked for services we start later lie outside the kernel's ephemeral range,
 * so they cannot be taken meanwhile by an outgoing connection or another port-0 listener.
 */
import net from 'node:net';
import { ephemeralPortRange, freePort, freePorts } from '../../stack/ports';

describe('freePort', () => {
  it('picks bindable ports outside the ephemeral range', async () => {
    const [lo, hi] = ephemeralPortRange();
    expect(lo).toBeGreaterThan(0);
    expect(hi).toBeGreaterThanOrEqual(lo);
    const ports = await freePorts(20);
    expect(new Set(ports).size).toBe(20);
    for (const p of ports) expect(p < lo || p > hi).toBe(true);
    const p = await freePort();
    const srv = net.createServer();
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject);
      srv.listen(p, '127.0.0.1', resolve);
    });
    await new Promise((r) => srv.close(r));
  });

  it('never returns a port something listens on', async () => {
    const held = await freePorts(50);
    const servers = await Promise.all(
      held.map(
        (p) =>
          new Promise<net.Server>((resolve, reject) => {
            const s = net.createServer();
            s.once('error', reject);
            s.listen(p, '127.0.0.1', () => resolve(s));
          }),
      ),
    );
    try {
      const picked = await freePorts(50);
      for (const p of picked) expect(held).not.toContain(p);
    } finally {
      await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
    }
  });
});
