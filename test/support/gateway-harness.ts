import type { Redis } from 'ioredis';
import type { AddressInfo } from 'node:net';
import { type ApiHarness, startApi } from './api-harness';
import { FakeOpenAiServer, type ModelReply, type SeenRequest } from './fake-openai-server';
import { freshRedis } from './infra';

/** What the fake provider answers to one user text: a reply, or a function that makes it (and may wait). */
export type GatewayReply = ModelReply | ((request: SeenRequest) => ModelReply | Promise<ModelReply>);

export interface GatewayHarness {
  /** The fake provider behind the gateway: it sees the upstream calls. */
  readonly provider: FakeOpenAiServer;
  readonly api: ApiHarness;
  /** The api's base URL, listening on a free port of 127.0.0.1 (the SDK's baseURL is this plus `/v1`). */
  readonly apiUrl: string;
  /** This jest worker's Redis, flushed: the gateway's records. */
  readonly redis: Redis;
  /** The provider's answer per user text; any other text gets `Echo: <text>`. */
  readonly replies: Map<string, GatewayReply>;
  /** The calls that reached the provider for one user text. */
  upstreamCalls(text: string): SeenRequest[];
  close(): Promise<void>;
}

/**
 * The api with its real gateway in front of a local fake provider, the
 * OpenAI provider settings pointing at it (key `sk-upstream`), listening on
 * a port of its own; `env` adds to those (e.g. INTERNAL_API_KEY).
 */
export async function startGateway(env: Record<string, string> = {}): Promise<GatewayHarness> {
  const redis = await freshRedis();
  const replies = new Map<string, GatewayReply>();
  const provider = await new FakeOpenAiServer(async (_n, text, seen) => {
    const reply = replies.get(text);
    if (reply === undefined) return { kind: 'complete', content: `Echo: ${text}` };
    return typeof reply === 'function' ? reply(seen) : reply;
  }).start();
  const api = await startApi({
    env: { LLM_PROVIDER: 'openai', OPENAI_API_KEY: 'sk-upstream', OPENAI_BASE_URL: provider.baseUrl, ...env },
  });
  await api.app.listen(0, '127.0.0.1');
  return {
    provider,
    api,
    apiUrl: `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`,
    redis,
    replies,
    upstreamCalls: (text) => provider.requests.filter((r) => r.userText === text),
    close: async () => {
      await provider.stop();
      await api.close();
      redis.disconnect();
    },
  };
}
