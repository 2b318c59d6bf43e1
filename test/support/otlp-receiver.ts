import type { ServerResponse } from 'node:http';
import { RecordingServer, type SeenRequest } from './recording-server';

/** A span as an OTLP/HTTP JSON export carries it, with its resource's `service.name`. */
export interface ReceivedSpan {
  readonly service: string;
  readonly traceId: string;
  readonly spanId: string;
  /** Undefined for a trace's root. */
  readonly parentSpanId: string | undefined;
  readonly name: string;
  /** OTLP's SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  readonly kind: number;
  readonly attributes: Readonly<Record<string, unknown>>;
}

interface OtlpAttribute {
  key: string;
  value: { stringValue?: string; intValue?: string | number; boolValue?: boolean; doubleValue?: number };
}
interface OtlpJson {
  resourceSpans?: {
    resource?: { attributes?: OtlpAttribute[] };
    scopeSpans?: {
      spans?: {
        traceId: string;
        spanId: string;
        parentSpanId?: string;
        name: string;
        kind: number;
        attributes?: OtlpAttribute[];
      }[];
    }[];
  }[];
}

const valueOf = (v: OtlpAttribute['value']): unknown =>
  v.stringValue ?? (v.intValue === undefined ? undefined : Number(v.intValue)) ?? v.boolValue ?? v.doubleValue;

const attributesOf = (list: OtlpAttribute[] = []): Record<string, unknown> =>
  Object.fromEntries(list.map((a) => [a.key, valueOf(a.value)]));

/**
 * An OpenTelemetry collector of our own: a local HTTP server taking OTLP/HTTP
 * exports at /v1/traces, as the apps send them with OTEL_EXPORTER_OTLP_ENDPOINT
 * set to its url. JSON exports (`http/json`) are decoded into `spans`;
 * every export, protobuf too, is kept as received (`exports`).
 */
export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = [];
  private readonly server = new RecordingServer((res, seen) => this.receive(res, seen));

  async start(): Promise<this> {
    await this.server.start();
    return this;
  }

  /** For OTEL_EXPORTER_OTLP_ENDPOINT: the exporter appends /v1/traces. */
  get url(): string {
    return this.server.url();
  }

  /** Every request, as it came. */
  get exports(): readonly SeenRequest[] {
    return this.server.seen;
  }

  stop(): Promise<void> {
    return this.server.stop();
  }

  /** The spans of one trace. */
  trace(traceId: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.traceId === traceId);
  }

  private receive(res: ServerResponse, seen: SeenRequest): void {
    if (seen.method === 'POST' && seen.url === '/v1/traces' && seen.headers['content-type'] === 'application/json') {
      const body = JSON.parse(seen.body.toString('utf8')) as OtlpJson;
      for (const rs of body.resourceSpans ?? []) {
        const service = String(attributesOf(rs.resource?.attributes)['service.name']);
        for (const ss of rs.scopeSpans ?? [])
          for (const s of ss.spans ?? [])
            this.spans.push({
              service,
              traceId: s.traceId,
              spanId: s.spanId,
              parentSpanId: s.parentSpanId || undefined,
              name: s.name,
              kind: s.kind,
              attributes: attributesOf(s.attributes),
            });
      }
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
  }
}
