import { Body, Controller, HttpCode, Post, Req, Res, UseFilters, UseGuards } from '@nestjs/common';
import { ApiBearerAuth, ApiBody, ApiHeader, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import {
  type DirectAnswer,
  IdempotencyContext,
  Idempotent,
  type IdempotencyRequestContext,
  StreamedAnswer,
} from '@app/idempotency';
import type { Request, Response as ExpressResponse } from 'express';
import { AcceptsInternalKey, ApiKeyGuard } from '../auth/api-key.guard';
import { Tenant } from '../auth/principal';
import { TENANT_KEY_AUTH } from '../openapi';
import { type ChatCompletionRequest, ChatCompletionRequestPipe } from './chat-completion-request.pipe';
import { ChatCompletionsRelay, is2xx } from './chat-completions.relay';
import { CHAT_COMPLETIONS_API } from './gateway-apis';
import { ApiGatewayCallErrors, openAiErrorFormat, OpenAiErrorFilter } from './openai-errors';

export const GATEWAY_PATH = 'v1/chat/completions';
/** A whole conversation, images as data URLs included, fits; OpenAI's own limit is larger still. */
export const GATEWAY_MAX_BODY_BYTES = 10 * 1024 * 1024;
/** The largest answer stored for replay; a larger one is relayed and not stored. */
export const GATEWAY_MAX_STORED_BYTES = 4 * 1024 * 1024;
/** How long a duplicate waits for the running call's answer to start before it gets 409. */
export const GATEWAY_ATTACH_WAIT_MS = 30_000;

/**
 * The OpenAI Chat Completions API in front of the configured provider, bytes
 * in and bytes out, with Idempotency-Key: a retry with the key gets the first
 * call's answer (its SSE events, for a stream) and never a second completion,
 * also while that call still runs on another instance. This is the route
 * (its contract, and refusing calls while the instance shuts down); the call
 * itself is ChatCompletionsRelay's.
 */
@ApiTags('gateway')
@ApiBearerAuth(TENANT_KEY_AUTH)
@Controller(GATEWAY_PATH)
@UseGuards(ApiKeyGuard)
@AcceptsInternalKey()
@UseFilters(OpenAiErrorFilter)
export class ChatCompletionsController {
  constructor(private readonly relay: ChatCompletionsRelay) {}

  @Post()
  @HttpCode(200)
  @Idempotent({
    required: false,
    storesStatus: is2xx,
    attach: { waitMs: GATEWAY_ATTACH_WAIT_MS },
    errors: openAiErrorFormat,
    maxStoredBodyBytes: GATEWAY_MAX_STORED_BYTES,
    acceptsRunScope: true,
  })
  @ApiOperation({
    summary: 'Create a chat completion (OpenAI-compatible), safe to retry with Idempotency-Key',
    description:
      'The OpenAI Chat Completions request and answer, relayed to the configured provider unchanged. With an Idempotency-Key, ' +
      'a retry with the same body gets the stored answer (for stream: true the same server-sent events, through data: [DONE]) with ' +
      'Idempotent-Replayed: true and no second upstream call; a retry while the first call runs is attached to it. ' +
      'Errors of the gateway itself are OpenAI error objects ({"error": {"message", "type", "code"}}).',
  })
  @ApiHeader({
    name: 'X-Tenant',
    required: false,
    description:
      'Only with INTERNAL_API_KEY (the worker’s model calls), and required with it: the tenant the call is made for, ' +
      'recorded and replayed as that tenant’s own. With any other key: 401.',
  })
  @ApiBody({
    description: 'A Chat Completions request: model, messages, stream and any other parameter, sent upstream as it is.',
    schema: {
      type: 'object',
      required: ['model', 'messages'],
      additionalProperties: true,
      properties: {
        model: { type: 'string' },
        messages: { type: 'array', minItems: 1, items: { type: 'object' } },
        stream: { type: 'boolean' },
        stream_options: { type: 'object', properties: { include_usage: { type: 'boolean' } } },
      },
    },
  })
  @ApiOkResponse({
    description:
      'The provider’s answer as it sent it: a chat.completion (application/json) or, for stream: true, text/event-stream chunks ending in data: [DONE]. ' +
      'A replay or an attached retry carries Idempotent-Replayed: true.',
    content: {
      'application/json': { schema: { type: 'object' } },
      'text/event-stream': { schema: { type: 'string' } },
    },
  })
  @ApiGatewayCallErrors('The body is not a Chat Completions request')
  async create(
    @Body(ChatCompletionRequestPipe) body: ChatCompletionRequest,
    @Req() req: Request,
    @Tenant() tenant: string,
    @IdempotencyContext() idempotency: IdempotencyRequestContext | undefined,
    @Res({ passthrough: true }) res: ExpressResponse,
  ): Promise<DirectAnswer | Response | StreamedAnswer> {
    return this.relay.handle(CHAT_COMPLETIONS_API, req, res, body, tenant, idempotency);
  }
}
