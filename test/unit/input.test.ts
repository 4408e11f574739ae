/** The input rule of domain/input.ts: text that cannot be stored, depth, prototype keys. */
import { headerText, jsonInputProblem, MAX_JSON_DEPTH, textProblem } from '../../domain/input';

describe('headerText', () => {
  it('reads a header that arrived as UTF-8 bytes as UTF-8, and keeps ASCII, Latin-1 and wider text as they came', () => {
    const asNodeHandsItOver = (text: string) => Buffer.from(text, 'utf8').toString('latin1');
    expect(headerText(asNodeHandsItOver('Café-Agent/1.0 (日本語)'))).toBe('Café-Agent/1.0 (日本語)');
    expect(headerText('curl/8.5.0')).toBe('curl/8.5.0');
    // Not valid UTF-8 (a Latin-1 é alone): kept as the Latin-1 text it is.
    expect(headerText('caf\u00e9')).toBe('caf\u00e9');
    expect(headerText('already decoded: 日本')).toBe('already decoded: 日本');
  });
});

describe('textProblem', () => {
  test.each([
    ['plain', null],
    ['emoji 🐦 pair', null],
    ['', null],
    ['a\u0000b', 'must not contain U+0000 (NUL)'],
    ['lone \ud800 high', 'must not contain a lone UTF-16 surrogate'],
    ['lone \udc00 low', 'must not contain a lone UTF-16 surrogate'],
    ['reversed \udc00\ud800', 'must not contain a lone UTF-16 surrogate'],
  ])('%j', (s, expected) => {
    expect(textProblem(s)).toBe(expected);
  });
});

describe('jsonInputProblem', () => {
  const nest = (n: number) => {
    let v: unknown = 1;
    for (let i = 0; i < n; i++) v = i % 2 ? [v] : { k: v };
    return v;
  };

  test('accepts ordinary bodies and scalars', () => {
    expect(jsonInputProblem({ a: [1, 'x', null, true, { b: 'y' }] })).toBeNull();
    expect(jsonInputProblem('text')).toBeNull();
    expect(jsonInputProblem(null)).toBeNull();
  });

  test('names the dotted path of a refused string, inside arrays too', () => {
    expect(jsonInputProblem({ files: [{ path: 'ok' }, { path: 'x\u0000' }] })).toEqual({
      path: 'files.1.path',
      message: 'must not contain U+0000 (NUL)',
    });
  });

  test('refuses a key that cannot be stored, naming the object that holds it', () => {
    expect(jsonInputProblem({ metrics: { ['k\ud800']: 1 } })).toEqual({
      path: 'metrics',
      message: 'a key must not contain a lone UTF-16 surrogate',
    });
  });

  test(`depth: ${MAX_JSON_DEPTH} levels pass, one more is refused, a million levels do not recurse`, () => {
    expect(jsonInputProblem(nest(MAX_JSON_DEPTH))).toBeNull();
    expect(jsonInputProblem(nest(MAX_JSON_DEPTH + 1))?.message).toMatch(/deeper than 64/);
    expect(jsonInputProblem(nest(1_000_000))?.message).toMatch(/deeper than 64/);
  });

  test('prototype keys', () => {
    expect(jsonInputProblem(JSON.parse('{"a":{"__proto__":{"x":1}}}'))).toEqual({
      path: 'a.__proto__',
      message: 'the key __proto__ is not allowed',
    });
    expect(jsonInputProblem({ constructor: { prototype: {} } })?.path).toBe('constructor.prototype');
    expect(jsonInputProblem({ constructor: 'a name' })).toBeNull();
  });
});
it('refuses numbers beyond the double range where they stand (JSON.parse reads them as Infinity); large finite numbers pass', () => {
  expect(jsonInputProblem(JSON.parse('{"config":{"n":1e400}}'))).toEqual({
    path: 'config.n',
    message: 'is a number outside the range of a double',
  });
  expect(jsonInputProblem(JSON.parse('{"a":[1,-1e999]}'))).toEqual({ path: 'a.1', message: 'is a number outside the range of a double' });
  expect(jsonInputProblem(JSON.parse('1e400'))).toEqual({ path: '', message: 'is a number outside the range of a double' });
  expect(jsonInputProblem(JSON.parse('{"n":1.7976931348623157e308,"m":-1e300,"k":1e-400}'))).toBeNull();
});
