import { Test } from '@nestjs/testing';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { ChatCompletionsUpstream } from './chat-completions.upstream';
import { ChatCompletionsUpstreamModule } from './chat-completions-upstream.module';
import type { ChatCompletionsUpstreamModuleOptions } from './chat-completions-upstream.module-definition';
import { FakeChatCompletionsUpstream } from './fake-chat-completions.upstream';
import { HttpChatCompletionsUpstream } from './http-chat-completions.upstream';

const appWith = (options: ChatCompletionsUpstreamModuleOptions) =>
  Test.createTestingModule({ imports: [ChatCompletionsUpstreamModule.forRoot(options)] }).compile();

describe('ChatCompletionsUpstreamModule', () => {
  it('provides the built-in model for the fake provider', async () => {
    const app = await appWith({ provider: 'fake' });
    expect(app.get(ChatCompletionsUpstream)).toBeInstanceOf(FakeChatCompletionsUpstream);
    await app.close();
  });

  it('refuses the openai provider without an API key', async () => {
    await expect(appWith({ provider: 'openai' })).rejects.toThrow('the openai provider needs an API key');
  });

  it('provides the HTTP upstream for openai, and closes its connections at shutdown', async () => {
    const connections: Socket[] = [];
    const provider = createServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
    }).on('connection', (socket: Socket) => connections.push(socket));
    provider.listen(0, '127.0.0.1');
    await once(provider, 'listening');
    const { port } = provider.address() as AddressInfo;

    const app = await appWith({ provider: 'openai', apiKey: 'sk-test', baseUrl: `http://127.0.0.1:${port}/v1` });
    const upstream = app.get<ChatCompletionsUpstream>(ChatCompletionsUpstream);
    expect(upstream).toBeInstanceOf(HttpChatCompletionsUpstream);
    const answer = await upstream.send({ body: Buffer.from('{}'), json: {}, signal: AbortSignal.timeout(5000) });
    for await (const _ of answer.body);
    expect(connections).toHaveLength(1);
    expect(connections[0].destroyed).toBe(false);

    await app.close();
    // Left open, this waits until the test times out.
    if (!connections[0].destroyed) await once(connections[0], 'close');
    await new Promise((resolve) => provider.close(resolve));
  });
});
