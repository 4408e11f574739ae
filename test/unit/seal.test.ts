import { randomBytes } from 'node:crypto';
import { openSealed, seal } from '../../domain/seal';

const key = randomBytes(32);

it('opens what it sealed, with the same key and associated data', () => {
  const s = seal(key, 'whsec_abc', 'webhook:site_1:wh_1');
  expect(s).toMatch(/^v1\.[\w-]+\.[\w-]+\.[\w-]+$/);
  expect(s).not.toContain('whsec_abc');
  expect(openSealed(key, s, 'webhook:site_1:wh_1').toString()).toBe('whsec_abc');
});

it('uses a fresh nonce each time', () => {
  expect(seal(key, 'x', 'a')).not.toBe(seal(key, 'x', 'a'));
});

it('refuses another key, other associated data, tampered bytes and unknown forms', () => {
  const s = seal(key, 'secret', 'webhook:site_1:wh_1');
  expect(() => openSealed(randomBytes(32), s, 'webhook:site_1:wh_1')).toThrow();
  expect(() => openSealed(key, s, 'webhook:site_2:wh_1')).toThrow();
  const [v, n, ct, tag] = s.split('.');
  const flipped = Buffer.from(ct, 'base64url');
  flipped[0] ^= 1;
  expect(() => openSealed(key, [v, n, flipped.toString('base64url'), tag].join('.'), 'webhook:site_1:wh_1')).toThrow();
  expect(() => openSealed(key, 'plain', 'a')).toThrow(/not a sealed value/);
  expect(() => seal(Buffer.alloc(16), 'x', 'a')).toThrow(/32 bytes/);
});
