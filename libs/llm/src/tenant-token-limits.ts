import { ConfigFieldError } from '@app/config';
import { type RedisClient, RedisScript } from '@app/redis';

/** One tenant's limit: at most `tokens` tokens (prompt plus completion) in each window of `windowMs`. */
export interface TokenLimit {
  readonly tokens: number;
  readonly windowMs: number;
  /** As it was written (`1d`, `5m`): the metrics' `window` label. */
  readonly window: string;
}

/** TENANT_TOKEN_LIMITS, parsed: the tenants named, and `*` for every tenant not named. */
export interface TenantTokenLimits {
  readonly byTenant: ReadonlyMap<string, TokenLimit>;
  readonly others?: TokenLimit;
}

const UNITS: Readonly<Record<string, number>> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const TENANT = /^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$/;
/** The longest window: a fixed window's key lives that long, and a week is longer than any billing question. */
const MAX_WINDOW_MS = 7 * 86_400_000;

/**
 * TENANT_TOKEN_LIMITS: `tenant=tokens/window` entries, comma separated,
 * window `Ns`, `Nm`, `Nh` or `Nd` (e.g. `t1=200000/1d,t2=5000/1m`); `*=...`
 * applies to every tenant not named. An entry without `=`, a window that is
 * not one of those, a number that is not a positive whole one, a tenant named
 * twice: a start-up error naming the entry by its position.
 */
export function parseTenantTokenLimits(raw: string | undefined): TenantTokenLimits | undefined {
  if (raw === undefined || raw.trim() === '') return undefined;
  const byTenant = new Map<string, TokenLimit>();
  let others: TokenLimit | undefined;
  for (const [i, part] of raw.split(',').entries()) {
    const entry = `entry ${i + 1}`;
    const text = part.trim();
    const eq = text.indexOf('=');
    if (eq < 0)
      throw new ConfigFieldError(
        `${entry} is not tenant=tokens/window${text === '' ? ' (it is empty: a stray comma?)' : ''}`,
      );
    const tenant = text.slice(0, eq).trim();
    if (!TENANT.test(tenant))
      throw new ConfigFieldError(`${entry}: the tenant must be a tenant name of API_KEYS, or *`);
    const limit = /^(\d+)\/(\d+)([smhd])$/.exec(text.slice(eq + 1).trim());
    if (limit === null)
      throw new ConfigFieldError(
        `${entry} is not tenant=tokens/window with a window of Ns, Nm, Nh or Nd (e.g. 5000/1m)`,
      );
    const tokens = Number(limit[1]);
    const windowMs = Number(limit[2]) * UNITS[limit[3]];
    if (!Number.isSafeInteger(tokens) || tokens <= 0)
      throw new ConfigFieldError(`${entry}: the tokens must be a positive whole number`);
    if (windowMs <= 0 || windowMs > MAX_WINDOW_MS)
      throw new ConfigFieldError(`${entry}: the window must be positive and at most 7d`);
    const parsed: TokenLimit = { tokens, windowMs, window: `${limit[2]}${limit[3]}` };
    if (tenant === '*') {
      if (others) throw new ConfigFieldError(`${entry}: * is given a limit twice`);
      others = parsed;
    } else {
      if (byTenant.has(tenant)) throw new ConfigFieldError(`${entry}: the tenant ${tenant} is named twice`);
      byTenant.set(tenant, parsed);
    }
  }
  return { byTenant, ...(others ? { others } : {}) };
}

/** The worst case's output when a request names no output limit. */
export const DEFAULT_MAX_OUTPUT_TOKENS = 4096;

/**
 * A call's worst case, reserved before it goes upstream: its prompt,
 * estimated as a token per 3 bytes of the whole request body (over, not
 * under, for English, where a token is about 4 characters, and for text of 3
 * UTF-8 bytes a character, where it is about one; the body holds names and
 * punctuation besides), plus the output it allows (`max_completion_tokens`,
 * `max_tokens` or `max_output_tokens`, else DEFAULT_MAX_OUTPUT_TOKENS) times
 * `n` (the choices asked for). What it cannot see: images and files, and the
 * earlier turns a `previous_response_id` brings (docs/clients.md).
 */
export function worstCaseTokens(bodyBytes: number, json: Readonly<Record<string, unknown>>): number {
  const prompt = Math.ceil(bodyBytes / 3);
  const named = [json.max_completion_tokens, json.max_tokens, json.max_output_tokens].find(
    (v): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v > 0,
  );
  const n = typeof json.n === 'number' && Number.isSafeInteger(json.n) && json.n > 1 ? json.n : 1;
  return prompt + (named ?? DEFAULT_MAX_OUTPUT_TOKENS) * n;
}

/**
 * One script for reserving and settling, on one hash per tenant
 * (`{tokens:<tenant>}`, so one slot on a cluster): its fixed window's start
 * `w` and the tokens settled in it `used`, and a field per reservation
 * `r:<id>` = `<tokens>:<lease end ms>`. Redis's clock decides the window.
 * A window that has ended is reset as it is met (`used` 0); reservations
 * still live carry over into the new one until they settle.
 *
 * reserve: expired reservations (their holder died: its lease ended) are
 * dropped; the call fits if `used` + the live reservations + its worst case
 * is within the limit. Reply `{1, 0}`, or `{0, ms to wait}`: until the
 * window ends when the tokens settled leave no room for it, else 1 s (only
 * live reservations are in the way, and they settle as their calls end).
 * The key lives until the window's end or its latest lease's, whichever is
 * later (a shorter lease of another app never cuts a longer one's).
 * settle: the reservation goes, and the call's actual tokens are added to
 * `used` (also when its lease had ended meanwhile: they were spent).
 */
const TOKENS = new RedisScript(
  'tenant-tokens',
  `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local windowMs = tonumber(ARGV[5])
local start = now - (now % windowMs)
if tonumber(redis.call('HGET', KEYS[1], 'w') or '-1') ~= start then
  redis.call('HSET', KEYS[1], 'w', start, 'used', 0)
end
local keep = math.max(start + windowMs, now + tonumber(ARGV[6])) + 1000
if redis.call('PEXPIRETIME', KEYS[1]) < keep then redis.call('PEXPIREAT', KEYS[1], keep) end
if ARGV[1] == 'settle' then
  redis.call('HDEL', KEYS[1], 'r:' .. ARGV[2])
  if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', KEYS[1], 'used', ARGV[3]) end
  return {1, 0}
end
local used = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
local total = used
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 2) == 'r:' then
    local amount, expires = string.match(fields[i + 1], '^(%d+):(%d+)$')
    if tonumber(expires) <= now then redis.call('HDEL', KEYS[1], fields[i]) else total = total + tonumber(amount) end
  end
end
local amount = tonumber(ARGV[3])
if total + amount > tonumber(ARGV[4]) then
  if used + amount <= tonumber(ARGV[4]) then return {0, 1000} end
  return {0, start + windowMs - now}
end
redis.call('HSET', KEYS[1], 'r:' .. ARGV[2], amount .. ':' .. (now + tonumber(ARGV[6])))
return {1, 0}`,
);

export type Reservation =
  | { readonly outcome: 'reserved'; settle(actualTokens: number): Promise<void> }
  | { readonly outcome: 'refused'; readonly retryAfterS: number; readonly limit: TokenLimit }
  | { readonly outcome: 'too_large'; readonly limit: TokenLimit };

/** A tenant's limiter key: its own hash tag, so a tenant's reservations and count share one slot. */
export function tokensKey(tenant: string): string {
  return `{tokens:${tenant}}`;
}

/** The limits, kept in Redis: reserve before a call goes upstream, settle when it ends. */
export class TenantTokenLimiter {
  constructor(
    private readonly redis: RedisClient,
    private readonly limits: TenantTokenLimits | undefined,
    /** How long a reservation holds without being settled: a holder that died frees its tokens after it. */
    private readonly leaseMs: number,
  ) {}

  limitOf(tenant: string): TokenLimit | undefined {
    return this.limits?.byTenant.get(tenant) ?? this.limits?.others;
  }

  /** Undefined for a tenant without a limit (no round trip). */
  async reserve(tenant: string, worstCase: number, id: string): Promise<Reservation | undefined> {
    const limit = this.limitOf(tenant);
    if (limit === undefined) return undefined;
    if (worstCase > limit.tokens) return { outcome: 'too_large', limit };
    const key = tokensKey(tenant);
    const [fits, waitMs] = await TOKENS.run<[number, number]>(
      this.redis,
      [key],
      ['reserve', id, worstCase, limit.tokens, limit.windowMs, this.leaseMs],
    );
    if (fits !== 1) return { outcome: 'refused', retryAfterS: Math.max(1, Math.ceil(waitMs / 1000)), limit };
    let settled = false;
    return {
      outcome: 'reserved',
      settle: async (actualTokens) => {
        if (settled) return;
        settled = true;
        await TOKENS.run(
          this.redis,
          [key],
          ['settle', id, Math.max(0, Math.round(actualTokens)), limit.tokens, limit.windowMs, this.leaseMs],
        );
      },
    };
  }

  /** Tokens settled in the tenant's current window (what /metrics shows). */
  async used(tenant: string): Promise<number> {
    const limit = this.limitOf(tenant);
    if (limit === undefined) return 0;
    const [start, used] = await this.redis.hmget(tokensKey(tenant), 'w', 'used');
    const now = Date.now();
    // A window that ended and was not met since: nothing used in the current one.
    if (start === null || Number(start) + limit.windowMs <= now) return 0;
    return Number(used ?? 0);
  }
}
