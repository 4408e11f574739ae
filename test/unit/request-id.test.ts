/**
 * api/app.ts `newRequestId`: request ids drawn from a block of random bytes keep their shape (`req_` + 20
 * lowercase hex) and stay distinct across block refills.
 */
import { newRequestId } from '../../api/app';

it('gives req_ + 20 hex characters, distinct across several refills of its random block', () => {
  // 4096-byte blocks of 10 bytes per id: 2,000 ids span four refills.
  const ids = Array.from({ length: 2000 }, () => newRequestId());
  for (const id of ids) expect(id).toMatch(/^req_[0-9a-f]{20}$/);
  expect(new Set(ids).size).toBe(ids.length);
});
