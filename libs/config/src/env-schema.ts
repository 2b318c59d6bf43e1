import { ConfigFieldError, ConfigProblem, ConfigValidationError } from './config.errors';

export type Env = Readonly<Record<string, string | undefined>>;

/**
 * The process's environment: the one place that reads `process.env`. Every
 * app's loader takes an `Env` (tests pass their own) and defaults to this.
 */
export function processEnv(): Env {
  return process.env;
}

/**
 * One variable: its name and how to turn the raw text into a value. `raw` is
 * undefined when the variable is unset or blank.
 */
export interface EnvField<T> {
  readonly variable: string;
  parse(raw: string | undefined, env: Env): T;
  /** What docs/operations.md's Configuration table says of it (libs/config's config-reference). */
  readonly doc?: FieldDoc;
}

/**
 * A variable's row in the configuration reference. `describe` is its meaning
 * (empty when the name says it all); `default` the default as the docs read
 * it, Markdown: derived from the schema's fallback unless given.
 */
export interface FieldDoc {
  readonly describe?: string;
  readonly default?: string;
}

/** What a schema may say of a variable for the docs; `docDefault` when the default needs words. */
export interface DocOptions {
  readonly describe?: string;
  readonly docDefault?: string;
}

export type EnvSchema = Readonly<Record<string, EnvField<unknown>>>;
export type ConfigOf<S extends EnvSchema> = {
  readonly [K in keyof S]: S[K] extends EnvField<infer T> ? T : never;
};

/**
 * Parses every field of `schema` from `env` and reports all bad variables at
 * once, by name.
 */
export function parseConfig<S extends EnvSchema>(schema: S, env: Env): ConfigOf<S> {
  const problems: ConfigProblem[] = [];
  const out: Record<string, unknown> = {};
  for (const [key, field] of Object.entries(schema)) {
    const value = env[field.variable];
    const raw = value === undefined || value.trim() === '' ? undefined : value.trim();
    try {
      out[key] = field.parse(raw, env);
    } catch (err) {
      if (!(err instanceof ConfigFieldError)) throw err;
      problems.push({ variable: field.variable, message: err.message });
    }
  }
  if (problems.length > 0) throw new ConfigValidationError(problems);
  return out as ConfigOf<S>;
}

function field<T>(
  variable: string,
  parse: (raw: string | undefined, env: Env) => T,
  doc: DocOptions = {},
  derivedDefault?: string,
): EnvField<T> {
  return { variable, parse, doc: { describe: doc.describe ?? '', default: doc.docDefault ?? derivedDefault ?? '—' } };
}

/** A default as the docs show it: code, or a dash when there is none. */
const code = (value: string | number | undefined): string | undefined =>
  value === undefined ? undefined : `\`${value}\``;

function required<T>(raw: string | undefined, fallback: T | undefined): string | T {
  if (raw !== undefined) return raw;
  if (fallback === undefined) throw new ConfigFieldError('is required');
  return fallback;
}

export const env = {
  string(variable: string, fallback?: string, doc?: DocOptions): EnvField<string> {
    return field(variable, (raw) => required(raw, fallback), doc, code(fallback));
  },

  optionalString(variable: string, doc?: DocOptions): EnvField<string | undefined> {
    return field(variable, (raw) => raw, doc);
  },

  int(
    variable: string,
    fallback: number,
    opts: { min?: number; max?: number } = {},
    doc?: DocOptions,
  ): EnvField<number> {
    return field(
      variable,
      (raw) => {
        if (raw === undefined) return fallback;
        if (!/^-?\d+$/.test(raw)) throw new ConfigFieldError(`must be an integer, got "${raw}"`);
        return inRange(Number(raw), opts);
      },
      doc,
      code(fallback),
    );
  },

  /** A positive number of seconds, fractions allowed ("0.2"); returned in milliseconds. */
  secondsAsMs(
    variable: string,
    fallbackSeconds: number,
    opts: { min?: number; max?: number } = {},
    doc?: DocOptions,
  ): EnvField<number> {
    return field(
      variable,
      (raw) => {
        if (raw === undefined) return Math.round(fallbackSeconds * 1000);
        if (!/^\d+(\.\d+)?$/.test(raw)) throw new ConfigFieldError(`must be a number of seconds, got "${raw}"`);
        const seconds = inRange(Number(raw), { min: 0.001, ...opts });
        return Math.round(seconds * 1000);
      },
      doc,
      code(fallbackSeconds),
    );
  },

  url(
    variable: string,
    fallback: string | undefined,
    protocols: readonly string[],
    doc?: DocOptions,
  ): EnvField<string> {
    return field(
      variable,
      (raw) => {
        const value = required(raw, fallback);
        let parsed: URL;
        try {
          parsed = new URL(value);
        } catch {
          throw new ConfigFieldError(`must be a URL, got "${redactUrl(value)}"`);
        }
        if (!protocols.includes(parsed.protocol)) {
          throw new ConfigFieldError(`must use ${protocols.join(' or ')}, got "${parsed.protocol}"`);
        }
        return value;
      },
      doc,
      code(fallback),
    );
  },

  optionalUrl(variable: string, protocols: readonly string[], doc?: DocOptions): EnvField<string | undefined> {
    const inner = env.url(variable, undefined, protocols);
    return field(variable, (raw, all) => (raw === undefined ? undefined : inner.parse(raw, all)), doc);
  },

  oneOf<const T extends string>(variable: string, fallback: T, values: readonly T[], doc?: DocOptions): EnvField<T> {
    return field(
      variable,
      (raw) => {
        const value = raw ?? fallback;
        if (!(values as readonly string[]).includes(value)) {
          throw new ConfigFieldError(`must be one of ${values.join(', ')}, got "${value}"`);
        }
        return value as T;
      },
      doc,
      code(fallback),
    );
  },

  /** A variable parsed by `parse`; its default for the docs is `doc.docDefault` (a dash when unset). */
  custom<T>(variable: string, parse: (raw: string | undefined, env: Env) => T, doc?: DocOptions): EnvField<T> {
    return field(variable, parse, doc);
  },
};

function inRange(n: number, { min, max }: { min?: number; max?: number }): number {
  if (min !== undefined && n < min) throw new ConfigFieldError(`must be at least ${min}, got ${n}`);
  if (max !== undefined && n > max) throw new ConfigFieldError(`must be at most ${max}, got ${n}`);
  return n;
}

/** Never echo a password from a URL into a log line. */
function redactUrl(value: string): string {
  return value.replace(/\/\/([^:/@]+):([^@]*)@/, '//$1:***@');
}

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** The variables every app shares (INTERFACE.md). */
export const commonEnv = {
  nodeEnv: env.string('NODE_ENV', 'development', { describe: '`production` makes `API_KEYS` required' }),
  redisUrl: env.url('REDIS_URL', 'redis://127.0.0.1:6379', ['redis:', 'rediss:'], {
    describe: '`redis://` or `rediss://`, database number allowed',
  }),
  redisClusterNodes: env.custom('REDIS_CLUSTER_NODES', parseClusterNodes, {
    describe:
      '`host:port,host:port,...`: seed nodes of a Redis Cluster (masters or replicas; the rest are discovered); ' +
      'set, every app uses the cluster and ignores `REDIS_URL`. Entries may also be `redis://[user:password@]host:port` ' +
      'or, for TLS, `rediss://...` (all entries one scheme; credentials the same wherever given; no database number); ' +
      "TLS checks the nodes' certificates against Node's CA store (a private CA: `NODE_EXTRA_CA_CERTS`)",
    docDefault: 'unset',
  }),
  databaseUrl: env.url('DATABASE_URL', 'postgres://postgres@127.0.0.1:5432/postgres', ['postgres:', 'postgresql:']),
  logLevel: env.oneOf('LOG_LEVEL', 'info', LOG_LEVELS, {
    describe: LOG_LEVELS.map((level) => `\`${level}\``).join(', '),
  }),
};

/**
 * REDIS_DURABILITY (the api and the worker, which write what a client is told was accepted): on a cluster, what a
 * write does when its master has no replica online. libs/redis's DurabilityMode names the same values.
 */
export const redisDurabilityEnv = {
  redisDurability: env.oneOf('REDIS_DURABILITY', 'replica', ['replica', 'strict'], {
    describe:
      'on a Redis Cluster: `replica`, a write (an idempotency claim or stored answer, a job) waits for a replica of ' +
      'its master (`WAIT`, 1 s) when the master has one online; a master without one (after a failover, before a new ' +
      'replica syncs) still takes writes, each counted in `redis_unreplicated_writes_total` and logged once a minute. ' +
      '`strict`: such writes are refused (`503`). Either way a replica that does not confirm in time is a `503`. ' +
      'No effect on one Redis',
  }),
};

/** A Redis Cluster seed node. */
export interface ClusterNode {
  readonly host: string;
  readonly port: number;
}

/** REDIS_CLUSTER_NODES: the seed nodes, and how every connection to the cluster logs in and encrypts. */
export interface RedisClusterConfig {
  readonly nodes: readonly ClusterNode[];
  /** An ACL user; the default user when only a password is given. */
  readonly username?: string;
  readonly password?: string;
  /** `rediss://` entries: TLS to every node, the server's certificate checked against Node's CA store. */
  readonly tls: boolean;
}

const HOST = String.raw`(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)`;
const PLAIN_ENTRY = new RegExp(String.raw`^${HOST}:(\d{1,5})$`);
/** scheme, user, password (up to the last `@`: the host has none), host, port, the rest (path, query). */
const URL_ENTRY = new RegExp(String.raw`^(rediss?)://(?:([^:@/]*)(?::(.*))?@)?${HOST}:(\d{1,5})([/?#].*)?$`, 's');
const FORMAT = 'must be host:port, redis://[user:password@]host:port or rediss://[user:password@]host:port';

/** An entry as an error may show it: whatever precedes the host's `@` (credentials) is masked. */
function redactEntry(entry: string): string {
  const at = entry.lastIndexOf('@');
  if (at < 0) return entry;
  const scheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(entry)?.[0] ?? '';
  return `${scheme}***${entry.slice(at)}`;
}

function decodeCredential(text: string | undefined, what: string, position: number): string | undefined {
  if (text === undefined || text === '') return undefined;
  try {
    return decodeURIComponent(text);
  } catch {
    throw new ConfigFieldError(`entry ${position} has a badly percent-encoded ${what}`);
  }
}

interface ParsedEntry {
  readonly scheme: 'plain' | 'redis' | 'rediss';
  readonly node: ClusterNode;
  readonly username?: string;
  readonly password?: string;
}

function parseClusterEntry(entry: string, position: number): ParsedEntry {
  const bad = (why: string) => new ConfigFieldError(`entry ${position} ${why}, got "${redactEntry(entry)}"`);
  const plain = PLAIN_ENTRY.exec(entry);
  const url = plain ? undefined : URL_ENTRY.exec(entry);
  if (!plain && !url) throw bad(FORMAT);
  const [host, portText] = plain ? [plain[1], plain[2]] : [url![4], url![5]];
  const port = Number(portText);
  if (port < 1 || port > 65535) throw bad(`${FORMAT} (a port from 1 to 65535)`);
  const node = { host: host.replace(/^\[|\]$/g, ''), port };
  if (plain) return { scheme: 'plain', node };
  const [, scheme, user, pass, , , rest = ''] = url!;
  if (rest !== '' && rest !== '/') throw bad('must not name a database or path (a cluster has only database 0)');
  const username = decodeCredential(user, 'user name', position);
  const password = decodeCredential(pass, 'password', position);
  if (username !== undefined && password === undefined)
    throw new ConfigFieldError(`entry ${position} names a user without a password`);
  return { scheme: scheme as 'redis' | 'rediss', node, username, password };
}

/**
 * `host:port,...` (IPv6 hosts in brackets), or the same as `redis://` / `rediss://` URLs with credentials;
 * unset or empty: no cluster. Credentials given on one entry apply to all (the nodes are one cluster).
 */
function parseClusterNodes(raw: string | undefined): RedisClusterConfig | undefined {
  if (raw === undefined || raw.trim() === '') return undefined;
  const entries = raw.split(',').map((entry, i) => parseClusterEntry(entry.trim(), i + 1));
  const tls = entries[0].scheme === 'rediss';
  let login: { readonly position: number; readonly username?: string; readonly password?: string } | undefined;
  entries.forEach((entry, i) => {
    if ((entry.scheme === 'rediss') !== tls)
      throw new ConfigFieldError(
        `entry ${i + 1} ${tls ? 'is not' : 'is'} rediss:// but entry 1 ${tls ? 'is' : 'is not'}: ` +
          'every entry must use TLS (rediss://) or none',
      );
    if (entry.password === undefined) return;
    if (login === undefined) login = { position: i + 1, username: entry.username, password: entry.password };
    else if (login.username !== entry.username || login.password !== entry.password)
      throw new ConfigFieldError(
        `entry ${i + 1} has other credentials than entry ${login.position}: credentials must be the same wherever given`,
      );
  });
  return {
    nodes: entries.map((entry) => entry.node),
    ...(login?.username === undefined ? {} : { username: login.username }),
    ...(login?.password === undefined ? {} : { password: login.password }),
    tls,
  };
}
