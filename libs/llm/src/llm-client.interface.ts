import { Inject } from '@nestjs/common';

export interface SummarizeOptions {
  /** Aborts the call: the wall-clock limit of the attempt, or shutdown. */
  readonly signal: AbortSignal;
}

/** The model, behind the one operation the worker needs. */
export interface LlmClient {
  summarize(text: string, options: SummarizeOptions): Promise<string>;
}

export const LlmClient = Symbol('LlmClient');
export const InjectLlmClient = (): ParameterDecorator => Inject(LlmClient);
