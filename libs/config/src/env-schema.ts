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

function field<T>(variable: string, parse: (raw: string | undefined, env: Env) => T): EnvField<T> {
  return { variable, parse };
}

function required<T>(raw: string | undefined, fallback: T | undefined): string | T {
  if (raw !== undefined) return raw;
  if (fallback === undefined) throw new ConfigFieldError('is required');
  return fallback;
}

export const env = {
  string(variable: string, fallback?: string): EnvField<string> {
    return field(variable, (raw) => required(raw, fallback));
  },

  optionalString(variable: string): EnvField<string | undefined> {
    return field(variable, (raw) => raw);
  },

  int(variable: string, fallback: number, opts: { min?: number; max?: number } = {}): EnvField<number> {
    return field(variable, (raw) => {
      if (raw === undefined) return fallback;
      if (!/^-?\d+$/.test(raw)) throw new ConfigFieldError(`must be an integer, got "${raw}"`);
      return inRange(Number(raw), opts);
    });
  },

  /** A positive number of seconds, fractions allowed ("0.2"); returned in milliseconds. */
  secondsAsMs(variable: string, fallbackSeconds: number, opts: { min?: number; max?: number } = {}): EnvField<number> {
    return field(variable, (raw) => {
      if (raw === undefined) return Math.round(fallbackSeconds * 1000);
      if (!/^\d+(\.\d+)?$/.test(raw)) throw new ConfigFieldError(`must be a number of seconds, got "${raw}"`);
      const seconds = inRange(Number(raw), { min: 0.001, ...opts });
      return Math.round(seconds * 1000);
    });
  },

  url(variable: string, fallback: string | undefined, protocols: readonly string[]): EnvField<string> {
    return field(variable, (raw) => {
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
    });
  },

  optionalUrl(variable: string, protocols: readonly string[]): EnvField<string | undefined> {
    const inner = env.url(variable, undefined, protocols);
    return field(variable, (raw, all) => (raw === undefined ? undefined : inner.parse(raw, all)));
  },

  oneOf<const T extends string>(variable: string, fallback: T, values: readonly T[]): EnvField<T> {
    return field(variable, (raw) => {
      const value = raw ?? fallback;
      if (!(values as readonly string[]).includes(value)) {
        throw new ConfigFieldError(`must be one of ${values.join(', ')}, got "${value}"`);
      }
      return value as T;
    });
  },

  custom<T>(variable: string, parse: (raw: string | undefined, env: Env) => T): EnvField<T> {
    return field(variable, parse);
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
  nodeEnv: env.string('NODE_ENV', 'development'),
  redisUrl: env.url('REDIS_URL', 'redis://127.0.0.1:6379', ['redis:', 'rediss:']),
  databaseUrl: env.url('DATABASE_URL', 'postgres://postgres@127.0.0.1:5432/postgres', ['postgres:', 'postgresql:']),
  logLevel: env.oneOf('LOG_LEVEL', 'info', LOG_LEVELS),
};
