import {
  type FrameBatchEffect,
  type FrameBatchEvent,
  frameBatchStep,
  type FrameBatches,
  noFrameBatches,
} from './frame-batches';

const f = (n: number): Buffer => Buffer.from(`frame ${n}\n`);
const frame = (n: number): FrameBatchEvent => ({ kind: 'frame', frame: f(n) });
const TURN: FrameBatchEvent = { kind: 'turn-ended' };
const APPENDED: FrameBatchEvent = { kind: 'appended' };
const FLUSH: FrameBatchEvent = { kind: 'flush' };
const CLOSE: FrameBatchEvent = { kind: 'close' };

/** The events in order from the start: each step's effects, as text, and the state after the last. */
function run(events: readonly FrameBatchEvent[]): { effects: string[]; state: string } {
  let state: FrameBatches = noFrameBatches();
  const effects: string[] = [];
  for (const event of events) {
    const next = frameBatchStep(state, event);
    state = next.state;
    effects.push(next.effects.map(shown).join(', '));
  }
  return { effects, state: `${state.kind} [${state.pending.map((b) => b.toString().trim()).join(', ')}]` };
}

function shown(effect: FrameBatchEffect): string {
  return effect.kind === 'append' ? `append ${effect.frames.map((b) => b.toString().trim()).join(' + ')}` : effect.kind;
}

describe('frameBatchStep', () => {
  it.each<[string, FrameBatchEvent[], string[], string]>([
    ['a frame waits for the end of its turn', [frame(1)], ['await-turn'], 'idle [frame 1]'],
    [
      "a turn's frames go in one append when it ends",
      [frame(1), frame(2), frame(3), TURN],
      ['await-turn', '', '', 'append frame 1 + frame 2 + frame 3'],
      'appending []',
    ],
    [
      'frames that come while an append is in flight go when it settles, not at their turn',
      [frame(1), TURN, frame(2), TURN, frame(3), APPENDED],
      ['await-turn', 'append frame 1', '', '', '', 'append frame 2 + frame 3'],
      'appending []',
    ],
    [
      'an append that settles with nothing pending leaves the batches idle',
      [frame(1), TURN, APPENDED, TURN],
      ['await-turn', 'append frame 1', '', ''],
      'idle []',
    ],
    [
      'the stream whole in the turn of its last frames: nothing appended, they are the completion’s',
      [frame(1), TURN, APPENDED, frame(2), frame(3), CLOSE, TURN],
      ['await-turn', 'append frame 1', '', 'await-turn', '', '', ''],
      'closed [frame 2, frame 3]',
    ],
    [
      'whole while an append is in flight: what came meanwhile waits for the completion, not for it',
      [frame(1), TURN, frame(2), CLOSE, APPENDED],
      ['await-turn', 'append frame 1', '', '', ''],
      'closed [frame 2]',
    ],
    [
      'broken: what is pending is appended at once, without waiting for the turn',
      [frame(1), FLUSH],
      ['await-turn', 'append frame 1'],
      'appending []',
    ],
    [
      'broken while an append is in flight: the rest goes when it settles, then the batches close',
      [frame(1), TURN, frame(2), FLUSH, APPENDED, APPENDED, CLOSE],
      ['await-turn', 'append frame 1', '', '', 'append frame 2', '', ''],
      'closed []',
    ],
    [
      'nothing stored any more (a refusal, the size cap): closed, and no event starts a batch',
      [frame(1), CLOSE, TURN, frame(2), FLUSH, APPENDED],
      ['await-turn', '', '', '', '', ''],
      'closed [frame 1]',
    ],
  ])('%s', (_, events, effects, state) => {
    expect(run(events)).toEqual({ effects, state });
  });
});
