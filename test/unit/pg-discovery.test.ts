/**
 * How the embedded PostgreSQL's binaries are found (stack/postgres.ts findPostgres): ROOST_PG_BIN, else
 * `pg_config --bindir`, else the newest N/bin of the Debian-style folder; 15 or newer; an existing cluster
 * only under its own major version; one line naming what to install when nothing fits. The installations
 * here are stand-in scripts answering `postgres --version` like the real ones.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { findPostgres } from '../../stack/postgres';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-pgfind-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function script(file: string, body: string): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, `#!/bin/sh\n${body}\n`, { mode: 0o755 });
}

/** A stand-in installation of `version` (e.g. '16.4') under root/major/bin. */
function install(root: string, version: string): string {
  const bin = path.join(root, version.split('.')[0], 'bin');
  script(path.join(bin, 'postgres'), `echo "postgres (PostgreSQL) ${version} (stand-in)"`);
  script(path.join(bin, 'initdb'), 'exit 0');
  script(path.join(bin, 'pg_ctl'), 'exit 0');
  return bin;
}

/** An environment where no pg_config is on PATH (or only the one in `pathDir`). */
const env = (extra: NodeJS.ProcessEnv = {}, pathDir = path.join(tmp, 'no-such-folder')): NodeJS.ProcessEnv => ({ PATH: pathDir, ...extra });

describe('findPostgres', () => {
  const root = path.join(tmp, 'lib-postgresql');
  const bins = { 14: install(root, '14.9'), 16: install(root, '16.4'), 17: install(root, '17.2') };

  it('takes the newest installation when nothing is set', () => {
    expect(findPostgres(env(), { searchRoot: root })).toMatchObject({ bin: bins[17], major: 17 });
  });

  it('prefers pg_config --bindir over the newest folder', () => {
    const pathDir = path.join(tmp, 'path-with-pg-config');
    script(path.join(pathDir, 'pg_config'), `echo "${bins[16]}"`);
    expect(findPostgres(env({}, pathDir), { searchRoot: root })).toMatchObject({ bin: bins[16], major: 16 });
  });

  it('takes ROOST_PG_BIN when set, and names it when it holds no server', () => {
    expect(findPostgres(env({ ROOST_PG_BIN: bins[16] }), { searchRoot: root }).major).toBe(16);
    const empty = path.join(tmp, 'empty-bin');
    fs.mkdirSync(empty, { recursive: true });
    expect(() => findPostgres(env({ ROOST_PG_BIN: empty }), { searchRoot: root })).toThrow(`ROOST_PG_BIN=${empty} does not hold`);
  });

  it('starts an existing cluster only under the major version that created it', () => {
    expect(findPostgres(env(), { searchRoot: root, cluster: { major: 16, dir: '/x/.data/pg' } }).bin).toBe(bins[16]);
    expect(() => findPostgres(env(), { searchRoot: root, cluster: { major: 15, dir: '/x/.data/pg' } })).toThrow(
      /created by PostgreSQL 15 .*install postgresql-15 .*delete \/x\/\.data\/pg/,
    );
  });

  it('refuses a server older than 15', () => {
    const old = path.join(tmp, 'only-old');
    install(old, '14.9');
    expect(() => findPostgres(env(), { searchRoot: old })).toThrow(/14 .* is too old: Roost needs 15 or newer/);
  });

  it('says in one line what to install when there is no server at all', () => {
    let message = '';
    try {
      findPostgres(env(), { searchRoot: path.join(tmp, 'nothing-here') });
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/^PostgreSQL server binaries not found .*install the PostgreSQL 15, 16 or 17 server .*ROOST_PG_BIN/);
    expect(message).not.toContain('\n');
  });
});
