import { responsesEventOf } from './responses-events';

const sse = (data: unknown, name?: string): string =>
  `${name === undefined ? '' : `event: ${name}\n`}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`;

describe('responsesEventOf', () => {
  it.each([
    ['a text delta', sse({ type: 'response.output_text.delta', delta: 'Hi', sequence_number: 4 }), 'more', 4],
    ['response.created', sse({ type: 'response.created', sequence_number: 0 }, 'response.created'), 'more', 0],
    ['response.completed', sse({ type: 'response.completed', sequence_number: 9 }), 'terminal', 9],
    ['response.incomplete', sse({ type: 'response.incomplete', sequence_number: 9 }), 'terminal', 9],
    ['response.failed', sse({ type: 'response.failed', sequence_number: 3 }), 'failed', 3],
    ['an error event', sse({ type: 'error', code: 'server_error', message: 'x', sequence_number: 2 }), 'failed', 2],
    [
      'the type from the event: field when data has none',
      sse({ response: {} }, 'response.completed'),
      'terminal',
      undefined,
    ],
    [
      'a delta whose text names a terminal type',
      sse({ type: 'response.output_text.delta', delta: '"type":"response.completed"' }),
      'more',
      undefined,
    ],
  ])('%s', (_, event, kind, sequenceNumber) => {
    const read = responsesEventOf(event);
    expect(read.kind).toBe(kind);
    expect(read.sequenceNumber).toBe(sequenceNumber);
  });

  it.each([
    ['a comment', ': keep-alive\n\n'],
    ['a lone blank line', '\n'],
  ])('%s is more of the stream', (_, event) => {
    expect(responsesEventOf(event)).toEqual({ kind: 'more' });
  });

  it.each([
    ['data that is not JSON', sse('{"type":"response.completed"')],
    ['data that is not an object', sse('[1,2]')],
    ['data: [DONE], which this API never sends', sse('[DONE]')],
    ['an object without a type', sse({ sequence_number: 1 })],
  ])('%s is malformed', (_, event) => {
    expect(responsesEventOf(event).kind).toBe('malformed');
  });
});
