/**
 * workflows/client.ts `updateCallTimedOut`: which failures of a control update call bounded by
 * CONTROL_UPDATE_WAIT_MS are the bound ending it (answered as "no worker took it", 503 with the update
 * handed over) and which are the call's own failure.
 */
import { ServiceError, WorkflowUpdateRPCTimeoutOrCancelledError } from '@temporalio/client';
import { updateCallTimedOut } from '../../workflows/client';

/** gRPC status codes (grpc-js `status`). */
const status = { CANCELLED: 1, DEADLINE_EXCEEDED: 4, NOT_FOUND: 5, UNAVAILABLE: 14 } as const;

/** A gRPC service error of the shape grpc-js gives (code, details, metadata). */
function grpcError(code: number, details: string): Error {
  return Object.assign(new Error(`${code} ${details}`), { code, details, metadata: {} });
}

const until = 1_000_000;

describe('updateCallTimedOut', () => {
  it('is the bound for DEADLINE_EXCEEDED, bare or wrapped by the SDK, before the bound as seen here', () => {
    const deadline = grpcError(status.DEADLINE_EXCEEDED, 'Deadline exceeded');
    expect(updateCallTimedOut(deadline, until, until - 5)).toBe(true);
    expect(updateCallTimedOut(new ServiceError('update failed', { cause: deadline }), until, until - 5)).toBe(true);
  });

  it('is the bound for the SDK update timeout-or-cancel error, whatever its cause', () => {
    const cancelled = grpcError(status.CANCELLED, 'Cancelled on client');
    expect(
      updateCallTimedOut(new WorkflowUpdateRPCTimeoutOrCancelledError('timeout or cancelled', { cause: cancelled }), until, until - 5),
    ).toBe(true);
  });

  it('is the bound for any failure that arrives once the bound has passed (the server answer racing it)', () => {
    expect(updateCallTimedOut(grpcError(status.UNAVAILABLE, 'context deadline exceeded'), until, until)).toBe(true);
    expect(updateCallTimedOut(new Error('anything'), until, until + 30)).toBe(true);
  });

  it('is the call’s own failure before the bound', () => {
    expect(updateCallTimedOut(grpcError(status.UNAVAILABLE, 'connection refused'), until, until - 1)).toBe(false);
    expect(updateCallTimedOut(grpcError(status.NOT_FOUND, 'workflow not found'), until, until - 1)).toBe(false);
    expect(updateCallTimedOut(new Error('the update failed'), until, until - 1)).toBe(false);
  });
});
