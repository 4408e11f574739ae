/** Which failures are a dependency outage (domain/outage.ts): by error codes and SQLSTATE classes, never message text. */
import { tagConnectionError } from '../../db/pool';
import { unavailableDependency } from '../../domain/outage';

const pgError = (code: string) => Object.assign(new Error('x'), { code, severity: 'FATAL', routine: 'r' });

test.each([
  [pgError('57P01'), 'database'], // admin shutdown
  [pgError('57P03'), 'database'], // cannot connect now (starting up)
  [pgError('08006'), 'database'], // connection failure
  [pgError('53300'), 'database'], // too many connections
  [Object.assign(new Error('x'), { code: 'ECONNREFUSED' }), 'network'],
  [new Error('wrapped', { cause: Object.assign(new Error('x'), { code: 'ECONNRESET' }) }), 'network'],
  [Object.assign(new Error('x'), { name: 'RestError', code: 'ECONNREFUSED' }), 'blob storage'],
  [new Error('x', { cause: Object.assign(new Error('y'), { code: 14, metadata: {} }) }), 'temporal'],
  [Object.assign(new Error('Connection terminated unexpectedly'), { dependency: 'database' }), 'database'], // marked by db/pool.ts
])('%s → %s', (err, expected) => {
  expect(unavailableDependency(err)).toBe(expected);
});

test.each([
  [pgError('23505')], // unique violation: a bug or a race, not an outage
  [pgError('40001')], // serialization failure: retried by withTx
  [new Error('Connection terminated unexpectedly')], // no code: not classified by its text
  [Object.assign(new Error('x'), { code: 5, metadata: {} })], // gRPC NOT_FOUND
  [null],
  ['text'],
])('%s is not an outage', (err) => {
  expect(unavailableDependency(err)).toBeNull();
});

test('db/pool.ts marks connection failures without a SQLSTATE, never a server answer or a programming error', () => {
  const lost = tagConnectionError(new Error('Connection terminated unexpectedly'));
  expect(unavailableDependency(lost)).toBe('database');
  expect(unavailableDependency(tagConnectionError(new Error('timeout exceeded when trying to connect')))).toBe('database');
  expect(unavailableDependency(tagConnectionError(pgError('23505')))).toBeNull();
  expect(unavailableDependency(tagConnectionError(new TypeError('Converting circular structure to JSON')))).toBeNull();
});
