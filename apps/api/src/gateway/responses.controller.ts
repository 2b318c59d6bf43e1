import {
  Body,
  Controller,
  Delete,
  Get,
  HttpCode,
  Param,
  Post,
  Query,
  Req,
  Res,
  UseFilters,
  UseGuards,
} from '@nestjs/common';
import { ApiBearerAuth, ApiBody, ApiHeader, ApiOkResponse, ApiOperation, ApiQuery, ApiTags } from '@nestjs/swagger';
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
import { GATEWAY_ATTACH_WAIT_MS, GATEWAY_MAX_STORED_BYTES } from './chat-completions.controller';
import { ChatCompletionsRelay, is2xx } from './chat-completions.relay';
import { RESPONSES_API } from './gateway-apis';
import {
  ApiGatewayCallErrors,
  ApiOpenAiErrors,
  OpenAiErrorException,
  openAiResponsesErrorFormat,
  OpenAiErrorFilter,
} from './openai-errors';
import { type ResponseAction, ResponsesLookup } from './responses-lookup';
import { type ResponseRequest, ResponseRequestPipe } from './response-request.pipe';

export const RESPONSES_PATH = 'v1/responses';

/**
 * The OpenAI Responses API (what the Vercel AI SDK's `openai()` and the
 * OpenAI Agents SDK call by default) in front of the configured provider,
 * on the same terms as chat completions: bytes in and out, Idempotency-Key
 * with replay, attach and caller-disconnect, the OpenAI error envelope. A
 * stream is whole when the provider closes it after `response.completed` or
 * `response.incomplete`; one that reports `response.failed` or `error`, or
 * ends otherwise, is relayed, not stored, and frees the key.
 */
@ApiTags('gateway')
@ApiBearerAuth(TENANT_KEY_AUTH)
@Controller(RESPONSES_PATH)
@UseGuards(ApiKeyGuard)
@UseFilters(OpenAiErrorFilter)
export class ResponsesController {
  constructor(
    private readonly relay: ChatCompletionsRelay,
    private readonly lookup: ResponsesLookup,
  ) {}

  @Post()
  @HttpCode(200)
  // The worker's model calls (INTERNAL_API_KEY, X-Tenant) make completions; a response's own routes are tenants'.
  @AcceptsInternalKey()
  @Idempotent({
    required: false,
    storesStatus: is2xx,
    attach: { waitMs: GATEWAY_ATTACH_WAIT_MS },
    errors: openAiResponsesErrorFormat,
    maxStoredBodyBytes: GATEWAY_MAX_STORED_BYTES,
    acceptsRunScope: true,
  })
  @ApiOperation({
    summary: 'Create a model response (OpenAI Responses API), safe to retry with Idempotency-Key',
    description:
      'The OpenAI Responses API request and answer, relayed to the configured provider unchanged. With an Idempotency-Key, ' +
      'a retry with the same body gets the stored answer (for stream: true the same event: and data: lines, through ' +
      'response.completed) with Idempotent-Replayed: true and no second upstream call; a retry while the first call runs is ' +
      'attached to it. A stream that ends with response.failed or error, or without a terminal event, is not stored. ' +
      'Errors of the gateway itself are OpenAI error objects ({"error": {"message", "type", "code"}}).',
  })
  @ApiHeader({
    name: 'X-Tenant',
    required: false,
    description:
      'Only with INTERNAL_API_KEY, and required with it: the tenant the call is made for. With any other key: 401.',
  })
  @ApiBody({
    description: 'A Responses API request: model, input, stream and any other parameter, sent upstream as it is.',
    schema: {
      type: 'object',
      required: ['model'],
      additionalProperties: true,
      properties: {
        model: { type: 'string' },
        input: { oneOf: [{ type: 'string' }, { type: 'array', items: { type: 'object' } }] },
        stream: { type: 'boolean' },
        previous_response_id: { type: 'string' },
      },
    },
  })
  @ApiOkResponse({
    description:
      'The provider’s answer as it sent it: a response object (application/json) or, for stream: true, text/event-stream ' +
      'events ending in response.completed or response.incomplete. A replay or an attached retry carries Idempotent-Replayed: true.',
    content: {
      'application/json': { schema: { type: 'object' } },
      'text/event-stream': { schema: { type: 'string' } },
    },
  })
  @ApiGatewayCallErrors('The body is not a Responses API request (or names a previous_response_id not made for you)')
  async create(
    @Body(ResponseRequestPipe) body: ResponseRequest,
    @Req() req: Request,
    @Tenant() tenant: string,
    @IdempotencyContext() idempotency: IdempotencyRequestContext | undefined,
    @Res({ passthrough: true }) res: ExpressResponse,
  ): Promise<DirectAnswer | Response | StreamedAnswer> {
    return this.relay.handle(RESPONSES_API, req, res, body, tenant, idempotency);
  }

  @Get(':id')
  @ApiOperation({
    summary: 'A response made through the gateway, or its stream resumed',
    description:
      'The response object as completed through the gateway, for the tenant that made it (404 for any other tenant ' +
      'or an unknown id). With stream=true: its events whose sequence_number is above starting_after (all of them ' +
      'without it), from the record, then live while it still runs. A response the gateway holds no record of (made ' +
      'without an Idempotency-Key, or past its retention) is asked of the upstream that made it.',
  })
  @ApiQuery({ name: 'stream', required: false, enum: ['true', 'false'] })
  @ApiQuery({ name: 'starting_after', required: false, schema: { type: 'integer', minimum: 0 } })
  @ApiOpenAiErrors({
    400: 'stream is not true or false, or starting_after is not a whole number.',
    404: 'No response with this id was made through the gateway for this tenant.',
    502: 'The upstream that made it could not be reached.',
  })
  async read(
    @Param('id') id: string,
    @Query('stream') stream: unknown,
    @Query('starting_after') startingAfter: unknown,
    @Tenant() tenant: string,
    @Res() res: ExpressResponse,
  ): Promise<void> {
    await this.lookup.answer(tenant, id, readAction(stream, startingAfter), res);
  }

  @Get(':id/input_items')
  @ApiOperation({
    summary: 'The input items of a response (forwarded to the upstream that made it)',
    description:
      'For the tenant that made it; its answer is the upstream’s. 404 for any other tenant or an unknown id.',
  })
  @ApiOpenAiErrors({ 404: 'No response with this id was made through the gateway for this tenant.' })
  async inputItems(
    @Param('id') id: string,
    @Req() req: Request,
    @Tenant() tenant: string,
    @Res() res: ExpressResponse,
  ): Promise<void> {
    // The list's own query (after, before, limit, order, include) goes as the caller sent it.
    const at = req.originalUrl.indexOf('?');
    await this.lookup.answer(tenant, id, { kind: 'input_items', query: at < 0 ? '' : req.originalUrl.slice(at) }, res);
  }

  @Post(':id/cancel')
  @HttpCode(200)
  @ApiOperation({
    summary: 'Cancel a response (forwarded to the upstream that made it)',
    description:
      'For the tenant that made it; its answer is the upstream’s. 404 for any other tenant or an unknown id.',
  })
  @ApiOpenAiErrors({ 404: 'No response with this id was made through the gateway for this tenant.' })
  async cancel(@Param('id') id: string, @Tenant() tenant: string, @Res() res: ExpressResponse): Promise<void> {
    await this.lookup.answer(tenant, id, { kind: 'cancel' }, res);
  }

  @Delete(':id')
  @ApiOperation({
    summary: 'Delete a response (forwarded to the upstream that made it)',
    description:
      'For the tenant that made it; its answer is the upstream’s, and once that deleted it the gateway forgets the id ' +
      '(a later GET is 404). 404 for any other tenant or an unknown id.',
  })
  @ApiOpenAiErrors({ 404: 'No response with this id was made through the gateway for this tenant.' })
  async remove(@Param('id') id: string, @Tenant() tenant: string, @Res() res: ExpressResponse): Promise<void> {
    await this.lookup.answer(tenant, id, { kind: 'delete' }, res);
  }
}

/** GET's query: `stream` (true or false) and `starting_after` (a whole number, with a stream). */
function readAction(stream: unknown, startingAfter: unknown): ResponseAction {
  if (stream !== undefined && stream !== 'true' && stream !== 'false')
    throw new OpenAiErrorException(400, 'invalid_request', 'stream must be true or false.', {}, 'stream');
  if (startingAfter !== undefined && (typeof startingAfter !== 'string' || !/^\d{1,15}$/.test(startingAfter)))
    throw new OpenAiErrorException(
      400,
      'invalid_request',
      'starting_after must be a whole number: the sequence_number of the last event you have.',
      {},
      'starting_after',
    );
  if (stream !== 'true') return { kind: 'get' };
  return { kind: 'stream', startingAfter: startingAfter === undefined ? undefined : Number(startingAfter) };
}
