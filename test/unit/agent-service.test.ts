/**
 * Pieces of the installed agent that need no API: the default machine root per platform, the reconnect
 * backoff, the owner-only state folder, the command journal, the status report of an unenrolled root,
 * and the audit chain check of `roost audit verify`.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { defaultAgentRoot } from '../../cli/commands/agent';
import { verifyChain } from '../../cli/commands/audit';
import { exitCodeOf } from '../../cli/context';
import { FileJournal } from '../../agent/journal';
import { reconnectDelayMs } from '../../agent/service';
import { modeOf, readStatusReport, restrictStateFolder } from '../../agent/state';
import { sealAuditRecord } from '../../domain/audit';

let tmp: string;
beforeEach(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'roost-agent-unit-'));
});
afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('defaultAgentRoot', () => {
  it('is %ProgramData%\\Roost\\agent on Windows, /var/lib/roost-agent elsewhere, ROOST_AGENT_ROOT when set', () => {
    expect(defaultAgentRoot('win32', { ProgramData: 'D:\\Data' })).toBe('D:\\Data\\Roost\\agent');
    expect(defaultAgentRoot('win32', {})).toBe('C:\\ProgramData\\Roost\\agent');
    expect(defaultAgentRoot('linux', {})).toBe('/var/lib/roost-agent');
    expect(defaultAgentRoot('linux', { ROOST_AGENT_ROOT: '/srv/a' })).toBe('/srv/a');
  });
});

describe('reconnectDelayMs', () => {
  it('doubles from 1 s to a 60 s cap, jittered to half..all of it', () => {
    expect(reconnectDelayMs(0, () => 0)).toBe(500);
    expect(reconnectDelayMs(0, () => 0.999999)).toBeCloseTo(1000, 0);
    expect(reconnectDelayMs(3, () => 0.999999)).toBeCloseTo(8000, 0);
    expect(reconnectDelayMs(30, () => 0.999999)).toBeCloseTo(60_000, 0);
  });
});

describe('restrictStateFolder', () => {
  it('makes the folder 0700 and every file under it 0600 (POSIX)', async () => {
    const state = path.join(tmp, 'state');
    fs.mkdirSync(path.join(state, 'work'), { recursive: true, mode: 0o755 });
    fs.writeFileSync(path.join(state, 'agent.json'), '{}', { mode: 0o644 });
    fs.writeFileSync(path.join(state, 'work', 'cmd_1.json'), '{}', { mode: 0o666 });
    await restrictStateFolder(state, 'linux');
    expect(await modeOf(state)).toBe(0o700);
    expect(await modeOf(path.join(state, 'work'))).toBe(0o700);
    expect(await modeOf(path.join(state, 'agent.json'))).toBe(0o600);
    expect(await modeOf(path.join(state, 'work', 'cmd_1.json'))).toBe(0o600);
  });
});

describe('FileJournal', () => {
  it('returns taken commands oldest first until done, and never writes a file for an unsafe id', async () => {
    const j = new FileJournal(tmp);
    const cmd = (id: string) => ({ commandId: id, type: 'sync_pull', params: { roostId: 'rst_1' }, createdAt: '', expiresAt: null });
    await j.taken(cmd('cmd_a'));
    await new Promise((r) => setTimeout(r, 5));
    await j.taken(cmd('cmd_b'));
    await j.taken(cmd('../escape'));
    expect((await j.pending()).map((c) => c.commandId)).toEqual(['cmd_a', 'cmd_b']);
    await j.done('cmd_a');
    expect((await j.pending()).map((c) => c.commandId)).toEqual(['cmd_b']);
    expect(fs.readdirSync(path.join(tmp, 'work'))).toEqual(['cmd_b.json']);
  });
});

describe('readStatusReport', () => {
  it('reports a root that was never enrolled', async () => {
    const r = await readStatusReport(path.join(tmp, 'none'));
    expect(r).toMatchObject({ enrolled: false, identity: null, hasToken: false, running: false, roosts: [], pendingWork: [] });
  });
});

describe('verifyChain', () => {
  const chain = () => {
    const a = {
      ...sealAuditRecord({
        kind: 'k',
        actor: 'user:u',
        occurredAt: '2026-01-01T00:00:00.000Z',
        attributes: {},
        previousHash: null,
        siteId: 's',
      }),
      sequence: 1,
    };
    const b = {
      ...sealAuditRecord({
        kind: 'k',
        actor: 'user:u',
        occurredAt: '2026-01-01T00:00:01.000Z',
        attributes: { n: 2 },
        previousHash: a.hash,
        siteId: 's',
      }),
      sequence: 2,
    };
    return [b, a];
  };
  it('accepts an intact chain and names the first failure of a tampered, gapped or truncated one', () => {
    expect(verifyChain('s', chain())).toMatchObject({ ok: true, checked: 2, failure: null });
    const tampered = chain();
    tampered[1] = { ...tampered[1], attributes: { evil: true } };
    expect(verifyChain('s', tampered).failure).toMatchObject({ sequence: 2, reason: 'predecessor_tampered' });
    const gap = chain();
    gap[1] = { ...gap[1], sequence: 0 };
    expect(verifyChain('s', gap).failure).toMatchObject({ sequence: 2, reason: 'sequence_gap' });
    expect(verifyChain('s', chain().slice(0, 1)).failure).toMatchObject({ sequence: 2, reason: 'predecessor_missing' });
  });
});

describe('exitCodeOf', () => {
  it('maps problems to the documented exit codes', () => {
    expect(exitCodeOf({ code: 'usage_error' })).toBe(2);
    expect(exitCodeOf({ code: 'no_credentials' })).toBe(5);
    expect([401, 403].map((status) => exitCodeOf({ status }))).toEqual([5, 5]);
    expect([404, 410].map((status) => exitCodeOf({ status }))).toEqual([4, 4]);
    expect([409, 412, 422].map((status) => exitCodeOf({ status }))).toEqual([3, 3, 3]);
    expect([400, 429, 500, 0].map((status) => exitCodeOf({ status }))).toEqual([1, 1, 1, 1]);
  });
});
