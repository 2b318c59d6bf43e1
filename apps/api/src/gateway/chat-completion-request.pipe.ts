import { Injectable, PipeTransform } from '@nestjs/common';
import { OpenAiErrorException } from './openai-errors';

/** What the gateway itself reads of a Chat Completions body; everything else goes upstream untouched. */
export interface ChatCompletionRequest {
  readonly model: string;
  readonly messages: readonly unknown[];
  readonly stream?: boolean | null;
  readonly [parameter: string]: unknown;
}

const MAX_MODEL_LENGTH = 256;

function invalid(message: string, param: string): OpenAiErrorException {
  return new OpenAiErrorException(400, 'invalid_request', message, {}, param);
}

/**
 * The least the gateway must know to relay a body: an object with a model,
 * messages, and `stream` as a boolean, as OpenAI requires them. The rest
 * (every other parameter, the messages' contents) is the provider's to judge,
 * and its 400 is passed through. Refused here, a body claims no key and costs
 * no upstream call.
 */
@Injectable()
export class ChatCompletionRequestPipe implements PipeTransform<unknown, ChatCompletionRequest> {
  transform(body: unknown): ChatCompletionRequest {
    if (typeof body !== 'object' || body === null || Array.isArray(body)) {
      throw invalid('The body must be a JSON object: a Chat Completions request.', 'body');
    }
    const { model, messages, stream, stream_options: streamOptions } = body as Record<string, unknown>;
    if (typeof model !== 'string' || model.length === 0 || model.length > MAX_MODEL_LENGTH) {
      throw invalid(`model must be a string of 1 to ${MAX_MODEL_LENGTH} characters.`, 'model');
    }
    if (!Array.isArray(messages) || messages.length === 0)
      throw invalid('messages must be a non-empty array.', 'messages');
    const notObject = messages.findIndex((m) => typeof m !== 'object' || m === null || Array.isArray(m));
    if (notObject >= 0) throw invalid(`messages[${notObject}] must be an object.`, `messages[${notObject}]`);
    if (stream !== undefined && stream !== null && typeof stream !== 'boolean')
      throw invalid('stream must be true or false.', 'stream');
    if (
      streamOptions !== undefined &&
      streamOptions !== null &&
      (typeof streamOptions !== 'object' || Array.isArray(streamOptions))
    ) {
      throw invalid('stream_options must be an object.', 'stream_options');
    }
    return body as ChatCompletionRequest;
  }
}
