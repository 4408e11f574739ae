/** Version refs (domain/versionRef.ts; docs/contract.md "Version id and version refs"). */
import { ApiError } from '../../domain/errors';
import { parseVersionRef } from '../../domain/versionRef';

const ID = '0123456789abcdef'.repeat(4);

describe('parseVersionRef', () => {
  it('parses stable ids, legacy vrs_ ids and vrs_ prefixes', () => {
    expect(parseVersionRef(ID)).toEqual({ kind: 'id', id: ID });
    expect(parseVersionRef(`vrs_${ID}`)).toEqual({ kind: 'id', id: ID });
    expect(parseVersionRef(`vrs_${ID.slice(0, 8)}`)).toEqual({ kind: 'idPrefix', prefix: ID.slice(0, 8) });
    expect(parseVersionRef(`vrs_${ID.slice(0, 63)}`)).toEqual({ kind: 'idPrefix', prefix: ID.slice(0, 63) });
  });

  it('parses version numbers in every spelling', () => {
    for (const s of ['3', '#3', 'v3', 'V3']) expect(parseVersionRef(s)).toEqual({ kind: 'number', number: 3 });
    expect(parseVersionRef('2147483647')).toEqual({ kind: 'number', number: 2147483647 });
  });

  it('parses the aliases', () => {
    for (const a of ['current', 'previous', 'first'] as const) expect(parseVersionRef(a)).toEqual({ kind: 'alias', alias: a });
  });

  it.each([
    '',
    '0',
    '#0',
    'v0',
    '-1',
    '03',
    '1.5',
    '#',
    'v',
    'vv3',
    '# 3',
    'latest',
    'Current',
    'HEAD',
    ID.toUpperCase(),
    ID + '0',
    `vrs_${ID.slice(0, 7)}`,
    'vrs_',
    'sha256:' + ID,
    '2147483648',
    '99999999999',
  ])('rejects %p as version_ref_malformed', (raw) => {
    let err: unknown;
    try {
      parseVersionRef(raw, 'targetVersion');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ApiError);
    expect(err).toMatchObject({ code: 'version_ref_malformed', status: 400, extras: { param: 'targetVersion' } });
  });

  it('rejects non-strings', () => {
    expect(() => parseVersionRef(3)).toThrow(ApiError);
    expect(() => parseVersionRef(undefined)).toThrow(ApiError);
  });
});
