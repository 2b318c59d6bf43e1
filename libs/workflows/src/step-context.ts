import type { Logger } from '@nestjs/common';
import { createHash } from 'node:crypto';
import {
  classifyLlmError,
  EmptyCompletionError,
  type ChatRequest,
  type ErrorClass,
  type LlmClient,
  type TenantTokenLimiter,
} from '@app/llm';
import { setTimeout as delay } from 'node:timers/promises';
import { HandBackError, JobError } from './consumer/job.errors';
import { randomUUID } from 'node:crypto';
import {
  reserveStepTokens,
  stepCallWorstCase,
  TokenLimitTooLarge,
  TokenLimitWait,
  tokenLimitWaitOf,
  tokensUsed,
} from './step-tokens';
import type { NewOutboxMessage } from '@app/persistence';
import { activeTraceparent } from '@app/tracing';
import type { ChatCompletion } from 'openai/resources/chat/completions';
import type { EntityManager } from 'typeorm';
import { RetryError } from './retry/retry.errors';
import type { RetryPolicy } from './retry/retry-policy.service';
import type { WorkerMetrics } from './worker.metrics';
import type { StepTransaction } from './workflow-store';

/** One model call's options. */
export interface StepCallOptions {
  /**
   * The call's Idempotency-Key instead of the default (modelCallKey): for a
   * workflow ported onto the engine whose calls had a key of their own, so
   * that a call made before the upgrade is answered from the gateway's record
   * rather than made again.
   */
  readonly idempotencyKey?: string;
}

/**
 * JSON with every object's keys sorted: one text for one request, however its properties were ordered. A value with
 * `toJSON` (a Date) is what it sends, as JSON.stringify (and so the client) has it.
 */
function canonicalJson(value: unknown): string {
  const own = value as { toJSON?: unknown } | null;
  if (typeof own === 'object' && own !== null && typeof own.toJSON === 'function')
    return canonicalJson((own.toJSON as () => unknown).call(own));
  if (Array.isArray(value)) return `[${value.map((v) => canonicalJson(v ?? null)).join(',')}]`;
  if (typeof value === 'object' && value !== null) {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

/**
 * A step's model call's default Idempotency-Key: `wf:<run_id>:<step>:<n>:<d>`,
 * n the call's place in the step (0, 1, ...) and d the first 16 hex digits of
 * the SHA-256 of the request as the client sends it (the default model
 * filled in, `stream: false`; model, messages and every parameter, keys
 * sorted). A retried identical call (a redelivery after a crash) has the same
 * key and is answered from the gateway's record; a changed one (a re-drive
 * after a prompt fix, a prompt that is not deterministic) is a new call, not
 * a 422 for reusing a key with another body. At most 125 ASCII characters
 * (names ≤ 64, n < 1000): within the gateway's 128.
 */
export function modelCallKey(
  runId: string,
  step: string,
  n: number,
  request: ChatRequest,
  defaultModel?: string,
): string {
  // As the client sends it: OPENAI_MODEL filled in, not streamed (a changed OPENAI_MODEL is a new call).
  const sent = { ...request, model: request.model ?? defaultModel, stream: false };
  const digest = createHash('sha256').update(canonicalJson(sent)).digest('hex').slice(0, 16);
  return `wf:${runId}:${step}:${n}:${digest}`;
}

/** Model calls from a step: each call's every attempt carries the same Idempotency-Key, and the run's tenant. */
export interface StepLlm {
  /** One chat completion under the step's RetryPolicy; its key is modelCallKey (call n of the step, its request). */
  chat(request: ChatRequest, options?: StepCallOptions): Promise<ChatCompletion>;
  /** The first choice's text (U+0000 removed; an answer of only whitespace is `llm_empty_answer`). */
  text(
    prompt: string | ChatRequest['messages'],
    request?: Partial<ChatRequest>,
    options?: StepCallOptions,
  ): Promise<string>;
}

/** What a step method is given. */
export interface StepContext<I = unknown> {
  readonly runId: string;
  readonly tenant: string;
  readonly workflow: string;
  readonly step: string;
  /** The run's input, validated against the workflow's `input` class. */
  readonly input: I;
  /** This delivery's number, 1 first. */
  readonly delivery: number;
  /** Aborted when the step's timeout, the run's deadline or the worker's drain time is over. */
  readonly signal: AbortSignal;
  /** What an earlier step of the run committed. */
  output<T = unknown>(step: string): T | undefined;
  readonly llm: StepLlm;
  /** A row committed with the step (`INSERT ... ON CONFLICT DO NOTHING`), group-committed with other steps'. */
  insert(table: string, row: Record<string, unknown>): void;
  /** An outbox row committed with the step; the relay delivers it. */
  outbox(message: NewOutboxMessage): void;
  /**
   * The step's own PostgreSQL transaction, for anything `insert` cannot say:
   * opened on the first call (taking the run row's lock, then the step
   * row's), committed with the step's output, rows and outbox rows once the
   * step returns, or rolled back if it throws or another delivery committed
   * the step first. It holds a pool connection, and those locks, until the
   * step returns: keep such a step short (no model call after opening it, if
   * it can be helped), and size the pool for the steps that may hold one at
   * once. Another delivery of the same run meanwhile is retried later
   * (`running_elsewhere`), not blocked.
   */
  transaction(): Promise<EntityManager>;
}

/** A table or column name `insert` takes: checked, since it goes into SQL text. */
export const SQL_NAME = /^[a-z_][a-z0-9_]*$/;

/** A row `insert` was given. */
export interface StepInsert {
  readonly table: string;
  readonly row: Readonly<Record<string, unknown>>;
}

/** What a step asked to commit with it. */
export interface StepWrites {
  readonly inserts: readonly StepInsert[];
  readonly outbox: readonly NewOutboxMessage[];
}

/** What the engine gives a step's context. */
export interface StepRuntime<I> {
  readonly runId: string;
  readonly tenant: string;
  readonly workflow: string;
  readonly step: string;
  readonly input: I;
  readonly delivery: number;
  readonly state: Readonly<Record<string, unknown>>;
  readonly signal: AbortSignal;
  /** Shutdown began: no new attempt, backoff sleeps end. */
  readonly stopRetrying: AbortSignal;
  /** Monotonic (performance.now) time by which the step's model calls must be done. */
  readonly deadline: number;
  readonly llm: LlmClient;
  readonly retry: RetryPolicy;
  readonly metrics: WorkerMetrics;
  readonly logger: Logger;
  readonly openTransaction: () => Promise<StepTransaction>;
  /** TENANT_TOKEN_LIMITS when the worker calls the provider itself (through the gateway, the gateway reserves). */
  readonly tokens?: TenantTokenLimiter;
  /** Notes on the run's record that this step waits for the token limit until `untilMs` (GET /v1/runs shows it). */
  readonly noteTokenWait?: (untilMs: number) => Promise<void>;
}

/** The StepContext of one delivery of a step; the engine reads back what it collected. */
export class StepContextImpl<I> implements StepContext<I> {
  readonly llm: StepLlm;
  private readonly inserts: StepInsert[] = [];
  private readonly messages: NewOutboxMessage[] = [];
  private tx: Promise<StepTransaction> | undefined;
  /** The next model call's place in the step. */
  private calls = 0;

  constructor(private readonly rt: StepRuntime<I>) {
    this.llm = {
      chat: (request, options) => this.call(request, (c) => c, options),
      text: (prompt, request = {}, options) => {
        const messages = typeof prompt === 'string' ? [{ role: 'user' as const, content: prompt }] : prompt;
        return this.call({ ...request, messages }, (c) => storableText(c.choices[0]?.message?.content), options);
      },
    };
  }

  get runId(): string {
    return this.rt.runId;
  }
  get tenant(): string {
    return this.rt.tenant;
  }
  get workflow(): string {
    return this.rt.workflow;
  }
  get step(): string {
    return this.rt.step;
  }
  get input(): I {
    return this.rt.input;
  }
  get delivery(): number {
    return this.rt.delivery;
  }
  get signal(): AbortSignal {
    return this.rt.signal;
  }

  output<T = unknown>(step: string): T | undefined {
    return this.rt.state[step] as T | undefined;
  }

  insert(table: string, row: Record<string, unknown>): void {
    if (!SQL_NAME.test(table)) throw new Error(`insert: table name ${JSON.stringify(table)} must match ${SQL_NAME}`);
    const bad = Object.keys(row).filter((c) => !SQL_NAME.test(c));
    if (bad.length > 0 || Object.keys(row).length === 0)
      throw new Error(`insert into ${table}: column names must match ${SQL_NAME} (${bad.join(', ') || 'no columns'})`);
    this.inserts.push({ table, row: { ...row } });
  }

  outbox(message: NewOutboxMessage): void {
    // The row carries the step's trace to the relay, whose send continues it (none when tracing is off).
    const traceparent = activeTraceparent();
    this.messages.push({
      topic: message.topic,
      dedupeKey: message.dedupeKey,
      payload: { ...message.payload },
      ...(traceparent === undefined ? {} : { traceparent }),
    });
  }

  transaction(): Promise<EntityManager> {
    this.tx ??= this.rt.openTransaction();
    return this.tx.then((t) => t.manager);
  }

  /** What the step asked to commit with it. */
  writes(): StepWrites {
    return { inserts: [...this.inserts], outbox: [...this.messages] };
  }

  /** The transaction `transaction()` opened, if the step called it. */
  openedTransaction(): Promise<StepTransaction> | undefined {
    return this.tx;
  }

  private async call<T>(request: ChatRequest, pick: (c: ChatCompletion) => T, options?: StepCallOptions): Promise<T> {
    const n = this.calls++;
    const idempotencyKey =
      options?.idempotencyKey ?? modelCallKey(this.rt.runId, this.rt.step, n, request, this.rt.llm.defaultModel);
    // A tenant token limit that has no room now is waited for (TokenLimitWait), and then the call is made
    // afresh: never a failed attempt of the call.
    let waited = false;
    for (;;) {
      try {
        const value = await this.attempted(request, pick, n, idempotencyKey);
        // The run no longer waits (GET /v1/runs): the note's time is set to the past.
        if (waited) await this.rt.noteTokenWait?.(0).catch(() => undefined);
        return value;
      } catch (err) {
        const wait = tokenLimitWaitOf(err instanceof RetryError ? err.cause : err);
        if (wait === undefined) throw err;
        waited = true;
        await this.waitForTokens(wait);
      }
    }
  }

  /**
   * The limit's wait: within this delivery when it is short (a slot held
   * waiting is one other tenants' steps do not get) and leaves the call most
   * of the delivery's time; else the delivery is handed back, its count set
   * back, and a later one (after CLAIM_IDLE_MS) tries again. A drain hands it
   * back at once. Neither counts toward the call's attempts or the entry's
   * deliveries.
   */
  private async waitForTokens(wait: TokenLimitWait): Promise<void> {
    const { metrics } = this.rt;
    const left = this.rt.deadline - performance.now();
    await this.rt.noteTokenWait?.(Date.now() + wait.retryAfterMs).catch(() => undefined);
    const handBack = (why: string): HandBackError => {
      metrics.tokenWaits.inc({ outcome: 'handed_back' });
      return new HandBackError(`${TOKEN_LIMIT.kind}: ${wait.message}; ${why}`, TOKEN_LIMIT);
    };
    if (wait.retryAfterMs > MAX_IN_DELIVERY_WAIT_MS || left - wait.retryAfterMs < Math.max(MIN_CALL_TIME_MS, left / 2))
      throw handBack('handed back for a later delivery');
    if (this.rt.stopRetrying.aborted) throw handBack('the worker is stopping');
    metrics.tokenWaits.inc({ outcome: 'waited' });
    metrics.tokenWaitSeconds.inc(wait.retryAfterMs / 1000);
    this.rt.logger.log(
      { run_id: this.rt.runId, step: this.rt.step, wait_ms: wait.retryAfterMs },
      "waiting for the tenant's token limit",
    );
    try {
      await delay(wait.retryAfterMs, undefined, { signal: AbortSignal.any([this.rt.signal, this.rt.stopRetrying]) });
    } catch (err) {
      if (this.rt.signal.aborted) throw err;
      throw handBack('the worker is stopping');
    }
  }

  private async attempted<T>(
    request: ChatRequest,
    pick: (c: ChatCompletion) => T,
    n: number,
    idempotencyKey: string,
  ): Promise<T> {
    const { retry, metrics, logger } = this.rt;
    const worstCase = this.rt.tokens ? stepCallWorstCase(request) : 0;
    try {
      const outcome = await retry.run(
        async (signal) => {
          // Each attempt reserves its own worst case (a timed-out attempt may have spent it) and settles it.
          const settle = await this.reserve(worstCase);
          let spent: number | undefined;
          try {
            const completion = await this.rt.llm.chat(request, { signal, idempotencyKey, tenant: this.rt.tenant });
            spent = tokensUsed(completion) ?? worstCase;
            return pick(completion);
          } catch (err) {
            // A refusal proves nothing was spent; anything else after the send may have been.
            spent ??= isProviderRefusal(err) ? 0 : worstCase;
            throw err;
          } finally {
            if (settle) await settle(spent ?? worstCase).catch(() => undefined);
          }
        },
        classifyStepCallError,
        {
          deadline: this.rt.deadline,
          signal: this.rt.signal,
          stopRetrying: this.rt.stopRetrying,
          onAttemptFailed: (attempt, error) => {
            // A limit's refusal is no failed attempt: the call waits for the window (call()).
            if (error.kind === TOKEN_LIMIT.kind) return;
            metrics.llmCalls.inc({ outcome: 'failed', error_class: error.kind });
            logger.warn(
              {
                run_id: this.rt.runId,
                step: this.rt.step,
                call: n,
                attempt,
                error_class: error.kind,
                status: error.status,
              },
              'model call failed',
            );
          },
        },
      );
      metrics.llmCalls.inc({ outcome: 'ok', error_class: 'none' });
      metrics.llmAttempts.observe(outcome.attempts);
      return outcome.value;
    } catch (err) {
      if (err instanceof RetryError && tokenLimitWaitOf(err.cause) === undefined)
        metrics.llmAttempts.observe(err.attempts);
      throw err;
    }
  }

  /**
   * The worker's own reservation (calling the provider itself): its settle,
   * or undefined without a limit. Refused: TokenLimitWait. Redis unreachable:
   * a retryable failure of the delivery. Over the whole limit: a failure for
   * good (no window would ever fit it).
   */
  private async reserve(worstCase: number): Promise<((tokens: number) => Promise<void>) | undefined> {
    try {
      return await reserveStepTokens(this.rt.tokens, this.rt.tenant, worstCase, randomUUID());
    } catch (err) {
      if (err instanceof TokenLimitWait) throw err;
      if (err instanceof TokenLimitTooLarge)
        throw new JobError(`request_exceeds_token_limit: ${err.message}`, {
          kind: 'request_exceeds_token_limit',
          retryable: false,
        });
      throw new JobError(`token_limiter_unavailable: ${err instanceof Error ? err.message : String(err)}`, {
        kind: 'token_limiter_unavailable',
        retryable: true,
      });
    }
  }
}

/** A provider's answer that refused the call (a status), which spent nothing. */
function isProviderRefusal(err: unknown): boolean {
  const status = (err as { status?: unknown } | null)?.status;
  return typeof status === 'number' && status >= 400;
}

/** The limit's refusal, as RetryPolicy sees it: not retried there (call() waits instead), not a failure. */
const TOKEN_LIMIT: ErrorClass = { kind: 'tenant_token_limit', retryable: true };

/** What a wait within the delivery leaves the call at least (and at least half the delivery's time left). */
const MIN_CALL_TIME_MS = 5000;
/** The longest wait within a delivery; longer, the delivery is handed back (its slot freed for other tenants). */
const MAX_IN_DELIVERY_WAIT_MS = 5000;

function classifyStepCallError(err: unknown): ErrorClass {
  if (tokenLimitWaitOf(err) !== undefined) return { ...TOKEN_LIMIT, retryable: false };
  // The worker's own limiter (reserve()): as it classified itself.
  if (err instanceof JobError) return err.failure;
  // The gateway's refusal of a call over the whole limit (its 400): for good, named as it is.
  if ((err as { code?: unknown } | null)?.code === 'request_exceeds_token_limit')
    return { kind: 'request_exceeds_token_limit', retryable: false };
  return classifyLlmError(err);
}

/** A model's text as jsonb stores it: no U+0000, no lone surrogate; only whitespace is no answer. */
function storableText(content: string | null | undefined): string {
  const text = typeof content === 'string' ? content.replaceAll('\u0000', '').toWellFormed() : '';
  if (text.trim() === '') throw new EmptyCompletionError();
  return text;
}
