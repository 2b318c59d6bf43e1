import { Body, Controller, HttpCode, HttpStatus, Post, Res, UseGuards } from '@nestjs/common';
import { ApiAcceptedResponse, ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import { IdempotencyContext, Idempotent, type IdempotencyRequestContext } from '@app/idempotency';
import { ApiProblemResponse } from '@app/problem';
import { InjectWorkflow, WorkflowHandle } from '@app/workflows';
import type { Response } from 'express';
import { ApiKeyGuard } from '../auth/api-key.guard';
import { Tenant } from '../auth/principal';
import { TENANT_KEY_AUTH } from '../openapi';
import { RunAcceptedDto } from '../runs/run-responses.dto';
import { rethrowNotQueued } from '../runs/run-not-queued.problem';
import { CreateTriageDto } from './create-triage.dto';

/** The run's input, in a fixed shape whatever order the body came in. */
export interface TriageInput {
  readonly ticket_id: string;
  readonly text: string;
  readonly notify: string;
}

export interface RunAccepted {
  readonly run_id: string;
  readonly status: 'queued';
}

/** The example workflow's route: the template for starting any workflow (docs/workflows.md). */
@ApiTags('triage')
@ApiBearerAuth(TENANT_KEY_AUTH)
@ApiProblemResponse(401, 'No or unknown API key')
@Controller('v1/triage')
@UseGuards(ApiKeyGuard)
export class TriageController {
  constructor(@InjectWorkflow('triage') private readonly triage: WorkflowHandle<TriageInput>) {}

  /**
   * Starts a triage run (classify, draft, notify). The run id derives from
   * the idempotency scope, so a retry that runs again (after a crash before
   * the answer was stored) starts the same run, whose steps commit once.
   */
  @Post()
  @Idempotent()
  @HttpCode(HttpStatus.ACCEPTED)
  @ApiAcceptedResponse({
    type: RunAcceptedDto,
    description: 'Queued; Location names the run. A replay carries Idempotent-Replayed: true.',
  })
  @ApiProblemResponse(413, 'The body is over 1 MiB. Nothing was done.')
  async create(
    @Body() body: CreateTriageDto,
    @Tenant() tenant: string,
    @IdempotencyContext() idempotency: IdempotencyRequestContext,
    @Res({ passthrough: true }) res: Response,
  ): Promise<RunAccepted> {
    const input: TriageInput = { ticket_id: body.ticket_id, text: body.text, notify: body.notify };
    const { runId } = await this.triage.start(input, { tenant, idempotency }).catch(rethrowNotQueued('run'));
    res.location(`/v1/runs/${runId}`);
    return { run_id: runId, status: 'queued' };
  }
}
