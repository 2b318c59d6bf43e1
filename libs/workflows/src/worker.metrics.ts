import { Injectable } from '@nestjs/common';
import { Counter, Histogram, Registry } from 'prom-client';
import type { LlmErrorKind } from '@app/llm';

const JOB_OUTCOMES = ['done', 'duplicate', 'transient', 'dead_lettered'] as const;
const LLM_ERROR_KINDS: readonly LlmErrorKind[] = [
  'timeout',
  'connection',
  'rate_limited',
  'server',
  'conflict',
  'gateway_auth',
  'client',
  'empty_answer',
  'unknown',
];
/** The reasons a delivery is dead-lettered for; `llm_<kind>` for the model errors that are never retried. */
const DEAD_LETTER_REASONS = [
  'max_deliveries',
  'deleted_from_stream',
  'malformed',
  'database',
  'unexpected',
  'llm_client',
  'llm_empty_answer',
  'llm_unknown',
  // A workflow step's (decide.ts, WorkflowHandler).
  'invalid_input',
  'unknown_workflow',
  'unknown_step',
  'deadline',
  'step_failed',
] as const;

/** The worker's own figures. Labels are bounded: no job ids or tenants. */
@Injectable()
export class WorkerMetrics {
  readonly jobs: Counter<'outcome'>;
  readonly jobDuration: Histogram<'outcome'>;
  readonly llmCalls: Counter<'outcome' | 'error_class'>;
  readonly llmAttempts: Histogram;
  readonly deadLetters: Counter<'reason'>;
  readonly reclaimed: Counter;
  readonly tokenWaits: Counter<'outcome'>;
  readonly tokenWaitSeconds: Counter;

  constructor(registry: Registry) {
    const registers = [registry];
    this.jobs = new Counter({
      name: 'worker_jobs_total',
      help: 'Job deliveries by outcome: done, duplicate, transient (left pending), dead_lettered',
      labelNames: ['outcome'],
      registers,
    });
    this.jobDuration = new Histogram({
      name: 'worker_job_duration_seconds',
      help: 'Time from the start of a delivery to its outcome',
      labelNames: ['outcome'],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120],
      registers,
    });
    this.llmCalls = new Counter({
      name: 'worker_llm_calls_total',
      help: 'Model calls by outcome and error class',
      labelNames: ['outcome', 'error_class'],
      registers,
    });
    this.llmAttempts = new Histogram({
      name: 'worker_llm_attempts_per_job',
      help: 'Model call attempts within one delivery',
      buckets: [1, 2, 3, 4, 5, 6, 8, 10],
      registers,
    });
    this.deadLetters = new Counter({
      name: 'worker_dead_letters_total',
      help: 'Messages moved to the dead-letter stream, by reason',
      labelNames: ['reason'],
      registers,
    });
    this.reclaimed = new Counter({
      name: 'worker_reclaimed_total',
      help: 'Messages this worker took over from consumers that stopped refreshing them',
      registers,
    });
    this.tokenWaits = new Counter({
      name: 'worker_token_waits_total',
      help: "Model calls of steps that their tenant's token limit (TENANT_TOKEN_LIMITS) made wait: waited (within the delivery), handed_back (for a later delivery, its count set back)",
      labelNames: ['outcome'],
      registers,
    });
    this.tokenWaitSeconds = new Counter({
      name: 'worker_token_wait_seconds_total',
      help: "Seconds steps waited within their deliveries for their tenant's token limit",
      registers,
    });
    for (const outcome of ['waited', 'handed_back']) this.tokenWaits.inc({ outcome }, 0);
    this.tokenWaitSeconds.inc(0);
    // Every known series from 0: a series that first appears at 1 has no
    // increase(), so the first dead letter of a fresh pod would not alert.
    for (const outcome of JOB_OUTCOMES) this.jobs.inc({ outcome }, 0);
    this.llmCalls.inc({ outcome: 'ok', error_class: 'none' }, 0);
    for (const kind of LLM_ERROR_KINDS) this.llmCalls.inc({ outcome: 'failed', error_class: kind }, 0);
    for (const reason of DEAD_LETTER_REASONS) this.deadLetters.inc({ reason }, 0);
    this.reclaimed.inc(0);
  }
}
