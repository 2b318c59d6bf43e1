import { createOpenAI } from '@ai-sdk/openai';
import { ChatOpenAI } from '@langchain/openai';
import { Agent, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } from '@openai/agents';
import { generateText, stepCountIs, streamText, tool } from 'ai';
import OpenAI from 'openai';
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { responseBody, responseEvents } from '@app/llm';
import { TENANT_A } from '../support/api-harness';
import { completionEvents, type ModelReply, type SeenRequest } from '../support/fake-openai-server';
import { type GatewayHarness, startGateway } from '../support/gateway-harness';

/** The Responses API input items of a request (its `input` when that is an array). */
const inputItems = (request: SeenRequest): { type?: string; call_id?: string; output?: unknown }[] =>
  Array.isArray(request.body.input) ? (request.body.input as { type?: string }[]) : [];

/** A whole response whose one output item asks for a function call, as OpenAI sends it. */
function functionCallReply(name: string, args: object, callId: string): ModelReply {
  const response = JSON.parse(responseBody({ pieces: [], inputTokens: 9, model: 'gpt-test' })) as Record<
    string,
    unknown
  >;
  response.output = [
    {
      type: 'function_call',
      id: `fc_${randomUUID().replaceAll('-', '')}`,
      call_id: callId,
      name,
      arguments: JSON.stringify(args),
      status: 'completed',
    },
  ];
  return {
    kind: 'raw',
    status: 200,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(response),
  };
}

/**
 * The clients people hold, pointed at the gateway as their own docs say a
 * custom base URL works, against a local fake provider that speaks chat
 * completions and responses: the Vercel AI SDK (`openai()` on the Responses
 * API, `openai.chat()`), LangChain's ChatOpenAI (both APIs) and the OpenAI
 * Agents SDK (both APIs). For each: the answer, a retry with the same key (or
 * a re-run under the same Idempotency-Scope) making no second upstream call,
 * and a stream and its replay, from one upstream call.
 */
describe('the gateway with the clients people hold', () => {
  let gateway: GatewayHarness;
  const upstream = (text: string) => gateway.provider.requests.filter((r) => r.userText === text);
  const baseURL = () => `${gateway.apiUrl}/v1`;

  beforeAll(async () => {
    gateway = await startGateway();
  });
  afterAll(() => gateway.close());

  describe('the Vercel AI SDK (ai, @ai-sdk/openai)', () => {
    const provider = (headers: Record<string, string> = {}) =>
      createOpenAI({ baseURL: baseURL(), apiKey: TENANT_A.key, headers });

    it('openai(): generateText on the Responses API, retried with the key: one upstream call, the same text', async () => {
      const headers = { 'Idempotency-Key': `ai-${randomUUID()}` };
      const ask = () =>
        generateText({ model: provider()('gpt-test'), prompt: 'ai sdk responses', headers, maxRetries: 0 });
      const first = await ask();
      const again = await ask();
      expect(first.text).toBe('Echo: ai sdk responses');
      expect(again.text).toBe(first.text);
      expect(again.response.headers?.['idempotent-replayed']).toBe('true');
      expect(upstream('ai sdk responses').map((r) => r.api)).toEqual(['responses']);
    });

    it('openai.chat(): generateText on chat completions, retried with the key: one upstream call', async () => {
      const headers = { 'Idempotency-Key': `ai-${randomUUID()}` };
      const ask = () =>
        generateText({ model: provider().chat('gpt-test'), prompt: 'ai sdk chat', headers, maxRetries: 0 });
      expect((await ask()).text).toBe('Echo: ai sdk chat');
      expect((await ask()).text).toBe('Echo: ai sdk chat');
      expect(upstream('ai sdk chat').map((r) => r.api)).toEqual(['chat/completions']);
    });

    it('streamText on the Responses API: the stream, then its replay, from one upstream call', async () => {
      gateway.replies.set('ai sdk stream', {
        kind: 'stream',
        events: responseEvents({
          pieces: ['Streamed', ' through', ' the', ' gateway.'],
          inputTokens: 3,
          model: 'gpt-test',
        }),
      });
      const headers = { 'Idempotency-Key': `ai-${randomUUID()}` };
      const streamed = async () => {
        const result = streamText({ model: provider()('gpt-test'), prompt: 'ai sdk stream', headers, maxRetries: 0 });
        let text = '';
        for await (const part of result.textStream) text += part;
        return text;
      };
      expect(await streamed()).toBe('Streamed through the gateway.');
      expect(await streamed()).toBe('Streamed through the gateway.');
      expect(upstream('ai sdk stream')).toHaveLength(1);
    });

    it('openai.chat(): streamText on chat completions, then its replay, from one upstream call', async () => {
      const text = 'ai sdk chat stream';
      gateway.replies.set(text, { kind: 'stream', events: completionEvents('Streamed over chat completions.') });
      const headers = { 'Idempotency-Key': `ai-${randomUUID()}` };
      const streamed = async () => {
        const result = streamText({ model: provider().chat('gpt-test'), prompt: text, headers, maxRetries: 0 });
        let out = '';
        for await (const part of result.textStream) out += part;
        return { text: out, replayed: (await result.response).headers?.['idempotent-replayed'] };
      };
      expect(await streamed()).toEqual({ text: 'Streamed over chat completions.', replayed: undefined });
      expect(await streamed()).toEqual({ text: 'Streamed over chat completions.', replayed: 'true' });
      expect(upstream(text).map((r) => r.api)).toEqual(['chat/completions']);
    });

    it('a tool loop under one Idempotency-Scope, run twice: the second run makes no upstream call', async () => {
      const text = 'where is order 4711';
      gateway.replies.set(text, (request) => {
        const output = inputItems(request).find((item) => item.type === 'function_call_output');
        if (output === undefined) return functionCallReply('lookup_order', { order: '4711' }, 'call_4711');
        return { kind: 'complete', content: `Order 4711: ${String(output.output)}` };
      });
      const scope = `agent-run-${randomUUID()}`;
      const lookups: string[] = [];
      const runAgent = () =>
        generateText({
          model: provider({ 'Idempotency-Scope': scope })('gpt-test'),
          prompt: text,
          maxRetries: 0,
          stopWhen: stepCountIs(3),
          tools: {
            lookup_order: tool({
              description: 'Looks an order up',
              inputSchema: z.object({ order: z.string() }),
              execute: ({ order }) => {
                lookups.push(order);
                return Promise.resolve('shipped');
              },
            }),
          },
        });
      const first = await runAgent();
      expect(first.steps).toHaveLength(2);
      expect(first.text).toMatch(/^Order 4711: .*shipped/);
      expect(upstream(text)).toHaveLength(2);
      const second = await runAgent();
      expect(second.text).toBe(first.text);
      // Both steps answered from the gateway's records; the tool is the client's and runs again.
      expect(upstream(text)).toHaveLength(2);
      expect(lookups).toEqual(['4711', '4711']);
    });
  });

  describe('LangChain (ChatOpenAI)', () => {
    const chat = (useResponsesApi: boolean) =>
      new ChatOpenAI({
        model: 'gpt-test',
        apiKey: TENANT_A.key,
        maxRetries: 0,
        useResponsesApi,
        configuration: { baseURL: baseURL() },
      });

    it.each([
      ['chat completions', false, 'chat/completions'],
      ['the Responses API', true, 'responses'],
    ])('invoke on %s with the key per call: one upstream call for two', async (_, useResponsesApi, api) => {
      const text = `langchain ${api}`;
      const options = { options: { headers: { 'Idempotency-Key': `lc-${randomUUID()}` } } };
      const first = await chat(useResponsesApi).invoke(text, options);
      const again = await chat(useResponsesApi).invoke(text, options);
      expect(first.text).toBe(`Echo: ${text}`);
      expect(again.text).toBe(first.text);
      expect(upstream(text).map((r) => r.api)).toEqual([api]);
    });

    // LangChain's stream() does not pass a call's `options.headers` on, on either API (its invoke() does): a
    // stream's key goes in the client's defaultHeaders, one client per key (docs/clients.md).
    const keyedClient = (useResponsesApi: boolean) =>
      new ChatOpenAI({
        model: 'gpt-test',
        apiKey: TENANT_A.key,
        maxRetries: 0,
        useResponsesApi,
        configuration: { baseURL: baseURL(), defaultHeaders: { 'Idempotency-Key': `lc-${randomUUID()}` } },
      });

    it('stream on chat completions, the key in the client’s default headers, and its replay', async () => {
      const text = 'langchain chat stream';
      gateway.replies.set(text, { kind: 'stream', events: completionEvents('Chunks for LangChain over chat.') });
      const keyed = keyedClient(false);
      const streamed = async () => {
        let out = '';
        for await (const chunk of await keyed.stream(text)) out += chunk.text;
        return out;
      };
      expect(await streamed()).toBe('Chunks for LangChain over chat.');
      expect(await streamed()).toBe('Chunks for LangChain over chat.');
      expect(upstream(text).map((r) => r.api)).toEqual(['chat/completions']);
    });

    it('stream on the Responses API, the key in the client’s default headers, and its replay', async () => {
      const text = 'langchain stream';
      gateway.replies.set(text, {
        kind: 'stream',
        events: responseEvents({ pieces: ['Chunks', ' for', ' LangChain.'], inputTokens: 3, model: 'gpt-test' }),
      });
      const keyed = keyedClient(true);
      const streamed = async () => {
        let out = '';
        for await (const chunk of await keyed.stream(text)) out += chunk.text;
        return out;
      };
      expect(await streamed()).toBe('Chunks for LangChain.');
      expect(await streamed()).toBe('Chunks for LangChain.');
      expect(upstream(text)).toHaveLength(1);
    });
  });

  describe('the OpenAI Agents SDK (@openai/agents)', () => {
    beforeAll(() => setTracingDisabled(true));
    afterEach(() => setOpenAIAPI('responses'));
    /** An agent on `mode`, its calls through a client of its own whose every request carries one run's scope. */
    const agentOnRun = (mode: 'responses' | 'chat_completions') => {
      setOpenAIAPI(mode);
      setDefaultOpenAIClient(
        new OpenAI({
          apiKey: TENANT_A.key,
          baseURL: baseURL(),
          maxRetries: 0,
          defaultHeaders: { 'Idempotency-Scope': `agents-${randomUUID()}` },
        }),
      );
      return new Agent({ name: 'support', instructions: 'Answer briefly.', model: 'gpt-test' });
    };

    it.each([
      ['responses', 'responses'],
      ['chat_completions', 'chat/completions'],
    ] as const)('run() on %s under one Idempotency-Scope, twice: one upstream call', async (mode, api) => {
      const text = `agents sdk ${mode}`;
      const agent = agentOnRun(mode);
      const first = await run(agent, text);
      const again = await run(agent, text);
      expect(first.finalOutput).toBe(`Echo: ${text}`);
      expect(again.finalOutput).toBe(first.finalOutput);
      expect(upstream(text).map((r) => r.api)).toEqual([api]);
    });

    it.each([
      ['responses', 'responses'],
      ['chat_completions', 'chat/completions'],
    ] as const)('a streamed run() on %s under one Idempotency-Scope, twice: one upstream call', async (mode, api) => {
      const text = `agents sdk stream ${mode}`;
      const answer = ['Streamed', ' for', ' the', ' agent.'];
      gateway.replies.set(text, {
        kind: 'stream',
        events:
          mode === 'responses'
            ? responseEvents({ pieces: answer, inputTokens: 3, model: 'gpt-test' })
            : completionEvents(answer.join(''), { usage: true }),
      });
      const agent = agentOnRun(mode);
      const streamed = async () => {
        const result = await run(agent, text, { stream: true });
        let out = '';
        for await (const delta of result.toTextStream()) out += delta;
        await result.completed;
        return { text: out, finalOutput: result.finalOutput };
      };
      const whole = { text: answer.join(''), finalOutput: answer.join('') };
      expect(await streamed()).toEqual(whole);
      expect(await streamed()).toEqual(whole);
      expect(upstream(text).map((r) => r.api)).toEqual([api]);
    });
  });
});
