/**
 * The send-time address check of webhook deliveries (net/webhooks.ts postWebhook; docs/decisions/webhook-urls.md):
 * a stored URL is judged again when it is sent, by the same rule as at create (domain/webhook-signature.ts), on
 * IP literals and on what a name resolves to at connect time, so no byte reaches a non-public address.
 */
import net from 'node:net';
import { postWebhook } from '../../net/webhooks';

describe('postWebhook without ROOST_WEBHOOK_ALLOW_PRIVATE', () => {
  let server: net.Server;
  let port: number;
  let connections = 0;
  beforeAll(async () => {
    server = net.createServer((s) => {
      connections++;
      s.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as net.AddressInfo).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const send = (url: string) => postWebhook({ url, body: '{}', headers: {}, timeoutMs: 5_000, allowPrivate: false });

  test.each([
    'https://127.0.0.1:PORT/hook',
    'https://[::127.0.0.1]:PORT/hook', // IPv4-compatible IPv6
    'https://[::ffff:127.0.0.1]:PORT/hook', // IPv4-mapped
    'https://[2002:7f00:1::]:PORT/hook', // 6to4 of 127.0.0.1
    'https://[64:ff9b::7f00:1]:PORT/hook', // NAT64 of 127.0.0.1
    'https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]:PORT/hook', // Teredo
    'https://localhost:PORT/hook', // a name: judged by what it resolves to, before connecting
  ])('refuses %s before any byte is sent', async (template) => {
    const before = connections;
    const r = await send(template.replace('PORT', String(port)));
    expect(r).toMatchObject({ ok: false, refused: true, statusCode: null });
    expect(connections).toBe(before);
  });
});
