/**
 * An HTTPS installer server for classic deployment tests and benchmarks: a self-signed certificate for
 * 127.0.0.1 (the `selfsigned` package; agents trust it through their `installerCa` option) serving
 * installer files from memory. Installers are POSIX shell scripts the reference agent really runs
 * (agent/installer.ts): `installerScript` writes one that succeeds, fails on chosen machines and attempts,
 * or hangs.
 */
import { createHash } from 'node:crypto';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { generate } from 'selfsigned';

/** A running installer server. */
export interface InstallerServer {
  /** `https://127.0.0.1:<port>` */
  baseUrl: string;
  /** PEM of the server's certificate: pass as the agents' `installerCa`. */
  ca: string;
  /** Serves `body` at `/<name>`; returns its URL and SHA-256 hex. */
  add(name: string, body: string | Buffer): { url: string; sha256: string };
  /** Number of GETs per file name. */
  hits: Map<string, number>;
  close(): Promise<void>;
}

/** Starts the server on a free loopback port. */
export async function startInstallerServer(): Promise<InstallerServer> {
  const pems = await generate([{ name: 'commonName', value: '127.0.0.1' }], {
    keySize: 2048,
    days: 2,
    extensions: [{ name: 'subjectAltName', altNames: [{ type: 7, ip: '127.0.0.1' }] }],
  } as Parameters<typeof generate>[1]);
  const files = new Map<string, Buffer>();
  const hits = new Map<string, number>();
  const server = https.createServer({ key: pems.private, cert: pems.cert }, (req, res) => {
    const name = decodeURIComponent((req.url ?? '/').slice(1).split('?')[0]);
    const body = files.get(name);
    hits.set(name, (hits.get(name) ?? 0) + 1);
    if (!body) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': body.length });
    res.end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const baseUrl = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    baseUrl,
    ca: pems.cert,
    hits,
    add(name, body) {
      const b = Buffer.isBuffer(body) ? body : Buffer.from(body);
      files.set(name, b);
      return { url: `${baseUrl}/${encodeURIComponent(name)}`, sha256: createHash('sha256').update(b).digest('hex') };
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * A POSIX shell installer. It runs in its download folder
 * (`<machine root>/state/installers/<deploymentId>/<attempt>`), so it can tell the machine and attempt apart.
 * - writes `marker` (a path) with the machine folder's name appended as a line when it runs (install or uninstall);
 * - install: creates `installs` (a folder path) + `/<machine>`; uninstall (`--uninstall`) removes it;
 * - exits `failCode` when the machine id is one of `failOn` (on attempt 1 only unless `always`);
 * - sleeps `sleepSeconds` first (a long sleep is a hanging installer); with `childPidFile`, the sleep is a
 *   background child whose pid is written to that file and the script waits for it (an installer whose
 *   work is done by a process it started, as setup.exe runs msiexec).
 */
export function installerScript(opts: {
  marker: string;
  installs: string;
  failOn?: string[];
  always?: boolean;
  failCode?: number;
  sleepSeconds?: number;
  childPidFile?: string;
}): string {
  const fail = (opts.failOn ?? []).map((m) => `${m}/state/installers/*/${opts.always ? '*' : '1'}`);
  return [
    '#!/bin/sh',
    '# roost test installer',
    'attempt_dir="$PWD"',
    'machine=$(basename "$(dirname "$(dirname "$(dirname "$(dirname "$attempt_dir")")")")")',
    `echo "$machine $*" >> '${opts.marker}'`,
    opts.sleepSeconds && opts.childPidFile
      ? `sleep ${opts.sleepSeconds} & echo $! > '${opts.childPidFile}.tmp' && mv '${opts.childPidFile}.tmp' '${opts.childPidFile}'; wait $!`
      : opts.sleepSeconds
        ? `sleep ${opts.sleepSeconds}`
        : '',
    ...fail.map((pattern) => `case "$attempt_dir" in */${pattern}) exit ${opts.failCode ?? 3};; esac`),
    `mkdir -p '${opts.installs}'`,
    `if [ "$1" = "--uninstall" ]; then rm -f '${opts.installs}'/"$machine"; else touch '${opts.installs}'/"$machine"; fi`,
    'exit 0',
    '',
  ].join('\n');
}
