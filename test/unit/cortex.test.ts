/**
 * Pure rules of the fleet assistant: the conversation page-size rule (clamped or defaulted, never refused),
 * the reply stream's frames, and the built-in retrieval assistant's tool choice and answers
 * (domain/cortex.ts, services/cortex-local.ts).
 */
import { conversationPageSize, encodeFrame, parseFrames } from '../../domain/cortex';
import { composeAnswer, LOCAL_DISCLOSURE, planCalls } from '../../services/cortex-local';

describe('conversation page size', () => {
  it.each([
    [undefined, 25],
    ['', 25],
    ['abc', 25],
    ['2.5', 25],
    ['1e3', 25],
    ['0', 1],
    ['-4', 1],
    ['1', 1],
    ['25', 25],
    ['100', 100],
    ['101', 100],
    ['999999999999999', 100],
    [['7', '9'], 7],
  ])('%p → %p', (raw, size) => {
    expect(conversationPageSize(raw)).toBe(size);
  });
});

describe('reply frames', () => {
  it('encodes text and error frames as prefixed JSON strings, one per line, and parses them back across chunk boundaries', () => {
    const text = 'line one\nline "two" \u00e9\u2028';
    const wire = encodeFrame({ kind: 'text', text }) + encodeFrame({ kind: 'error', message: 'boom' });
    expect(wire.split('\n')).toHaveLength(3);
    const first = parseFrames(wire.slice(0, 7));
    expect(first.frames).toEqual([]);
    const rest = parseFrames(first.rest + wire.slice(7));
    expect(rest.frames).toEqual([
      { kind: 'text', text },
      { kind: 'error', message: 'boom' },
    ]);
    expect(rest.rest).toBe('');
  });

  it('skips frame kinds it does not know and refuses a payload that is not a JSON string', () => {
    expect(parseFrames('2:[1]\n0:"a"\n').frames).toEqual([{ kind: 'text', text: 'a' }]);
    expect(() => parseFrames('0:{"a":1}\n')).toThrow(/not a JSON string/);
  });
});

describe('local assistant', () => {
  const all = new Set([
    'list_machines',
    'get_machine',
    'list_roosts',
    'get_roost',
    'list_rollouts',
    'recent_audit',
    'propose_roost_deploy',
  ]);

  it('looks up what the question names, and follows up on the machines and roosts it mentions', () => {
    expect(planCalls('which machines are offline?', all, [], null)).toEqual([{ toolName: 'list_machines', input: {} }]);
    expect(planCalls('who changed things?', all, [], null)).toEqual([{ toolName: 'recent_audit', input: {} }]);
    expect(planCalls('hello there', all, [], null)).toEqual([]);
    expect(planCalls('how is it doing', all, [], 'pc-1')).toEqual([{ toolName: 'get_machine', input: {} }]);
    const listed = [
      { toolName: 'list_machines', input: {}, output: { machines: [{ machineId: 'pc-7', hostname: 'kiosk.local' }] }, error: null },
      { toolName: 'list_roosts', input: {}, output: { roosts: [{ roostId: 'rst_1', name: 'signage' }] }, error: null },
    ];
    expect(planCalls('show the cpu of kiosk.local', all, listed, null)).toEqual([
      { toolName: 'get_machine', input: { machineId: 'pc-7' } },
    ]);
    expect(planCalls('deploy signage please', all, listed, null)).toEqual([
      { toolName: 'propose_roost_deploy', input: { roostId: 'rst_1' } },
    ]);
    expect(planCalls('rollouts of rst_1', all, listed, null)).toEqual([{ toolName: 'list_rollouts', input: { roostId: 'rst_1' } }]);
  });

  it('never calls a tool it was not offered, and says when the key cannot make a change', () => {
    const readOnly = new Set(['list_roosts']);
    const listed = [{ toolName: 'list_roosts', input: {}, output: { roosts: [{ roostId: 'rst_1', name: 'signage' }] }, error: null }];
    expect(planCalls('deploy signage', readOnly, listed, null)).toEqual([]);
    const answer = composeAnswer('deploy signage', readOnly, listed);
    expect(answer.startsWith(LOCAL_DISCLOSURE)).toBe(true);
    expect(answer).toContain('Your key cannot make that change');
    expect(answer).toContain('signage (rst_1)');
  });

  it('answers only from tool results, and reports refused calls as such', () => {
    const answer = composeAnswer('which machines are offline', new Set(['list_machines']), [
      {
        toolName: 'list_machines',
        input: {},
        output: {
          online: 1,
          machines: [
            { machineId: 'a', online: true, cortexEnabled: true },
            { machineId: 'b', online: false, lastHeartbeat: '2026-01-01T00:00:00.000Z', cortexEnabled: true },
          ],
        },
        error: null,
      },
      { toolName: 'get_machine', input: { machineId: 'x' }, output: null, error: 'not_found: machine not found' },
    ]);
    expect(answer).toContain('2 machine(s), 1 online');
    expect(answer).toContain('- b: offline');
    expect(answer).not.toContain('- a:');
    expect(answer).toContain('get_machine was refused: not_found');
  });
});
