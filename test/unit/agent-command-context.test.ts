/**
 * agent/http.ts command context: what runs inside withCommandContext carries the command's request id and
 * trace id (and sends its traceparent); outsideCommandContext leaves it, so an agent restarted by a
 * reboot_machine (agent/power.ts) does not send that command's trace context with every later request.
 */
import { commandLogFields, outsideCommandContext, withCommandContext } from '../../agent/http';

const cmd = { traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`, requestId: 'req-1' };

it('withCommandContext carries the command ids into async work, outsideCommandContext drops them', async () => {
  const inside = await withCommandContext(cmd, async () => {
    await new Promise((r) => setImmediate(r));
    return commandLogFields();
  });
  expect(inside).toEqual({ requestId: 'req-1', traceId: 'a'.repeat(32) });
  const later = await withCommandContext(cmd, () =>
    outsideCommandContext(async () => {
      await new Promise((r) => setImmediate(r));
      return commandLogFields();
    }),
  );
  expect(later).toEqual({});
  expect(commandLogFields()).toEqual({});
});
