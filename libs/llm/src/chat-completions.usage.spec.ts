import { usageOf } from './chat-completions.usage';

describe('usageOf', () => {
  it('reads the counts of a stream’s usage chunk', () => {
    const event =
      'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}\n\n';
    expect(usageOf(event)).toEqual({ prompt_tokens: 9, completion_tokens: 12 });
  });

  it('reads a whole answer, pretty-printed as OpenAI sends it', () => {
    const body = JSON.stringify(
      { id: 'chatcmpl-1', choices: [], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } },
      null,
      2,
    );
    expect(body).toContain('"usage": {');
    expect(usageOf(body)).toEqual({ prompt_tokens: 3, completion_tokens: 4 });
  });

  it('reads an event with CRLF lines and its data over two lines', () => {
    expect(usageOf('data: {"choices":[],\r\ndata: "usage":{"prompt_tokens":1,"completion_tokens":2}}\r\n\r\n')).toEqual(
      { prompt_tokens: 1, completion_tokens: 2 },
    );
  });

  it('reads a response’s input and output tokens, whole or on a stream’s terminal event', () => {
    const response = {
      id: 'resp_1',
      object: 'response',
      usage: { input_tokens: 5, output_tokens: 8, total_tokens: 13 },
    };
    expect(usageOf(JSON.stringify(response))).toEqual({ prompt_tokens: 5, completion_tokens: 8 });
    const completed = `event: response.completed\ndata: ${JSON.stringify({ type: 'response.completed', response })}\n\n`;
    expect(usageOf(completed)).toEqual({ prompt_tokens: 5, completion_tokens: 8 });
    const created = `event: response.created\ndata: ${JSON.stringify({ type: 'response.created', response: { ...response, usage: null } })}\n\n`;
    expect(usageOf(created)).toBeUndefined();
  });

  it.each([
    ['a chunk with "usage":null', 'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'],
    ['a chunk without usage', 'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'],
    ['the end of the stream', 'data: [DONE]\n\n'],
    [
      'usage only inside the content',
      'data: {"choices":[{"delta":{"content":"\\"usage\\":{\\"prompt_tokens\\":1}"}}]}\n\n',
    ],
    ['a nested usage', 'data: {"choices":[{"usage":{"prompt_tokens":1,"completion_tokens":2}}]}\n\n'],
    ['broken JSON', 'data: {"usage":{"prompt_tokens":1,\n\n'],
    ['negative counts', '{"usage":{"prompt_tokens":-1,"completion_tokens":2}}'],
    ['fractional counts', '{"usage":{"prompt_tokens":1.5,"completion_tokens":2}}'],
    ['counts as strings', '{"usage":{"prompt_tokens":"1","completion_tokens":"2"}}'],
    ['a comment', ': "usage":{\n\n'],
    ['JSON that is not an object', 'data: ["usage",{"prompt_tokens":1}]\n\n'],
  ])('has none in %s', (_, text) => {
    expect(usageOf(text)).toBeUndefined();
  });
});
