/*
 * Where a server's CPU went, by component of the request's path: each sample
 * of a V8 CPU profile is charged to the innermost frame of its stack that
 * belongs to a known component (so a component's figure includes the Node
 * internals it calls, e.g. a log line's write()), else to Node's HTTP or
 * socket code, GC, or "other". Per request: the profile's samples over the
 * requests answered in its window.
 */

interface ProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string };
  readonly children?: readonly number[];
}

export interface CpuProfile {
  readonly nodes: readonly ProfileNode[];
  readonly samples: readonly number[];
  readonly timeDeltas: readonly number[];
}

/** In order: the first that matches a frame's script URL names it. */
const COMPONENTS: readonly (readonly [string, RegExp])[] = [
  ['access log (pino, pino-http, nestjs-pino)', /pino|sonic-boom|\/redact|logging\.module|redacted-url/],
  ['metrics (prom-client)', /prom-client|http-metrics/],
  [
    'validation (class-validator, class-transformer)',
    /class-validator|class-transformer|validation\.pipe|\/validator\//,
  ],
  [
    'JSON body (parse, limits)',
    /body-parser|raw-body|json-body|json-limits|iconv-lite|type-is|content-type|media-typer/,
  ],
  ['API key guard', /api-key\.guard|guards-consumer/],
  ['idempotency (ours)', /libs\/idempotency|idempotency\/src/],
  ['idempotency (@node-idempotency)', /@node-idempotency|@redis\/client|\/redis\/dist/],
  ['ioredis', /ioredis|redis-script|redis-parser|standard-as-callback|cluster-key-slot|denque/],
  [
    'handler, job ids, enqueue',
    /servers\/plain|nest-anchor\/server|summary-job|run-start|uuid-v5|run-ids|summaries\.controller|workflows\/src\/client/,
  ],
  ['problem+json filter', /libs\/problem/],
  ['gateway (relay, routes, usage, its middleware)', /apps\/api\/src\/gateway|libs\/llm\//],
  ['HTTP client (NodeHttpTransport)', /libs\/http\/src\/node-http\.transport/],
  ['Nest (core, common, rxjs)', /@nestjs\/|rxjs|direct-answer|reflect-metadata/],
  [
    'Express and its router',
    /\/express\/|\/router\/|path-to-regexp|finalhandler|etag|\/send\/|\/fresh\/|parseurl|on-finished/,
  ],
  ['Node HTTP', /node:_http|_http_|node:http/],
  ['Node sockets and streams', /node:net|streams\/|stream_base|node:stream/],
];

export function componentsOf(profile: CpuProfile, requests: number): Map<string, number> {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const owner = new Map<number, string>();
  const ownerOf = (id: number): string => {
    const known = owner.get(id);
    if (known !== undefined) return known;
    const { functionName, url } = byId.get(id)!.callFrame;
    let name: string | undefined;
    if (functionName === '(garbage collector)') name = 'garbage collection';
    else if (functionName === '(program)') name = 'V8 and Node, outside JavaScript';
    else if (url) name = COMPONENTS.find(([, re]) => re.test(url))?.[0];
    if (name === undefined) {
      const up = parent.get(id);
      name = up === undefined ? 'other' : ownerOf(up);
    }
    owner.set(id, name);
    return name;
  };
  const micros = new Map<string, number>();
  profile.samples.forEach((id, i) => {
    if (byId.get(id)!.callFrame.functionName === '(idle)') return;
    const name = ownerOf(id);
    micros.set(name, (micros.get(name) ?? 0) + (profile.timeDeltas[i] ?? 0));
  });
  return new Map([...micros].map(([name, us]) => [name, us / requests]));
}
