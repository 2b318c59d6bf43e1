import { Injectable } from '@nestjs/common';
import { sanitizeSummary } from '@app/llm';
import { SummaryWriter } from '@app/persistence';
import {
  CONSUMER_GROUP,
  parseSummaryJobPayload,
  STREAM_TAG_PREFIX,
  summaryReadyMessage,
  type SummaryJobPayload,
} from '@app/summary-queue';
import { type FinishedElsewhere, Step, type StepContext, Workflow } from '@app/workflows';

/**
 * The model's instructions, as OpenAiLlmClient.summarize gives them (kept the
 * same word for word, so a summary reads as it always has).
 */
const SYSTEM_PROMPT =
  'Summarise the user text in a few sentences of plain prose. Keep names, numbers and dates exact. ' +
  'Do not add anything that is not in the text.';

/**
 * POST /v1/summaries' job as a one-step workflow: its stream, group, keys,
 * tables, statuses and webhook stay as they were (`{summaries}:jobs`,
 * `summarizers`, the job id as the run id). The summary's row goes in with the
 * step's commit (`insert`, group-committed with other jobs'), its notification
 * with it (`outbox`). A payload without text and notify was never a summary
 * job: its entry is dead-lettered `malformed` as it is read (`parse`), as it
 * always was, before any work on it.
 */
@Workflow(STREAM_TAG_PREFIX, { queue: STREAM_TAG_PREFIX, group: CONSUMER_GROUP, parse: parseSummaryJobPayload })
@Injectable()
export class SummariesWorkflow implements FinishedElsewhere {
  constructor(private readonly writer: SummaryWriter) {}

  @Step()
  async summarize(ctx: StepContext<SummaryJobPayload>): Promise<{ summary: string }> {
    const { text, notify } = ctx.input;
    const summary = sanitizeSummary(
      await ctx.llm.text([
        { role: 'system', content: SYSTEM_PROMPT },
        { role: 'user', content: text },
      ]),
    );
    ctx.insert('summaries', { job_id: ctx.runId, tenant: ctx.tenant, summary });
    ctx.outbox(summaryReadyMessage(ctx.runId, notify));
    return { summary };
  }

  /**
   * A job finished before summaries ran on the engine has its summary stored
   * and no step row: its redelivery (an entry pending across the upgrade) is
   * a duplicate. One id: the single-row query the job always made.
   */
  async finishedAmong(runIds: readonly string[]): Promise<ReadonlySet<string>> {
    if (runIds.length === 1) return (await this.writer.isStored(runIds[0])) ? new Set(runIds) : new Set();
    return this.writer.storedAmong(runIds);
  }
}
