import { Injectable, PipeTransform } from '@nestjs/common';
import { OpenAiErrorException } from './openai-errors';

/** What the gateway itself reads of a Responses API body; everything else goes upstream untouched. */
export interface ResponseRequest {
  readonly model: string;
  readonly input?: string | readonly unknown[];
  readonly stream?: boolean | null;
  readonly previous_response_id?: string | null;
  readonly [parameter: string]: unknown;
}

const MAX_MODEL_LENGTH = 256;
/** OpenAI's response ids are `resp_` and 48 hex digits; this leaves room for other providers' ids. */
const MAX_RESPONSE_ID_LENGTH = 256;

function invalid(message: string, param: string): OpenAiErrorException {
  return new OpenAiErrorException(400, 'invalid_request', message, {}, param);
}

/**
 * The least the gateway must know to relay a Responses API body: an object
 * with a model (which upstream serves it), `input` as a string or an array
 * when given, `stream` as a boolean, and `previous_response_id` as a string
 * when given. The rest (tools, instructions, the items' contents) is the
 * provider's to judge, and its 400 is passed through. Refused here, a body
 * claims no key and costs no upstream call.
 */
@Injectable()
export class ResponseRequestPipe implements PipeTransform<unknown, ResponseRequest> {
  transform(body: unknown): ResponseRequest {
    if (typeof body !== 'object' || body === null || Array.isArray(body)) {
      throw invalid('The body must be a JSON object: a Responses API request.', 'body');
    }
    const { model, input, stream, previous_response_id: previous, conversation } = body as Record<string, unknown>;
    // A conversation lives in the provider's account, which every tenant shares; the gateway records no owner of it.
    if (conversation !== undefined && conversation !== null)
      throw invalid(
        'conversation is not supported through this gateway (a conversation lives in the provider account that all ' +
          'tenants share); continue a conversation with previous_response_id.',
        'conversation',
      );
    if (typeof model !== 'string' || model.length === 0 || model.length > MAX_MODEL_LENGTH) {
      throw invalid(`model must be a string of 1 to ${MAX_MODEL_LENGTH} characters.`, 'model');
    }
    if (input !== undefined && input !== null && typeof input !== 'string' && !Array.isArray(input)) {
      throw invalid('input must be a string or an array of input items.', 'input');
    }
    if (stream !== undefined && stream !== null && typeof stream !== 'boolean')
      throw invalid('stream must be true or false.', 'stream');
    if (
      previous !== undefined &&
      previous !== null &&
      (typeof previous !== 'string' || previous.length === 0 || previous.length > MAX_RESPONSE_ID_LENGTH)
    ) {
      throw invalid(
        `previous_response_id must be a response id (a string of 1 to ${MAX_RESPONSE_ID_LENGTH} characters).`,
        'previous_response_id',
      );
    }
    return body as ResponseRequest;
  }
}
