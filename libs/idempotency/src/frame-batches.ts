/**
 * How a recorded stream's frames reach the store (StreamRecorder): in
 * batches, one append in flight at a time, so the store never holds the
 * stream back. A frame waits for the end of the event-loop turn it came in
 * (the frames of one chunk go together), or for the append in flight. Once
 * the stream is whole, no batch starts: what is pending goes with the
 * completion. A stream that broke has its pending frames appended first, for
 * the callers following it.
 *
 * A step returns the next state; the frames pending are one array handed on
 * from state to state and pushed to in place (a stream may queue many frames
 * behind a slow append), so a state is not to be kept once stepped from.
 */
export type FrameBatches =
  /** No append in flight. `turnQueued`: a turn's end is awaited to start one. */
  | { readonly kind: 'idle'; readonly pending: Buffer[]; readonly turnQueued: boolean }
  | { readonly kind: 'appending'; readonly pending: Buffer[]; readonly turnQueued: boolean }
  /** No batch starts any more; `pending` is the completion's (or nobody's: the answer is not stored). */
  | { readonly kind: 'closed'; readonly pending: Buffer[] };

export type FrameBatchEvent =
  /** A frame to store. */
  | { readonly kind: 'frame'; readonly frame: Buffer }
  /** The turn a frame came in has ended. */
  | { readonly kind: 'turn-ended' }
  /** The append in flight settled (written, refused or failed: the recorder decides what that means). */
  | { readonly kind: 'appended' }
  /** The stream broke: append what is pending now. */
  | { readonly kind: 'flush' }
  /** The stream is whole, or nothing more is stored: no batch starts from here. */
  | { readonly kind: 'close' };

export type FrameBatchEffect =
  /** Send `turn-ended` once this turn is over (setImmediate). */
  | { readonly kind: 'await-turn' }
  /** Append these frames (and send `appended` when it settles). */
  | { readonly kind: 'append'; readonly frames: readonly Buffer[] };

/** Before the first frame. */
export function noFrameBatches(): FrameBatches {
  return { kind: 'idle', pending: [], turnQueued: false };
}

export function frameBatchStep(
  state: FrameBatches,
  event: FrameBatchEvent,
): { readonly state: FrameBatches; readonly effects: readonly FrameBatchEffect[] } {
  if (state.kind === 'closed') return { state, effects: [] };
  switch (event.kind) {
    case 'frame': {
      state.pending.push(event.frame);
      // While an append is in flight, the frame waits for it; else for the end of this turn.
      if (state.kind === 'appending' || state.turnQueued) return { state, effects: [] };
      return { state: { kind: 'idle', pending: state.pending, turnQueued: true }, effects: [{ kind: 'await-turn' }] };
    }
    case 'turn-ended':
      if (state.kind === 'appending') return { state: { ...state, turnQueued: false }, effects: [] };
      return startBatch(state.pending, false);
    case 'appended':
      return startBatch(state.pending, state.turnQueued);
    case 'flush':
      if (state.kind === 'appending') return { state, effects: [] };
      return startBatch(state.pending, state.turnQueued);
    case 'close':
      return { state: { kind: 'closed', pending: state.pending }, effects: [] };
  }
}

/** No append in flight: the pending frames go now, if there are any. */
function startBatch(
  pending: Buffer[],
  turnQueued: boolean,
): { readonly state: FrameBatches; readonly effects: readonly FrameBatchEffect[] } {
  if (pending.length === 0) return { state: { kind: 'idle', pending, turnQueued }, effects: [] };
  return { state: { kind: 'appending', pending: [], turnQueued }, effects: [{ kind: 'append', frames: pending }] };
}
