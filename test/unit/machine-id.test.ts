/** The machine-id rule (domain/schemas.ts MACHINE_ID_RE, docs/decisions/machine-ids.md) and the agent's own check of it. */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import Ajv from 'ajv';
import { isMachineId, MACHINE_ID_RE, MachineId } from '../../domain/schemas';
import { enrolService, machineIdProblem } from '../../agent/service';
import { baseProgram } from '../../cli/program';
import { UsageError } from '../../cli/context';

const VALID = ['m', 'kiosk-01', 'KIOSK_01', 'a.b', '.a', 'a.', '.a.', '..a', 'a..', '-', '_', 'm'.repeat(64), `${'.'.repeat(63)}a`];
const INVALID = ['', '.', '..', '...', '.'.repeat(64), '.'.repeat(65), 'm'.repeat(65), 'bad id', 'a/b', '../etc', 'a:b', 'é', '..\n'];

describe('MACHINE_ID_RE', () => {
  it('takes 1..64 of [A-Za-z0-9._-] with at least one character that is not a dot', () => {
    for (const id of VALID) expect([id, MACHINE_ID_RE.test(id), isMachineId(id)]).toEqual([id, true, true]);
    for (const id of INVALID) expect([id, MACHINE_ID_RE.test(id), isMachineId(id)]).toEqual([id, false, false]);
    expect(isMachineId(undefined)).toBe(false);
    expect(isMachineId(42)).toBe(false);
  });

  it('the MachineId schema the routes validate with (ajv, unicode patterns) applies the same rule', () => {
    const check = new Ajv({ strict: false }).compile(MachineId);
    for (const id of VALID) expect([id, check(id)]).toEqual([id, true]);
    for (const id of INVALID) expect([id, check(id)]).toEqual([id, false]);
  });
});

describe("the agent's check (agent/service.ts)", () => {
  it('machineIdProblem names the id and the rule', () => {
    expect(machineIdProblem('kiosk-01')).toBeNull();
    expect(machineIdProblem('a.')).toBeNull();
    expect(machineIdProblem('..')).toBe('machine id ".." is not valid: 1..64 characters of [A-Za-z0-9._-], not only dots');
  });

  it('enrolService refuses an all-dots id before it writes a file or asks the API', async () => {
    const tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-machine-id-'));
    try {
      for (const machineId of ['.', '..', '...']) {
        const rootDir = path.join(tmp, 'root');
        await expect(
          // Port 9 (discard): a request would fail with a network error, not this message.
          enrolService({ api: 'http://127.0.0.1:9', siteId: 'site_x', secret: 'ses_x', machineId, rootDir, agentVersion: '1' }),
        ).rejects.toThrow(`machine id ${JSON.stringify(machineId)} is not valid`);
        await expect(fs.stat(rootDir)).rejects.toMatchObject({ code: 'ENOENT' });
      }
    } finally {
      await fs.rm(tmp, { recursive: true, force: true });
    }
  });
});

describe('roost agent enrol --machine-id (cli/commands/agent.ts)', () => {
  it('refuses an all-dots id as a usage error and passes the others on unchanged', () => {
    const enrol = baseProgram()
      .commands.find((c) => c.name() === 'agent')
      ?.commands.find((c) => c.name() === 'enrol');
    const parse = enrol?.options.find((o) => o.long === '--machine-id')?.parseArg;
    expect(parse).toBeDefined();
    for (const id of ['.', '..', '...']) {
      expect(() => parse?.(id, undefined)).toThrow(UsageError);
      expect(() => parse?.(id, undefined)).toThrow(`--machine-id: machine id ${JSON.stringify(id)} is not valid`);
    }
    for (const id of ['a.b', '.a', 'a.']) expect(parse?.(id, undefined)).toBe(id);
  });
});
