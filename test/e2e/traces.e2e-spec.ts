import { OUTBOX_CHANNEL } from '@app/persistence';
import { randomBytes, randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { type AppProcess, type BuiltApp, startAppProcess } from '../support/app-process';
import { FakeOpenAiServer } from '../support/fake-openai-server';
import {
  eventually,
  freePort,
  freshRedis,
  testDatabaseUrl,
  testDataSource,
  testRedisUrl,
  truncateAll,
} from '../support/infra';
import { OtlpReceiver, type ReceivedSpan } from '../support/otlp-receiver';
import { RecordingServer, type SeenRequest } from '../support/recording-server';

/*
 * Traces (INTERFACE.md): the built apps, as an operator runs them, export to
 * an OTLP receiver of the test's own. One POST /v1/summaries is one trace,
 * from the api's server span through the stream entry, the worker's delivery,
 * its step and model call, and the outbox row, to the relay's webhook request,
 * which carries that trace's traceparent. Unset, the SDK is not loaded.
 */

const TENANT = { tenant: 'acme', key: 'acme-traces-key-0123456789' };
const SPAN_KIND = { server: 2, client: 3, consumer: 5 } as const;

/** `00-<trace id>-<parent span id>-<flags>`, W3C's traceparent, as its parts. */
/** POSTs `body` as the test tenant, with a fresh Idempotency-Key. */
function postAsTenant(url: string, body: object): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${TENANT.key}`,
      'idempotency-key': `traces-${randomUUID()}`,
      'content-type': 'application/json',
    },
    body: JSON.stringify(body),
  });
}

function traceparentOf(header: string | string[] | undefined): { traceId: string; spanId: string } {
  const m = /^00-([0-9a-f]{32})-([0-9a-f]{16})-0[01]$/.exec(typeof header === 'string' ? header : '');
  if (!m) throw new Error(`not a traceparent: ${String(header)}`);
  return { traceId: m[1], spanId: m[2] };
}

/** The span's ancestors in `spans`, nearest first; stops where a parent is not (yet) among them. */
function ancestors(span: ReceivedSpan, spans: readonly ReceivedSpan[]): ReceivedSpan[] {
  const byId = new Map(spans.map((s) => [s.spanId, s]));
  const chain: ReceivedSpan[] = [];
  for (let p = span.parentSpanId && byId.get(span.parentSpanId); p; p = p.parentSpanId && byId.get(p.parentSpanId))
    chain.push(p);
  return chain;
}

/** Each app's loaded @opentelemetry packages, written to stderr as it exits (Module._cache is every require's). */
const REPORT_LOADED = `data:text/javascript,${encodeURIComponent(
  "import M from 'node:module'; process.on('exit', () => process.stderr.write('LOADED ' + " +
    "JSON.stringify([...new Set(Object.keys(M._cache).map((k) => /node_modules\\/(@opentelemetry\\/[^/]+)/.exec(k)?.[1]).filter(Boolean))]) + '\\n'));",
)}`;

const loadedOtelPackages = (proc: AppProcess): string[] => {
  const line = /^LOADED (.*)$/m.exec(proc.stderr());
  if (!line) throw new Error(`no LOADED line: ${proc.stderr()}`);
  return (JSON.parse(line[1]) as string[]).sort();
};

describe('traces', () => {
  let receiver: OtlpReceiver;
  let db: DataSource;
  const procs: AppProcess[] = [];

  const start = async (app: BuiltApp, port: number, env: Record<string, string>) => {
    const proc = await startAppProcess(
      app,
      freePort(port),
      { REDIS_URL: testRedisUrl(), DATABASE_URL: testDatabaseUrl(), LOG_LEVEL: 'info', ...env },
      ['--import', REPORT_LOADED],
    );
    procs.push(proc);
    return proc;
  };
  const stop = async (proc: AppProcess) => {
    proc.kill('SIGTERM');
    expect((await proc.exited).code).toBe(0);
  };

  beforeAll(async () => {
    receiver = await new OtlpReceiver().start();
    db = await testDataSource();
  });
  beforeEach(async () => {
    await truncateAll(db);
    (await freshRedis()).disconnect();
  });
  afterEach(async () => {
    for (const proc of procs.splice(0)) proc.kill('SIGKILL');
  });
  afterAll(async () => {
    await receiver?.stop();
    await db?.destroy();
  });

  /** A webhook that answers 200 and hands over the first request it gets. */
  const webhook = async () => {
    let first!: (seen: SeenRequest) => void;
    const received = new Promise<SeenRequest>((resolve) => (first = resolve));
    const server = await new RecordingServer((res, seen) => {
      res.writeHead(200).end();
      first(seen);
    }).start();
    return { server, received };
  };

  it.each(['the provider', "the api's gateway"])(
    'one request is one trace: POST, stream entry, delivery, step, model call (to %s), outbox, webhook',
    async (through) => {
      const gateway = through !== 'the provider';
      const model = await new FakeOpenAiServer(() => ({ kind: 'complete', content: 'Traced.' })).start();
      const hook = await webhook();
      try {
        const otel = {
          OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
          OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
          OTEL_BSP_SCHEDULE_DELAY: '50',
        };
        const provider = { LLM_PROVIDER: 'openai', OPENAI_API_KEY: 'test-key', OPENAI_BASE_URL: model.baseUrl };
        // Through the gateway, the worker calls the api (with the internal key), which calls the provider.
        const internal = { INTERNAL_API_KEY: 'internal-traces-key-0123456789' };
        const [api, worker, relay] = await Promise.all([
          start('api', 86, {
            ...otel,
            API_KEYS: `${TENANT.tenant}:${TENANT.key}`,
            ...(gateway ? { ...provider, ...internal } : {}),
          }),
          start('worker', 87, {
            ...otel,
            ...(gateway ? { ...internal, LLM_GATEWAY_URL: `http://127.0.0.1:${freePort(86)}` } : provider),
          }),
          start('relay', 88, { ...otel, NOTIFY_WEBHOOK_URL: hook.server.url('/notify?token=webhook-secret-0123') }),
        ]);

        const res = await postAsTenant(`${api.url}/v1/summaries`, {
          text: 'Follow me from the POST to the webhook.',
          notify: 'reader@example.com',
        });
        expect(res.status).toBe(202);
        const { job_id: jobId } = (await res.json()) as { job_id: string };

        // The webhook's request names the trace, and the relay's span that sent it.
        const delivered = traceparentOf((await hook.received).headers.traceparent);
        const { traceId } = delivered;

        // The model call carried the same trace, from the span that made it (the worker's, or the gateway's).
        expect(model.calls).toBe(1);
        const modelCall = traceparentOf(model.requests[0].headers.traceparent);
        expect(modelCall.traceId).toBe(traceId);

        // The spans arrive on the exporters' timers: wait until both ends and the hops between are in.
        const spans = await eventually(
          () => {
            const t = receiver.trace(traceId);
            const has = (id: string) => t.some((s) => s.spanId === id);
            const root = t.find((s) => s.service === 'api' && s.parentSpanId === undefined);
            const relayed = t.find((s) => s.spanId === delivered.spanId);
            return root && relayed && has(modelCall.spanId) && ancestors(relayed, t).includes(root) ? t : undefined;
          },
          20_000,
          `the spans of trace ${traceId}`,
        );

        // One trace across the three apps, rooted at the api's server span of the POST.
        expect(new Set(spans.map((s) => s.service))).toEqual(new Set(['api', 'worker', 'relay']));
        const roots = spans.filter((s) => s.parentSpanId === undefined);
        expect(roots).toEqual([
          expect.objectContaining({ service: 'api', kind: SPAN_KIND.server, name: 'POST /v1/summaries' }),
        ]);
        const root = roots[0];
        const named = (service: string, name: string) => {
          const found = spans.filter((s) => s.service === service && s.name === name);
          expect({ service, name, count: found.length }).toEqual({ service, name, count: 1 });
          return found[0];
        };

        // The worker's delivery continues the POST's trace through the stream entry.
        const delivery = named('worker', 'process {summaries}:jobs');
        expect(delivery).toMatchObject({ kind: SPAN_KIND.consumer, attributes: { job_id: jobId, outcome: 'done' } });
        expect(ancestors(delivery, spans)).toContain(root);
        expect(ancestors(delivery, spans).every((s) => s.service === 'api')).toBe(true);

        // The step is the delivery's child, and the model call the step's.
        const step = named('worker', 'step summaries.summarize');
        expect(step.parentSpanId).toBe(delivery.spanId);
        const call = spans.find((s) => s.spanId === modelCall.spanId)!;
        expect(call).toMatchObject({ service: gateway ? 'api' : 'worker', kind: SPAN_KIND.client });
        expect(ancestors(call, spans)).toContain(step);
        if (gateway) {
          // The gateway's server span is the worker's call's child, and the provider's call its descendant.
          const served = named('api', 'POST /v1/chat/completions');
          expect(served.kind).toBe(SPAN_KIND.server);
          expect(ancestors(call, spans)).toContain(served);
          expect(spans.find((s) => s.spanId === served.parentSpanId)).toMatchObject({
            service: 'worker',
            kind: SPAN_KIND.client,
          });
          // Between them the route's handler span: the fast path names it with the route (Express's
          // instrumentation names its own plain `request handler`), so this fails if tracing turned the fast path off.
          const handler = named('api', 'request handler - /v1/chat/completions');
          expect(handler.parentSpanId).toBe(served.spanId);
          expect(ancestors(call, spans)).toContain(handler);
        }

        // The relay's send continues the step's trace through the outbox row; the webhook's request is its child.
        const send = named('relay', 'deliver outbox');
        expect(send.parentSpanId).toBe(step.spanId);
        const webhookCall = spans.find((s) => s.spanId === delivered.spanId)!;
        expect(webhookCall).toMatchObject({ service: 'relay', kind: SPAN_KIND.client });
        expect(webhookCall.parentSpanId).toBe(send.spanId);

        // The webhook's URL is exported as the logs write it: its query's values redacted.
        expect(webhookCall.attributes).toMatchObject({
          'url.full': expect.stringMatching(/^http:\/\/127\.0\.0\.1:\d+\/notify\?token=\[redacted\]$/),
        });
        // No span holds what the request carried or what a script was given: the text, the address, the secret.
        const exported = JSON.stringify(receiver.trace(traceId));
        for (const secret of ['Follow me from the POST', 'reader@example.com', 'webhook-secret-0123', TENANT.key])
          expect(exported).not.toContain(secret);

        // Redis and PostgreSQL commands inside the request show, under it.
        expect(spans.some((s) => s.service === 'api' && /^eval/.test(s.name))).toBe(true);
        expect(spans.some((s) => s.service === 'worker' && s.name.startsWith('pg.query'))).toBe(true);

        // Log lines carry the trace and span they were written in.
        const finished = await eventually(
          () => worker.lines.find((l) => l.msg === 'job finished' && l.job_id === jobId),
          5000,
          "the worker's line for the job",
        );
        expect(finished).toMatchObject({ trace_id: traceId, span_id: delivery.spanId });
        const answered = await eventually(
          () => api.lines.find((l) => (l.req as { url?: string } | undefined)?.url === '/v1/summaries' && 'res' in l),
          5000,
          "the api's line for the POST",
        );
        expect(answered.trace_id).toBe(traceId);

        // Traced, each app loaded the SDK.
        await Promise.all([api, worker, relay].map(stop));
        for (const proc of [api, worker, relay]) expect(loadedOtelPackages(proc)).toContain('@opentelemetry/sdk-trace');
      } finally {
        await hook.server.stop();
        await model.stop();
      }
    },
  );

  it('a workflow of three steps is one trace: each delivery continues the one before, the send the last step', async () => {
    const model = await new FakeOpenAiServer((_n, text) => ({
      kind: 'complete',
      content: text.startsWith('Category:') ? 'We are refunding the second charge.' : 'billing',
    })).start();
    const hook = await webhook();
    try {
      const otel = {
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        OTEL_BSP_SCHEDULE_DELAY: '50',
      };
      const [api] = await Promise.all([
        start('api', 86, { ...otel, API_KEYS: `${TENANT.tenant}:${TENANT.key}` }),
        start('worker', 87, {
          ...otel,
          LLM_PROVIDER: 'openai',
          OPENAI_API_KEY: 'test-key',
          OPENAI_BASE_URL: model.baseUrl,
        }),
        start('relay', 88, { ...otel, NOTIFY_WEBHOOK_URL: hook.server.url('/notify') }),
      ]);

      const res = await postAsTenant(`${api.url}/v1/triage`, {
        ticket_id: 'T-1',
        text: 'Charged twice in March.',
        notify: 'agent@example.com',
      });
      expect(res.status).toBe(202);
      const { run_id: runId } = (await res.json()) as { run_id: string };

      // The last step's email, sent by the relay, names the trace.
      const sent = await hook.received;
      expect(JSON.parse(sent.body.toString('utf8'))).toMatchObject({ topic: 'email.triage_ready' });
      const delivered = traceparentOf(sent.headers.traceparent);
      const { traceId } = delivered;
      // classify and draft called the model, each within the trace.
      expect(model.requests.map((r) => traceparentOf(r.headers.traceparent).traceId)).toEqual([traceId, traceId]);

      const DELIVERY = 'process {workflows}:jobs';
      const spans = await eventually(
        () => {
          const t = receiver.trace(traceId);
          const root = t.find((s) => s.service === 'api' && s.parentSpanId === undefined);
          const relayed = t.find((s) => s.spanId === delivered.spanId);
          const deliveries = t.filter((s) => s.name === DELIVERY).length;
          const stepSpans = t.filter((s) => s.name.startsWith('step triage.')).length;
          const calls = model.requests.every((r) =>
            t.some((s) => s.spanId === traceparentOf(r.headers.traceparent).spanId),
          );
          const chained = root && relayed && ancestors(relayed, t).includes(root);
          return chained && deliveries === 3 && stepSpans === 3 && calls ? t : undefined;
        },
        20_000,
        `the spans of trace ${traceId}`,
      );

      const roots = spans.filter((s) => s.parentSpanId === undefined);
      expect(roots).toEqual([
        expect.objectContaining({ service: 'api', kind: SPAN_KIND.server, name: 'POST /v1/triage' }),
      ]);
      const root = roots[0];
      const named = (service: string, name: string) => {
        const found = spans.filter((s) => s.service === service && s.name === name);
        expect({ service, name, count: found.length }).toEqual({ service, name, count: 1 });
        return found[0];
      };
      const steps = ['classify', 'draft', 'notify'].map((step) => named('worker', `step triage.${step}`));
      // Each step's delivery is its step span's parent: one delivery per step, each done.
      const deliveries = steps.map((step) => spans.find((s) => s.spanId === step.parentSpanId)!);
      for (const [i, delivery] of deliveries.entries()) {
        expect(delivery).toMatchObject({
          service: 'worker',
          name: DELIVERY,
          kind: SPAN_KIND.consumer,
          attributes: { job_id: runId, workflow: 'triage', outcome: 'done' },
        });
        expect(delivery.attributes.step).toBe(i === 0 ? undefined : ['classify', 'draft', 'notify'][i]);
      }
      // The first delivery continues the POST; each next one the delivery before it, through the entry it added.
      expect(ancestors(deliveries[0], spans)).toContain(root);
      expect(ancestors(deliveries[0], spans).every((s) => s.service === 'api')).toBe(true);
      expect(deliveries[1].parentSpanId).toBe(deliveries[0].spanId);
      expect(deliveries[2].parentSpanId).toBe(deliveries[1].spanId);
      // Each model call under its step.
      for (const [i, request] of model.requests.entries()) {
        const call = spans.find((s) => s.spanId === traceparentOf(request.headers.traceparent).spanId)!;
        expect(ancestors(call, spans)).toContain(steps[i]);
      }

      // The relay's send continues the step that asked for the email; the webhook's request is its child.
      const send = named('relay', 'deliver outbox');
      expect(send).toMatchObject({ attributes: { 'outbox.topic': 'email.triage_ready', outcome: 'sent' } });
      expect(send.parentSpanId).toBe(steps[2].spanId);
      expect(spans.find((s) => s.spanId === delivered.spanId)?.parentSpanId).toBe(send.spanId);
    } finally {
      await hook.server.stop();
      await model.stop();
    }
  });

  /** An outbox row as a step writes it, with `traceparent`, waking the relay. */
  const insertRow = async (key: string, traceparent: string | null) => {
    await db.query(
      `WITH row AS (
         INSERT INTO outbox (topic, dedupe_key, payload, traceparent)
         VALUES ('email.summary_ready', $1, '{"job_id": "j", "to": "someone@example.com"}', $2)
         RETURNING id
       )
       SELECT pg_notify('${OUTBOX_CHANNEL}', id::text) FROM row`,
      [key, traceparent],
    );
  };

  it('http/protobuf: the relay exports protobuf, and its send continues the trace its row names', async () => {
    const hook = await webhook();
    try {
      const relay = await start('relay', 88, {
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
        OTEL_BSP_SCHEDULE_DELAY: '50',
        NOTIFY_WEBHOOK_URL: hook.server.url('/notify'),
      });
      const traceId = randomBytes(16).toString('hex');
      const parent = randomBytes(8).toString('hex');
      await insertRow(`traced:${randomUUID()}`, `00-${traceId}-${parent}-01`);

      const sent = traceparentOf((await hook.received).headers.traceparent);
      expect(sent.traceId).toBe(traceId);
      expect(sent.spanId).not.toBe(parent);
      // The export is protobuf: the trace id is in it as its 16 raw bytes.
      await eventually(
        () =>
          receiver.exports.find(
            (e) =>
              e.url === '/v1/traces' &&
              e.headers['content-type'] === 'application/x-protobuf' &&
              e.body.includes(Buffer.from(traceId, 'hex')),
          ),
        20_000,
        'a protobuf export of the trace',
      );
      await stop(relay);
    } finally {
      await hook.server.stop();
    }
  });

  it('unset: the SDK is not loaded, nothing is exported and the webhook carries no traceparent', async () => {
    const hook = await webhook();
    try {
      const before = receiver.exports.length;
      // The protocol alone does not turn tracing on.
      const relay = await start('relay', 88, {
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        NOTIFY_WEBHOOK_URL: hook.server.url('/notify'),
      });
      await insertRow(`untraced:${randomUUID()}`, null);
      const seen = await hook.received;
      expect(seen.headers.traceparent).toBeUndefined();
      await stop(relay);
      // No SDK, exporter or instrumentation: only the API, which prom-client loads anyway (for its exemplars).
      expect(loadedOtelPackages(relay)).toEqual(['@opentelemetry/api']);
      expect(receiver.exports.length).toBe(before);
    } finally {
      await hook.server.stop();
    }
  });
});
