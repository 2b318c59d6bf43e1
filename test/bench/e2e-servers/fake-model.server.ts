import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

/*
 * The model for the out-of-process benches: POST /v1/chat/completions
 * answered with one fixed chat.completion after MODEL_LATENCY_MS (0: at
 * once), or, for `stream: true`, with STREAM_CHUNKS chunks (default 16) a
 * chunk every STREAM_CHUNK_MS (default 2) and `data: [DONE]`, in a process
 * of its own so its CPU is not the worker's. Only what the openai SDK needs
 * to parse an answer; nothing is recorded,
 * so its memory does not grow with the jobs. Prints `fake model listening
 * on http://127.0.0.1:<port>/v1` on stderr when ready, and on GET /count the
 * number of requests it answered and the ms it held the non-stream ones in all
 * (its latency as served: the timer's own lateness on a busy machine included).
 *
 * Args: [port (0: any)] [latency ms].
 */
const port = Number(process.argv[2] ?? 0);
const latencyMs = Number(process.argv[3] ?? 0);
let answered = 0;
/** The ms non-stream answers were held, from the request's last byte to the answer's end(): latency as served. */
let heldMsTotal = 0;

const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/count') {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ answered, heldMsTotal }));
    return;
  }
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    if (req.method !== 'POST' || !req.url?.endsWith('/chat/completions')) {
      res.writeHead(404).end();
      return;
    }
    const { model, stream } = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
      model?: string;
      stream?: boolean;
    };
    if (stream === true) {
      answered++;
      void streamAnswer(res, model ?? 'bench', answered);
      return;
    }
    const received = performance.now();
    const answer = () => {
      answered++;
      heldMsTotal += performance.now() - received;
      if (res.destroyed) return;
      res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          id: `chatcmpl-${answered}`,
          object: 'chat.completion',
          created: Math.floor(Date.now() / 1000),
          model: model ?? 'bench',
          choices: [
            {
              index: 0,
              finish_reason: 'stop',
              logprobs: null,
              message: { role: 'assistant', content: 'A summary.', refusal: null },
            },
          ],
          usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 },
        }),
      );
    };
    if (latencyMs > 0) setTimeout(answer, latencyMs);
    else answer();
  });
});
const streamChunks = Number(process.env.STREAM_CHUNKS ?? 16);
const chunkMs = Number(process.env.STREAM_CHUNK_MS ?? 2);

async function streamAnswer(res: import('node:http').ServerResponse, model: string, n: number): Promise<void> {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
  const base = { id: `chatcmpl-${n}`, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model };
  for (let i = 0; i < streamChunks && !res.destroyed; i++) {
    if (i > 0 && chunkMs > 0) await new Promise((r) => setTimeout(r, chunkMs));
    const delta = i === 0 ? { role: 'assistant', content: '' } : { content: ` word${i}` };
    res.write(`data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`);
  }
  res.end(
    `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\ndata: [DONE]\n\n`,
  );
}

server.keepAliveTimeout = 65_000;
server.listen(port, '127.0.0.1', () => {
  const { port: bound } = server.address() as AddressInfo;
  console.error(`fake model listening on http://127.0.0.1:${bound}/v1 (latency ${latencyMs} ms)`);
});
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
