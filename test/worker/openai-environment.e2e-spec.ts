import { OpenAiLlmClient } from '@app/llm';
import { FakeOpenAiServer } from '../support/fake-openai-server';

/**
 * The openai SDK reads OPENAI_* variables from process.env by itself; the
 * worker's client is not the SDK, and its validated config is its only
 * source: with the SDK's variables set around it, the client neither prints
 * the user's text nor sends anything they ask for.
 */
describe('the openai client and the environment', () => {
  const SDK_ENV: Record<string, string> = {
    OPENAI_LOG: 'debug',
    OPENAI_ORG_ID: 'org-from-env',
    OPENAI_PROJECT_ID: 'proj-from-env',
    OPENAI_CUSTOM_HEADERS: 'X-From-Env: leaked',
  };
  let server: FakeOpenAiServer;
  const saved: Record<string, string | undefined> = {};

  beforeAll(async () => {
    server = await new FakeOpenAiServer(() => ({ kind: 'complete', content: 'A summary.' })).start();
    for (const [k, v] of Object.entries(SDK_ENV)) {
      saved[k] = process.env[k];
      process.env[k] = v;
    }
  });
  afterAll(async () => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    await server.stop();
  });

  it('with OPENAI_LOG=debug prints nothing of the request, and sends no organization, project or custom header', async () => {
    const printed: string[] = [];
    const capture = (...args: unknown[]) => {
      printed.push(args.map((a) => (typeof a === 'string' ? a : JSON.stringify(a))).join(' '));
    };
    const spies = [
      ...(['log', 'debug', 'info', 'warn', 'error'] as const).map((m) =>
        jest.spyOn(console, m).mockImplementation(capture),
      ),
      jest
        .spyOn(process.stdout, 'write')
        .mockImplementation((chunk: string | Uint8Array) => (capture(String(chunk)), true)),
      jest
        .spyOn(process.stderr, 'write')
        .mockImplementation((chunk: string | Uint8Array) => (capture(String(chunk)), true)),
    ];
    const text = `A private text ${Date.now()} that must not reach a log.`;
    try {
      const llm = new OpenAiLlmClient({
        apiKey: 'test',
        baseUrl: server.baseUrl,
        model: 'gpt-4.1-mini',
        requestTimeoutMs: 5000,
      });
      await expect(llm.summarize(text, { signal: new AbortController().signal })).resolves.toBe('A summary.');
    } finally {
      for (const spy of spies) spy.mockRestore();
    }
    expect(server.requests.map((r) => r.userText)).toEqual([text]);
    expect(printed.filter((line) => line.includes('private text'))).toEqual([]);
    expect(printed.filter((line) => /sending request|response start|response parsed/.test(line))).toEqual([]);
    const headers = server.requests[0].headers;
    expect(headers['openai-organization']).toBeUndefined();
    expect(headers['openai-project']).toBeUndefined();
    expect(headers['x-from-env']).toBeUndefined();
  });
});
