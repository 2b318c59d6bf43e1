import { Injectable } from '@nestjs/common';
import { IsEmail, IsString, Length } from 'class-validator';
import { Step, type StepContext, Workflow } from '@app/workflows';

/** A triage run's input, as POST /v1/triage takes it; checked again here, where the steps rely on it. */
export class TriageInput {
  @IsString()
  @Length(1, 64)
  readonly ticket_id!: string;

  @IsString()
  @Length(1, 100_000)
  readonly text!: string;

  @IsEmail()
  readonly notify!: string;
}

export const TRIAGE_READY_TOPIC = 'email.triage_ready';

const CLASSIFY_PROMPT =
  'Classify the support ticket the user sends into one short category, such as billing, bug, account, ' +
  'feature_request or other. Answer with the category only.';
const DRAFT_PROMPT =
  'Draft a short, polite first reply to the support ticket the user sends, given its category. ' +
  'Answer with the reply only.';

/**
 * The example workflow, and the template for a new one: classify a support
 * ticket, draft a reply, tell someone. Each step is a method; what it returns
 * is committed once and handed to the later steps (`ctx.output`); model calls
 * go through `ctx.llm`, which retries them and keys them so that a retried
 * step is not billed twice; external effects go through `ctx.outbox`, sent by
 * the relay once the step has committed.
 */
@Workflow('triage', { input: TriageInput })
@Injectable()
export class TriageWorkflow {
  @Step()
  async classify(ctx: StepContext<TriageInput>): Promise<{ category: string }> {
    const answer = await ctx.llm.text([
      { role: 'system', content: CLASSIFY_PROMPT },
      { role: 'user', content: ctx.input.text },
    ]);
    return { category: answer.trim() };
  }

  @Step()
  async draft(ctx: StepContext<TriageInput>): Promise<{ draft: string }> {
    const category = ctx.output<{ category: string }>('classify')?.category ?? 'other';
    const draft = await ctx.llm.text([
      { role: 'system', content: DRAFT_PROMPT },
      { role: 'user', content: `Category: ${category}\n\nTicket:\n${ctx.input.text}` },
    ]);
    return { draft };
  }

  @Step()
  notify(ctx: StepContext<TriageInput>): void {
    const category = ctx.output<{ category: string }>('classify')?.category;
    ctx.outbox({
      topic: TRIAGE_READY_TOPIC,
      dedupeKey: `triage_ready:${ctx.runId}`,
      payload: { run_id: ctx.runId, to: ctx.input.notify, category },
    });
  }
}
